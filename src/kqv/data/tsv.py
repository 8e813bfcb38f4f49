"""Labelled examples for classification: `text<TAB>label` files and a deterministic train/dev split."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import DATA_FILE, DataError, option
from .lines import text_lines


def read_tsv(path: str | Path) -> list[tuple[str, str]]:
    """(text, label) pairs of a file of `text<TAB>label` lines; blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no TSV file at {path}; give one with {option(DATA_FILE)} (lines of text<TAB>label)")
    examples = []
    for number, line in enumerate(text_lines(path.read_bytes(), path), 1):
        if not line.strip():
            continue
        text, tab, label = line.rpartition("\t")
        if not tab or not text.strip() or not label.strip():
            raise DataError(f"{path}:{number}: expected text<TAB>label, got {line[:60]!r}")
        examples.append((text.strip(), label.strip()))
    if len(examples) < 2:
        raise DataError(f"{path} has {len(examples)} example(s); a train and a dev split need at least 2")
    return examples


def split_examples(examples: list, dev_fraction: float, seed: int) -> tuple[list, list]:
    """A deterministic shuffle, then the first `dev_fraction` (at least one example) is the dev set."""
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed)).tolist()
    n_dev = min(max(1, round(dev_fraction * len(examples))), len(examples) - 1)
    return [examples[i] for i in order[n_dev:]], [examples[i] for i in order[:n_dev]]
