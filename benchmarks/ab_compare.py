#!/usr/bin/env python
"""One benchmark, run on today's code and on an older commit's, alternately, in one run: the ratio new / old.

A speed claim about a change ("no slower than before") needs both sides measured on the same machine in the same
minutes: this checks out `--base` (a commit) as a git worktree, then runs the benchmark command `--rounds` times
on each tree, alternating which goes first, each time as a fresh `python` whose `PYTHONPATH` is that tree's
`src/` (the benchmark script itself is always today's, so both sides are measured the same way; it records
through `kqv_lab.measuring`, which a base from before that module lacks: the base's scratch checkout then gets
today's copy, which nothing measured imports). `{out}` in the
command is replaced by a JSON path per run; every number in those JSONs whose path matches `--metric` (a regular
expression, default `/tokens_per_s$`) is compared: the median over rounds on each side and their ratio.

    python benchmarks/ab_compare.py --base cd3eb51 --name trainer -- benchmarks/trainer_throughput.py --output {out}
    python benchmarks/ab_compare.py --base cd3eb51 --name train --metric '/rows\\[\\d+\\]/tokens_per_s' -- \\
        benchmarks/train_throughput.py --models kqv,hf --output {out}

Writes benchmarks/results/ab_NAME.json (both sides per round, the machine, the commands) and prints a table.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
from kqv.nn import environment


def numbers(tree: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every number of a JSON tree as ("/rows[0]/tokens_per_s", value)."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from numbers(value, f"{prefix}/{key}")
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from numbers(value, f"{prefix}[{i}]")
    elif isinstance(tree, int | float) and not isinstance(tree, bool):
        yield prefix, float(tree)


def run_once(src: Path, command: list[str], scratch: Path, label: str) -> dict:
    """Run `command` with kqv imported from `src`; return the JSON it wrote to {out}."""
    out = scratch / f"{label}.json"
    argv = [sys.executable, *(part.replace("{out}", str(out)) for part in command)]
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(argv, cwd=harness.ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        sys.exit(f"{label}: the benchmark failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return json.loads(out.read_text())


def compare(runs: dict[str, list[dict]], metric: re.Pattern) -> list[dict]:
    """Per matching number: the median over rounds on each side, and new / old."""
    rows = []
    keys = [key for key, _ in numbers(runs["new"][0]) if metric.search(key)]
    for key in keys:
        medians = {}
        for side, records in runs.items():
            medians[side] = statistics.median(dict(numbers(r)).get(key, float("nan")) for r in records)
        rows.append(
            {
                "metric": key,
                "old": medians["old"],
                "new": medians["new"],
                "new_over_old": medians["new"] / medians["old"],
            }
        )
    return rows


def lend_measuring(tree: Path) -> bool:
    """Give the checkout `tree` today's `kqv_lab/measuring.py` when it has none (a base from before it), so that
    today's benchmark scripts record there as here; True when it was copied."""
    target = tree / "src" / "kqv_lab" / "measuring.py"
    if target.exists():
        return False
    target.parent.mkdir(exist_ok=True)
    (target.parent / "__init__.py").touch()
    shutil.copyfile(harness.ROOT / "src" / "kqv_lab" / "measuring.py", target)
    return True


def cpu() -> str:
    """The CPU model and the flags that decide its kernels (kqv.nn.environment.cpu)."""
    found = environment.cpu()
    return f"{found['model']} ({', '.join(found['flags'])})"


def main() -> int:
    parser = harness.arguments(
        __doc__.splitlines()[0], output_help="JSON path (default benchmarks/results/ab_NAME.json)"
    )
    parser.add_argument("--base", required=True, help="the older commit (anything git rev-parse takes)")
    parser.add_argument("--name", required=True, help="names the result file: benchmarks/results/ab_NAME.json")
    parser.add_argument("--rounds", type=int, default=3, help="runs per side, alternating (default 3)")
    parser.add_argument(
        "--metric",
        default=r"/tokens_per_s$",
        help="regular expression over JSON paths to compare (default: /tokens_per_s at the end)",
    )
    parser.add_argument("command", nargs="...", help="-- SCRIPT ARGS..., with {out} for its JSON path")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not any("{out}" in part for part in command):
        parser.error("give the benchmark after --, with {out} where its JSON output path goes")
    base = subprocess.run(["git", "rev-parse", args.base], cwd=harness.ROOT, capture_output=True, text=True)
    if base.returncode != 0:
        parser.error(f"--base {args.base!r} is not a commit here")
    base_commit = base.stdout.strip()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=harness.ROOT, capture_output=True, text=True).stdout.strip()
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="kqv-ab-") as scratch:
        old_tree = Path(scratch) / "old"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(old_tree), base_commit], cwd=harness.ROOT, check=True
        )
        try:
            lent = lend_measuring(old_tree)
            sources = {"old": old_tree / "src", "new": harness.ROOT / "src"}
            for k in range(args.rounds):
                for side in ("old", "new") if k % 2 == 0 else ("new", "old"):
                    runs[side].append(run_once(sources[side], command, Path(scratch), f"{side}{k}"))
                    print(f"round {k + 1}/{args.rounds}: {side} done", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old_tree)], cwd=harness.ROOT, check=False)
    rows = compare(runs, re.compile(args.metric))
    print(f"{cpu()}; old {base_commit[:10]}, new {head[:10]}; median of {args.rounds} alternating runs each")
    print("| metric | old | new | new / old |\n| --- | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['metric']} | {row['old']:,.1f} | {row['new']:,.1f} | {row['new_over_old']:.3f} |")
    output = args.output or harness.results_path(f"ab_{args.name}")
    output.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": "ab_compare",
        "name": args.name,
        "old_commit": base_commit,
        "new_commit": head,
        "command": " ".join(command),
        "rounds": args.rounds,
        "measuring_lent_to_old": lent,
        "machine": cpu(),
        "load_average_end": os.getloadavg(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rows": rows,
        "runs": runs,
    }
    harness.write_record(output, record)
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
