"""What every benchmark script shares, said once: its arguments (a parser with the common flags: `--quick`, the
results path, `--seed`, `--threads`), the machine it runs on, where its results go (`benchmarks/results/NAME.json`)
and how its record is written (`kqv_lab.measuring.write_record`: the JSON with the machine, the command, the date and
the commit, written atomically).

A script builds its parser with `arguments(summary(__doc__), quick=..., output=results_path("NAME"))`, adds its
own flags, and writes with `write_record(path, record)`; `docs/gen_tables.py` reads what lands in
`benchmarks/results/`. Not a benchmark itself: `tests/test_benchmarks.py` runs every other module here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kqv_lab.measuring import machine, write_json, write_record

__all__ = ["RESULTS", "ROOT", "arguments", "machine", "output_path", "results_path", "summary", "write_json"]
__all__ += ["write_record"]

RESULTS = Path(__file__).resolve().parent / "results"  # benchmarks/results: what docs/gen_tables.py reads
ROOT = RESULTS.parents[1]  # the repository's root


def results_path(name: str) -> Path:
    """Where the benchmark `name` writes its record by default: benchmarks/results/NAME.json."""
    return RESULTS / f"{name}.json"


def summary(doc: str | None) -> str:
    """A script's docstring's first paragraph: its parser's description."""
    return (doc or "").split("\n\n")[0]


def arguments(
    description: str,
    *,
    whole: bool = False,
    quick: str | None = None,
    output: Path | None = None,
    output_flag: str | None = "--output",
    output_help: str | None = None,
    seed: bool = False,
    threads: int | None | bool = False,
) -> argparse.ArgumentParser:
    """A benchmark's parser with the flags it shares with the others: `--quick` (its help, where given), the
    results path (`output_flag`, default `output`, read as `args.output`; None: no such flag), `--seed` (default 0) and
    `--threads` (torch's threads, default `threads`; False: no such flag). `whole` keeps the description's own
    line breaks (a docstring given in full)."""
    formatter = argparse.RawDescriptionHelpFormatter if whole else argparse.HelpFormatter
    parser = argparse.ArgumentParser(description=description, formatter_class=formatter)
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick)
    if output_flag is not None:
        parser.add_argument(output_flag, dest="output", type=Path, default=output, help=output_help)
    if seed:
        parser.add_argument("--seed", type=int, default=0, help="the seed (default 0)")
    if threads is not False:
        help = f"torch threads (default {threads})" if threads else "torch threads (default: torch's own)"
        parser.add_argument("--threads", type=int, default=threads, help=help)
    return parser


def output_path(args: argparse.Namespace, name: str, *, quick: bool = False) -> Path | None:
    """Where a run writes its record: `--output` where given, else nothing for a smoke test (`quick`), else
    `results_path(name)`."""
    if args.output is not None:
        return args.output
    return None if quick else results_path(name)
