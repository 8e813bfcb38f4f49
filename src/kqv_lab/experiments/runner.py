"""Run an experiment and write what it found: DIR/NAME/results.json, the PNG plots and report.md.

results.json holds the config, the seeds, every measured number (`results`, per seed), the table, the checks and
the verdict derived from them (each check with the intervals behind its figure as numbers, and for an inconclusive
one how many seeds would decide it: `statistics.judge`), the plots' file names, the command that produced it and
its date, the wall time, library versions and the machine (`kqv_lab.measuring`, as the benchmarks record it: CPU model,
flags and cores, torch threads, GPUs, the load average before and after: timings taken on a loaded machine are
upper bounds), and its provenance (`kqv_lab.experiments.provenance`): the git commit and
whether the tree was dirty, torch, the CPU model and flags, and `code`, the hash of the modules the experiment ran,
which the test suite compares with today's code. A `--quick` run is a smoke test of the code, not a test of the
claim: its record says so in `smoke_test`, and its report and summary line say so first.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shlex
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from kqv.nn import Accelerator

from .. import measuring
from . import get
from .base import TRAINING_DEVICE, Check, Experiment, ExperimentError, Progress, verdict
from .provenance import code_hash, provenance
from .records import load_record, write_record
from .reproduction import quick_fingerprint
from .statistics import judge

SMOKE_TEST = "smoke test (--quick): checks the code runs end to end; not a test of the claim"
LIBRARIES = ("kqv", "torch", "numpy", "scipy", "matplotlib", "tokenizers", "sacrebleu", "tqdm")


def run_experiment(
    name: str,
    *,
    quick: bool = False,
    seeds: int | None = None,
    out: str | Path = "experiments",
    overrides: Sequence[str] = (),
    threads: int = 1,
    progress: bool = True,
    device: str = "cpu",
    position: tuple[int, int] | None = None,
    share: tuple[float, float] = (0.0, 1.0),
) -> dict[str, Any]:
    """Run experiment `name` and write its results; returns the results.json record.

    `seeds` overrides the config's number of seeds (seeds are 0 .. seeds - 1); `overrides` are `field=value`
    changes to the config; `threads` is torch's thread count during the run (1 keeps runs comparable on a
    shared machine); `device` is where its models train (`TRAINING_DEVICE`; the CPU by default); `position` and
    `share` place it within a run of several (see `base.Progress`)."""
    experiment = get(name)
    if seeds is not None:
        overrides = [*overrides, f"seeds={seeds}"]
    config = experiment.config(quick, overrides)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ExperimentError(f"threads must be a positive integer, got {threads!r}")
    Accelerator.resolve(device)  # a device this machine lacks is refused before anything runs
    directory = Path(out) / name
    directory.mkdir(parents=True, exist_ok=True)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    training_device = TRAINING_DEVICE.set(device)
    load_before, started = measuring.load_average(), time.perf_counter()
    bar = Progress(name, enabled=progress, position=position, share=share)
    try:
        results = experiment.run(config, list(range(config.seeds)), bar)
    finally:
        bar.close()
        torch.set_num_threads(previous_threads)
        TRAINING_DEVICE.reset(training_device)
    seconds = time.perf_counter() - started
    # a full run vouches for its numbers with its quick size's (kqv_lab.experiments.reproduction), taken after
    # its timing
    quick_numbers = None if quick else {**quick_fingerprint(name), "made_at_commit": measuring.git_state()["commit"]}
    return write_results(
        experiment,
        config,
        results,
        directory,
        quick=quick,
        seconds=seconds,
        threads=threads,
        load=(load_before, measuring.load_average()),
        command=command_line(name, quick, overrides, out, threads, device),
        fingerprint=quick_numbers,
    )


def write_results(
    experiment: Experiment,
    config: Any,
    results: dict[str, Any],
    directory: Path,
    *,
    quick: bool,
    seconds: float,
    threads: int,
    load: tuple,
    command: str,
    fingerprint: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Derive the checks, verdict, table and plots from `results` and write results.json and report.md;
    `fingerprint`: the quick size's fingerprint, made by the same code (`reproduction.quick_fingerprint`)."""
    missing = [key for key in experiment.fields if key not in results]
    if missing:
        raise RuntimeError(f"experiment {experiment.name} measured no {missing}: its run() breaks its contract")
    checks = judge(experiment.checks, results)
    columns, rows = experiment.table(results)
    plots = [Path(p).name for p in experiment.plots(results, directory)]
    record = {
        "experiment": experiment.name,
        "claim": experiment.claim,
        "lecture": experiment.lecture,
        "quick": quick,
        "smoke_test": SMOKE_TEST if quick else None,
        "command": command,
        "date": time.strftime(measuring.DATE_FORMAT),
        "config": dataclasses.asdict(config),
        "seeds": list(range(config.seeds)),
        "method": experiment.method(config),
        "results": results,
        "table": {"columns": columns, "rows": rows},
        "checks": [dataclasses.asdict(c) for c in checks],
        "verdict": verdict(checks),
        "plots": plots,
        "seconds": round(seconds, 3),
        "versions": library_versions(),
        "machine": machine(threads, load),
        "provenance": provenance(),
        "code": {
            **code_hash(experiment.module),
            "recorded": "when it ran",
            **({"quick": fingerprint} if fingerprint is not None else {}),
        },
    }
    write_record(directory, record)
    return record


