"""What a `kqv` command is: its help, its arguments, and what it does with them. `kqv.cli.main.COMMANDS` is the one
registry of them, by name.

Three kinds: `Train` (`kqv train NAME`, one subcommand per job in `kqv.jobs.JOBS`), `RunCommand` (`kqv eval RUN`,
answered by the job that wrote RUN), and the top-level commands that are not about a run (`kqv embed`, ...).
Each parses flags, calls `kqv.api` (or a run's methods), and prints what comes back.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import api
from ..api import PretrainedRun, TrainedRun
from ..errors import RunError
from ..flag_names import CONFIG, OUT, QUIET, SAMPLE_MB, TOKENIZER, VOCAB_SIZE
from .flags import DEVICE_FLAG, SHARED_TRAIN_FLAGS, TRAIN_FLAGS, Flag


class Command:
    """`kqv NAME ...`: its help, its arguments and what it does."""

    help: str = ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare the command's arguments."""

    def run(self, args: argparse.Namespace) -> int | None:
        """Do it; return the exit status (None = 0). Raise a `kqv.errors.KqvError` for expected errors."""
        raise NotImplementedError


class Train(Command):
    """`kqv train NAME [--config C] [--out DIR] [--steps N] [--set S.K=V] [--resume | --overwrite] [--quiet]` plus
    the job's own flags (`TRAIN_FLAGS[NAME]`): `kqv.api.train` with those values."""

    help = "train a model"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        tasks = parser.add_subparsers(dest="task", required=True)
        for job in api.all_jobs().values():
            job_parser = tasks.add_parser(job.name, help=job.help)
            shipped = api.shipped_configs(job.name)
            job_parser.add_argument(
                CONFIG, help=f"{', '.join(shipped) or 'quick'} (default: quick), or a path to a TOML run config"
            )
            job_parser.add_argument(OUT, default=f"runs/{job.name}", help=f"run directory (default runs/{job.name})")
            for flag in (*TRAIN_FLAGS.get(job.name, ()), *SHARED_TRAIN_FLAGS):
                flag.add_to(job_parser)

    def run(self, args: argparse.Namespace) -> None:
        """Flags with a config key become overrides (after --set's), the others the job's keyword options."""
        own = TRAIN_FLAGS.get(args.task, ())
        overrides = list(args.set) + [
            override
            for flag in (*own, *SHARED_TRAIN_FLAGS)
            if flag.key is not None and getattr(args, flag.dest) is not None
            for override in flag.overrides(getattr(args, flag.dest))
        ]
        options = {flag.dest: getattr(args, flag.dest) for flag in own if flag.key is None}
        api.train(
            args.task,
            args.config,
            out=args.out,
            overrides=overrides,
            resume=args.resume,
            overwrite=args.overwrite,
            quiet=args.quiet,
            **options,
        )


class Prepare(Command):
    """`kqv prepare TEXT_OR_DIR --out DIR [--tokenizer bpe|char|DIR] [--vocab-size N] [--sample-mb M]`:
    `kqv.api.prepare`, and the line that says what it made."""

    help = "encode a text once into a token corpus on disk, for `kqv train lm --data DIR`"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("text", metavar="TEXT_OR_DIR", help="a UTF-8 text file or a directory of .txt files")
        parser.add_argument(OUT, required=True, help="the corpus directory (new, or an unfinished prepare's)")
        parser.add_argument(
            TOKENIZER, default="bpe", help="bpe (trained on a sample), char, or a saved tokenizer's or run's dir"
        )
        parser.add_argument(VOCAB_SIZE, type=int, help="bpe only: the vocabulary (default 4096)")
        parser.add_argument(SAMPLE_MB, type=float, help="bpe only: MiB of text it is trained on (default 32)")
        parser.add_argument(QUIET, action="store_true", help="no progress bar")

    def run(self, args: argparse.Namespace) -> None:
        prepared = api.prepare(
            args.text,
            args.out,
            tokenizer=args.tokenizer,
            vocab_size=args.vocab_size,
            sample_mb=args.sample_mb,
            progress=not args.quiet,
        )
        print(api.describe_prepared(prepared))


class Reseal(Command):
    """`kqv reseal RUN`: `kqv.api.reseal`, and the line that says what it recorded."""

    help = "record a run's checksums (SHA256SUMS) anew, as its files are now: on purpose, after restoring them"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run", metavar="RUN", help="a run directory")

    def run(self, args: argparse.Namespace) -> None:
        recorded = api.reseal(args.run)
        print(f"{args.run}: SHA256SUMS records {len(recorded)} files as they are now")


@dataclass(frozen=True)
class JobCommand:
    """What a command on a run does for one job's runs: its help, its flags, and `run(trained_run, args)`, which
    calls the run's methods and prints their results."""

    help: str
    run: Callable[[TrainedRun | PretrainedRun, argparse.Namespace], Any]
    flags: tuple[Flag, ...] = ()


HF_ENTRIES = ("lm", "mt")  # the job entries whose operations a Hugging Face directory's PretrainedRun offers


class RunCommand(Command):
    """`kqv NAME RUN [flags]`: RUN loaded by `kqv.api.load`, answered by the entry of the job that wrote it (its
    run.toml's task; `HF_ENTRIES` for a Hugging Face directory), for the jobs in `by_job`, whose runs offer
    `capability` (a protocol of `kqv.jobs.offers`)."""

    def __init__(self, capability: type, by_job: dict[str, JobCommand]):
        self.capability, self.by_job = capability, dict(sorted(by_job.items()))

    @property
    def help(self) -> str:
        if len(self.by_job) == 1:
            return next(iter(self.by_job.values())).help
        return "; ".join(f"{job.upper()}: {command.help}" for job, command in self.by_job.items())

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """RUN, then every job's flags once; a flag only some jobs have says whose it is."""
        parser.add_argument("run", help="a run directory, or a Hugging Face model directory (as kqv.load takes)")
        DEVICE_FLAG.add_to(parser)
        seen: set[str] = set()
        for command in self.by_job.values():
            for flag in command.flags:
                if flag.name not in seen:
                    seen.add(flag.name)
                    owners = [
                        job.upper() for job, c in self.by_job.items() if any(f.name == flag.name for f in c.flags)
                    ]
                    flag.add_to(parser, f"{'/'.join(owners)}: {flag.help}" if len(owners) < len(self.by_job) else None)

    def run(self, args: argparse.Namespace) -> Any:
        """Load RUN as `kqv.load` does and hand it to the entry of its job; a run of a job without one is refused
        before its model is read. A Hugging Face directory (`PretrainedRun`) takes the LM entry where there is one
        (generate, eval, attention) and else the MT entry (translate); one whose model lacks the capability is
        refused once it is loaded (`kqv.jobs.offers.require`), before the entry starts."""
        job = api.run_job(args.run)
        hf = job is None
        kind = next((k for k in HF_ENTRIES if k in self.by_job), "") if hf else job
        if kind not in self.by_job:
            what = "a Hugging Face model directory" if hf else f"a run of task {kind!r}"
            raise RunError(f"{args.run} is {what}; kqv {args.command} works on runs of {sorted(self.by_job)}")
        loaded = api.load(args.run, device=args.device)
        api.require(loaded, self.capability)
        return self.by_job[kind].run(loaded, args)


def report(line: str, result: dict[str, Any], as_json: bool) -> None:
    """Print an evaluation's one-line report, then (for `--json`) the result as one JSON line."""
    print(line)
    if as_json:
        print(json.dumps(result))
