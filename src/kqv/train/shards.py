"""A checkpoint's shards: those of a sharded (FSDP) run, where every rank writes its own rows of the weights and of
the optimizer state with torch.distributed.checkpoint (DCP), so no rank ever gathers the whole training state to
save it, and a resume reads back each rank's own rows (on any number of processes: DCP cuts the rows anew).

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

Read back, in any number of processes, each process reads the rows it holds from the files state.json verified
(`VerifiedCheckpoint`: `kqv.train.checkpoints.Checkpoint` is one), and the index (`shards/.metadata`, a pickle) is
read by an unpickler that builds nothing but the index's own records.
"""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed import checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from ..errors import RunError
from .files import make_staging, sha256, swap_in, write_shared
from .layout import SHARDS_DIR, STAGING_PREFIX, STATE_FILE, RunFiles, remedy
from .topology import Topology

T = TypeVar("T")


class VerifiedCheckpoint(Protocol):
    """What reading shards takes of a verified checkpoint (`kqv.train.checkpoints.Checkpoint`): its directory
    (`path`), its files held open by name (`files`), and a path that opens one of them itself (`path_of`)."""

    path: Path
    files: dict[str, BinaryIO]

    def path_of(self, name: str) -> Path: ...


WEIGHTS_KEY, OPTIMIZER_KEY = "model/", "optimizer/"  # a sharded checkpoint's names: model/FQN, optimizer/FQN/KEY


def is_sharded(checkpoint: VerifiedCheckpoint) -> bool:
    """Whether `checkpoint` holds its weights and optimizer state as shards (a sharded run's)."""
    return any(name.startswith(SHARDS_DIR + "/") for name in checkpoint.files)


def read_shards(checkpoint: VerifiedCheckpoint, tensors: dict[str, Tensor]) -> None:
    """Fill `tensors` (names as `kqv.train.shards` writes them: "model/FQN", "optimizer/FQN/KEY"; plain tensors or
    this process's shards, DTensors, of any number of processes) from the checkpoint's shards, in place: each
    process reads by itself the rows it holds (no collective), from the verified files only. A RunError when the
    shards hold another model."""
    try:
        with warnings.catch_warnings():  # DCP's aside that it reads in one process: what no_dist asks for
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            unwrapped(dcp.load, tensors, storage_reader=_VerifiedShards(checkpoint), no_dist=True)
    except (RuntimeError, KeyError, ValueError, AssertionError, EOFError) as error:
        if isinstance(error, RunError):
            raise
        missing = sorted(set(tensors) - set(shard_index(checkpoint).state_dict_metadata))
        why = f"it lacks {missing[:5]}" if missing else f"{str(error).strip().splitlines()[-1][:300]}"
        raise RunError(
            f"{checkpoint.path / SHARDS_DIR} does not fit the model ({why}); build the model with the config the "
            f"run was trained with"
        ) from None


def unwrapped(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`call(*args, **kwargs)` of torch.distributed.checkpoint, whose failure is the first process's own error
    (a full disk, a damaged file) instead of its wrapper (a CheckpointException, which is no Exception)."""
    try:
        return call(*args, **kwargs)
    except CheckpointException as error:
        for failure in error.failures.values():
            cause = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(cause, BaseException):
                raise cause from None
        raise RuntimeError(str(error)) from None


def shard_index(checkpoint: VerifiedCheckpoint) -> Metadata:
    """The index of a sharded checkpoint: every tensor's name, shape, dtype and where its rows are."""
    return _VerifiedShards(checkpoint).read_metadata()


def whole_weights(checkpoint: VerifiedCheckpoint) -> dict[str, Tensor]:
    """The whole weights of a sharded checkpoint, in this one process (on the CPU), by their names in the model:
    what `load_weights` loads for inference or export when the checkpoint has no model.safetensors."""
    return whole_tensors(checkpoint, WEIGHTS_KEY)


def whole_tensors(checkpoint: VerifiedCheckpoint, prefix: str) -> dict[str, Tensor]:
    """Every tensor of a sharded checkpoint whose name starts with `prefix` (`WEIGHTS_KEY`, `OPTIMIZER_KEY`),
    whole, in this one process (on the CPU), by its name without the prefix."""
    index = shard_index(checkpoint).state_dict_metadata
    tensors = {
        name: torch.empty(entry.size, dtype=entry.properties.dtype)
        for name, entry in index.items()
        if name.startswith(prefix) and isinstance(entry, TensorStorageMetadata)
    }
    read_shards(checkpoint, tensors)
    return {name.removeprefix(prefix): tensor for name, tensor in tensors.items()}


# What a DCP index (.metadata) is made of: its own records, torch's sizes, dtypes, layouts and memory formats, and
# the path it was written to. Nothing else is built: a pickle can name any function to run, and this one may not.
_INDEX_RECORDS = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
}


