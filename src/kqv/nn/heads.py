"""What an encoder is trained and used for: heads that turn its hidden states into predictions.

The encoder (`kqv.Encoder`) gives one contextual vector per token. BERT (Devlin et al. 2019) pretrains it by
masked language modelling and fine-tunes it for tasks such as classification, each with a small head on top:

* `MaskedLMHead`: dense -> activation -> norm ("the transform"), then a projection to the vocabulary that shares
  its matrix with the token embeddings and has a bias of its own. Logits for every position; the loss is taken
  at the masked ones only.
* `ClassificationHead`: pool the sequence into one vector (the first token, BERT's [CLS], or the mean over the
  real tokens) -> dropout -> linear to the classes.

`MaskedLM` and `SequenceClassifier` are an `Encoder` with one of these heads. `mean_pool` is also the pooling of
sentence embeddings (Reimers & Gurevych 2019, sentence-transformers).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError, DataError
from .config import ModelConfig
from .dropout import Dropout
from .experts import with_auxiliary_loss
from .layers import ACTIVATIONS, make_norm
from .models import Encoder, init_weights, lm_loss
from .vocabulary import output_layer

Pooling = Literal["first", "mean"]


def mean_pool(hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """The mean of the hidden states (batch, time, d_model) over real tokens (attention_mask 1) -> (batch, d_model)."""
    if attention_mask is None:
        return hidden.mean(dim=1)
    weights = attention_mask.to(hidden.dtype)[..., None]  # (batch, time, 1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


class MaskedLMHead(nn.Module):
    """BERT's prediction head: to_vocab(norm(act(dense(h)))), to_vocab tied to the token embeddings if given."""

    def __init__(self, config: ModelConfig, tokens: nn.Embedding | None = None):
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.activation = ACTIVATIONS[config.activation]  # a gated activation's nonlinearity (silu, gelu)
        self.norm = make_norm(config)
        vocab = config.vocab_size  # BERT's head always has a bias; padded columns are cut off (`kqv.nn.vocabulary`)
        self.to_vocab = output_layer(config.d_model, vocab, config.padded(vocab), bias=True)
        if tokens is not None:
            self.to_vocab.weight = tokens.weight

    def forward(self, hidden: Tensor) -> Tensor:
        return self.to_vocab(self.norm(self.activation(self.dense(hidden))))  # (batch, time, vocab)


class ClassificationHead(nn.Module):
    """Pool (first token or mean over real tokens) -> dropout -> linear: logits (batch, n_classes)."""

    def __init__(self, config: ModelConfig, n_classes: int, pooling: Pooling = "first"):
        super().__init__()
        if pooling not in ("first", "mean"):
            raise ConfigError(f"pooling must be 'first' (BERT's [CLS] token) or 'mean', got {pooling!r}")
        if not isinstance(n_classes, int) or n_classes < 2:
            raise ConfigError(f"n_classes must be an integer of at least 2, got {n_classes!r}")
        self.pooling = pooling
        self.dropout = Dropout(config.dropout)
        self.to_classes = nn.Linear(config.d_model, n_classes)

    def forward(self, hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        pooled = hidden[:, 0] if self.pooling == "first" else mean_pool(hidden, attention_mask)  # (batch, d_model)
        return self.to_classes(self.dropout(pooled))


def predicted_positions(targets: Tensor) -> Tensor:
    """Where each row has a target: targets (batch, time), -100 where none -> (batch, k) time indices in order, k the
    most any row has, shorter rows filled with -1.

    Which rows of the hidden states reach the head depends on the data, so finding them on the device means
    reading a count back (boolean-mask indexing waits for it). Found where batches are made, on the host, and
    handed to `MaskedLM` with the batch, the training step gathers them without a sync; being (batch, k), they
    split by rows like the rest of the batch (gradient accumulation, torchrun)."""
    wanted = targets != -100
    k = int(wanted.sum(dim=1).max()) if wanted.numel() else 0  # free on the host; a sync on a device
    order = wanted.to(torch.uint8).argsort(dim=1, descending=True, stable=True)[:, :k]  # targets first, in order
    return torch.where(wanted.gather(1, order), order, -1)


class MaskedLM(nn.Module):
    """An encoder pretrained by filling in masked tokens: logits over the vocabulary at every position."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.head = MaskedLMHead(config)
        init_weights(self)
        if config.tie_embeddings:
            self.head.to_vocab.weight = self.encoder.embeddings.tokens.weight

    def forward(
        self,
        ids: Tensor,
        targets: Tensor | None = None,
        *,
        attention_mask: Tensor | None = None,
        predicted: Tensor | None = None,
    ) -> Tensor:
        """ids (batch, time) -> logits (batch, time, vocab), or the mean cross-entropy when targets are given
        (targets (batch, time): the original token at masked positions, -100 everywhere else).

        With targets, the head runs at the masked positions only (about 15% of them): the same loss for a fraction
        of the cost of projecting every position to the vocabulary. `predicted` (batch, k) are those positions as
        `predicted_positions(targets)` gives them; made with the batch, they spare the step a host sync, which
        finding them here costs. In training the experts' load-balancing loss is added (`kqv.nn.experts`).
        """
        hidden = self.encoder(ids, attention_mask)  # (batch, time, d_model)
        if targets is None:
            return self.head(hidden)
        if targets.shape != ids.shape:
            raise DataError(f"targets must have shape {tuple(ids.shape)} like the ids, got {tuple(targets.shape)}")
        if predicted is None:
            predicted = predicted_positions(targets)
        elif predicted.dim() != 2 or predicted.shape[0] != ids.shape[0] or predicted.dtype != torch.long:
            raise DataError(
                f"predicted must be a LongTensor (batch, k) = ({ids.shape[0]}, k) from predicted_positions(targets), "
                f"got {predicted.dtype} of shape {tuple(predicted.shape)}"
            )
        index = predicted.clamp(min=0)  # (batch, k); -1 fills the rows with fewer targets
        rows = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))  # (batch, k, d_model)
        wanted = targets.gather(1, index).masked_fill(predicted < 0, -100)  # (batch, k)
        return with_auxiliary_loss(self, lm_loss(self.head(rows), wanted))


class SequenceClassifier(nn.Module):
    """An encoder with a classification head: one label per sequence."""

    def __init__(self, config: ModelConfig, n_classes: int, pooling: Pooling = "first"):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.head = ClassificationHead(config, n_classes, pooling)
        init_weights(self)

    def forward(self, ids: Tensor, labels: Tensor | None = None, *, attention_mask: Tensor | None = None) -> Tensor:
        """ids (batch, time) -> logits (batch, n_classes), or the mean cross-entropy when labels (batch,) are given
        (plus the experts' load-balancing loss in training)."""
        logits = self.head(self.encoder(ids, attention_mask), attention_mask)
        if labels is None:
            return logits
        if labels.shape != logits.shape[:1]:
            raise DataError(
                f"labels must have shape ({logits.shape[0]},), one label per sequence, got {tuple(labels.shape)}"
            )
        return with_auxiliary_loss(self, F.cross_entropy(logits.float(), labels))
