"""A sharded checkpoint's files, read in any number of processes (`kqv.train.shards` writes them): each process
reads the rows it holds from the files state.json verified, and the index (`shards/.metadata`, a pickle) is read by
an unpickler that builds nothing but the index's own records."""

from __future__ import annotations

import os
import pickle
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor
from torch.distributed import checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemReader
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from ..errors import RunError
from .files import SHARDS_DIR, STATE_FILE
from .verified import Checkpoint, remedy

T = TypeVar("T")


WEIGHTS_KEY, OPTIMIZER_KEY = "model/", "optimizer/"  # a sharded checkpoint's names: model/FQN, optimizer/FQN/KEY


def is_sharded(checkpoint: Checkpoint) -> bool:
    """Whether `checkpoint` holds its weights and optimizer state as shards (a sharded run's)."""
    return any(name.startswith(SHARDS_DIR + "/") for name in checkpoint.files)


def read_shards(checkpoint: Checkpoint, tensors: dict[str, Tensor]) -> None:
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


def shard_index(checkpoint: Checkpoint) -> Metadata:
    """The index of a sharded checkpoint: every tensor's name, shape, dtype and where its rows are."""
    return _VerifiedShards(checkpoint).read_metadata()


def whole_weights(checkpoint: Checkpoint) -> dict[str, Tensor]:
    """The whole weights of a sharded checkpoint, in this one process (on the CPU), by their names in the model:
    what `load_weights` loads for inference or export when the checkpoint has no model.safetensors."""
    return whole_tensors(checkpoint, WEIGHTS_KEY)


def whole_tensors(checkpoint: Checkpoint, prefix: str) -> dict[str, Tensor]:
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

    def __init__(self, checkpoint: Checkpoint):
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

    def __init__(self, checkpoint: Checkpoint):
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
