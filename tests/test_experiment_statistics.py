"""The harness's statistics on constructed data (a clear effect holds, a null one is inconclusive, a reversed one
does not hold, a collapsed arm is inconclusive), the smoke-test label and the k/n counter of a quick run, and the
provenance of results: fields present, and committed results whose code has changed since they ran."""

import json
import math
import re
import warnings
from pathlib import Path

import pytest
from scipy import stats

from kqv.experiments import get, names
from kqv.experiments.base import FAILS, HOLDS, INCONCLUSIVE, Check, Progress, verdict
from kqv.experiments.provenance import code_files, code_hash, provenance
from kqv.experiments.runner import RESULTS_FILE, SMOKE_TEST
from kqv.experiments.statistics import (
    decide,
    interval_check,
    mean_interval,
    paired_difference,
    paired_ratio,
    ratio_interval,
)

ROOT = Path(__file__).resolve().parents[1]
SEEDS = 6
BASE = [2.10, 2.31, 1.95, 2.20, 2.05, 2.40]  # one arm's loss per seed: seeds differ far more than the effect


def _arm(shift: float, noise: float = 0.004) -> list[float]:
    """The base arm moved by `shift`, with a small per-seed wobble (paired: the seed effect cancels)."""
    return [b + shift + noise * (-1) ** i for i, b in enumerate(BASE)]


def test_interval_matches_the_student_t_interval_computed_independently():
    values = [0.008, 0.035, 0.021]
    low, high = stats.t.interval(0.95, len(values) - 1, loc=stats.tmean(values), scale=stats.sem(values))
    found = mean_interval(values)
    assert (found.low, found.high) == pytest.approx((low, high))
    assert math.isinf(mean_interval([1.0]).high), "one seed decides nothing"


def test_a_clear_effect_holds_a_null_one_is_inconclusive_a_reversed_one_does_not_hold():
    claim = lambda other: interval_check("worse", "> 0.02", paired_difference(other, BASE), 0.02).outcome
    assert claim(_arm(0.10)) == HOLDS
    assert claim(_arm(0.0, noise=0.05)) == INCONCLUSIVE
    assert claim(_arm(0.02, noise=0.01)) == INCONCLUSIVE, "an effect at the threshold is not decided"
    assert claim(_arm(-0.10)) == FAILS
    unpaired = mean_interval(_arm(0.10)).mean - mean_interval(BASE).mean
    assert unpaired == pytest.approx(0.10) and decide(paired_difference(_arm(0.10), BASE), 0.02) == HOLDS


def test_a_collapsed_arm_makes_the_check_inconclusive_whatever_the_interval():
    check = interval_check("better", "> 0", paired_difference(_arm(0.5), BASE), 0.0, failed_arm="arm at BLEU 0")
    assert check.outcome == INCONCLUSIVE and not check.holds and "arm at BLEU 0" in check.figure


def test_the_claimed_direction_may_be_below_the_threshold():
    faster = paired_difference([1.0, 1.1, 0.9, 1.05], [2.0, 2.1, 1.9, 2.0])
    assert decide(faster, 0.0, above=False) == HOLDS and decide(faster, 0.0, above=True) == FAILS


def test_ratios_of_timings_are_decided_by_their_repeats():
    slow, fast = [2.0, 2.1, 1.9, 2.05], [1.0, 1.05, 0.95, 1.0]
    assert decide(paired_ratio(slow, fast), 1.5) == HOLDS and decide(ratio_interval(slow, fast), 1.5) == HOLDS
    assert decide(paired_ratio(fast, slow), 1.0) == FAILS
    assert decide(ratio_interval([0.191, 0.190, 0.193], [0.192, 0.189, 0.194]), 1.0) == INCONCLUSIVE
    assert decide(ratio_interval([0.191], [0.192]), 1.0) == INCONCLUSIVE, "one timing decides nothing"


def test_verdict_reads_inconclusive_when_no_check_fails_but_one_is_undecided():
    yes, no, maybe = Check("a", "t", "1", True), Check("b", "t", "2", False), Check("c", "t", "3", False, INCONCLUSIVE)
    assert maybe.outcome == INCONCLUSIVE and not maybe.holds
    assert verdict([yes, maybe]) == "inconclusive" and verdict([maybe]) == "inconclusive"
    assert verdict([yes, no, maybe]) == "holds in part" and verdict([no, maybe]) == "does not hold here"
    assert verdict([yes, yes]) == "holds"


# ---------------------------------------------------------------------------------------------------------------
# The smoke-test label and the counter


