"""Metrics where users watch them: a run's log records handed to TensorBoard, a CSV file or Weights & Biases, as
`train.loggers` asks (default: none; kqv's own metrics.jsonl and loss.png are always written).

`LOGGERS` is the one registry, name -> class. Each logger takes what a metrics.jsonl record holds as numbers
(`figures`: train_loss, val_loss, lr, tokens_per_s, mfu, peak_memory_mb, ...; a value that is missing, None or not
finite is left out) at that record's step, so every logger shows the same curves at the same steps. They are
opened by the run directory (`kqv.train.rundir.RunDirectory.prepare`, rank 0's: no other process writes) when
training starts from `step`, fed by it with every record it appends to metrics.jsonl (the Trainer's log intervals:
nothing is read from the device for them), and closed with it. A resumed run continues the same curves: what was
logged after its checkpoint is dropped, as metrics.jsonl drops it, and redone.

A logger whose package is missing is a ConfigError naming the install command (`check_installed`), said before any
training; an unknown name one listing the valid ones (`check_names`, when the config is made).
"""

from __future__ import annotations

import csv
import importlib
import io
import math
import secrets
from collections.abc import Iterable
from typing import Any, ClassVar

from ..errors import ConfigError
from ..validation import did_you_mean
from .files import append_line, write_atomically, write_text
from .layout import RunFiles
from .metrics import read_metrics

FIELD = "train.loggers"