class _IndexUnpickler(pickle.Unpickler):
    """An unpickler of a DCP index that builds only the index's own records (`_INDEX_RECORDS`) and torch's dtypes."""

    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) in _INDEX_RECORDS or dtype:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which no checkpoint index holds")


class _VerifiedFiles(FileSystem):
    """torch.distributed.checkpoint's file access, limited to reading the checkpoint's verified files."""

    def __init__(self, checkpoint: VerifiedCheckpoint):
        self.checkpoint = checkpoint

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        name = f"{SHARDS_DIR}/{Path(path).name}"
        if "r" not in mode or "+" in mode or name not in self.checkpoint.files:
            raise RunError(
                f"{self.checkpoint.path / name} is not among the files {STATE_FILE} verifies, so the checkpoint is "
                f"incomplete; {remedy(self.checkpoint.path)}"
            )
        with open(self.checkpoint.path_of(name), "rb") as stream:
            yield stream


class _VerifiedShards(FileSystemReader):
    """A reader of a sharded checkpoint's verified files, whose index builds only its own records."""

    def __init__(self, checkpoint: VerifiedCheckpoint):
        super().__init__(checkpoint.path / SHARDS_DIR)
        self.fs = _VerifiedFiles(checkpoint)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with self.fs.create_stream(self.fs.concat_path(self.path, ".metadata"), "rb") as file:
            try:
                metadata = _IndexUnpickler(file).load()
                if not isinstance(metadata, Metadata):
                    raise pickle.UnpicklingError(f"it holds a {type(metadata).__name__}, not an index")
            except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as error:
                path = self.fs.checkpoint.path
                raise RunError(
                    f"{path / SHARDS_DIR} has an index that is damaged or not kqv's ({error}); kqv never runs code "
                    f"from a checkpoint; {remedy(path)}"
                ) from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


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
    run: RunFiles, model: nn.Module, optimizer: Any, topology: Topology, finish: Callable[[Path, dict[str, str]], None]
) -> None:
    """Write the checkpoint of a sharded run into `run` (every rank of `topology` must call it; see the module
    docstring): this process's shards, then on rank 0 `finish(staging, digests)`, which writes the other files into the
    staging directory (state.json last, recording `digests`, the shards' SHA-256 by name), and the swap. A
    RunError on every rank when rank 0 does not see every rank's files (no shared file system), or rank 0's
    error when its part fails (others get a RunError that names it)."""
    path, rank, world_size = run.checkpoint_dir, topology.rank, topology.world_size
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
        _from_rank0(lambda: _complete(tmp, run, digests, finish), rank)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # this rank's view of it (rank 0's: the shared one)
        raise


def _complete(tmp: Path, run: RunFiles, digests: dict[str, str | None], finish: Callable) -> str:
    """Rank 0: check the shards are all there, write the rest, swap the checkpoint in."""
    unseen = [name for name, digest in digests.items() if digest is None or not (tmp / name).is_file()]
    if unseen:
        raise RunError(
            f"rank 0 on {socket.gethostname()} does not see {', '.join(unseen[:4])} that other ranks wrote into "
            f"{tmp}: a run on several nodes needs its run directory on a file system every node sees (a shared "
            f"file system such as NFS or Lustre, at the same path on every node); the last checkpoint stands"
        )
    finish(tmp, {name: digest for name, digest in digests.items() if digest is not None})
    swap_in(tmp, run.checkpoint_dir, run.previous_checkpoint_dir)
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


def load_sharded(model: nn.Module, optimizer: Any, checkpoint: VerifiedCheckpoint) -> None:
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
