"""Input checks: a clear message at the model's door instead of an IndexError deep inside torch.

Where a check runs decides what it costs. Reading a tensor's values on the host (`.tolist()`, `bool(t)`) waits
for a GPU to finish everything queued, so the model's forward pass checks only what it can see without reading
values, and reads none on the training path:

* `check_id_tensor`: type, dtype and shape of the ids, in every forward (free);
* `check_ids`: that and the values (every id in the vocabulary; one read): where ids are made, on the host
  before the copy to the device (the batch makers of `kqv.data`, `kqv.nn.generation`, the explorer and the
  API's paths), never inside a training step;
* `lookup_tokens`: the embedding lookup itself is the value check of a direct call: an id outside the table
  makes torch raise IndexError on the CPU, which becomes the same DataError as `check_ids`' (nothing is read
  unless the lookup failed). On a GPU an out-of-range id is a device-side assert: check values with `check_ids`
  before the copy;
* `check_attention_mask`: the shape always; the values (only 0 and 1) only for a mask that is not bool, so the
  batch makers hand bool masks and a training step reads nothing.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import DataError, DataTypeError
from .attention import padding_mask


def check_id_tensor(ids: Tensor, name: str = "ids") -> None:
    """Type, dtype and shape of a (batch, time) tensor of token ids: no value is read (no host sync)."""
    if not isinstance(ids, Tensor):
        raise DataTypeError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise DataTypeError(f"{name} must be an integer tensor (torch.long), got {ids.dtype}")
    if ids.dim() != 2:
        hint = f"; add a batch dimension with {name}[None]" if ids.dim() == 1 else ""
        raise DataError(f"{name} must have shape (batch, time), got {tuple(ids.shape)}{hint}")
    if ids.numel() == 0:
        raise DataError(f"{name} is empty (shape {tuple(ids.shape)}); give at least one token per sequence")


def check_ids(ids: Tensor, vocab_size: int, name: str = "ids") -> None:
    """`check_id_tensor` and every id in [0, vocab_size): one host read, for ids on the host or outside a step."""
    check_id_tensor(ids, name)
    check_id_values(ids, vocab_size, name)


def check_id_values(ids: Tensor, vocab_size: int, name: str = "ids") -> None:
    """DataError naming the first id outside [0, vocab_size), for ids of any shape (one host read)."""
    if ids.numel() == 0:
        return
    low, high = torch.stack(torch.aminmax(ids)).tolist()  # one read, not two
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise DataError(
            f"{name} contains token id {bad}, outside the vocabulary [0, {vocab_size}); "
            f"was the input encoded with the tokenizer this model was built for?"
        )


def lookup_tokens(table: nn.Module, ids: Tensor, vocab_size: int | None, name: str = "ids") -> Tensor:
    """`table(ids)`, with torch's IndexError for an id outside the table turned into `check_ids`' DataError."""
    try:
        return table(ids)
    except IndexError:
        if vocab_size is None:
            raise
        check_id_values(ids, vocab_size, name)
        raise


def check_attention_mask(
    attention_mask: Tensor | None, ids: Tensor, past: int = 0, name: str = "attention_mask"
) -> Tensor | None:
    """Validate a (batch, past + time) mask of 1 = token, 0 = padding; return it as (batch, 1, 1, time) bool.
    The values of a bool mask need no check (and none is read); any other dtype's are read once. A bool
    (batch, 1, time, past + time) mask, True = may attend (a packed row's, `kqv.nn.cores.packed_mask`), is checked
    by shape and returned as it is."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, Tensor):
        raise DataTypeError(f"{name} must be a torch.Tensor, got {type(attention_mask).__name__}")
    if attention_mask.dim() == 4:
        return check_pair_mask(attention_mask, ids, past, name)
    expected = (ids.shape[0], past + ids.shape[1])
    if tuple(attention_mask.shape) != expected:
        raise DataError(
            f"{name} must have shape (batch, time) = {expected} to match the ids, got {tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype != torch.bool and not ((attention_mask == 0) | (attention_mask == 1)).all():
        raise DataError(f"{name} must contain only 1 (token) and 0 (padding)")
    return padding_mask(attention_mask)


def check_pair_mask(mask: Tensor, ids: Tensor, past: int = 0, name: str = "attention_mask") -> Tensor:
    """A bool (batch, 1, time, past + time) mask of which key each query may attend to, checked by shape only."""
    expected = (ids.shape[0], 1, ids.shape[1], past + ids.shape[1])
    if tuple(mask.shape) != expected or mask.dtype != torch.bool:
        raise DataError(
            f"a 4-D {name} must be bool with shape (batch, 1, time, time) = {expected}, got {tuple(mask.shape)} "
            f"{mask.dtype}"
        )
    return mask
