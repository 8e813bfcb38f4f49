"""The names of a run directory's files, and how they are written and checked: atomically, fsynced, by SHA-256.

A leaf of `kqv.train`: it imports nothing else from it, so every module that reads or writes a run directory
(checkpoints, metrics, the manifest, the run directory itself, the jobs) takes its names from here, and none of
them needs another for a file name. What each file holds is described in `kqv.train.runs`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

# what a job writes
RUN_CONFIG, TOKENIZER_DIR, SUMMARY_FILE = "run.toml", "tokenizer", "summary.json"
TOKENS_FILE, PAIRS_FILE, TEXT_DIR = "tokens.safetensors", "pairs.safetensors", "data"
SAMPLES_FILE, TEST_HYPOTHESES_FILE = "samples.txt", "test.hyp"
MANIFEST_FILE = "SHA256SUMS"
# what the trainer writes
METRICS_FILE, PLOT_FILE = "metrics.jsonl", "loss.png"
CHECKPOINT_DIR = "checkpoint"
PREVIOUS_CHECKPOINT_DIR = "checkpoint.old"  # exists only between the two renames of a checkpoint swap
MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE = "model.safetensors", "optimizer.pt", "rng.safetensors", "state.json"
LOCK_FILE = ".lock"  # the writer's lock (kqv.train.lock)

JOB_FILES = {
    RUN_CONFIG,
    TOKENIZER_DIR,
    SUMMARY_FILE,
    TOKENS_FILE,
    PAIRS_FILE,
    TEXT_DIR,
    SAMPLES_FILE,
    TEST_HYPOTHESES_FILE,
}
TRAINER_FILES = (CHECKPOINT_DIR, PREVIOUS_CHECKPOINT_DIR, METRICS_FILE, PLOT_FILE)  # what marks an earlier run
RUN_FORMAT = {*JOB_FILES, *TRAINER_FILES, LOCK_FILE}  # everything kqv writes into a run directory


def run_files(run_dir: Path) -> list[Path]:
    """The trainer's files of an earlier run in `run_dir` (checkpoint, metrics, plot): what refusing, resuming or
    overwriting decides about."""
    return [run_dir / name for name in TRAINER_FILES if (run_dir / name).exists()]


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename: a reader sees the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def sha256(source: Path | BinaryIO) -> str:
    """SHA-256 of a file, given by path or as an open binary file (read from its start)."""
    if isinstance(source, Path):
        with open(source, "rb") as file:
            return sha256(file)
    source.seek(0)
    digest = hashlib.sha256()
    for chunk in iter(lambda: source.read(1 << 20), b""):
        digest.update(chunk)
    return digest.hexdigest()


def fsync(path: Path) -> None:
    """Flush a file or a directory (after renames in it) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
