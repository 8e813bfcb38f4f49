"""A run's checkpoint files: written atomically, verified by SHA-256 (`Checkpoint`, a verified checkpoint as its
readers hold it) and loaded without executing code. What a training saves in them after an update and loads back to
resume is `kqv.train.saving`'s.

`run_dir/checkpoint/` holds `model.safetensors`, `optimizer.pt` (loaded with `weights_only=True`),
`rng.safetensors` (the torch generator state of every rank) and `state.json` (step, config, generator states of
`random` and numpy, `extra_state`, the `TrainState`, SHA-256 of the other files). The generators' states are put
into that form by `kqv.train.rng`. Where each is, is the run's to say (`kqv.train.layout.RunFiles`).

A sharded (FSDP) run's checkpoint holds `shards/` instead of `model.safetensors` and `optimizer.pt`: every rank's
rows of the weights and the optimizer state, in torch.distributed.checkpoint's layout (`kqv.train.shards` writes
and reads it), with `model.safetensors` beside them in a run's final checkpoint. Its files are verified like the
others; its index (`shards/.metadata`, a pickle) is read by an unpickler that builds nothing but the index's own
records, and its tensors with `weights_only=True`. `load_weights` reads the whole weights from either layout, and a
one-process checkpoint resumes under FSDP too (`kqv.train.saving.load_checkpoint`: each rank reads only its rows
of it).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import stat
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch
from safetensors import SafetensorError
from safetensors.torch import load as safetensors_load
from safetensors.torch import save_file, save_model
from torch import Tensor, nn

from ..errors import RunError
from ..signals import deferred
from .config import TrainConfig
from .files import sha256, write_directory
from .layout import MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, SHARDS_DIR, STAGING_PREFIX, STATE_FILE, RunFiles, remedy
from .shards import whole_weights

logger = logging.getLogger("kqv.train.trainer")  # the trainer's voice
FORMAT = 1


@dataclass
class Checkpoint:
    """A verified checkpoint: where it is, the update it was taken after, its config and extra_state.

    It also holds its files open (`open(name)`), so what is loaded from it is what was verified, even when a
    training process swaps in a newer checkpoint meanwhile: readers never lock the run directory.
    """

    path: Path
    step: int
    config: TrainConfig
    extra_state: dict[str, Any]
    state: dict[str, Any]  # the whole state.json
    files: dict[str, BinaryIO] = field(default_factory=dict, repr=False)

    def open(self, name: str) -> BinaryIO:
        """The verified file `name` of this checkpoint, rewound to its start."""
        file = self.files[name]
        file.seek(0)
        return file

    def path_of(self, name: str) -> Path:
        """A path that opens the verified file `name` itself, for readers that open by path (safetensors'
        `safe_open`, `torch.load(mmap=True)`): /proc/self/fd/N where there is one (Linux), else its name in the
        checkpoint directory, which a resuming trainer, holding the run's lock, knows no one replaces."""
        fd = Path(f"/proc/self/fd/{self.files[name].fileno()}")
        return fd if fd.exists() else self.path / name

    def close(self) -> None:
        for file in self.files.values():
            file.close()

    def __del__(self) -> None:
        self.close()


Weights = nn.Module | dict[str, Tensor]  # a model, or its state dict (e.g. gathered from shards)
OptimizerState = torch.optim.Optimizer | dict[str, Any]  # an optimizer, or its state dict


def write_checkpoint(
    run_dir: str | Path | RunFiles,
    model: Weights,
    optimizer: OptimizerState,
    state: dict[str, Any],
    tensors: dict[str, Tensor],
) -> None:
    """Write a checkpoint into a temporary directory, then swap it in for the run's checkpoint/ (`run_dir`: the
    run, or its path).

    The old checkpoint stays until the new one is complete: it is renamed to `checkpoint.old`, the new directory
    is renamed to `checkpoint`, and only then is the old one deleted. A crash between the two renames leaves
    `checkpoint.old`, which `read_checkpoint` falls back to. Files are never changed once in place, so a reader
    that has opened them keeps a consistent checkpoint. Ctrl-C or SIGTERM during the write waits until it is done
    (`kqv.signals.deferred`), so a second one while the first one's checkpoint is saved cannot cut it short.
    """
    with deferred():
        _write_checkpoint(_run_of(run_dir), model, optimizer, state, tensors)


