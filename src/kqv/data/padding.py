"""Right padding of variable-length sequences into one batch tensor, and the mask of the real tokens."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def pad_sequences(sequences: list[Tensor], value: int) -> Tensor:
    """(batch, longest): the sequences, right-padded with `value`."""
    return nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=value)


def lengths_mask(lengths: list[int], width: int) -> Tensor:
    """(batch, width) booleans, True at the first `lengths[row]` positions of each row."""
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def pad_batch(sequences: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """(ids, attention_mask): (batch, longest) int64 ids, right-padded, and a bool mask, True on real tokens (a
    bool mask is one the model need not read back to check: `kqv.nn.checks.check_attention_mask`)."""
    ids = pad_sequences([torch.tensor(s, dtype=torch.long) for s in sequences], pad_id)
    return ids, lengths_mask([len(s) for s in sequences], ids.shape[1])
