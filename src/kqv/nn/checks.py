"""Input checks: a clear message at the model's door instead of an IndexError deep inside torch."""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import DataError, DataTypeError
from .attention import padding_mask


def check_ids(ids: Tensor, vocab_size: int, name: str = "ids") -> None:
    if not isinstance(ids, Tensor):
        raise DataTypeError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise DataTypeError(f"{name} must be an integer tensor (torch.long), got {ids.dtype}")
    if ids.dim() != 2:
        hint = f"; add a batch dimension with {name}[None]" if ids.dim() == 1 else ""
        raise DataError(f"{name} must have shape (batch, time), got {tuple(ids.shape)}{hint}")
    if ids.numel() == 0:
        raise DataError(f"{name} is empty (shape {tuple(ids.shape)}); give at least one token per sequence")
    low, high = torch.stack(torch.aminmax(ids)).tolist()  # one host sync per forward, not two (on a GPU)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise DataError(
            f"{name} contains token id {bad}, outside the vocabulary [0, {vocab_size}); "
            f"was the input encoded with the tokenizer this model was built for?"
        )


def check_attention_mask(
    attention_mask: Tensor | None, ids: Tensor, past: int = 0, name: str = "attention_mask"
) -> Tensor | None:
    """Validate a (batch, past + time) mask of 1 = token, 0 = padding; return it as (batch, 1, 1, time) bool."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, Tensor):
        raise DataTypeError(f"{name} must be a torch.Tensor, got {type(attention_mask).__name__}")
    expected = (ids.shape[0], past + ids.shape[1])
    if tuple(attention_mask.shape) != expected:
        raise DataError(
            f"{name} must have shape (batch, time) = {expected} to match the ids, got {tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype != torch.bool and not ((attention_mask == 0) | (attention_mask == 1)).all():
        raise DataError(f"{name} must contain only 1 (token) and 0 (padding)")
    return padding_mask(attention_mask)