def rejudge(directory: str | Path, *, plots: bool = False) -> dict[str, Any]:
    """Recompute the table, checks and verdict of a stored run from its per-seed numbers (no rerun) with today's
    checks, and rewrite its results.json and report.md (and its plots when `plots`). For fixing how a verdict
    is reached or presented (the checks' intervals and `to_decide`); measured numbers never change here: only
    `table`, `checks`, `verdict`, `rejudged` (and `plots`, `smoke_test` when absent) are written."""
    directory = Path(directory)
    record = load_record(directory)
    experiment = get(record["experiment"])
    checks = judge(experiment.checks, record["results"])
    columns, rows = experiment.table(record["results"])
    record.update(
        table={"columns": columns, "rows": rows},
        checks=[dataclasses.asdict(c) for c in checks],
        verdict=verdict(checks),
    )
    record.setdefault("smoke_test", SMOKE_TEST if record["quick"] else None)
    record["rejudged"] = {
        "at_commit": measuring.git_state()["commit"],
        "note": "table, checks and verdict recomputed from the stored numbers with the checks of this commit",
    }
    if plots:
        record["plots"] = [Path(p).name for p in experiment.plots(record["results"], directory)]
    write_record(directory, record)
    return record


def checks_from_record(record: dict[str, Any]) -> list[Check]:
    """The checks an experiment derives from the numbers of a results.json record, with the intervals behind them
    (`statistics.judge`; for tests and readers)."""
    return judge(get(record["experiment"]).checks, record["results"])


def expected_minutes(name: str, quick: bool) -> float:
    """The minutes experiment `name` is expected to take here, to weight a run of several's progress: from
    `QUICK_MINUTES` or `FULL_MINUTES`, shipped with the package (nothing is read from a source checkout)."""
    return QUICK_MINUTES.get(name, 0.3) if quick else FULL_MINUTES.get(name, 30.0)


# minutes each --quick run took on this project's 2-core machine, shared (measured 2026-11-24; they only weight the
# progress of `run all --quick`; an experiment not listed counts as 0.3)
QUICK_MINUTES = {
    "parallelism": 0.01,
    "scaling": 0.30,
    "no-causal-mask": 0.22,
    "no-positions": 0.07,
    "no-query-key-maps": 0.04,
    "heads": 0.04,
    "depth-without-residuals": 0.11,
    "rnn-vs-transformer": 0.71,
    "position-extrapolation": 0.05,
    "norm-placement": 0.06,
    "modifications": 0.06,
    "scaling-laws": 0.08,
    "long-attention": 0.46,
    # the lecture's own claims, measured 2026-11-24 on the idle machine (each 2 s or less; 0.01 is the floor here)
    "quadratic-cost": 0.01,
    "rnn-interaction-distance": 0.01,
    "ffn-needed": 0.03,
    "multihead-cost": 0.01,
    "scaling-head-dim": 0.01,
}

# minutes each full run took, as its committed results.json (docs/experiments/NAME) says (they only weight the progress
# of `run all`; tests/test_experiments.py checks them against the records; one not listed counts as 30)
FULL_MINUTES = {
    "depth-without-residuals": 2.08,
    "ffn-needed": 1.11,
    "heads": 1.8,
    "long-attention": 2.84,
    "modifications": 3.48,
    "multihead-cost": 1.1,
    "no-causal-mask": 0.99,
    "no-positions": 4.22,
    "no-query-key-maps": 0.83,
    "norm-placement": 9.91,
    "parallelism": 3.11,
    "position-extrapolation": 3.84,
    "quadratic-cost": 1.66,
    "rnn-interaction-distance": 3.47,
    "rnn-vs-transformer": 16.65,
    "scaling-head-dim": 0.03,
    "scaling-laws": 27.02,
    "scaling": 7.76,
}


def command_line(
    name: str, quick: bool, overrides: Sequence[str], out: str | Path, threads: int, device: str = "cpu"
) -> str:
    words = ["kqv", "experiment", "run", name] + (["--quick"] if quick else [])
    for override in overrides:
        words += ["--seeds", override.partition("=")[2]] if override.startswith("seeds=") else ["--set", override]
    words += ["--out", str(out)] + (["--threads", str(threads)] if threads != 1 else [])
    words += ["--device", device] if device != "cpu" else []
    return shlex.join(words)


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def machine(threads: int, load: tuple) -> dict[str, Any]:
    """The machine a run measured on (`kqv_lab.measuring.machine`, with the threads it ran with), the load average
    before and after it, and `cpus`, its cores under the name the reports read."""
    before, after = load
    return {
        **measuring.machine(threads),
        "cpus": os.cpu_count(),
        "load_average_before": before,
        "load_average_after": after,
        "note": "timings are upper bounds when the load average exceeds the number of cpus",
    }
