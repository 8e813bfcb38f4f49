"""A vocabulary padded to a multiple of 64 (`ModelConfig.vocab_multiple`), as nanoGPT pads GPT-2's.

The output layer is a (vocab, d_model) product at every position, about a quarter of GPT-2 small's FLOPs, and a
GPU computes a product in tiles of 64 or 128 rows: at 50,257 rows the last tile is nearly empty and the kernels
chosen for an odd size are slower ones. Padding the token table and the output layer to 50,304 rows (786 x 64)
adds 47 rows that no token uses. They must change nothing the model says:

* the model's outputs are the real vocabulary's logits: `PaddedHead` computes the padded product (the shape the
  tiles want) and returns its first `vocab_size` columns, so sampling, greedy and beam search never see a padded
  id, and the loss never scores one (`kqv.nn.losses.linear_cross_entropy` takes the same columns);
* the padded rows of the token table are never looked up (the tokenizer has no id for them) and get no gradient,
  neither from the lookup nor from the output layer, whose padded columns are cut off before the softmax;
* exported and converted weights keep the real vocabulary (`real_rows`, used by `kqv.interop`).

An unpadded model (`vocab_multiple = 1`, or a vocabulary already a multiple) has a plain `nn.Linear` head: nothing
changes for it, its state dict included.
"""

from __future__ import annotations

from torch import Tensor, nn

from .embeddings import Embeddings


class PaddedHead(nn.Linear):
    """The output projection to a padded vocabulary: `padded` output rows computed, the first `vocab_size` returned.

    The slice is a view of the product's output; what reads it next (the fp32 cast of the loss, the softmax of
    sampling, a fused kernel under torch.compile) reads only the real columns, so the padding costs the product's
    extra rows and nothing after them."""

    def __init__(self, d_model: int, vocab_size: int, padded: int, bias: bool = True):
        super().__init__(d_model, padded, bias=bias)
        self.vocab_size = vocab_size

    def forward(self, hidden: Tensor) -> Tensor:
        return super().forward(hidden)[..., : self.vocab_size]  # (..., vocab): the padded columns left out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, vocab_size={self.vocab_size}"


def output_layer(d_model: int, vocab_size: int, padded: int, bias: bool) -> nn.Linear:
    """The projection from d_model to a vocabulary of `vocab_size` tokens whose table has `padded` rows: a plain
    `nn.Linear` when there is no padding, else a `PaddedHead`."""
    if padded == vocab_size:
        return nn.Linear(d_model, vocab_size, bias=bias)
    return PaddedHead(d_model, vocab_size, padded, bias=bias)


def classes(head: nn.Linear) -> int:
    """How many of `head`'s output rows are real classes: its `vocab_size` when padded, else all of them."""
    return head.vocab_size if isinstance(head, PaddedHead) else head.out_features


def real_rows(model: nn.Module) -> dict[str, int]:
    """Each state-dict name of a padded vocabulary tensor of `model` (token tables, output layers' weights and
    biases) and its number of real rows; empty for a model without padding. Tied weights appear under each name."""
    rows: dict[str, int] = {}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, PaddedHead):
            rows |= {f"{prefix}{p}": module.vocab_size for p, _ in module.named_parameters(recurse=False)}
        elif isinstance(module, Embeddings) and isinstance(module.tokens, nn.Embedding):
            if module.tokens.num_embeddings != module.vocab_size:
                rows[f"{prefix}tokens.weight"] = module.vocab_size
    return rows