def figures(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics record that a logger plots: every finite int or float but its step (a bool, a
    nested table such as a plan, or a None is not one)."""
    return {
        key: value
        for key, value in record.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    }


class Logger:
    """One place a run's metrics go besides metrics.jsonl: opened on the run `run` for a training that starts
    after update `step` (0: fresh; a resume's checkpoint step), fed `log(step, figures)`, closed at the end.
    `package`: what it imports (None: nothing beyond kqv's own)."""

    package: ClassVar[str | None] = None

    def __init__(self, run: RunFiles, step: int):
        self.run, self.step = run, step

    def log(self, step: int, figures: dict[str, float]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Flush and release what the logger holds (nothing by default)."""


class TensorBoardLogger(Logger):
    """Event files in `<run>/tensorboard/`, written by TensorBoard's own writer (`SummaryWriter`), one scalar per
    figure, tagged with its metrics.jsonl name. A resume purges the events after its checkpoint (TensorBoard's
    `purge_step`), so the redone steps are not shown twice; a run that gains the logger on a resume is given the
    curves before it from metrics.jsonl."""

    package = "tensorboard"

    def __init__(self, run: RunFiles, step: int):
        super().__init__(run, step)
        from torch.utils.tensorboard import SummaryWriter

        earlier = run.tensorboard_dir.exists()
        self.writer = SummaryWriter(str(run.tensorboard_dir), purge_step=step + 1 if earlier else None, flush_secs=30)
        if not earlier and step > 0:
            for record in read_metrics(run.metrics_file) if run.metrics_file.exists() else []:
                self.log(record["step"], figures(record))

    def log(self, step: int, figures: dict[str, float]) -> None:
        for name, value in figures.items():
            self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        self.writer.close()


class CSVLogger(Logger):
    """metrics.csv: a `step` column and one per figure, in the order they first appear, a row per metrics.jsonl
    record with figures (an empty cell where a record has no such figure). It is written from metrics.jsonl when
    training starts (whose records after a resume's checkpoint are already dropped), atomically, and then grows a
    line per record; a record that brings a new figure (the first evaluation's val_loss, say) rewrites it whole,
    atomically, with the new column."""

    def __init__(self, run: RunFiles, step: int):
        super().__init__(run, step)
        self.rows: list[dict[str, Any]] = []
        self.columns: list[str] = ["step"]
        earlier = read_metrics(run.metrics_file) if run.metrics_file.exists() else []
        for record in earlier:
            if found := figures(record):
                self.add(record["step"], found)
        self.rewrite()

    def add(self, step: int, figures: dict[str, float]) -> bool:
        """Note a row; whether it brought a new column."""
        self.rows.append({"step": step, **figures})
        new = [name for name in figures if name not in self.columns]
        self.columns += new
        return bool(new)

    def log(self, step: int, figures: dict[str, float]) -> None:
        if self.add(step, figures):  # the first row, or a new column: the header changes
            self.rewrite()
        else:
            append_line(self.run.csv_file, self.line(self.rows[-1]))

    def line(self, row: dict[str, Any]) -> str:
        """A row's cells, in the columns' order, as one line of CSV (without its end)."""
        return csv_line([repr_value(row.get(name)) for name in self.columns])

    def rewrite(self) -> None:
        """The whole file, atomically: the header and every row (nothing while there is no row)."""
        if self.rows:
            lines = [csv_line(self.columns), *map(self.line, self.rows)]
            write_text(self.run.csv_file, "".join(f"{line}\n" for line in lines))
        elif self.run.csv_file.exists():  # a resume from before the first record
            write_atomically(self.run.csv_file, b"")


def csv_line(cells: list[str]) -> str:
    """One line of CSV, quoted where a cell needs it."""
    text = io.StringIO()
    csv.writer(text, lineterminator="").writerow(cells)
    return text.getvalue()


def repr_value(value: Any) -> str:
    """A cell: a number as Python writes it exactly (`repr`: a float read back is the same float), or empty."""
    return "" if value is None else repr(value)


class WandbLogger(Logger):
    """A Weights & Biases run (`wandb.init`; `WANDB_MODE=offline` keeps it on this machine, under `<run>/wandb/`;
    `WANDB_PROJECT` names its project), one per kqv run: its id is kept in the run directory, so a resume
    continues the same W&B run. W&B never rewrites a step it has: a resume logs only the steps after the last one
    it holds (those before were logged with the same losses: a resumed run redoes them exactly)."""

    package = "wandb"

    def __init__(self, run: RunFiles, step: int):
        super().__init__(run, step)
        import wandb

        run.wandb_dir.mkdir(parents=True, exist_ok=True)
        if not run.wandb_id_file.exists():
            write_text(run.wandb_id_file, secrets.token_hex(8))
        run_id = run.wandb_id_file.read_text().strip()
        try:
            self.wandb = wandb.init(
                dir=str(run.path), id=run_id, name=run.path.name, resume="allow", reinit="create_new"
            )
        except wandb.errors.Error as error:  # not logged in, say: a line, not wandb's traceback
            said = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(
                f"{FIELD} asks for 'wandb', which could not start a W&B run ({said}); log in with `wandb login`, "
                f"or keep the run on this machine with WANDB_MODE=offline"
            ) from None

    def log(self, step: int, figures: dict[str, float]) -> None:
        if step >= self.wandb.step:
            self.wandb.log(figures, step=step)

    def close(self) -> None:
        self.wandb.finish()


LOGGERS: dict[str, type[Logger]] = {"tensorboard": TensorBoardLogger, "csv": CSVLogger, "wandb": WandbLogger}


def check_names(names: Iterable[str]) -> None:
    """ConfigError, one line, for a name not in `LOGGERS` (listing the valid ones) or one named twice."""
    names = list(names)
    unknown = [name for name in names if name not in LOGGERS]
    if unknown:
        valid = ", ".join(repr(name) for name in LOGGERS)
        raise ConfigError(
            f"{FIELD} has no logger {unknown[0]!r}{did_you_mean(unknown, LOGGERS)}; the loggers are {valid}"
        )
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"{FIELD} names {twice[0]!r} twice; name each logger once")


def check_installed(names: Iterable[str]) -> None:
    """ConfigError, one line naming the install command, for a logger whose package cannot be imported here."""
    for name in names:
        package = LOGGERS[name].package
        if package is None:
            continue
        try:
            importlib.import_module(package)
        except ImportError:
            raise ConfigError(
                f"{FIELD} asks for {name!r}, which needs the {package} package: install it with "
                f"`pip install {package}`, or take {name!r} out of {FIELD}"
            ) from None


class Loggers:
    """The loggers of one training (rank 0's), fed every metrics record the run directory appends."""

    def __init__(self, opened: list[Logger] | None = None):
        self.opened = opened or []

    @classmethod
    def open(cls, names: Iterable[str], run: RunFiles, step: int) -> Loggers:
        """The loggers `names` on `run`, for a training that starts after update `step`."""
        names = tuple(names)
        check_names(names)
        check_installed(names)
        loggers = cls()
        try:
            for name in names:
                loggers.opened.append(LOGGERS[name](run, step))
        except BaseException:
            loggers.close()
            raise
        return loggers

    def log(self, record: dict[str, Any]) -> None:
        """Hand a metrics record's figures, at its step, to every logger (nothing for a record without any)."""
        found = figures(record)
        if found:
            for logger in self.opened:
                logger.log(record["step"], found)

    def close(self) -> None:
        opened, self.opened = self.opened, []
        for logger in opened:
            logger.close()
