"""`kqv experiment`: list the lecture's claims, and test them.

kqv experiment list
kqv experiment run NAME [--quick] [--seeds N] [--out DIR] [--set FIELD=VALUE] [--threads T] [--device D]
kqv experiment run all [--quick] ...
kqv experiment gallery [--dir docs/experiments] [--out docs/experiments.md]
kqv experiment rejudge NAME|all [--dir docs/experiments]   (recompute verdicts from stored numbers, no rerun)
kqv experiment fingerprint NAME|all [--dir docs/experiments] [--commit C]
    (store the quick-size numbers of a stored run's code)

Each action parses its flags, calls `kqv_lab.experiments.actions` and prints what comes back.
"""

from __future__ import annotations

import argparse

from kqv.cli import DEVICE_HELP, Command
from kqv.flag_names import COMMIT, DEVICE, DIR, OUT, QUICK, QUIET, SEEDS, SET, THREADS


def cmd_list(args: argparse.Namespace) -> None:
    from ..experiments.actions import claims

    listed = claims()
    width = max(len(name) for name, _ in listed)
    for name, claim in listed:
        print(f"{name:<{width}}  {claim}")


def cmd_run(args: argparse.Namespace) -> None:
    from ..experiments.actions import run_experiments, summary
    from ..experiments.runner import SMOKE_TEST

    records = run_experiments(  # every name and option is checked here, before anything runs
        args.name,
        quick=args.quick,
        seeds=args.seeds,
        out=args.out,
        overrides=args.set,
        threads=args.threads,
        progress=not args.quiet,
        device=args.device,
    )
    if args.quick:
        print(f"kqv: {SMOKE_TEST}", flush=True)
    for position, record in records:
        print(summary(record, position, args.out), flush=True)


def cmd_gallery(args: argparse.Namespace) -> None:
    from ..experiments.actions import write_gallery

    page = write_gallery(args.dir, args.out)
    print(f"wrote {page} from the results in {args.dir}")


def cmd_rejudge(args: argparse.Namespace) -> None:
    from ..experiments.actions import rejudge_runs
    from ..experiments.records import RESULTS_FILE

    for name, record in rejudge_runs(args.name, args.dir):
        print(f"{name}: {record['verdict']} (re-judged from {args.dir}/{name}/{RESULTS_FILE})")


def cmd_fingerprint(args: argparse.Namespace) -> None:
    from ..experiments.actions import fingerprint_runs

    for name, record in fingerprint_runs(args.name, args.dir, args.commit):
        quick = record["code"]["quick"]
        dropped = ", ".join(f"{n} {why}" for why, n in quick["dropped"].items() if n)
        print(f"{name}: {len(quick['numbers'])} quick-size numbers stored (dropped: {dropped or 'none'})")


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
            QUICK,
            action="store_true",
            help="the small size: a smoke test of the code (minutes for all), not a test of the claims",
        )
        run.add_argument(SEEDS, type=int, help="number of seeds (default: the experiment's)")
        run.add_argument(OUT, default="experiments", help="output directory (default experiments/)")
        run.add_argument(
            SET,
            action="append",
            default=[],
            metavar="FIELD=VALUE",
            help="change a size of the experiment's config, e.g. --set steps=500 (repeatable)",
        )
        run.add_argument(THREADS, type=int, default=1, help="torch threads (default 1)")
        run.add_argument(
            DEVICE,
            default="cpu",
            help=f"where the models train: {DEVICE_HELP.partition(': ')[2]} (default cpu, where every figure in "
            "docs/experiments was measured); what is measured after training runs on the CPU",
        )
        run.add_argument(QUIET, action="store_true", help="no progress output")
        run.set_defaults(action_func=cmd_run)
        page = actions.add_parser("gallery", help="one Markdown page of every experiment's results in a directory")
        page.add_argument(DIR, default="docs/experiments", help="the runs' --out directory (default docs/experiments)")
        page.add_argument(OUT, default="docs/experiments.md", help="the page to write (default docs/experiments.md)")
        page.set_defaults(action_func=cmd_gallery)
        again = actions.add_parser(
            "rejudge", help="recompute the table, checks and verdict of stored runs from their numbers (no rerun)"
        )
        again.add_argument("name", help="an experiment name, or all (every run found in --dir)")
        again.add_argument(DIR, default="docs/experiments", help="the runs' --out directory (default docs/experiments)")
        again.set_defaults(action_func=cmd_rejudge)
        vouch = actions.add_parser(
            "fingerprint",
            help="store in stored runs the quick-size numbers their code computes the same on every CPU kernel set "
            "(so a refactor that computes the same numbers keeps them; made by today's code or --commit's, which "
            "must be the code that made them)",
        )
        vouch.add_argument("name", help="an experiment name, or all (every run found in --dir)")
        vouch.add_argument(DIR, default="docs/experiments", help="the runs' --out directory (default docs/experiments)")
        vouch.add_argument(
            COMMIT, default=None, help="the commit whose code made the runs (default: today's working tree)"
        )
        vouch.set_defaults(action_func=cmd_fingerprint)

    def run(self, args: argparse.Namespace) -> None:
        args.action_func(args)
