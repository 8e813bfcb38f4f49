"""Metrics of a run: `metrics.jsonl` (one JSON record per log or evaluation step), the loss plot, progress lines."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

METRICS_FILE, PLOT_FILE = "metrics.jsonl", "loss.png"


def finite(value: Any) -> Any:
    """`value` (JSON-like: dicts, lists, numbers) with every NaN or infinite float replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def strict_json(value: Any, **options: Any) -> str:
    """JSON text that any parser reads: a NaN or infinite float, which JSON has no number for, is written as null
    (Python's json would write the bare NaN / Infinity that JavaScript's JSON.parse and jq refuse)."""
    try:
        return json.dumps(value, allow_nan=False, **options)
    except ValueError:  # the rare non-finite value: only then is the whole value walked
        return json.dumps(finite(value), allow_nan=False, **options)


def append_metrics(path: Path, record: dict[str, Any]) -> None:
    """Append one record as a line of strict JSON: a non-finite loss (a diverged evaluation) is written as null."""
    with open(path, "a") as file:
        file.write(strict_json(record) + "\n")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, skipping a line left incomplete by a crash. A value written as null (not
    finite) reads as None, which readers skip as they skip an absent value (`r.get("val_loss") is not None`);
    files from before null was written, with bare NaN, still read (as float nan)."""
    records = []
    for line in Path(path).read_bytes().splitlines():
        try:
            records.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError):  # a line cut short by a crash, or damaged
            continue
    return [r for r in records if isinstance(r, dict) and "step" in r]


def plot_losses(metrics_path: str | Path, png_path: str | Path) -> None:
    """Draw training and validation loss against step from metrics.jsonl (Agg canvas; no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(metrics_path) if Path(metrics_path).exists() else []
    figure = Figure(figsize=(7, 4), dpi=100, layout="tight")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for key, style in (("train_loss", "-"), ("val_loss", "o-")):
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if points:
            axes.plot(*zip(*points), style, label=key.replace("_", " "))
    axes.set(xlabel="step", ylabel="loss")
    axes.grid(alpha=0.3)
    if axes.lines:
        axes.legend()
    png_path = Path(png_path)
    tmp = png_path.with_name(png_path.name + ".tmp")
    figure.savefig(tmp, format="png")
    os.replace(tmp, png_path)


# ---------------------------------------------------------------------------------------------------------------
# Batches, distributed set-up and random generators


class Window:
    """Losses, tokens and compute time since the last log record."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.loss, self.steps, self.tokens, self.seconds = 0.0, 0, 0, 0.0

    def add(self, loss: float, tokens: int | None, seconds: float) -> None:
        self.loss += loss
        self.steps += 1
        self.tokens = None if tokens is None or self.tokens is None else self.tokens + tokens
        self.seconds += seconds

    def mean_loss(self) -> float:
        return self.loss / self.steps

    def tokens_per_s(self) -> float | None:
        return None if self.tokens is None else self.tokens / self.seconds


def progress_line(step: int, steps: int, record: dict[str, Any]) -> str:
    """One line per evaluation, e.g. `step  200/1200  train 1.912  val 1.987  41,250 tok/s  1.2 min`."""
    parts = [f"step {step:>{len(str(steps))}}/{steps}"]
    parts += [
        f"{name.removesuffix('_loss')} {record[name]:.3f}" for name in ("train_loss", "val_loss") if name in record
    ]
    shown_otherwise = ("train_loss", "val_loss", "lr", "tokens_per_s", "grad_norm", "train_seconds", "elapsed_s")
    parts += [
        f"{name} {value:.4g}"
        for name, value in record.items()
        if isinstance(value, float) and name not in shown_otherwise
    ]
    if record.get("tokens_per_s"):
        parts.append(f"{record['tokens_per_s']:,.0f} tok/s")
    return "  ".join(parts + [f"{record['elapsed_s'] / 60:.1f} min"])


def progress_bar(total: int, initial: int, shown: bool) -> tqdm:
    """The training progress bar (steps): shown only when asked and standard error is a terminal."""
    return tqdm(
        total=total, initial=initial, unit="step", dynamic_ncols=True, disable=not shown or not sys.stderr.isatty()
    )
