"""Sharded checkpoints of a sharded (FSDP) run: every rank writes its own rows of the weights and of the optimizer
state with torch.distributed.checkpoint (DCP), so no rank ever gathers the whole training state to save it, and a
resume reads back each rank's own rows (on any number of processes: DCP cuts the rows anew).

A sharded run's `checkpoint/` holds

    state.json          step, config, generator states, ... and the SHA-256 of every file below
    rng.safetensors     every rank's torch generator states (small: rank 0 writes them)
    shards/.metadata    DCP's index: the name, shape and dtype of every tensor, and which file holds which rows
    shards/__R_0.distcp rank R's rows of every weight ("model/FQN") and optimizer moment ("optimizer/FQN/KEY")
    model.safetensors   the whole weights, in a run's final checkpoint only: for export and inference

and is written as atomically as any checkpoint (`kqv.train.files`): rank 0 makes a staging directory beside the
run's checkpoint and tells every rank its name; every rank writes its shards into it; each file's SHA-256 is taken
(the files shared out between the ranks); rank 0 checks that it sees every rank's files, writes the rest, state.json
last, and swaps the staging directory in. Every rank hears whether that worked, so all go on or all stop.

The ranks must therefore write into one directory: under several nodes the run directory lies on a file system
every node sees (`kqv.train.distributed.agree_on_checkpoint` refuses a resume where they do not).

The optimizer's hyperparameters (its `param_groups`) are the run's config, not its state: a resume takes them
from the optimizer it builds, as `kqv.train.checkpoints.load_optimizer_state` keeps the configured betas and weight
decay, and the trainer sets the learning rate before every update.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed import checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from ..errors import RunError
from .checkpoints import STAGING_PREFIX, Checkpoint
from .files import CHECKPOINT_DIR, PREVIOUS_CHECKPOINT_DIR, SHARDS_DIR, make_staging, sha256, swap_in, write_shared
from .shard_files import OPTIMIZER_KEY, WEIGHTS_KEY, read_shards, unwrapped

INDEX_FILE = ".metadata"  # DCP's index of the shards


def flat_state(model: nn.Module, optimizer: Any) -> dict[str, Tensor]:
    """This process's part of the training state by name: "model/FQN" for every weight and buffer of the state
    dict, "optimizer/FQN/KEY" for every optimizer state tensor (its shards under FSDP, DTensors, the tensors
    themselves, not copies). A fresh optimizer's state is made first (zeros), for a resume to load into."""
    weights = get_model_state_dict(model)
    moments = get_optimizer_state_dict(model, optimizer)["state"]
    flat = {WEIGHTS_KEY + name: tensor for name, tensor in weights.items()}
    for name, entries in moments.items():
        for key, value in entries.items():
            if not isinstance(value, Tensor):
                raise RunError(
                    f"optimizer state {name}/{key} is a {type(value).__name__}, not a tensor: a sharded checkpoint "
                    f"holds tensors alone (kqv's AdamW keeps nothing else)"
                )
            flat[f"{OPTIMIZER_KEY}{name}/{key}"] = value
    return flat


def local_bytes(tensors: dict[str, Tensor]) -> int:
    """The bytes of this process's part of `tensors` (its shards of a DTensor)."""
    local = (t.to_local() if isinstance(t, DTensor) else t for t in tensors.values())
    return sum(t.numel() * t.element_size() for t in local)


