"""The job contract: what every job (lm, mt, mlm, cls, ...) implements, and the one registry of jobs.

A job is a `Job` subclass with a `name`; defining it in a module of `kqv.jobs` registers it, and then, with no
change anywhere else:

* `kqv train NAME [--config C] [--out DIR] [--steps N] [--set S.K=V] [--resume | --overwrite] [--quiet]` plus the
  job's `train_flags` reads `configs/NAME-C.toml` into the job's `config_class` and calls `Job.train`;
* `kqv eval|generate|translate|attention|... RUN` reads the `task` of RUN's run.toml, loads the run with
  `Job.load`, and calls the method its `commands` entry names;
* `load_run(RUN)` gives any run directory's model, tokenizer and config.

`docs/architecture.md` shows a new job step by step.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import resource
import time
from dataclasses import dataclass, field
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..data.tokenizers import load_tokenizer
from ..errors import ConfigError
from ..nn.config import ModelConfig
from ..nn.models import count_parameters
from ..train.checkpoints import load_weights
from ..train.runs import (TOKENIZER_DIR, RunConfig, read_config_values, read_run, run_task, write_run_config,
                          write_summary)
from ..train.rundir import RunDirectory
from ..train.trainer import Trainer


@dataclass(frozen=True)
class Flag:
    """A command-line flag of a job: its argparse options and, for `kqv train`, the config value it sets.

    With `key` ("data.path") the flag is a shortcut for `--set data.path=VALUE`; without, its value reaches
    `Job.train` as the keyword argument of its name (`--data-from` -> `data_from=`).
    """

    name: str
    help: str
    key: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # further argparse keywords: type, choices, default, ...

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser, help: str | None = None) -> None:
        parser.add_argument(self.name, help=help or self.help, **self.options)


@dataclass(frozen=True)
class RunCommand:
    """`kqv COMMAND RUN [flags]` for the runs of a job: its help, its flags, and the `Job` method that runs it,
    called as `method(run: TrainedRun, args: argparse.Namespace)`."""

    help: str
    method: str
    flags: tuple[Flag, ...] = ()


@dataclass
class TrainedRun:
    """A trained run, loaded: its job, config, model (in eval mode), tokenizer and the whole run.toml."""

    job: Job
    config: RunConfig
    model: nn.Module
    tokenizer: Any
    run_dir: Path
    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainingResult:
    """What `Job.fit` returns: the trainer (its step and train_seconds), the last metrics, and wall-clock time."""

    trainer: Trainer
    final: dict[str, float]
    wall_seconds: float


class Job:
    """The contract of a job. Subclasses set the class attributes and implement `train` and `build_model`."""

    name: ClassVar[str]  # `kqv train NAME`, configs/NAME-*.toml, `task = NAME` in run.toml
    help: ClassVar[str]
    config_class: ClassVar[type[RunConfig]]
    run_class: ClassVar[type[TrainedRun]] = TrainedRun
    train_flags: ClassVar[tuple[Flag, ...]] = ()  # besides the shared ones (--config, --out, --steps, ...)
    commands: ClassVar[dict[str, RunCommand]] = {}  # what `kqv COMMAND RUN` does for this job's runs

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            _REGISTRY[cls.name] = cls()

    # -- configs ---------------------------------------------------------------------------------------------

    def load_config(self, path: str | Path, overrides: list[str] = ()) -> Any:
        """Read a TOML run config and apply `section.key=value` overrides (as `kqv train NAME --set` does)."""
        values = read_config_values(path, overrides, f"configs/{self.name}-*.toml")
        return self.config_class.from_dict(values)

    def read_config(self, run_dir: str | Path) -> Any:
        """The run config a run was trained with, from its run.toml (to resume it as it was)."""
        return self.config_class.from_run(read_run(run_dir, self.name))

    # -- training --------------------------------------------------------------------------------------------

    def train(self, config: RunConfig, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
              quiet: bool = False, **options: Any) -> dict[str, Any]:
        """Train as configured into run_dir (continue its checkpoint with `resume`, replace it with `overwrite`);
        write the run directory and return the summary. `options` are the job's flags without a config key.

        A job's `train` opens the run directory first (`open_run`) and writes everything through it: run.toml,
        the tokenizer and the encoded data come before the Trainer, and a second writer must not replace them
        under a running one."""
        raise NotImplementedError

    @staticmethod
    def open_run(run_dir: str | Path, *, resume: bool, overwrite: bool) -> AbstractContextManager[RunDirectory]:
        """The run directory of one training, locked and inspected (`RunDirectory.open`): `resume` continues
        its checkpoint, `overwrite` replaces its run, neither refuses one that is there."""
        if resume and overwrite:
            raise ConfigError("resume and overwrite exclude each other: continue the run in the directory, or "
                              "replace it, not both")
        return RunDirectory.open(run_dir, "resume" if resume else ("overwrite" if overwrite else "error"))

    def build_model(self, model_config: Any, config: RunConfig, values: dict[str, Any]) -> nn.Module:
        """The job's model for a model config (`values`: the run.toml being written or read)."""
        raise NotImplementedError

    def start(self, config: RunConfig, run: RunDirectory, model_config: Any, **extra: Any) -> nn.Module:
        """Write run.toml (with `extra` tables; rank 0 only under torchrun) and build the freshly seeded model."""
        values = config.run_values(model_config.to_dict(), **extra)
        if run.writes:
            write_run_config(run.path, values)
        torch.manual_seed(config.train.seed)
        return self.build_model(model_config, config, values)

    def make_trainer(self, model: nn.Module, config: RunConfig, run: RunDirectory, *, quiet: bool,
                     **trainer_options: Any) -> Trainer:
        """The shared Trainer for `model` in the opened run directory (`trainer_options`: train_batches, loss_fn,
        val_batches, eval_fn, ...). It resumes `run.checkpoint` when there is one."""
        return Trainer(model, config.train, run, quiet=quiet, **trainer_options)

    @staticmethod
    def fit(trainer: Trainer) -> TrainingResult:
        """Run the trainer to the end, timing this session."""
        started = time.perf_counter()
        final = trainer.train()
        return TrainingResult(trainer, final, time.perf_counter() - started)

    def summarise(self, run_dir: Path, result: TrainingResult, model: nn.Module, **figures: Any) -> dict[str, Any]:
        """Write summary.json: the figures every job reports, then the job's own.

        `train_seconds` is the time spent in updates (evaluation and checkpoints excluded) summed over every
        session of the run, resumes included; `wall_seconds` is the wall-clock time of this session's training,
        evaluation included. `peak_rss_mb` is the process's peak resident memory so far (`peak_rss_mb()`): the
        job's own when it runs in a process of its own, as under `kqv train`.
        """
        trainer = result.trainer
        summary = {"steps": trainer.step, "train_seconds": round(trainer.train_seconds, 1),
                   "wall_seconds": round(result.wall_seconds, 1), "peak_rss_mb": round(peak_rss_mb(), 1),
                   "parameters": count_parameters(model),
                   "final_train_loss": result.final.get("train_loss"), "final_val_loss": result.final.get("val_loss"),
                   **figures}
        write_summary(run_dir, summary)
        return summary

    # -- using a trained run ---------------------------------------------------------------------------------

    def load(self, run_dir: str | Path) -> Any:
        """A trained run for generation or evaluation (weights from safetensors, no code executed)."""
        run_dir = Path(run_dir)
        values = read_run(run_dir, self.name)
        config = self.config_class.from_run(values)
        model = self.build_model(self.model_config_of_run(values), config, values)
        load_weights(model, run_dir)
        return self.run_class(self, config, model.eval(), self.load_tokenizer(run_dir), run_dir, values)

    def model_config_of_run(self, values: dict[str, Any]) -> Any:
        """The exact model config a run trained, from its run.toml."""
        return ModelConfig.from_dict(values["model"])

    def load_tokenizer(self, run_dir: Path) -> Any:
        return load_tokenizer(run_dir / TOKENIZER_DIR)

    @staticmethod
    def draw_attention(weights: list, rows: list[str], columns: list[str], out: str | Path, title: str) -> Path:
        """A PNG of attention maps, one panel per layer and head (matplotlib is imported only when drawing)."""
        from ..explore.plots import plot_attention_grid

        return plot_attention_grid(weights, rows, columns, out, title=title)


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (10^6 bytes): `getrusage`'s ru_maxrss, in KiB on Linux."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def report(line: str, result: dict[str, Any], as_json: bool) -> None:
    """Print an evaluation's one-line report, then (for `--json`) the result as one JSON line."""
    print(line)
    if as_json:
        print(json.dumps(result))


_REGISTRY: dict[str, Job] = {}


def all_jobs() -> dict[str, Job]:
    """Every job, by name: each module of `kqv.jobs` is imported, and each `Job` subclass in it registered."""
    package = importlib.import_module(__package__)
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{__package__}.{module.name}")
    return dict(sorted(_REGISTRY.items()))


def get_job(name: str) -> Job:
    jobs = all_jobs()
    if name not in jobs:
        raise ConfigError(f"kqv has no job {name!r}; the jobs are {sorted(jobs)}")
    return jobs[name]


def load_run(run_dir: str | Path) -> TrainedRun:
    """Any run directory, loaded by the job that wrote it (the `task` of its run.toml)."""
    return get_job(run_task(read_run(run_dir))).load(run_dir)
