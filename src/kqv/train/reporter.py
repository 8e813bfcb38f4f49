"""`Reporter`: the one place a training's events (`kqv.train.events`) become output.

The line before training, the result, samples and messages go to standard output; the progress bar (tqdm) to
standard error when that is a terminal; without one, a progress line at least every `LINE_EVERY_S` seconds of the
run's clock and one per evaluation; warnings to the log (`logging`), quiet or not. Given `on_event`, it hands every
event to that function as well (the Python API's callback)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from .events import Evaluation, Event, Message, Plan, Progress, Sample, Summary
from .metrics import Bar, progress_bar, progress_line

logger = logging.getLogger("kqv")

LINE_EVERY_S = 30.0  # without a terminal, a progress line at least this often


class Reporter:
    """Shows a training's events unless `quiet`, logs its warnings, and hands every event to `on_event`."""

    def __init__(self, quiet: bool = False, on_event: Callable[[Event], Any] | None = None):
        self.quiet, self.on_event = quiet, on_event
        self.bar: Bar | None = None
        self.last_line = self.previous = 0.0  # on the run's clock (`elapsed_s`): the last line, the last update
        self.shown: dict[str, float] = {}  # the last logged figures, for the lines between log records

    def __call__(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)
        if isinstance(event, Message) and event.warning:
            logger.warning("%s", event.text)
        elif not self.quiet:
            self.show(event)

    def show(self, event: Event) -> None:
        """Render one event for a person."""
        if isinstance(event, Progress):
            self.progress(event)
        elif isinstance(event, Evaluation):
            self.write(progress_line(event.step, event.steps, event.metrics, event.left_s))
            self.last_line = event.metrics.get("elapsed_s", self.last_line)
        elif isinstance(event, Sample):
            self.write(f"--- sample ---\n{event.text}\n--- end of sample ---")
        elif isinstance(event, (Plan, Summary, Message)):
            if isinstance(event, Summary):
                self.close()
            self.write(f"kqv: {event.text}")

    def progress(self, event: Progress) -> None:
        """The bar on a terminal; without one, a line when the next update would pass `LINE_EVERY_S` since the last
        line (the next update is assumed to take as long as the last, so the line comes before the limit)."""
        if self.bar is None:
            self.bar = progress_bar(event.steps, event.step - 1, shown=True)
        shown = {
            "train_loss": event.train_loss,
            "tokens_per_s": event.tokens_per_s,
            "mfu": event.mfu,
            "peak_memory_mb": event.peak_memory_mb,
        }
        self.shown.update({key: value for key, value in shown.items() if value is not None})
        self.bar.total, self.bar.left_s = event.steps, event.left_s
        if event.train_loss is not None:
            self.bar.set_postfix(
                loss=f"{event.train_loss:.4f}",
                **({"lr": f"{event.lr:.2e}"} if event.lr is not None else {}),
                **({"tok/s": f"{event.tokens_per_s:,.0f}"} if event.tokens_per_s else {}),
                **({"MFU": f"{event.mfu:.1%}"} if event.mfu else {}),
                refresh=False,
            )
        self.bar.update(1)
        iteration, self.previous = event.elapsed_s - self.previous, event.elapsed_s
        if self.bar.disable and event.elapsed_s - self.last_line + iteration >= LINE_EVERY_S:
            record = {**self.shown, "elapsed_s": event.elapsed_s}
            self.write(progress_line(event.step, event.steps, record, event.left_s))
            self.last_line = event.elapsed_s

    def write(self, text: str) -> None:
        """A line (or lines) on standard output, beside the bar if there is one."""
        tqdm.write(text)

    def close(self) -> None:
        """Close the bar, if one is open (at the end of the updates)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
