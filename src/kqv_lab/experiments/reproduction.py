"""Whether a committed result still describes today's code: the quick-size fingerprint that lets a refactor keep it.

A committed results.json records the hash of the code it ran (`provenance.code_hash`) and the full config it ran
with. A change of that code would make the result stale until rerun, even when the change computes exactly the
same numbers (a host sync removed, state moved between modules): hours of reruns for no new number. So a result
also records a *fingerprint*: numbers of the experiment's quick size that the code which made the result computed,
kept only when they mean something on any machine:

* **the same on every CPU kind**: the quick run is repeated under each of torch's CPU kernel sets
  (`KERNEL_SETS`: `ATEN_CPU_CAPABILITY` default / avx2 / avx512, with oneDNN and MKL capped alike), and a number
  is kept only if every set reproduces it within `RTOL / MARGIN`. A training run that diverges amplifies the last
  bit of a kernel's rounding far past any tolerance; such numbers drop out because they were measured to move;
* **computed**: the quick run is repeated with other seeds, and a number is kept only if it moves with the seed.
  Echoes of the config, parameter and FLOP counts, ratios fixed by construction and accuracies stuck at a constant
  do not move, vouch for nothing, and drop out;
* timings (keys that name a time) and whatever a wall-clock-budgeted experiment trains (`WALL_CLOCK`) never count.

A result stands when its code hash is today's, or when today's quick run reproduces every fingerprinted number
within `RTOL`, and in both cases only while its recorded config is what today's `FULL` (with the recorded
command's overrides) gives, and only while its fingerprint holds a number: a fingerprint that is missing, empty
(nothing it could vouch for) or made by an older rule leaves the result standing on nothing: rerun. A timing
cannot be fingerprinted: a result of a `TIMED` experiment stands only on its own code hash and names its CPU.
`made_at_commit` names the commit whose code made the fingerprint
(`add_fingerprint(directory, commit=...)` makes one in a temporary worktree of a commit in the history of the
repository that holds `directory`, after checking that commit's code hash is the record's). The fingerprint is a
smoke-size proof that the code computes what it computed, not a rerun of the claim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kqv.errors import COMMIT, RUN_EXPERIMENT, option

from .provenance import SOURCE_ROOT, TIMED, timing_change

# keys that hold a time or a speed: never part of a fingerprint, even when two runs happen to agree
TIMING = re.compile(
    r"(^|[/_ ])(ms|seconds|times|minutes|peak_mb|peak_rss_mb|peak_memory_mb|mfu|wall|threads|tokens_per_s)($|[/_ \[])"
)
# experiments that train for a wall-clock budget: how far they get depends on the machine's load, so nothing they
# compute can be fingerprinted (seen: 6 updates twice, then 7)
WALL_CLOCK = {"rnn-vs-transformer"}
RTOL, ATOL = 1e-3, 1e-6  # today's quick run must reproduce each fingerprinted number this closely
MARGIN = 10  # ... and every kernel set must have agreed on it ten times more closely when it was fingerprinted
RULE = 2  # the fingerprint rule: 1 = two runs on one machine (pre-2026-11-26), 2 = kernel sets and seeds
SEED_SHIFT = 1000  # the other seeds: 1000, 1001, ... instead of 0, 1, ...

# torch's CPU kernel sets, as other CPU kinds would pick them: ATen's vectorised kernels by ATEN_CPU_CAPABILITY,
# oneDNN's by ONEDNN_MAX_CPU_ISA, MKL's by MKL_ENABLE_INSTRUCTIONS (a set the CPU lacks falls back to what it has)
KERNEL_SETS: dict[str, dict[str, str]] = {
    "default": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512"},
}

# what a fingerprint process runs: the quick size of one experiment with the given first seed, one thread, its
# results as JSON. Written against the experiment contract alone, so it runs on the code of any commit (whose
# experiments are the package `experiments_package` names)
_WORKER = """
import importlib, json, sys, torch
name, first, out, experiments = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
get, Progress = importlib.import_module(experiments).get, importlib.import_module(experiments + ".base").Progress
torch.set_num_threads(1)
experiment = get(name)
seeds = list(range(first, first + experiment.quick.seeds))
results = experiment.run(experiment.quick, seeds, Progress(name, enabled=False))
tolist = lambda value: value.tolist() if isinstance(value, torch.Tensor) else str(value)
with open(out, "w", encoding="utf-8") as f:
    json.dump({"results": results, "capability": torch.backends.cpu.get_cpu_capability()}, f, default=tolist)
"""


def experiments_package(imports: Path) -> str:
    """The experiments' package in the source folder `imports` (a src/): kqv_lab's, or in a tree from before kqv_lab
    was beside the library, kqv's."""
    return "kqv_lab.experiments" if (imports / "kqv_lab" / "experiments").is_dir() else "kqv.experiments"