def write_sharded(
    run_dir: Path,
    model: nn.Module,
    optimizer: Any,
    rank: int,
    world_size: int,
    finish: Callable[[Path, dict[str, str]], None],
) -> None:
    """Write the checkpoint of a sharded run into `run_dir` (every rank must call it; see the module docstring):
    this process's shards, then on rank 0 `finish(staging, digests)`, which writes the other files into the
    staging directory (state.json last, recording `digests`, the shards' SHA-256 by name), and the swap. A
    RunError on every rank when rank 0 does not see every rank's files (no shared file system), or rank 0's
    error when its part fails (others get a RunError that names it)."""
    path = run_dir / CHECKPOINT_DIR
    tensors = flat_state(model, optimizer)
    needed = local_bytes(tensors)
    staging = _from_rank0(lambda: str(make_staging(path, needed * world_size, STAGING_PREFIX)), rank)
    tmp = Path(staging)
    try:
        writer = FileSystemWriter(tmp / SHARDS_DIR, single_file_per_rank=True, sync_files=True)
        save = lambda _: unwrapped(dcp.save, tensors, storage_writer=writer)  # noqa: E731 - this rank's shards
        index = write_shared(tmp / SHARDS_DIR, save, needed, path)
        files = sorted({info.relative_path for info in index.storage_data.values()} | {INDEX_FILE})
        digests = _digests(tmp / SHARDS_DIR, files[rank::world_size], world_size)
        _from_rank0(lambda: _complete(tmp, path, digests, finish), rank)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # this rank's view of it (rank 0's: the shared one)
        raise


def _complete(tmp: Path, path: Path, digests: dict[str, str | None], finish: Callable) -> str:
    """Rank 0: check the shards are all there, write the rest, swap the checkpoint in."""
    unseen = [name for name, digest in digests.items() if digest is None or not (tmp / name).is_file()]
    if unseen:
        raise RunError(
            f"rank 0 on {socket.gethostname()} does not see {', '.join(unseen[:4])} that other ranks wrote into "
            f"{tmp}: a run on several nodes needs its run directory on a file system every node sees (a shared "
            f"file system such as NFS or Lustre, at the same path on every node); the last checkpoint stands"
        )
    finish(tmp, {name: digest for name, digest in digests.items() if digest is not None})
    swap_in(tmp, path, PREVIOUS_CHECKPOINT_DIR)
    return ""


def _digests(folder: Path, mine: list[str], world_size: int) -> dict[str, str | None]:
    """The SHA-256 of every shard file, each taken by one rank (`mine`: this rank's share), on every rank: by
    "shards/NAME"; None for a file its rank did not see."""
    own = {f"{SHARDS_DIR}/{name}": sha256(folder / name) if (folder / name).is_file() else None for name in mine}
    shares: list[Any] = [None] * world_size
    dist.all_gather_object(shares, own)
    return {name: digest for share in shares for name, digest in share.items()}


def _from_rank0(work: Callable[[], str], rank: int) -> str:
    """What `work()` returns on rank 0, on every rank (every rank must call it). When it fails, rank 0 raises its
    error and every other rank a RunError that names it: all stop together."""
    said: list[Any] = [None]
    failure: BaseException | None = None
    if rank == 0:
        try:
            said = [("ok", work())]
        except Exception as error:  # noqa: BLE001 - said to every rank, then raised
            failure, said = error, [("failed", f"{type(error).__name__}: {error}")]
    dist.broadcast_object_list(said, src=0)
    outcome, text = said[0]
    if failure is not None:
        raise failure
    if outcome == "failed":
        raise RunError(f"rank 0 could not write the checkpoint, so no rank goes on: {text}")
    return text


def load_sharded(model: nn.Module, optimizer: Any, checkpoint: Checkpoint) -> None:
    """Load a sharded checkpoint's weights and optimizer state into `model` and `optimizer`: this process's shards
    of a sharded model, or the whole of a plain one (a run resumed under DDP or in one process). Each process reads
    by itself what it holds, whatever the number of processes that wrote the shards."""
    tensors = flat_state(model, optimizer)
    read_shards(checkpoint, tensors)
    weights = {name.removeprefix(WEIGHTS_KEY): t for name, t in tensors.items() if name.startswith(WEIGHTS_KEY)}
    state: dict[str, dict[str, Tensor]] = {}
    for name, tensor in tensors.items():
        if name.startswith(OPTIMIZER_KEY):
            fqn, _, key = name.removeprefix(OPTIMIZER_KEY).rpartition("/")
            state.setdefault(fqn, {})[key] = tensor
    set_model_state_dict(model, weights)
    groups = get_optimizer_state_dict(model, optimizer)["param_groups"]  # the configured hyperparameters
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups})
