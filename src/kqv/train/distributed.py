"""Multi-process training under torchrun: joining the process group, wrapping the model for data parallelism
(DDP) or sharding it (FSDP2, `kqv.train.sharding`), gradient synchronisation, and each rank's slice of a batch."""

from __future__ import annotations

import inspect
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from ..errors import TRAINER_RESUME, DataError, ProcessLost, RunError, option
from ..nn.training import may_skip_parameters
from .topology import Topology

Batch = Any


@dataclass(frozen=True)
class OwnRows:
    """A batch function's answer that is already this rank's rows of the global batch, `share`'s cut, made alone
    (a corpus on disk reads only its own blocks: `kqv.jobs.lm_prepared`); `weight` is its loss's weight."""

    batch: Batch
    weight: float


logger = logging.getLogger("kqv.train.trainer")  # the trainer's voice


def backend_for(device: torch.device) -> str:
    """The process-group backend for a model on `device`: gloo on the CPU; on CUDA, NCCL for CUDA tensors
    (gradients, FSDP's all-gathers) and gloo for the trainer's CPU scalars and objects (losses, generator
    states), the `device:backend` form torch accepts for a group that serves both."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def init_distributed(topology: Topology, device: torch.device | None = None, timeout_minutes: float = 10.0) -> bool:
    """Whether we created the process group; with several processes (`topology`) joins a group whose backend
    suits `device`, where this process trains (`backend_for`; the CPU's when not given), whose collectives fail
    after waiting `timeout_minutes` for another process (`train.collective_timeout_minutes`) instead of hanging.
    The group must agree with `topology` (`Topology.check_group`), which alone says the rank and world size."""
    if not topology.several:
        return False
    created = not dist.is_initialized()
    if created:
        device = device or torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(topology.device(device))
        dist.init_process_group(backend_for(device), timeout=timedelta(minutes=timeout_minutes))
    topology.check_group()
    _note_processes(topology.world_size)
    return created


_PROCESSES: list[tuple[str, int]] = []  # (host, process id) of every rank, to name a lost one


def _note_processes(world_size: int) -> None:
    """Learn where every rank runs (a collective), so that a rank that dies can be named by the others."""
    processes: list[Any] = [None] * world_size
    dist.all_gather_object(processes, (socket.gethostname(), os.getpid()))
    _PROCESSES[:] = processes


def lost_ranks(wait: float = 0.0) -> list[int]:
    """The ranks on this machine whose process is gone (exited, killed; a zombie counts as gone), waiting up to
    `wait` seconds for one: a killed process closes its connections before it is gone. Only this machine's:
    a process on another node cannot be looked at from here (`remote_ranks` are the ones it cannot tell about)."""
    host, deadline = socket.gethostname(), time.monotonic() + wait
    while True:
        lost = [rank for rank, (where, pid) in enumerate(_PROCESSES) if where == host and not _alive(pid)]
        if lost or time.monotonic() >= deadline:
            return lost
        time.sleep(0.05)


def remote_ranks() -> list[int]:
    """The ranks that run on other machines than this one: whether their processes live, `lost_ranks` cannot
    tell."""
    host = socket.gethostname()
    return [rank for rank, (where, _) in enumerate(_PROCESSES) if where != host]


def agree_on_checkpoint(checkpoint: Any, run_dir: Path, world_size: int) -> None:
    """Refuse on every rank at once when the ranks did not all find rank 0's checkpoint (`checkpoint`: this
    rank's, or None) in the run directory, before a rank resumes from another step than the others and their
    collectives no longer meet (a hang). Under several nodes a rank sees no checkpoint, or an older one, when its
    node sees another file system at `run_dir` than rank 0's. Every rank must call it (a collective)."""
    if world_size == 1:
        return
    found: list[Any] = [None] * world_size
    step = None if checkpoint is None else checkpoint.step
    dist.all_gather_object(found, (step, socket.gethostname()))
    if all(theirs == found[0][0] for theirs, _ in found):
        return

    def sees(step: int | None) -> str:
        return "no checkpoint" if step is None else f"the checkpoint of step {step}"

    others = [f"rank {rank} on {host} sees {sees(s)}" for rank, (s, host) in enumerate(found) if s != found[0][0]]
    raise RunError(
        f"rank 0 on {found[0][1]} sees {sees(found[0][0])} in {run_dir}, but {'; '.join(others[:4])}: the ranks "
        f"would train from different steps, so none starts. A run on several nodes needs its run directory on a "
        f"file system every node sees (a shared file system such as NFS or Lustre, at the same path on every "
        f"node); put it there and start all {world_size} processes again"
    )


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
        elsewhere = remote_ranks()
        if lost:
            who = f"rank {', '.join(map(str, lost))} of {world_size} stopped (its process is gone)"
        elif elsewhere:  # this node cannot look at another's processes
            who = f"a process on another node (one of ranks {_listed(elsewhere)}) stopped or lost its connection"
        else:
            who = "another process of the run stopped (its process is gone)"
        raise ProcessLost(
            f"{who}, so rank {rank} stops too; the last checkpoint stands: start all "
            f"{world_size} processes again with {option(TRAINER_RESUME)}"
        ) from None


def _listed(ranks: list[int]) -> str:
    """Ranks in words, a long list cut short."""
    return ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def data_parallel(model: nn.Module) -> nn.parallel.DistributedDataParallel:
    """`model` wrapped in DistributedDataParallel. With mixture-of-experts layers an expert may get no tokens on
    one process and some on another, so DDP looks for parameters a forward pass left unused (which it reduces as
    zeros) instead of waiting for their gradients. Buffers are not broadcast before every forward (DDP's default):
    kqv's (RoPE's frequencies, ALiBi's slopes) are made from the config, the same on every process, and saved in
    no checkpoint, so the broadcast would be a collective per step that changes nothing."""
    return nn.parallel.DistributedDataParallel(
        model, find_unused_parameters=may_skip_parameters(model), **no_buffer_sync()
    )


def no_buffer_sync(ddp: type = nn.parallel.DistributedDataParallel) -> dict[str, bool]:
    """DDP's option that skips the buffer broadcast before every forward: `forward_sync_buffers=False` where `ddp`
    takes it (torch 2.13 on), else `broadcast_buffers=False`, which before it also skipped the one at wrapping:
    the same buffers either way, since every rank makes them from the same config (`TORCH_FEATURES`)."""
    if "forward_sync_buffers" in inspect.signature(ddp.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


@contextmanager
def gradient_sync(model: nn.Module, sync: bool) -> Iterator[None]:
    """Backward passes inside synchronise gradients across processes only when `sync`, under DDP: with gradient
    accumulation every micro-batch but the last accumulates locally (`no_sync`), and the last one's backward
    reduces the sum once; each process holds its whole gradient anyway. FSDP reduce-scatters every micro-batch's
    gradient into its shard (grad_accum reductions per update instead of one): accumulating locally would hold
    every block's whole unsharded gradient on every process until the last micro-batch (the model's parameter
    count x 4 bytes in fp32, or x 2 in bf16 rounded at every sum), which is the memory FSDP is there to save."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper of a DDP model
    if isinstance(model, nn.parallel.DistributedDataParallel) and not sync:
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


def update_mark(device: torch.device, world_size: int) -> Any:
    """A mark in the device's queue after an update's last kernel (a CUDA event: recording it waits for nothing),
    under several processes on a GPU; None elsewhere (on the CPU the host has waited for every op, collectives
    included, by the time it runs the next line)."""
    if world_size == 1 or device.type != "cuda":
        return None
    mark = torch.cuda.Event()
    mark.record()
    return mark


@contextmanager
def reads_up_to(mark: Any, wait: float = 5.0) -> Iterator[bool]:
    """Inside, reads of the device wait only for the work queued before `mark` (`update_mark`): on a side stream
    that waits for the mark, not behind the collectives queued after it, which another process may never join (an
    interrupted rank's save). Yields whether that work is done within `wait` seconds; when not (a collective of
    the marked update is still pending), nothing may be read, and it says so."""
    if mark is None:
        yield True
        return
    deadline = time.monotonic() + wait
    while not mark.query() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not mark.query():
        logger.warning("interrupted while the last update waited for another process: its checkpoint stands")
        yield False
        return
    side = torch.cuda.Stream()
    side.wait_event(mark)
    with torch.cuda.stream(side):
        yield True


def rank0_says(flag: bool, world_size: int) -> bool:
    """Rank 0's `flag` on every rank (every rank must call it), so that all stop at the same update."""
    if world_size == 1:
        return flag
    decided = torch.tensor(float(flag))
    dist.broadcast(decided, src=0)
    return bool(decided)


def share(
    batch: Batch, rank: int, world_size: int, loss_terms: Callable[[Batch], float] | None = None
) -> tuple[Batch, float]:
    """This rank's rows of every tensor in `batch`, and the weight its loss takes so that the processes' mean of
        the weighted losses is the loss of the whole batch in one process (and DDP's or FSDP's mean of the gradients
        that one process's gradient). The batch's n rows (dim 0 of every tensor; a token-budget batch may have any
        number) are cut at `r * n // world_size`; a rank left without rows (n < world_size) computes row 0 with weight
        0. A `loss_fn` averages its loss over `loss_terms(batch)` terms (the targets that count, say; by default the
        rows), so a rank's weight is `world_size * its terms / the batch's`: 1 when every rank has as many, as with a
        fixed-size batch of fixed-size rows. One process: the batch itself, weight 1. A batch function that made only
    this rank's rows says so with `OwnRows`, which is taken as it is."""
    if isinstance(batch, OwnRows):
        return batch.batch, batch.weight
    if world_size == 1:
        return batch, 1.0
    count = rows(batch)
    start, end = rank * count // world_size, (rank + 1) * count // world_size
    if start == end:
        return _rows(batch, 0, 1, count), 0.0
    local = _rows(batch, start, end, count)
    terms = loss_terms or rows
    whole = terms(batch)
    return local, (world_size * terms(local) / whole if whole else 1.0)


def rows(batch: Batch) -> int:
    """The rows of a batch: dim 0 of its first tensor; a DataError for a batch without one."""
    if isinstance(batch, Tensor) and batch.dim() > 0:
        return batch.shape[0]
    parts = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else ()
    for part in parts:
        with suppress(DataError):
            return rows(part)
    raise DataError(
        f"under torchrun a batch is split along dim 0 of its tensors (its rows), but this one has none: {batch!r:.200}"
    )


def _rows(batch: Batch, start: int, end: int, count: int) -> Batch:
    """Rows `start:end` of every tensor in the batch, each of which must have `count` rows."""
    if isinstance(batch, Tensor):
        if batch.dim() == 0 or batch.shape[0] != count:
            raise DataError(
                f"under torchrun every tensor in a batch is split along dim 0, so every one must have the batch's "
                f"{count} rows; got a tensor of shape {tuple(batch.shape)}"
            )
        return batch[start:end]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(_rows(x, start, end, count) for x in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_rows(x, start, end, count) for x in batch)
    if isinstance(batch, dict):
        return {k: _rows(v, start, end, count) for k, v in batch.items()}
    return batch


def batch_tokens(batch: Batch) -> int | None:
    """The token count of a batch for tokens/s: the numel of the batch tensor, or of the first tensor of a
    tuple/list/dict; None for anything else."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()), None)
    if isinstance(batch, (tuple, list)) and batch:
        batch = batch[0]
    return batch.numel() if isinstance(batch, Tensor) else None