def numbers(results: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every number in a `results` tree as ("/arms/1 head/val_loss[0]", value), timings left out."""
    if isinstance(results, dict):
        for key, value in results.items():
            yield from numbers(value, f"{prefix}/{key}")
    elif isinstance(results, list | tuple):
        for i, value in enumerate(results):
            yield from numbers(value, f"{prefix}[{i}]")
    elif isinstance(results, int | float) and not isinstance(results, bool) and not TIMING.search(prefix):
        yield prefix, float(results)


def close(a: float, b: float, rtol: float = RTOL) -> bool:
    return math.isclose(a, b, rel_tol=rtol, abs_tol=ATOL)


def fingerprint(
    name: str, by_kernels: dict[str, dict[str, Any]], other_seeds: dict[str, Any]
) -> tuple[dict[str, float], dict[str, int]]:
    """The numbers of `by_kernels` (kernel set -> quick results) that every kernel set agrees on within
    RTOL / MARGIN and that `other_seeds` (the quick results with shifted seeds) does not reproduce; and how many
    numbers were dropped for each reason."""
    runs = [dict(numbers(results)) for results in by_kernels.values()]
    moved = dict(numbers(other_seeds))
    reasons = ("not finite", "trained for a wall-clock budget", "kernel-sensitive", "the same with other seeds")
    kept, dropped = {}, dict.fromkeys(reasons, 0)
    for key, value in runs[0].items():
        if not all(math.isfinite(run.get(key, math.nan)) for run in runs):
            dropped["not finite"] += 1
        elif name in WALL_CLOCK:
            dropped["trained for a wall-clock budget"] += 1
        elif not all(close(run[key], value, RTOL / MARGIN) for run in runs[1:]):
            dropped["kernel-sensitive"] += 1
        elif key in moved and close(moved[key], value, RTOL):
            dropped["the same with other seeds"] += 1
        else:
            kept[key] = value
    return kept, dropped


def differences(expected: dict[str, float], results: dict[str, Any]) -> list[str]:
    """The fingerprinted numbers that `results` (today's quick run) does not reproduce, as readable lines."""
    found = dict(numbers(results))
    off = []
    for key, value in expected.items():
        if key not in found:
            off.append(f"{key}: missing (was {value:g})")
        elif not close(found[key], value):
            off.append(f"{key}: {found[key]:g} (was {value:g})")
    return off


def recorded_overrides(command: str) -> list[str]:
    """The `field=value` overrides a recorded `kqv experiment run` command made (--seeds N is seeds=N)."""
    words, overrides = shlex.split(command), []
    for flag, value in zip(words, words[1:], strict=False):
        if flag == "--seeds":
            overrides.append(f"seeds={value}")
        elif flag == "--set":
            overrides.append(value)
    return overrides


def config_change(record: dict[str, Any], experiment: Any) -> str | None:
    """Why today's config for the run `record` describes is not the one it ran with (None: the same); `experiment`
    is today's `base.Experiment`. A full run is compared with today's FULL plus the recorded overrides."""
    try:
        today = experiment.config(bool(record.get("quick")), recorded_overrides(record.get("command", "")))
    except ValueError as error:
        return f"the overrides it ran with no longer apply ({error})"
    today = json.loads(json.dumps(dataclasses.asdict(today)))
    recorded = record.get("config") or {}
    changed = sorted(k for k in today.keys() | recorded.keys() if today.get(k) != recorded.get(k))
    if not changed:
        return None
    shown = ", ".join(f"{k}: {recorded.get(k)!r} -> {today.get(k)!r}" for k in changed[:3])
    return f"today's {'QUICK' if record.get('quick') else 'FULL'} config differs from the one it ran with ({shown})"


def standing(
    record: dict[str, Any], today_hash: str, quick_results: dict[str, Any] | None, experiment: Any = None
) -> str | None:
    """None when a committed `record` describes today's code (same config, and a fingerprint of computed numbers
    with the same hash or reproduced by `quick_results`, today's quick run; for a `TIMED` experiment, the same hash
    and a named CPU); otherwise why it is stale, in one line. `experiment`
    (today's `base.Experiment`) is needed to compare configs; without it the config is not compared."""
    if experiment is not None and (changed := config_change(record, experiment)):
        return changed
    code = record.get("code") or {}
    if record.get("experiment") in TIMED:
        return timing_change(record, today_hash)
    quick = code.get("quick") or {}
    if quick.get("rule") != RULE:
        return "its fingerprint is missing or was made by an older rule that does not hold on every CPU"
    if not quick.get("numbers"):
        return (
            "its fingerprint vouches for nothing (no number of its quick run is both the same on every CPU kernel "
            "set and moved by the seed)"
        )
    if code.get("hash") == today_hash:
        return None
    if quick_results is None:
        return "its code changed; no quick run of today's code was given to compare its fingerprint with"
    off = differences(quick["numbers"], quick_results)
    if off:
        shown = "; ".join(off[:3]) + (f"; and {len(off) - 3} more" if len(off) > 3 else "")
        return f"its code changed and today's quick run differs from its fingerprint in {len(off)} numbers: {shown}"
    return None


def quick_run(name: str, imports: Path, first_seed: int, env: dict[str, str], scratch: Path) -> dict[str, Any]:
    """Experiment `name`'s quick results, run in a fresh process (in `scratch`) on the kqv package found in
    `imports` (the folder that holds it: a source tree's src/) with `env` added to the environment and seeds
    `first_seed`, `first_seed + 1`, ...; also the capability it ran."""
    out = scratch / f"{name}-{first_seed}-{len(env)}-{'-'.join(env.values())}.json"
    environment = {**os.environ, **env, "PYTHONPATH": str(imports), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, name, str(first_seed), str(out), experiments_package(imports)],
        env=environment,
        cwd=scratch,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        from .base import ExperimentError

        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise ExperimentError(f"{name}: its quick run under {env or 'the native kernels'} failed: {tail[0]}")
    return json.loads(out.read_text(encoding="utf-8"))


def quick_fingerprint(name: str, source: str | Path | None = None) -> dict[str, Any]:
    """Experiment `name`'s fingerprint (`code.quick` of results.json), made with the code of `source` (a kqv
    source tree, its src/; by default the kqv package running now, wherever it is installed): its quick size under
    every kernel set, and once more with other seeds."""
    imports = Path(source) / "src" if source is not None else SOURCE_ROOT
    with tempfile.TemporaryDirectory(prefix="kqv-fingerprint-") as scratch:
        runs = {label: quick_run(name, imports, 0, env, Path(scratch)) for label, env in KERNEL_SETS.items()}
        shifted = quick_run(name, imports, SEED_SHIFT, {}, Path(scratch))
    kept, dropped = fingerprint(name, {k: r["results"] for k, r in runs.items()}, shifted["results"])
    return {
        "rule": RULE,
        "numbers": kept,
        "dropped": dropped,
        "kernel_sets": {label: run["capability"] for label, run in runs.items()},
        "rtol": RTOL,
        "agreement": RTOL / MARGIN,
    }


def add_fingerprint(directory: str | Path, commit: str | None = None) -> dict[str, Any]:
    """Fingerprint the committed run in `directory` (DIR/NAME) and store it in its results.json, under
    `code.quick`. The fingerprint is made by the code that made the run: today's (refused unless its hash is the
    record's), or that of `commit`, a commit of this repository whose code hash is the record's, checked out in
    a temporary worktree."""
    from .. import experiments
    from ..measuring import git_state
    from .base import ExperimentError
    from .provenance import code_hash
    from .records import RESULTS_FILE, load_record, write_record

    record = load_record(directory)
    name = record["experiment"]
    rerun = f"rerun it: {option(RUN_EXPERIMENT, name=name, out=str(Path(directory).parent))}"
    if commit is None:
        if (record.get("code") or {}).get("hash") != code_hash(experiments.get(name).module)["hash"]:
            raise ExperimentError(
                f"{name}: its code changed since {Path(directory) / RESULTS_FILE} was made, so today's code cannot "
                f"vouch for its numbers; give the commit whose code made it ({option(COMMIT)}), or {rerun}"
            )
        record["code"]["quick"] = {**quick_fingerprint(name), "made_at_commit": git_state()["commit"]}
    else:
        with _worktree(commit, Path(directory)) as (source, full_commit):
            if _hash_at(source, name) != (record.get("code") or {}).get("hash"):
                raise ExperimentError(f"{name}: the code of commit {commit} is not the code that made it; {rerun}")
            record["code"]["quick"] = {**quick_fingerprint(name, source), "made_at_commit": full_commit}
    write_record(Path(directory), record)
    return record


def _hash_at(source: Path, name: str) -> str:
    """Experiment `name`'s code hash in the source tree `source`, by that tree's own rule."""
    experiments = experiments_package(source / "src")
    program = f"import sys; from {experiments} import get; from {experiments}.provenance import code_hash; "
    program += "print(code_hash(get(sys.argv[1]).module)['hash'])"
    environment = {**os.environ, "PYTHONPATH": str(source / "src")}
    done = subprocess.run(
        [sys.executable, "-c", program, name], env=environment, cwd=source, capture_output=True, text=True
    )
    return done.stdout.strip()


@contextlib.contextmanager
def _worktree(commit: str, inside: Path) -> Iterator[tuple[Path, str]]:
    """A temporary git worktree of `commit` of the repository that holds the folder `inside` (the committed run's):
    (its path, the full hash)."""
    repository = inside.resolve()

    def git(*args: str) -> str:
        from .base import ExperimentError

        done = subprocess.run(["git", *args], cwd=repository, capture_output=True, text=True)
        if done.returncode != 0:
            raise ExperimentError(f"git {' '.join(args)}: {done.stderr.strip() or 'failed'}")
        return done.stdout.strip()

    full = git("rev-parse", "--verify", f"{commit}^{{commit}}")
    with tempfile.TemporaryDirectory(prefix="kqv-worktree-") as scratch:
        path = Path(scratch) / "tree"
        git("worktree", "add", "--detach", str(path), full)
        try:
            yield path, full
        finally:
            git("worktree", "remove", "--force", str(path))