def _write_checkpoint(
    run: RunFiles, model: Weights, optimizer: OptimizerState, state: dict[str, Any], tensors: dict[str, Tensor]
) -> None:
    optimizer_state = optimizer if isinstance(optimizer, dict) else optimizer.state_dict()
    needed = checkpoint_bytes(model, optimizer_state, tensors)
    writers = checkpoint_writers(state, tensors, model, optimizer_state)
    write_directory(run.checkpoint_dir, writers, needed, run.previous_checkpoint_dir, STAGING_PREFIX)


def checkpoint_writers(
    state: dict[str, Any],
    tensors: dict[str, Tensor],
    model: Weights | None = None,
    optimizer_state: dict[str, Any] | None = None,
    shards: dict[str, str] | None = None,
) -> dict[str, Callable[[Path], object]]:
    """What writes each file of a checkpoint (`kqv.train.files.write_directory` calls them in order): the weights
    and optimizer state when given, the generators' `tensors`, and state.json last, with the SHA-256 of every
    other file: those just written and the `shards` (name: SHA-256) already in the directory."""
    writers: dict[str, Callable[[Path], object]] = {}
    if model is not None:
        weights = model if isinstance(model, nn.Module) else _StateDict(model)
        writers[MODEL_FILE] = lambda path: save_model(weights, str(path))
    if optimizer_state is not None:
        writers[OPTIMIZER_FILE] = lambda path: torch.save(optimizer_state, path)
    writers[RNG_FILE] = lambda path: save_file(tensors, str(path))

    def write_state(path: Path) -> None:  # after the others: their SHA-256s, for reading them back verified
        hashes = {name: sha256(path.parent / name) for name in writers if name != STATE_FILE}
        path.write_text(json.dumps({**state, "files": {**(shards or {}), **hashes}}, indent=1))

    writers[STATE_FILE] = write_state
    return writers


def checkpoint_bytes(model: Weights, optimizer_state: dict[str, Any], tensors: dict[str, Tensor]) -> int:
    """The bytes of the tensors a checkpoint holds (each storage once: tied weights share one), a lower bound of
    its size on disk: what a write needs free."""
    weights = model.state_dict() if isinstance(model, nn.Module) else model
    found: dict[tuple, int] = {}
    stack: list[Any] = [weights, optimizer_state, tensors]
    while stack:
        item = stack.pop()
        if isinstance(item, Tensor):
            found[(item.device, item.data_ptr(), item.nbytes)] = item.nbytes
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return sum(found.values())


class _StateDict:
    """What `save_model` reads of a module, for a state dict: it drops the duplicate names of tied weights."""

    def __init__(self, tensors: dict[str, Tensor]):
        self.tensors = tensors

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.tensors)


def has_checkpoint(run_dir: str | Path | RunFiles) -> bool:
    """Whether `run_dir` holds a checkpoint (maybe only as `checkpoint.old`, after a swap cut short by a crash).
    Anything by those names counts, a file too: reading it then says it is damaged, rather than a resume
    silently starting over."""
    run = _run_of(run_dir)
    return any(os.path.lexists(path) for path in (run.checkpoint_dir, run.previous_checkpoint_dir))


class _Swapped(Exception):
    """The checkpoint directory was replaced and deleted while being opened: read the new one."""


def read_checkpoint(run_dir: str | Path | RunFiles) -> Checkpoint:
    """Read and verify (SHA-256 of every file) the checkpoint of a run, without loading any tensors.

    Safe while another process trains into `run_dir`: the checkpoint's directory is opened once and every file
    through it, so all of them come from one checkpoint; if that checkpoint is deleted by a newer one's swap
    before its files are open, the newer one is read instead.
    """
    run = _run_of(run_dir)
    for _ in range(20):
        try:
            return _read_once(run)
        except _Swapped:
            continue
    raise RuntimeError(
        f"the checkpoint in {run.path} was replaced 20 times while being read; is a run writing "
        f"checkpoints continuously (checkpoint_every=1)? try again"
    )


