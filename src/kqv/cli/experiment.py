"""`kqv experiment`: list the lecture's claims, and test them.

kqv experiment list
kqv experiment run NAME [--quick] [--seeds N] [--out DIR] [--set FIELD=VALUE] [--threads T] [--device D]
kqv experiment run all [--quick] ...
kqv experiment gallery [--dir docs/experiments] [--out docs/experiments.md]
kqv experiment rejudge NAME|all [--dir docs/experiments]   (recompute verdicts from stored numbers, no rerun)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import ConfigError
from .commands import Command
from .flags import DEVICE_HELP


def cmd_list(args: argparse.Namespace) -> None:
    from ..experiments import get, names

    width = max(map(len, names()))
    for name in names():
        print(f"{name:<{width}}  {get(name).claim}")


def cmd_run(args: argparse.Namespace) -> None:
    from ..experiments import get, names
    from ..experiments.runner import SMOKE_TEST, expected_minutes, run_experiment

    chosen = names() if args.name == "all" else [args.name]
    overrides = {name: own_overrides(get(name), args.set) if args.name == "all" else args.set for name in chosen}
    unknown = set(args.set) - {o for own in overrides.values() for o in own}
    if unknown:
        raise ConfigError(f"no experiment has the option(s) of {sorted(unknown)}; see each experiment's Config")
    for name in chosen:  # every name and config is checked before anything runs
        get(name).config(args.quick, overrides[name])
    if args.seeds is not None and args.seeds < 1:
        raise ConfigError(f"--seeds must be at least 1, got {args.seeds}")
    if args.quick:
        print(f"kqv: {SMOKE_TEST}", flush=True)
    work = [expected_minutes(name, args.quick) for name in chosen]
    for k, name in enumerate(chosen):
        record = run_experiment(
            name,
            quick=args.quick,
            seeds=args.seeds,
            out=args.out,
            overrides=overrides[name],
            threads=args.threads,
            progress=not args.quiet,
            device=args.device,
            position=(k + 1, len(chosen)),
            share=(sum(work[:k]) / sum(work), work[k] / sum(work)),
        )
        print(summary(record, k + 1, len(chosen), args.out))
        sys.stdout.flush()


def summary(record: dict, k: int, n: int, out: str) -> str:
    """The lines printed after an experiment: its place in the run, its verdict (labelled as a smoke test's when
    it was a quick run) and each check's outcome."""
    name, minutes = record["experiment"], record["seconds"] / 60
    verdict = f"smoke test only, checks read: {record['verdict']}" if record["quick"] else record["verdict"]
    lines = [f"[{k}/{n}] {name}: {verdict} ({minutes:.1f} min) -> {out}/{name}/report.md"]
    lines += [
        f"  [{check.get('outcome', check['holds'])}] {check['what']}: {check['figure']}" for check in record["checks"]
    ]
    return "\n".join(lines)


def own_overrides(experiment, overrides: list[str]) -> list[str]:
    """The `field=value` overrides whose field the experiment's config has (for `run all`)."""
    return [o for o in overrides if o.partition("=")[0].strip() in experiment.options()]


def cmd_gallery(args: argparse.Namespace) -> None:
    from ..experiments.gallery import gallery

    page = Path(args.out)
    text = gallery(args.dir, page)
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text, encoding="utf-8")
    print(f"wrote {page} from the results in {args.dir}")


def cmd_rejudge(args: argparse.Namespace) -> None:
    from ..experiments import get, names
    from ..experiments.runner import RESULTS_FILE, rejudge

    chosen = (
        [n for n in names() if (Path(args.dir) / n / RESULTS_FILE).is_file()] if args.name == "all" else [args.name]
    )
    if args.name != "all":
        get(args.name)  # an unknown name is a clear error
    if not chosen:
        raise ConfigError(f"no experiment results in {args.dir}; run `kqv experiment run NAME --out {args.dir}` first")
    for name in chosen:
        record = rejudge(Path(args.dir) / name)
        print(f"{name}: {record['verdict']} (re-judged from {args.dir}/{name}/{RESULTS_FILE})")


class Experiment(Command):
    """`kqv experiment list | run NAME | gallery | rejudge NAME`."""

    help = "test the lecture's claims: list, or run NAME / all"

    def add_arguments(self, experiment: argparse.ArgumentParser) -> None:
        actions = experiment.add_subparsers(dest="action", required=True)
        listing = actions.add_parser("list", help="every experiment and the claim it tests")
        listing.set_defaults(action_func=cmd_list)
        run = actions.add_parser("run", help="run one experiment (or all) and write results.json, plots, report.md")
        run.add_argument("name", help="an experiment name from `kqv experiment list`, or all")
        run.add_argument(
            "--quick",
            action="store_true",
            help="the small size: a smoke test of the code (minutes for all), not a test of the claims",
        )
        run.add_argument("--seeds", type=int, help="number of seeds (default: the experiment's)")
        run.add_argument("--out", default="experiments", help="output directory (default experiments/)")
        run.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="FIELD=VALUE",
            help="change a size of the experiment's config, e.g. --set steps=500 (repeatable)",
        )
        run.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
        run.add_argument(
            "--device",
            default="cpu",
            help=f"where the models train: {DEVICE_HELP.partition(': ')[2]} (default cpu, where every figure in "
            "docs/experiments was measured); what is measured after training runs on the CPU",
        )
        run.add_argument("--quiet", action="store_true", help="no progress output")
        run.set_defaults(action_func=cmd_run)
        page = actions.add_parser("gallery", help="one Markdown page of every experiment's results in a directory")
        page.add_argument(
            "--dir", default="docs/experiments", help="the runs' --out directory (default docs/experiments)"
        )
        page.add_argument(
            "--out", default="docs/experiments.md", help="the page to write (default docs/experiments.md)"
        )
        page.set_defaults(action_func=cmd_gallery)
        again = actions.add_parser(
            "rejudge", help="recompute the table, checks and verdict of stored runs from their numbers (no rerun)"
        )
        again.add_argument("name", help="an experiment name, or all (every run found in --dir)")
        again.add_argument(
            "--dir", default="docs/experiments", help="the runs' --out directory (default docs/experiments)"
        )
        again.set_defaults(action_func=cmd_rejudge)

    def run(self, args: argparse.Namespace) -> None:
        args.action_func(args)
