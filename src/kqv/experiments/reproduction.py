"""Whether a committed result still describes today's code: the quick-size fingerprint that lets a refactor keep it.

A committed results.json records the hash of the code it ran (`provenance.code_hash`). A change of that code used to
make the result stale until rerun, even when the change computes exactly the same numbers (a host sync removed,
state moved between modules): hours of reruns for no new number. So a result also records a *fingerprint*: the
numbers of the experiment's quick size, run twice by the same code that made the result, keeping only the numbers
that came out identical both times (timings, and everything trained for a wall-clock budget, differ between two
runs and drop out by themselves; keys that name a time drop out by name too).

When the code hash differs, the result stands if today's quick run reproduces every fingerprinted number within
`RTOL` (other CPU kinds round fp32 differently); one number off, or a fingerprint that is missing or empty, and
the result is stale: rerun it. The fingerprint is a smoke-size proof that the code computes what it computed,
not a rerun of the claim: what a full run measured on its machine (its timings above all) is still that run's.
"""

from __future__ import annotations

import math
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# keys that hold a time or a speed: never part of a fingerprint, even when two runs happen to agree
TIMING = re.compile(r"(^|[/_ ])(ms|seconds|times|minutes|peak_mb|peak_rss_mb|wall|threads|tokens_per_s)($|[/_ \[])")
# experiments that train for a wall-clock budget: how far they get depends on the machine's load, so two runs that
# agree may have agreed by chance (seen: 6 updates twice, then 7); only these numbers, fixed before training, count
WALL_CLOCK = {"rnn-vs-transformer": re.compile(r"/(parameters|beam_size|test_sentences)$")}
RTOL, ATOL = 1e-3, 1e-6  # fp32 kernels of other CPU kinds sum in other orders; a changed computation moves far more


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


def fingerprint(first: dict[str, Any], second: dict[str, Any]) -> dict[str, float]:
    """The numbers two quick runs of the same code agree on exactly (NaN and infinities left out)."""
    again = dict(numbers(second))
    return {key: value for key, value in numbers(first) if math.isfinite(value) and again.get(key) == value}


def differences(expected: dict[str, float], results: dict[str, Any]) -> list[str]:
    """The fingerprinted numbers that `results` (today's quick run) does not reproduce, as readable lines."""
    found = dict(numbers(results))
    off = []
    for key, value in expected.items():
        if key not in found:
            off.append(f"{key}: missing (was {value:g})")
        elif not math.isclose(found[key], value, rel_tol=RTOL, abs_tol=ATOL):
            off.append(f"{key}: {found[key]:g} (was {value:g})")
    return off


def standing(record: dict[str, Any], today_hash: str, quick_results: dict[str, Any] | None) -> str | None:
    """None when a committed `record` describes today's code (same hash, or its fingerprint reproduced by
    `quick_results`, today's quick run); otherwise why it is stale, in one line."""
    code = record.get("code") or {}
    if code.get("hash") == today_hash:
        return None
    quick = code.get("quick") or {}
    if not quick.get("numbers"):
        return "its code changed and it has no quick-size fingerprint to show the change computes the same numbers"
    if quick_results is None:
        return "its code changed; no quick run of today's code was given to compare its fingerprint with"
    off = differences(quick["numbers"], quick_results)
    if off:
        shown = "; ".join(off[:3]) + (f"; and {len(off) - 3} more" if len(off) > 3 else "")
        return f"its code changed and today's quick run differs from its fingerprint in {len(off)} numbers: {shown}"
    return None


def quick_fingerprint(name: str, runs: int = 2) -> dict[str, float]:
    """Run experiment `name`'s quick size `runs` times (1 thread, no progress) and fingerprint what agrees."""
    from .runner import run_experiment  # the runner records fingerprints itself: import here, not at the top

    with tempfile.TemporaryDirectory(prefix="kqv-fingerprint-") as scratch:
        results = [
            run_experiment(name, quick=True, out=Path(scratch) / str(k), progress=False)["results"] for k in range(runs)
        ]
    found = dict(numbers(results[0]))
    for other in results[1:]:
        found = {key: value for key, value in fingerprint(results[0], other).items() if key in found}
    return before_training(name, found)


def before_training(name: str, found: dict[str, float]) -> dict[str, float]:
    """`found` less what a wall-clock-budgeted experiment's training decides (`WALL_CLOCK`)."""
    fixed = WALL_CLOCK.get(name)
    return found if fixed is None else {key: value for key, value in found.items() if fixed.search(key)}


def add_fingerprint(directory: str | Path) -> dict[str, Any]:
    """Fingerprint the committed run in `directory` (DIR/NAME) with today's code and store it in its results.json,
    under `code.quick`. Refused unless today's code is the code that made the run: a fingerprint must come from
    the code whose numbers it vouches for."""
    from .. import experiments
    from .base import ExperimentError
    from .provenance import code_hash, git_state
    from .runner import RESULTS_FILE, load_record, write_record

    record = load_record(directory)
    name = record["experiment"]
    today = code_hash(experiments.get(name).module)["hash"]
    if (record.get("code") or {}).get("hash") != today:
        raise ExperimentError(
            f"{name}: its code changed since {Path(directory) / RESULTS_FILE} was made, so today's code cannot "
            f"vouch for its numbers; rerun it: `kqv experiment run {name} --out {Path(directory).parent}`"
        )
    record["code"]["quick"] = {
        "numbers": quick_fingerprint(name),
        "made_at_commit": git_state()["commit"],
        "rtol": RTOL,
    }
    write_record(Path(directory), record)
    return record
