"""Metrics of a run: `metrics.jsonl` (one JSON record per log or evaluation step), the loss plot, progress lines.

Progress lines and the bar show the time left (`Pace`); `kqv.train.reporter` decides when they are shown."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from .files import append_line, write_atomically, write_png


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
    append_line(path, strict_json(record))


def keep_records(path: Path, step: int) -> None:
    """Drop the records of steps after `step` (a resumed run redoes them), rewriting the file atomically."""
    if path.exists():
        kept = [r for r in read_metrics(path) if r["step"] <= step]
        write_atomically(path, "".join(strict_json(r) + "\n" for r in kept).encode())


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
    # a failed write (a full disk) leaves the previous plot and no temporary file
    write_png(Path(png_path), figure)


class Window:
    """The updates since the last log record: each one's loss, gradient norm and guard verdict stay on the device
    (no host sync per update) until `read` brings them all to the host at once, at the log interval or before a
    checkpoint or an evaluation; the good updates' losses and tokens are then summed for the record, over the
    seconds of every update in the window (`time`)."""

    def __init__(self):
        self.pending: list[tuple[int, Tensor, int | None]] = []  # (step, [loss, norm, good], tokens)
        self.grad_norm = math.nan  # the last update's gradient norm, as last read
        self.reset()

    def reset(self) -> None:
        self.loss, self.steps, self.tokens, self.seconds = 0.0, 0, 0, 0.0

    def add(self, step: int, loss: Tensor, grad_norm: Tensor, good: Tensor, tokens: int | None) -> None:
        """Note update `step`: its figures on the device, its `tokens` on the host."""
        self.pending.append((step, torch.stack([loss.float(), grad_norm.float(), good.float()]), tokens))

    def time(self, seconds: float) -> None:
        """Note the seconds of the last update."""
        self.seconds += seconds

    def read(self) -> tuple[list[int], list[bool], list[float], list[float]]:
        """(steps, good, losses, gradient norms) of the updates added since the last read, read with one sync; the
        good ones are summed into the window."""
        if not self.pending:
            return [], [], [], []
        values = torch.stack([figures for _, figures, _ in self.pending]).tolist()
        for (_, _, tokens), (loss, _, good) in zip(self.pending, values):
            if good:
                self.loss += loss
                self.steps += 1
                self.tokens = None if tokens is None or self.tokens is None else self.tokens + tokens
        steps = [step for step, _, _ in self.pending]
        self.pending, self.grad_norm = [], values[-1][1]
        return steps, [bool(v[2]) for v in values], [v[0] for v in values], [v[1] for v in values]

    def mean_loss(self) -> float:
        return self.loss / self.steps

    def tokens_per_s(self) -> float | None:
        return None if self.tokens is None or self.seconds <= 0 else self.tokens / self.seconds


def format_duration(seconds: float) -> str:
    """A duration as a person reads it: `45 s`, `4 min 12 s`, `1 h 05 min`."""
    seconds = max(round(seconds), 0)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


DIAGNOSTICS = ("batch_ms", "wait_ms")  # the batch pipeline's host times: in metrics.jsonl, not in a progress line


def progress_line(step: int, steps: int, record: dict[str, Any], left: float | None = None) -> str:
    """One progress line, e.g. `step  200/1200  train 1.912  val 1.987  41,250 tok/s  MFU 31.5%  peak 1,204 MB
    1.2 min  left 6 min 02 s` (`left`: the estimated seconds of training still to come; `left ?` before the first
    estimate; MFU where the device's peak is known, peak memory where the device keeps one)."""
    parts = [f"step {step:>{len(str(steps))}}/{steps}"]
    parts += [
        f"{name.removesuffix('_loss')} {record[name]:.3f}" for name in ("train_loss", "val_loss") if name in record
    ]
    shown_otherwise = ("train_loss", "val_loss", "lr", "tokens_per_s", "grad_norm", "train_seconds", "elapsed_s")
    shown_otherwise += ("mfu", "peak_memory_mb", *DIAGNOSTICS)
    parts += [
        f"{name} {value:.4g}"
        for name, value in record.items()
        if isinstance(value, float) and name not in shown_otherwise
    ]
    if record.get("tokens_per_s"):
        parts.append(f"{record['tokens_per_s']:,.0f} tok/s")
    if record.get("mfu"):
        parts.append(f"MFU {record['mfu']:.1%}")
    if record.get("peak_memory_mb"):
        parts.append(f"peak {record['peak_memory_mb']:,.0f} MB")
    parts += [f"{record['elapsed_s'] / 60:.1f} min", f"left {'?' if left is None else format_duration(left)}"]
    return "  ".join(parts)


class Bar(tqdm):
    """tqdm's bar with kqv's estimate of the time left (`left_s`, evaluations and budgets considered) in place of
    tqdm's own, which knows only the step rate and a total that a budget may not have fixed yet."""

    left_s: float | None = None

    @property
    def format_dict(self) -> dict[str, Any]:
        return {**super().format_dict, "left": "?" if self.left_s is None else format_duration(self.left_s)}


def progress_bar(total: int, initial: int, shown: bool) -> Bar:
    """The training progress bar (steps): shown only when asked and standard error is a terminal."""
    return Bar(
        total=total,
        initial=initial,
        unit="step",
        dynamic_ncols=True,
        disable=not shown or not sys.stderr.isatty(),
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, left {left}, {rate_fmt}{postfix}]",
    )


FIRST_UPDATES = 3  # a session's first updates build kernels and caches (compilation, oneDNN): slower, not paced


class Pace:
    """A session's pace, for the time left that the bar and every progress line show (`kqv.train.reporter`)."""

    def __init__(self, clock: Callable[[], float], step: int):
        self.clock, self.start_step, self.started = clock, step, clock()
        self.warm: tuple[float, int] | None = None  # (time, step) after the session's FIRST_UPDATES

    def step_seconds(self, step: int) -> float | None:
        """This session's seconds per update, evaluations and checkpoints included: after its FIRST_UPDATES once
        there are more, else from its start (None before its first update)."""
        now = self.clock()
        if self.warm is None and step >= self.start_step + FIRST_UPDATES:
            self.warm = (now, step)
        since, start = self.warm if self.warm is not None and step > self.warm[1] else (self.started, self.start_step)
        return (now - since) / (step - start) if step > start else None