def _run_of(run: str | Path | RunFiles) -> RunFiles:
    """The files of the run `run` (given as such, or by its path)."""
    return run if isinstance(run, RunFiles) else RunFiles(run)


def _read_once(run: RunFiles) -> Checkpoint:
    path = run.checkpoint_to_read
    state_path = path / STATE_FILE
    try:
        directory = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except NotADirectoryError:
        raise RunError(f"{path} is not a directory, so the run has no usable checkpoint; {remedy(path)}") from None
    except FileNotFoundError:
        if run.checkpoint_dir.exists() or run.previous_checkpoint_dir.exists():
            raise _Swapped from None
        raise FileNotFoundError(
            f"no checkpoint in {run.path}: {state_path} does not exist; start a fresh run "
            f"instead of resuming, or check the run directory"
        ) from None
    files: dict[str, BinaryIO] = {}
    try:
        files[STATE_FILE] = _open_in(directory, STATE_FILE, path)
        state, step, config, extra_state, digests = _parse_state(files[STATE_FILE].read(), path)
        for name, digest in digests.items():
            files[name] = _open_in(directory, name, path)
            if sha256(files[name]) != digest:
                raise RunError(
                    f"{path / name} is corrupt: its SHA-256 differs from the one recorded in "
                    f"{state_path}; {remedy(path)}"
                )
    except BaseException:
        for file in files.values():
            file.close()
        raise
    finally:
        os.close(directory)
    return Checkpoint(path, step, config, extra_state, state, files)


def _open_in(directory: int, name: str, path: Path) -> BinaryIO:
    """Open `name` inside the already opened checkpoint directory."""
    try:
        file = os.fdopen(os.open(name, os.O_RDONLY, dir_fd=directory), "rb")
    except FileNotFoundError:
        if _replaced(directory, path):  # a newer swap moved this checkpoint aside and is deleting it
            raise _Swapped from None
        what = "so the checkpoint is incomplete" if name == STATE_FILE else "from the checkpoint"
        raise FileNotFoundError(f"{path / name} is missing, {what}; {remedy(path)}") from None
    if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):  # a directory opens read-only without an error
        file.close()
        raise RunError(f"{path / name} is not a regular file, so the checkpoint is damaged; {remedy(path)}")
    return file


def _replaced(directory: int, path: Path) -> bool:
    """Whether the opened checkpoint directory is no longer the run's current checkpoint."""
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return True
    opened = os.fstat(directory)
    if (current.st_dev, current.st_ino) != (opened.st_dev, opened.st_ino):
        return True
    run = RunFiles(path.parent)
    return path == run.previous_checkpoint_dir and run.checkpoint_dir.exists()


def _parse_state(text: bytes, path: Path) -> tuple[dict, int, TrainConfig, dict, dict[str, str]]:
    try:
        state = json.loads(text)
        step, config = state["step"], TrainConfig.from_dict(_trainer_options(state["config"]))
        digests, extra_state = dict(state["files"]), state["extra_state"]
        if state["format"] != FORMAT:
            raise RunError(f"format {state['format']} is not {FORMAT}")
        unknown = sorted(name for name in digests if not _known(name))
        if unknown:
            raise RunError(f"unknown files {unknown}")
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as error:
        raise RunError(f"{path / STATE_FILE} is corrupt or not a kqv checkpoint ({error}); {remedy(path)}") from None
    return state, step, config, extra_state, digests


def _known(name: str) -> bool:
    """Whether `name` is a file a checkpoint may hold: its own files, or a file right inside its shards/."""
    folder, _, leaf = name.rpartition("/")
    return name in (MODEL_FILE, OPTIMIZER_FILE, RNG_FILE) or (folder == SHARDS_DIR and leaf not in ("", ".", ".."))


def _trainer_options(saved: dict[str, Any]) -> dict[str, Any]:
    """The TrainConfig options of a saved [train] table, without a job's own (a TrainConfig subclass's, such as the
    MT job's label_smoothing), which are not the trainer's."""
    return {k: v for k, v in saved.items() if k in {f.name for f in dataclasses.fields(TrainConfig)}}


