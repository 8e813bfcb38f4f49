"""Token batches for training and evaluation: random blocks of a long id sequence, and every block in order."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..errors import ConfigError, DataError


def _check_ids(ids: torch.Tensor) -> None:
    """Require a 1-D tensor of integer token ids."""
    if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise DataError(f"ids must be a 1-D integer tensor, got shape {tuple(ids.shape)} and dtype {ids.dtype}")


def sample_batch(
    ids: torch.Tensor, batch_size: int, context: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``batch_size`` random blocks of ``context`` tokens and their next-token targets.

    Returns ``(x, y)``, both LongTensors of shape (batch_size, context) with ``y[:, t] == x[:, t + 1]``
    for ``t < context - 1`` and ``y[:, -1]`` the token after the block. Start positions are uniform over
    every valid start and drawn from ``generator``, so a seeded generator gives the same batches.
    """
    _check_ids(ids)
    if batch_size < 1 or context < 1:
        raise ConfigError(f"batch_size and context must be positive, got {batch_size} and {context}")
    if len(ids) < context + 1:
        raise DataError(
            f"The data has {len(ids)} tokens, but a block of context {context} needs at least "
            f"{context + 1} (context + 1 for the shifted target); use more text or a shorter context"
        )
    starts = torch.randint(0, len(ids) - context, (batch_size,), generator=generator).to(ids.device)
    positions = starts[:, None] + torch.arange(context + 1, device=ids.device)  # (B, T + 1)
    blocks = ids[positions].long()  # (B, T + 1)
    return blocks[:, :-1], blocks[:, 1:]  # (B, T), (B, T)


def iter_eval_batches(ids: torch.Tensor, batch_size: int, context: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(x, y)`` batches of consecutive, non-overlapping blocks that cover the whole split once.

    Every target position ``1 .. len(ids) - 1`` appears in exactly one ``y``, so summing the token losses
    and dividing by ``len(ids) - 1`` gives the exact per-token loss (and perplexity). Full blocks of
    ``context`` tokens come in batches of up to ``batch_size`` rows; the leftover tokens, if any, come
    last as a single shorter row of shape (1, remainder).
    """
    _check_ids(ids)
    if batch_size < 1 or context < 1:
        raise ConfigError(f"batch_size and context must be positive, got {batch_size} and {context}")
    if len(ids) < 2:
        raise DataError(f"Evaluation needs at least 2 tokens (one input, one target), got {len(ids)}")
    ids = ids.long()
    n_blocks = (len(ids) - 1) // context
    for first in range(0, n_blocks, batch_size):
        rows = torch.arange(first, min(first + batch_size, n_blocks), device=ids.device)
        positions = rows[:, None] * context + torch.arange(context + 1, device=ids.device)  # (B, T + 1)
        blocks = ids[positions]  # (B, T + 1)
        yield blocks[:, :-1], blocks[:, 1:]
    tail = ids[n_blocks * context :]
    if len(tail) >= 2:
        yield tail[None, :-1], tail[None, 1:]  # (1, remainder)


def batch_generator(seed: int, i: int) -> torch.Generator:
    """The generator of batch i: the same batch for the same i, as the trainer's determinism contract asks. A
    large seed (up to 2**63 - 1, `kqv.validation.check_seed`) is wrapped into torch's seed range; a seed torch
    takes as it is stays, so every batch of an existing run stays the same."""
    mixed = seed * 1_000_003 + i
    return torch.Generator().manual_seed(mixed if -(2**63) <= mixed < 2**64 else mixed % 2**64)