def test_a_quick_run_is_labelled_a_smoke_test_everywhere_and_counts_k_of_n(tmp_path, capsys):
    from kqv.cli.main import main

    out = tmp_path / "runs"
    argv = ["experiment", "run", "no-causal-mask", "--quick", "--out", str(out), "--set", "steps=4"]
    assert main(argv + ["--set", "eval_every=4", "--set", "warmup_steps=1", "--seeds", "1"]) == 0
    captured = capsys.readouterr()
    assert SMOKE_TEST in captured.out and "[1/1] no-causal-mask: smoke test only" in captured.out
    assert re.search(r"kqv: \[1/1 \d+%\] no-causal-mask \d/\d running causal seed 0", captured.err)
    assert "kqv: [1/1 100%] no-causal-mask" in captured.err
    record = json.loads((out / "no-causal-mask" / RESULTS_FILE).read_text())
    assert record["quick"] is True and record["smoke_test"] == SMOKE_TEST
    report = (out / "no-causal-mask" / "report.md").read_text()
    assert report.startswith("# `no-causal-mask`: smoke test, not a test of the claim") and SMOKE_TEST in report
    assert {"commit", "dirty"} <= set(record["provenance"]["git"]) and record["provenance"]["torch"]
    assert {"model", "flags", "cores"} <= set(record["provenance"]["cpu"])
    assert record["machine"]["load_average_before"] is not None
    assert record["code"]["hash"] == code_hash("kqv.experiments.no_causal_mask")["hash"]


def test_progress_weights_each_experiment_by_its_share_of_the_work(capsys):
    bar = Progress("scaling", position=(3, 13), share=(0.25, 0.5))
    bar.plan(4)
    bar.step("one")
    assert bar.prefix() == "[3/13 38%] "  # 0.25 before it, a quarter of its own half done
    bar.start("two")
    assert "[3/13 38%] scaling 1/4 running two" in capsys.readouterr().err
    bar.close()


# ---------------------------------------------------------------------------------------------------------------
# Provenance: which code a result came from


def test_code_files_follow_the_imports_of_the_experiment_module():
    files = {p.as_posix() for p in code_files("kqv.experiments.scaling")}
    assert {"kqv/experiments/scaling.py", "kqv/experiments/lm.py", "kqv/nn/attention.py"} <= files
    assert "kqv/train/trainer.py" in files and "kqv/experiments/report.py" not in files
    assert "kqv/experiments/heads.py" not in files, "only what the experiment imports"
    assert provenance()["cpu"]["cores"] >= 1


def test_the_code_hash_follows_what_code_does_not_how_it_is_written():
    """A docstring, a comment or reformatting leaves results current; a changed line of code makes them stale."""
    from kqv.experiments.provenance import _normalised

    original = 'def f(x):\n    """Doubles."""\n    return x * 2\n'
    reworded = 'def f(x):  # a comment\n    """Twice x, said differently."""\n\n    return (x *\n            2)\n'
    changed = 'def f(x):\n    """Doubles."""\n    return x * 3\n'
    assert _normalised(original) == _normalised(reworded)
    assert _normalised(original) != _normalised(changed)
    assert _normalised('"""Only a docstring."""\n') == _normalised("pass\n")


def test_committed_results_were_made_by_todays_code():
    """A committed results.json that recorded the hash of the code it ran must match today's code: change the
    model, trainer or experiment and its results are stale until rerun. Results from before hashes were kept
    say so (`code.recorded`), with the commit they came from, and are listed here as a warning: failing on them
    would fail every checkout until hours of reruns are done."""
    unhashed = []
    for name in names():
        path = ROOT / "docs" / "experiments" / name / RESULTS_FILE
        if not path.is_file():
            continue
        record = json.loads(path.read_text())
        code = record.get("code") or {}
        if code.get("hash"):
            assert code["hash"] == code_hash(get(name).module)["hash"], (
                f"{name}: its code changed since docs/experiments/{name}/results.json was made: rerun "
                f"`kqv experiment run {name} --out docs/experiments`"
            )
        else:  # made before hashes were kept: listed, and due for a rerun
            unhashed.append(f"{name} ({code.get('recorded', 'no provenance')})")
    if unhashed:
        warnings.warn(
            f"results made before code hashes were kept (rerun to record one): {', '.join(unhashed)}", stacklevel=1
        )


def test_rejudge_recomputes_a_stored_verdict_from_its_numbers_without_changing_them(tmp_path, capsys):
    """`kqv experiment rejudge`: a stored run whose verdict was written by older checks is judged again by
    today's, from the same numbers."""
    import shutil

    from kqv.cli.main import main
    from kqv.experiments.runner import checks_from_record

    shutil.copytree(ROOT / "docs" / "experiments" / "scaling", tmp_path / "scaling")
    path = tmp_path / "scaling" / RESULTS_FILE
    stale = json.loads(path.read_text())
    stale["verdict"], stale["checks"] = "holds", []  # as an older harness might have judged it
    path.write_text(json.dumps(stale))
    assert main(["experiment", "rejudge", "all", "--dir", str(tmp_path)]) == 0
    record = json.loads(path.read_text())
    assert record["results"] == stale["results"], "re-judging never changes a measured number"
    assert record["verdict"] == verdict(checks_from_record(record)) == "holds in part"
    assert "scaling: holds in part" in capsys.readouterr().out
    assert "## Verdict: holds in part" in (tmp_path / "scaling" / "report.md").read_text()
    assert main(["experiment", "rejudge", "all", "--dir", str(tmp_path / "empty")]) == 2
