"""Checkpoint files of a run directory: written atomically, verified by SHA-256, loaded without executing code.

`run_dir/checkpoint/` holds `model.safetensors`, `optimizer.pt` (loaded with `weights_only=True`),
`rng.safetensors` (the torch generator state of every rank) and `state.json` (step, config, generator states of
`random` and numpy, `extra_state`, SHA-256 of the other files). The random generators are serialised here too:
their state is part of a checkpoint, so that a resumed run continues dropout exactly.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_file, save_model
from torch import Tensor, nn

from .config import TrainConfig
from .metrics import METRICS_FILE, PLOT_FILE

CHECKPOINT_DIR = "checkpoint"
PREVIOUS_CHECKPOINT_DIR = "checkpoint.old"  # exists only between the two renames of a checkpoint swap
MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE = "model.safetensors", "optimizer.pt", "rng.safetensors", "state.json"
_TMP_PREFIX = ".checkpoint-tmp-"
FORMAT = 1


@dataclass
class Checkpoint:
    """A verified checkpoint: where it is, the update it was taken after, its config and extra_state."""

    path: Path
    step: int
    config: TrainConfig
    extra_state: dict[str, Any]
    state: dict[str, Any]  # the whole state.json


def write_checkpoint(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                     tensors: dict[str, Tensor]) -> None:
    """Write a checkpoint into a temporary directory, then swap it in for `run_dir/checkpoint`.

    The old checkpoint stays until the new one is complete: it is renamed to `checkpoint.old`, the new directory
    is renamed to `checkpoint`, and only then is the old one deleted. A crash between the two renames leaves
    `checkpoint.old`, which `read_checkpoint` falls back to.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    final, previous = run_dir / CHECKPOINT_DIR, run_dir / PREVIOUS_CHECKPOINT_DIR
    for stale in run_dir.glob(_TMP_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=run_dir))
    try:
        save_model(model, str(tmp / MODEL_FILE))  # drops the duplicate names of tied weights
        torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        save_file(tensors, str(tmp / RNG_FILE))
        state = {**state, "files": {name: _sha256(tmp / name) for name in (MODEL_FILE, OPTIMIZER_FILE, RNG_FILE)}}
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
        for name in (MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE):
            _fsync(tmp / name)
        if final.exists():
            if previous.exists():  # a leftover from an earlier, completed swap
                shutil.rmtree(previous)
            os.replace(final, previous)
        os.replace(tmp, final)
        _fsync(run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(previous, ignore_errors=True)


def read_checkpoint(run_dir: str | Path) -> Checkpoint:
    """Read and verify (SHA-256 of every file) the checkpoint of a run, without loading any tensors."""
    run_dir = Path(run_dir)
    path = run_dir / CHECKPOINT_DIR
    if not path.exists() and (run_dir / PREVIOUS_CHECKPOINT_DIR).exists():
        path = run_dir / PREVIOUS_CHECKPOINT_DIR  # a swap was interrupted after the old checkpoint moved aside
    state_path = path / STATE_FILE
    remedy = (f"restore {path} from a backup, or start the run over with if_exists='overwrite' (deletes it)")
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint in {run_dir}: {state_path} does not exist; start a fresh run "
                                f"instead of resuming, or check the run_dir")
    if not state_path.is_file():
        raise FileNotFoundError(f"{state_path} is missing, so the checkpoint in {path} is incomplete; {remedy}")
    try:
        state = json.loads(state_path.read_text())
        step, config = state["step"], TrainConfig.from_dict(state["config"])
        files, extra_state = state["files"], state["extra_state"]
        if state["format"] != FORMAT:
            raise ValueError(f"format {state['format']} is not {FORMAT}")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise ValueError(f"{state_path} is corrupt or not a kqv checkpoint ({error}); {remedy}") from None
    for name, digest in files.items():
        file = path / name
        if not file.is_file():
            raise FileNotFoundError(f"{file} is missing from the checkpoint; {remedy}")
        if _sha256(file) != digest:
            raise ValueError(f"{file} is corrupt: its SHA-256 differs from the one recorded in {state_path}; {remedy}")
    return Checkpoint(path, step, config, extra_state, state)


def load_weights(model: nn.Module, checkpoint: str | Path | Checkpoint) -> Checkpoint:
    """Load the weights of a checkpoint (or of the run in a run_dir) into `model`, e.g. for evaluation."""
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = read_checkpoint(checkpoint)
    path = checkpoint.path / MODEL_FILE
    try:
        load_model(model, str(path), strict=True)
    except (RuntimeError, SafetensorError) as error:
        raise ValueError(f"{path} does not fit the model ({error}); build the model with the config the run was "
                         f"trained with (saved in extra_state if the training script put it there)") from None
    return checkpoint


def run_files(run_dir: Path) -> list[Path]:
    names = (CHECKPOINT_DIR, PREVIOUS_CHECKPOINT_DIR, METRICS_FILE, PLOT_FILE)
    return [run_dir / name for name in names if (run_dir / name).exists()]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------------------
# Random generators


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def rng_to_json(state: dict[str, Any], torch_as_bytes: bool = False) -> dict[str, Any]:
    """JSON form of the `random` and numpy states (the torch state is a tensor, saved in rng.safetensors)."""
    version, internal, gauss = state["python"]
    name, keys, position, has_gauss, cached = state["numpy"]
    out = {"python": [version, list(internal), gauss],
           "numpy": [name, keys.tolist(), int(position), int(has_gauss), float(cached)]}
    if torch_as_bytes:
        out["torch"] = state["torch"].numpy().tobytes()
    return out


def rng_from_json(state: dict[str, Any]) -> dict[str, Any]:
    version, internal, gauss = state["python"]
    name, keys, position, has_gauss, cached = state["numpy"]
    out = {"python": (version, tuple(internal), gauss),
           "numpy": (name, np.array(keys, dtype=np.uint32), position, has_gauss, cached)}
    if "torch" in state:
        out["torch"] = torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8)
    return out
