"""The model's input layer: token ids become vectors, plus where each token is when positions are absolute.

Each token id indexes a learned vector (`nn.Embedding`); absolute position schemes (sinusoidal, learned; see
`kqv.nn.positions`) add their vector for the token's position here, once, at the bottom of the model, while the
relative schemes act inside attention instead. (Sentence embeddings, vectors for whole texts, are the
`embeddings` job in `kqv.jobs`.)
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from .checks import lookup_tokens
from .config import ModelConfig, require_vocabulary
from .dropout import Dropout
from .layers import make_norm
from .positions import input_positions


class Embeddings(nn.Module):
    """Token embedding, plus absolute positions when the config uses them, then optional norm and dropout.

    `tokens` is the token table to use (shared with another model part), by default a new `nn.Embedding`; any
    module that maps the input to (batch, time, d_model) vectors works, e.g. a ViT's `PatchEmbedding`. `name` is
    what an error about out-of-range ids calls them (`kqv.nn.checks.lookup_tokens`). A new table has
    `config.padded(vocab_size)` rows (`kqv.nn.vocabulary`): the ids past `vocab_size` are padding, which no
    tokenizer makes and `check_ids` refuses."""

    def __init__(self, config: ModelConfig, vocab_size: int | None, tokens: nn.Module | None = None, name: str = "ids"):
        super().__init__()
        self.name = name
        if tokens is None:
            require_vocabulary(vocab_size)
        self.vocab_size = vocab_size
        self.tokens = tokens if tokens is not None else nn.Embedding(config.padded(vocab_size), config.d_model)
        self.positions = input_positions(config)
        self.scale = math.sqrt(config.d_model) if config.scale_embeddings else 1.0
        self.norm = make_norm(config) if config.embed_norm else None
        self.dropout = Dropout(config.dropout)

    def forward(self, ids: Tensor, positions: Tensor) -> Tensor:
        x = lookup_tokens(self.tokens, ids, self.vocab_size, self.name) * self.scale  # (batch, time, d_model)
        if self.positions is not None:
            x = x + self.positions(positions).to(x.dtype)
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)
