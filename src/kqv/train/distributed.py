"""Multi-process training under torchrun: joining the process group, wrapping the model for data parallelism
(DDP) or sharding it (FSDP2, `kqv.train.sharding`), gradient synchronisation, and each rank's slice of a batch."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from ..errors import DataError, ProcessLost, spoken
from ..nn.experts import expert_layers

Batch = Any


def backend_for(device: torch.device) -> str:
    """The process-group backend for a model on `device`: gloo on the CPU; on CUDA, NCCL for CUDA tensors
    (gradients, FSDP's all-gathers) and gloo for the trainer's CPU scalars and objects (losses, generator
    states), the `device:backend` form torch accepts for a group that serves both."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def rank_device(device: torch.device) -> torch.device:
    """The device this process trains on: under torchrun every process takes its own GPU (cuda:LOCAL_RANK)."""
    if device.type != "cuda" or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return device
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def init_distributed(device: torch.device | None = None) -> tuple[int, int, bool]:
    """(rank, world size, whether we created the process group); under torchrun joins a group whose backend
    suits `device`, where this process trains (`backend_for`; the CPU's when not given)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1, False
    created = not dist.is_initialized()
    if created:
        device = device or torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(rank_device(device))
        dist.init_process_group(backend_for(device))
    _note_processes()
    return dist.get_rank(), dist.get_world_size(), created


_PROCESSES: list[tuple[str, int]] = []  # (host, process id) of every rank, to name a lost one


def _note_processes() -> None:
    """Learn where every rank runs (a collective), so that a rank that dies can be named by the others."""
    processes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(processes, (socket.gethostname(), os.getpid()))
    _PROCESSES[:] = processes


def lost_ranks(wait: float = 0.0) -> list[int]:
    """The ranks on this machine whose process is gone (exited, killed; a zombie counts as gone), waiting up to
    `wait` seconds for one: a killed process closes its connections before it is gone."""
    host, deadline = socket.gethostname(), time.monotonic() + wait
    while True:
        lost = [rank for rank, (where, pid) in enumerate(_PROCESSES) if where == host and not _alive(pid)]
        if lost or time.monotonic() >= deadline:
            return lost
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: whether a signal could be sent
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


@contextmanager
def stops_when_a_process_is_lost(rank: int, world_size: int) -> Iterator[None]:
    """Inside, a collective that fails because another rank's process is gone (gloo: "Connection closed by
    peer"), or torchrun's SIGTERM after it (which saves a checkpoint first, `kqv.signals`), becomes one
    `ProcessLost` that names the lost rank, instead of a traceback from deep inside torch."""
    try:
        yield
    except (RuntimeError, KeyboardInterrupt) as error:
        if world_size == 1:
            raise
        failed = isinstance(error, dist.DistError) or "by peer" in str(error)  # gloo's words, in DDP's backward too
        lost = lost_ranks(wait=3.0 if failed else 0.0)
        if not lost and not failed:
            raise
        who = f"rank {', '.join(map(str, lost))} of {world_size}" if lost else "another process of the run"
        raise ProcessLost(
            f"{who} stopped (its process is gone), so rank {rank} stops too; the last checkpoint stands: start all "
            f"{world_size} processes again with {spoken('`--resume`', 'Trainer.resume(...)')}"
        ) from None


def data_parallel(model: nn.Module) -> nn.parallel.DistributedDataParallel:
    """`model` wrapped in DistributedDataParallel. With mixture-of-experts layers an expert may get no tokens on
    one process and some on another, so DDP looks for parameters a forward pass left unused (which it reduces as
    zeros) instead of waiting for their gradients."""
    return nn.parallel.DistributedDataParallel(model, find_unused_parameters=bool(expert_layers(model)))


@contextmanager
def gradient_sync(model: nn.Module, sync: bool) -> Iterator[None]:
    """Backward passes inside synchronise gradients across processes only when `sync`: with gradient
    accumulation every micro-batch but the last accumulates locally (DDP's `no_sync`, FSDP2's
    `set_requires_gradient_sync(False)`), and the last one's backward reduces the sum once."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper of a DDP model
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)
        yield
    elif isinstance(model, nn.parallel.DistributedDataParallel) and not sync:
        with model.no_sync():
            yield
    else:
        yield


def clip_gradients(model: nn.Module, max_norm: float) -> Tensor:
    """Scale the gradients of `model` to a total norm of at most `max_norm`; returns the norm before, on the device
    (of the whole gradient also when the model is sharded: FSDP's norm is a DTensor over the shards)."""
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def process_mean(value: Tensor, world_size: int) -> Tensor:
    """The mean of `value` over the processes (in place; every rank must call it); `value` in one process."""
    if world_size > 1:
        dist.all_reduce(value)
        value /= world_size
    return value


def settle(world_size: int) -> None:
    """Wait until every rank's last collective is done, on the way out of a completed training (never on an error
    path, where a rank may not come). Gloo's worker threads free a finished collective's tensors under the GIL,
    and the group's destructor holds the GIL while it joins them: without this, exit deadlocked about 1 run in 4."""
    if world_size > 1:
        dist.barrier()


def rank0_says(flag: bool, world_size: int) -> bool:
    """Rank 0's `flag` on every rank (every rank must call it), so that all stop at the same update."""
    if world_size == 1:
        return flag
    decided = torch.tensor(float(flag))
    dist.broadcast(decided, src=0)
    return bool(decided)


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
