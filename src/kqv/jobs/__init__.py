"""The jobs: each module trains one kind of model end to end and knows how to use its runs.

`lm` (a GPT-style language model), `mt` (translation: the Transformer or its LSTM baseline), `mlm` (masked-LM
pretraining of an encoder), `cls` (text classification) and `vit` (a Vision Transformer on 8x8 digits). Every
job implements the contract in `kqv.jobs.base`; `JOBS` below is the one registry of them (a new job is one more
entry), and `get_job(name)` and `load_run(run_dir)` find them.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from ..train.runs import read_run, run_task
from . import cls, lm, mlm, mt, vit
from .base import Job, TrainedRun
from .mt import mt_loss
from .mt import prepare_data as prepare_mt_data  # an MT run's tokenizer and splits, for runs to share (--data-from)
from .sampling import generate_text
from .scoring import constant_answer, kind_constants, normalise, reading_guess, runner_up
from .translation import spread

# Every job, by the name `kqv train NAME`, configs/NAME-*.toml and run.toml's `task` use (its config's task).
JOBS: dict[str, Job] = {"cls": cls.JOB, "lm": lm.JOB, "mlm": mlm.JOB, "mt": mt.JOB, "vit": vit.JOB}


def all_jobs() -> dict[str, Job]:
    """Every job, by name (a copy of `JOBS`, sorted)."""
    return dict(sorted(JOBS.items()))


def get_job(name: str) -> Job:
    """The job called `name`, or a ConfigError naming the jobs there are."""
    if name not in JOBS:
        raise ConfigError(f"kqv has no job {name!r}; the jobs are {sorted(JOBS)}")
    return JOBS[name]


def load_run(run_dir: str | Path, device: str = "cpu") -> TrainedRun:
    """Any run directory, loaded by the job that wrote it (the `task` of its run.toml) as that job's run class, its
    model on `device`."""
    return get_job(run_task(read_run(run_dir))).load(run_dir, device)


__all__ = ["JOBS", "Job", "TrainedRun", "all_jobs", "generate_text", "get_job", "load_run", "prepare_mt_data"]
__all__ += ["constant_answer", "kind_constants", "mt_loss", "normalise", "reading_guess", "runner_up", "spread"]