def load_weights(
    model: nn.Module, checkpoint: str | Path | Checkpoint, load: Callable[[dict[str, Tensor]], None] | None = None
) -> Checkpoint:
    """Load the weights of a checkpoint (or of the run in a run_dir) into `model`, e.g. for evaluation; `load`
    sets them (into a sharded model, say) instead of `model.load_state_dict`."""
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = read_checkpoint(checkpoint)
    whole = MODEL_FILE in checkpoint.files
    path = checkpoint.path / (MODEL_FILE if whole else SHARDS_DIR)
    try:
        weights = safetensors_load(checkpoint.open(MODEL_FILE).read()) if whole else whole_weights(checkpoint)
        (load or (lambda state: _load_state(model, state)))(weights)
    except (RuntimeError, SafetensorError) as error:
        raise RunError(
            f"{path} does not fit the model ({error}); build the model with the config the run was "
            f"trained with (saved in extra_state if the training script put it there)"
        ) from None
    return checkpoint


def _load_state(model: nn.Module, state: dict[str, Tensor]) -> None:
    """`model.load_state_dict(state)`, where names of tied weights that `save_model` dropped may be missing."""
    own = model.state_dict()
    missing, unexpected = model.load_state_dict(state, strict=False)
    loaded = {own[name].untyped_storage().data_ptr() for name in state if name in own}
    missing = [name for name in missing if own[name].untyped_storage().data_ptr() not in loaded]
    if missing or unexpected:
        raise RuntimeError(f"missing {missing}, unexpected {unexpected}")


def partial_loader(
    model: nn.Module, part: Callable[[dict[str, Tensor]], dict[str, Tensor]]
) -> Callable[[dict[str, Tensor]], None]:
    """What `load_weights` calls to load a checkpoint that holds only `part(model.state_dict())` (a LoRA
    fine-tune's adapters): exactly those tensors, none missing and none more; the model's other weights stay."""

    def load(state: dict[str, Tensor]) -> None:
        expected = set(part(model.state_dict()))
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or unexpected:
            raise RuntimeError(f"missing {missing}, unexpected {unexpected}")
        model.load_state_dict(state, strict=False)

    return load


def load_optimizer_state(
    optimizer: torch.optim.Optimizer,
    checkpoint: Checkpoint,
    run_dir: Path,
    load: Callable[[dict[str, Any]], None] | None = None,
    mmap: bool = False,
) -> None:
    """Load the optimizer state of `checkpoint` (`weights_only=True`: no code runs), keeping the betas and weight
    decay the optimizer was configured with (a resumed run may change them); `load` sets the state (into a
    sharded model's optimizer, say) instead of `optimizer.load_state_dict`. The state is read onto the CPU
    whatever device wrote it, and `load_state_dict` moves it to the device of the parameters it belongs to: a run
    trained on a GPU resumes on the CPU and the other way round. With `mmap` the file is mapped, not read: only
    the pages of the tensors `load` touches are read (a shard's rows, say)."""
    configured = [(g["betas"], g["weight_decay"]) for g in optimizer.param_groups]
    try:
        with warnings.catch_warnings():  # torch's aside on a foreign pickle protocol: the error below says it all
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            file = checkpoint.path_of(OPTIMIZER_FILE) if mmap else checkpoint.open(OPTIMIZER_FILE)
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
        (load or optimizer.load_state_dict)(state)
    except pickle.UnpicklingError:  # its message would suggest weights_only=False: running the file's code
        raise RunError(
            f"{checkpoint.path / OPTIMIZER_FILE} is damaged or not kqv's: it holds more than tensors and numbers, "
            f"and kqv never runs code from a checkpoint. Do not load it by other means unless you trust its "
            f"source; {remedy(checkpoint.path)}"
        ) from None
    except (ValueError, KeyError, IndexError, RuntimeError, EOFError) as error:
        raise RunError(
            f"{checkpoint.path / OPTIMIZER_FILE} does not fit this model's optimizer ({error}); was the model built "
            f"with the same config as the run in {run_dir}?"
        ) from None
    for group, (betas, weight_decay) in zip(optimizer.param_groups, configured):
        group["betas"], group["weight_decay"] = betas, weight_decay
