"""What a training says while it runs, as events: its plan, its progress, its evaluations, samples, its summary.

Jobs and the Trainer print nothing: they hand these small frozen records to one reporter
(`kqv.train.reporter.Reporter`), which shows them (the line before training, the bar on a terminal, progress lines
without one, the result) and logs the warnings; `kqv.train(..., on_event=f)` hands them to `f` instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Plan:
    """Before the first update: the job's one-line description of the model, its data and `run_dir`."""

    text: str
    parameters: int
    steps: int
    run_dir: str


@dataclass(frozen=True)
class Progress:
    """After an update: `step` of `steps` (a budget's plan may change `steps`), seconds since the run started
    (`elapsed_s`), the estimated seconds of training left (`left_s`, None before an estimate), and the last logged
    `train_loss`, learning rate, tokens per second, model FLOPs utilisation and peak memory in MB (None before the
    first log record; `mfu` None where the device's peak is unknown)."""

    step: int
    steps: int
    elapsed_s: float
    left_s: float | None = None
    train_loss: float | None = None
    lr: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_memory_mb: float | None = None


@dataclass(frozen=True)
class Evaluation:
    """An evaluation at `step`: its `metrics` record as written to metrics.jsonl (val_loss, accuracies, ...)."""

    step: int
    steps: int
    metrics: dict[str, Any] = field(default_factory=dict)
    left_s: float | None = None


@dataclass(frozen=True)
class Sample:
    """A text the trained model generated (the LM job's sample)."""

    text: str


@dataclass(frozen=True)
class Summary:
    """The end of a training: `figures` as in summary.json, and `text`, the one line that reads them out."""

    figures: dict[str, Any]
    text: str


@dataclass(frozen=True)
class Message:
    """Anything else worth a line (a budget's plan, say); a `warning` goes to the log even when quiet."""

    text: str
    warning: bool = False


Event = Plan | Progress | Evaluation | Sample | Summary | Message
