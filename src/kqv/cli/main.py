"""The `kqv` command: train, generate, evaluate and look inside models.

    kqv train lm [--config quick] [--out runs/lm] [--data text.txt] [--set train.steps=200]
    kqv generate runs/lm --prompt "ROMEO:"
    kqv eval runs/lm [--data other.txt]
    kqv attention runs/lm --text "To be, or not to be" --out attention.png
    kqv train mt [--config quick|lstm] [--out runs/mt] [--pair de-en] [--data pairs.tsv]
    kqv translate runs/mt "Im Anfang war das Wort"      (or one sentence per line on stdin / --file)
    kqv eval runs/mt [--beam 4]                          (BLEU and chrF on the test split)
    kqv attention runs/mt --src "Im Anfang war das Wort" --out alignment.png
    kqv train mlm [--config quick] [--out runs/mlm]      (masked-LM pretraining of an encoder on Shakespeare)
    kqv train cls --data file.tsv [--init runs/mlm]      (classify text<TAB>label lines; dev accuracy)
    kqv embed "some text" ... [--out embeddings.npy]     (all-MiniLM-L6-v2 sentence embeddings)
    kqv similarity "first text" "second text" ...        (their cosine similarities as a table)
    kqv explore runs/lm [--port 8765] [--open]            (a local web app: every layer and head of any run)
    kqv experiment list | run NAME [--quick]             (test the lecture's claims)
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from importlib import resources
from pathlib import Path

from ..errors import ConfigError, KqvError, RunError, command_line
from ..jobs.base import Flag, Job, RunCommand, all_jobs, get_job
from ..train.runs import read_run, run_task
from .commands import all_commands

# The flags of `kqv train NAME` that every job has; a job adds its own (Job.train_flags).
SHARED_TRAIN_FLAGS = (
    Flag("--steps", "number of optimizer updates", "train.steps", {"type": int}),
    Flag("--set", "override a config value, e.g. --set model.d_model=128 (repeatable)",
         options={"action": "append", "default": [], "metavar": "SECTION.KEY=VALUE"}),
    Flag("--resume", "continue the run in --out from its checkpoint", options={"action": "store_true"}),
    Flag("--overwrite", "replace the run in --out", options={"action": "store_true"}),
    Flag("--quiet", "print nothing but errors", options={"action": "store_true"}),
)


def packaged_config(name: str, task: str = "lm") -> Path:
    """A config shipped with kqv (e.g. `quick` for configs/{task}-quick.toml), or any path to a TOML file."""
    if Path(name).suffix == ".toml" or Path(name).exists():
        return Path(name)
    packaged = resources.files("kqv") / "configs" / f"{task}-{name}.toml"
    if not packaged.is_file():
        raise FileNotFoundError(f"no {task} config {name!r}: give a .toml path or one of {shipped_configs(task)}")
    return Path(str(packaged))


def shipped_configs(task: str) -> list[str]:
    """The names of the configs kqv ships for a job (configs/{task}-NAME.toml), `quick` first."""
    names = [p.name.removeprefix(f"{task}-").removesuffix(".toml") for p in (resources.files("kqv") / "configs")
             .iterdir() if p.name.startswith(f"{task}-") and p.name.endswith(".toml")]
    return sorted(names, key=lambda name: (name != "quick", name))


# ---------------------------------------------------------------------------------------------------------------
# kqv train NAME


def add_training(commands: argparse._SubParsersAction) -> None:
    tasks = commands.add_parser("train", help="train a model").add_subparsers(dest="task", required=True)
    for job in all_jobs().values():
        parser = tasks.add_parser(job.name, help=job.help)
        shipped = shipped_configs(job.name)
        parser.add_argument("--config", help=f"{', '.join(shipped) or 'quick'} (default: quick), or a path to a "
                                             f"TOML run config")
        parser.add_argument("--out", default=f"runs/{job.name}", help=f"run directory (default runs/{job.name})")
        for flag in (*job.train_flags, *SHARED_TRAIN_FLAGS):
            flag.add_to(parser)
        parser.set_defaults(func=partial(train, job))


def train(job: Job, args: argparse.Namespace) -> None:
    """Read the config (the shipped one, a TOML file, or with --resume alone the run's own) and train."""
    flags = (*job.train_flags, *SHARED_TRAIN_FLAGS)
    overrides = list(args.set) + [f"{flag.key}={json.dumps(getattr(args, flag.dest))}" for flag in flags
                                  if flag.key is not None and getattr(args, flag.dest) is not None]
    options = {flag.dest: getattr(args, flag.dest) for flag in job.train_flags if flag.key is None}
    if args.resume and args.config is None:
        if overrides:
            raise ConfigError("with --resume and no --config the run's own run.toml is used; pass --config to "
                              "change it")
        config = job.read_config(args.out)
    else:
        config = job.load_config(packaged_config(args.config or "quick", job.name), overrides)
    job.train(config, args.out, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet, **options)


# ---------------------------------------------------------------------------------------------------------------
# kqv COMMAND RUN: the commands on a trained run, answered by the job that wrote it


def add_run_commands(commands: argparse._SubParsersAction) -> None:
    """One subcommand per name any job declares in `Job.commands`, with the flags of every job that has it."""
    offered: dict[str, list[tuple[Job, RunCommand]]] = {}
    for job in all_jobs().values():
        for name, command in job.commands.items():
            offered.setdefault(name, []).append((job, command))
    for name, entries in offered.items():
        summary = entries[0][1].help if len(entries) == 1 else "; ".join(f"{job.name.upper()}: {command.help}"
                                                                          for job, command in entries)
        parser = commands.add_parser(name, help=summary)
        parser.add_argument("run", help="a run directory")
        seen: set[str] = set()
        for job, command in entries:
            for flag in command.flags:
                if flag.name not in seen:
                    seen.add(flag.name)
                    owners = [j.name.upper() for j, c in entries if any(f.name == flag.name for f in c.flags)]
                    flag.add_to(parser, f"{'/'.join(owners)}: {flag.help}" if len(owners) < len(entries) else None)
        parser.set_defaults(func=partial(run_command, name))


def run_command(name: str, args: argparse.Namespace) -> None:
    job = get_job(run_task(read_run(args.run)))
    if name not in job.commands:
        able = sorted(j.name for j in all_jobs().values() if name in j.commands)
        raise RunError(f"{args.run} is a run of task {job.name!r}; kqv {name} works on runs of {able}")
    getattr(job, job.commands[name].method)(job.load(args.run), args)


# ---------------------------------------------------------------------------------------------------------------
# The parser and the entry point


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kqv", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    add_training(commands)
    add_run_commands(commands)
    for command in all_commands().values():
        command.add_arguments(subparser := commands.add_parser(command.name, help=command.help))
        subparser.set_defaults(func=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line. Expected errors (kqv's own, a missing file, a run in the way) print one line and
    exit with status 2; anything else is a bug and shows its traceback."""
    args = build_parser().parse_args(argv)
    try:
        with command_line():  # error messages name flags, not Python arguments
            status = args.func(args)
    except (KqvError, FileNotFoundError, FileExistsError) as error:
        print(f"kqv: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kqv: interrupted", file=sys.stderr)
        return 130
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
