"""Multi-process training under torchrun: joining the process group, and each rank's slice of a batch."""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist
from torch import Tensor

from ..errors import DataError

Batch = Any


def init_distributed() -> tuple[int, int, bool]:
    """(rank, world size, whether we created the process group); joins a gloo group under torchrun."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1, False
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), False
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), True


def slice_batch(batch: Batch, rank: int, world_size: int, batch_size: int) -> Batch:
    """This rank's rows of every tensor in the batch (the batch itself in a single process)."""
    if world_size == 1:
        return batch
    if isinstance(batch, Tensor):
        if batch.dim() == 0 or batch.shape[0] != batch_size:
            raise DataError(
                f"under torchrun every tensor in a batch is split along dim 0, which must be "
                f"batch_size={batch_size}; got a tensor of shape {tuple(batch.shape)}"
            )
        rows = batch_size // world_size
        return batch[rank * rows : (rank + 1) * rows]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(slice_batch(x, rank, world_size, batch_size) for x in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(slice_batch(x, rank, world_size, batch_size) for x in batch)
    if isinstance(batch, dict):
        return {k: slice_batch(v, rank, world_size, batch_size) for k, v in batch.items()}
    return batch


def batch_tokens(batch: Batch) -> int | None:
    """The token count of a batch for tokens/s: the numel of the batch tensor, or of the first tensor of a
    tuple/list/dict; None for anything else."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()), None)
    if isinstance(batch, (tuple, list)) and batch:
        batch = batch[0]
    return batch.numel() if isinstance(batch, Tensor) else None
