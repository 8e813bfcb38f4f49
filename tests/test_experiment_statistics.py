"""The harness's statistics on constructed data (a clear effect holds, a null one is inconclusive, a reversed one
does not hold, a collapsed arm is inconclusive), the smoke-test label and the k/n counter of a quick run, and the
provenance of results: fields present, and committed results whose code has changed since they ran."""

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
from scipy import stats

from kqv_lab.experiments import get, names
from kqv_lab.experiments.base import FAILS, HOLDS, INCONCLUSIVE, Check, Progress, verdict
from kqv_lab.experiments.provenance import code_files, code_hash, provenance
from kqv_lab.experiments.records import RESULTS_FILE
from kqv_lab.experiments.runner import SMOKE_TEST
from kqv_lab.experiments.statistics import (
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
    undecided = [c["what"] for c in record["checks"] if c["outcome"] == INCONCLUSIVE]
    assert undecided, "one seed decides no interval"
    assert all(f"  to decide *{what}*: " in captured.out for what in undecided)
    assert "one value gives no spread to project from: run at least 2" in captured.out
    report = (out / "no-causal-mask" / "report.md").read_text()
    assert report.startswith("# `no-causal-mask`: smoke test, not a test of the claim") and SMOKE_TEST in report
    assert {"commit", "dirty"} <= set(record["provenance"]["git"]) and record["provenance"]["torch"]
    assert {"model", "flags", "cores"} <= set(record["provenance"]["cpu"])
    assert record["machine"]["load_average_before"] is not None
    assert record["code"]["hash"] == code_hash("kqv_lab.experiments.no_causal_mask")["hash"]


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
    files = {p.as_posix() for p in code_files("kqv_lab.experiments.scaling")}
    assert {"kqv_lab/experiments/scaling.py", "kqv_lab/experiments/lm.py", "kqv/nn/attention.py"} <= files
    assert "kqv/train/trainer.py" in files and "kqv_lab/experiments/report.py" not in files
    assert "kqv_lab/experiments/heads.py" not in files, "only what the experiment imports"
    assert provenance()["cpu"]["cores"] >= 1


def test_code_files_follow_a_public_name_to_the_module_that_defines_it():
    """kqv_lab imports `from kqv.nn import DecoderLM`: the code it ran is kqv/nn/models.py, not every module the
    package's __init__ exports (nor, through `from .. import signals`, all of kqv)."""
    files = {p.as_posix() for p in code_files("kqv_lab.experiments.scaling")}
    assert "kqv/nn/models.py" in files and "kqv/train/config.py" in files
    assert not {"kqv/__init__.py", "kqv/nn/__init__.py", "kqv/train/__init__.py", "kqv/api.py"} & files
    assert not any(path.startswith("kqv/jobs/") for path in files), "the experiment trains no job"


def test_a_fingerprint_runs_the_experiments_of_the_tree_it_is_made_from(tmp_path):
    """A commit from before kqv_lab holds its experiments in kqv (`kqv experiment fingerprint --commit`)."""
    from kqv_lab.experiments.reproduction import experiments_package

    (tmp_path / "kqv" / "experiments").mkdir(parents=True)
    assert experiments_package(tmp_path) == "kqv.experiments"
    (tmp_path / "kqv_lab" / "experiments").mkdir(parents=True)
    assert experiments_package(tmp_path) == "kqv_lab.experiments"


def test_the_code_hash_follows_what_code_does_not_how_it_is_written():
    """A docstring, a comment or reformatting leaves results current; a changed line of code makes them stale."""
    from kqv_lab.experiments.provenance import _normalised

    original = 'def f(x):\n    """Doubles."""\n    return x * 2\n'
    reworded = 'def f(x):  # a comment\n    """Twice x, said differently."""\n\n    return (x *\n            2)\n'
    changed = 'def f(x):\n    """Doubles."""\n    return x * 3\n'
    assert _normalised(original) == _normalised(reworded)
    assert _normalised(original) != _normalised(changed)
    assert _normalised('"""Only a docstring."""\n') == _normalised("pass\n")


def test_the_code_hash_leaves_out_an_experiment_module_s_wording_and_judging():
    """Rewording the claim or rewriting `checks` keeps a result's hash (the verdict is recomputed from its numbers
    anyway); a change of `run` or of a helper it calls does not."""
    from kqv_lab.experiments.provenance import JUDGING, _normalised

    module = 'CLAIM = "x"\ndef run(c):\n    return 1\ndef checks(r):\n    return [r]\n'
    rejudged = 'CLAIM = "y"\nREVISIONS = ("z",)\ndef run(c):\n    return 1\ndef checks(r):\n    return []\n'
    rerun = 'CLAIM = "x"\ndef run(c):\n    return 2\ndef checks(r):\n    return [r]\n'
    assert _normalised(module, JUDGING) == _normalised(rejudged, JUDGING)
    assert _normalised(module, JUDGING) != _normalised(rerun, JUDGING)
    assert _normalised(module) != _normalised(rejudged), "other modules keep every line"


def test_a_fingerprint_keeps_what_every_kernel_set_computes_alike_and_the_seed_moves():
    """Kept: numbers every CPU kernel set agrees on within RTOL / MARGIN and that other seeds change. Dropped: a
    number that moves between kernel sets (a diverging run), a config echo or count the seed does not move, a
    timing, a non-finite number."""
    from kqv_lab.experiments.reproduction import MARGIN, RTOL, fingerprint, numbers

    def run(loss, diverging, **extra):
        return {"arms": {"a": {"val_loss": [loss, diverging], "seconds": [1.0]}}, "steps": 7, "x": math.nan, **extra}

    by_kernels = {"default": run(2.5, 3.19), "avx2": run(2.5 * (1 + RTOL / MARGIN / 2), 3.17), "avx512": run(2.5, 3.2)}
    assert dict(numbers(run(2.5, 3.0))).keys() == {"/arms/a/val_loss[0]", "/arms/a/val_loss[1]", "/steps", "/x"}
    kept, dropped = fingerprint("heads", by_kernels, run(2.7, 3.1))
    assert kept == {"/arms/a/val_loss[0]": 2.5}
    assert dropped == {
        "not finite": 1,
        "trained for a wall-clock budget": 0,
        "kernel-sensitive": 1,
        "the same with other seeds": 1,
    }
    apart = {**by_kernels, "avx2": run(2.5 * (1 + 2 * RTOL / MARGIN), 3.19)}
    assert fingerprint("heads", apart, run(2.7, 3.1))[0] == {}, "a number that moved between kernel sets is dropped"


def test_a_wall_clock_budgeted_experiment_fingerprints_nothing():
    """Two budgeted runs on a loaded machine once agreed on 6 updates by chance, and a third made 7."""
    from kqv_lab.experiments.reproduction import fingerprint

    runs = {"lstm": [{"steps": 6, "test_bleu": 0.03, "parameters": 270080}]}
    kept, dropped = fingerprint("rnn-vs-transformer", {"avx2": runs, "avx512": runs}, {"lstm": [{"steps": 7}]})
    assert kept == {} and dropped["trained for a wall-clock budget"] == 3


def test_a_changed_code_hash_stands_only_when_the_quick_run_reproduces_its_fingerprint():
    """The rule `test_committed_results_describe_todays_code` (tests/test_experiments.py) applies to every
    committed result: a fingerprint of the current rule that holds a number, and same hash or today's quick run
    reproducing it."""
    from kqv_lab.experiments.reproduction import RTOL, RULE, standing

    quick = {"arms": {"a": {"val_loss": [2.5, 2.25]}}, "steps": 7}
    record = {"code": {"hash": "old", "quick": {"rule": RULE, "numbers": {"/arms/a/val_loss[0]": 2.5}}}}
    assert standing(record, "old", None) is None, "the code that made it"
    assert standing(record, "new", quick) is None, "changed code that computes the same numbers"
    nudged = {"arms": {"a": {"val_loss": [2.5 * (1 + RTOL / 2), 2.25]}}}
    assert standing(record, "new", nudged) is None, "within the tolerance"
    moved = {"arms": {"a": {"val_loss": [2.5 * (1 + 2 * RTOL), 2.25]}}}
    assert "differs from its fingerprint in 1 numbers: /arms/a/val_loss[0]: 2.505 (was 2.5)" in standing(
        record, "new", moved
    )
    assert "missing" in standing(record, "new", {"arms": {"a": {"val_loss": []}}})
    older = {"code": {"hash": "old", "quick": {"numbers": {"/arms/a/val_loss[0]": 2.5}}}}
    assert "an older rule" in standing(older, "new", quick)
    assert "an older rule" in standing({"code": {"hash": "old"}}, "new", quick)
    empty = {"code": {"hash": "old", "quick": {"rule": RULE, "numbers": {}}}}
    assert "vouches for nothing" in standing(empty, "old", quick) and "vouches for nothing" in standing(
        empty, "new", quick
    )


@pytest.mark.parametrize("name", ["heads", "norm-placement"])
def test_a_committed_result_is_stale_once_today_s_full_config_differs_from_the_one_it_ran_with(name):
    """Even with its own code hash: a result describes the config it ran, not today's FULL."""
    from kqv_lab.experiments.reproduction import config_change, standing

    record = json.loads((ROOT / "docs" / "experiments" / name / RESULTS_FILE).read_text())
    experiment = get(name)
    assert config_change(record, experiment) is None, "the committed config is today's (with its command's --seeds)"
    changed = dataclasses.replace(experiment, full=dataclasses.replace(experiment.full, steps=50))
    stale = standing(record, record["code"]["hash"], None, changed)
    assert stale is not None and "FULL config differs" in stale and "steps" in stale


def test_a_fingerprint_is_refused_for_a_run_whose_code_changed_and_stored_for_one_whose_did_not(tmp_path, capsys):
    """`kqv experiment fingerprint`: only the code that made a run may vouch for its numbers; the fingerprint is
    made under every kernel set and with other seeds, and says what it dropped."""
    import shutil

    from kqv.cli.main import main
    from kqv_lab.experiments.reproduction import KERNEL_SETS, RULE

    shutil.copytree(ROOT / "docs" / "experiments" / "scaling-head-dim", tmp_path / "scaling-head-dim")
    path = tmp_path / "scaling-head-dim" / RESULTS_FILE
    record = json.loads(path.read_text())
    record["code"] = {"hash": "made by other code"}
    path.write_text(json.dumps(record))
    assert main(["experiment", "fingerprint", "scaling-head-dim", "--dir", str(tmp_path)]) != 0
    assert "give the commit whose code made it (--commit)" in capsys.readouterr().err
    assert json.loads(path.read_text())["code"] == {"hash": "made by other code"}, "nothing written"
    record["code"] = code_hash(get("scaling-head-dim").module)
    path.write_text(json.dumps(record))
    assert main(["experiment", "fingerprint", "scaling-head-dim", "--dir", str(tmp_path)]) == 0
    assert "quick-size numbers stored (dropped: " in capsys.readouterr().out
    stored = json.loads(path.read_text())
    assert stored["results"] == record["results"], "a fingerprint never changes a measured number"
    quick = stored["code"]["quick"]
    assert quick["rule"] == RULE and set(quick["kernel_sets"]) == set(KERNEL_SETS) and quick["made_at_commit"]
    assert quick["numbers"] and all(not key.endswith("ms") for key in quick["numbers"])
    assert main(["experiment", "fingerprint", "scaling-head-dim", "--dir", str(tmp_path), "--commit", "nope"]) != 0
    assert "nope" in capsys.readouterr().err
    numbers = stored["code"]["quick"]["numbers"]
    assert numbers and all(math.isfinite(v) for v in numbers.values())
    assert not any("seconds" in key or "/ms" in key for key in numbers)


def test_rejudge_recomputes_a_stored_verdict_from_its_numbers_without_changing_them(tmp_path, capsys):
    """`kqv experiment rejudge`: a stored run whose verdict was written by older checks is judged again by
    today's, from the same numbers."""
    import shutil

    from kqv.cli.main import main
    from kqv_lab.experiments.runner import checks_from_record

    shutil.copytree(ROOT / "docs" / "experiments" / "scaling", tmp_path / "scaling")
    path = tmp_path / "scaling" / RESULTS_FILE
    stale = json.loads(path.read_text())
    stale["verdict"], stale["checks"] = "holds", []  # as an older harness might have judged it
    path.write_text(json.dumps(stale))
    assert main(["experiment", "rejudge", "all", "--dir", str(tmp_path)]) == 0
    record = json.loads(path.read_text())
    assert record["results"] == stale["results"], "re-judging never changes a measured number"
    kept = set(stale) - {"table", "checks", "verdict", "rejudged"}
    assert {key: record[key] for key in kept} == {key: stale[key] for key in kept}, "only the judgement is rewritten"
    assert record["verdict"] == verdict(checks_from_record(record)) == "holds in part"
    assert "scaling: holds in part" in capsys.readouterr().out
    assert "## Verdict: holds in part" in (tmp_path / "scaling" / "report.md").read_text()
    assert main(["experiment", "rejudge", "all", "--dir", str(tmp_path / "empty")]) == 2


# ---------------------------------------------------------------------------------------------------------------
# The intervals as numbers, and how many seeds would decide an undecided check

INTERVAL_TEXT = re.compile(r"(?<![\w.+\-\[])[+-]?\d+(?:\.\d+)?x? \[[^\[\]]+\] \(n=\d+\)")


def _reference_n(gap: float, sd: float) -> int:
    """The fewest n whose 95% t interval around `gap` (sd / sqrt(n) its standard error) lies above 0: scipy's own
    interval, n by n."""
    n = 2
    while stats.t.interval(0.95, n - 1, loc=gap, scale=sd / math.sqrt(n))[0] <= 0:
        n += 1
    return n


def _sample(mean: float, sd: float, n: int) -> list[float]:
    """n values with exactly this mean and sample standard deviation."""
    z = [i - (n - 1) / 2 for i in range(n)]
    scale = sd / stats.tstd(z)
    return [mean + scale * v for v in z]


@pytest.mark.parametrize("gap, sd", [(1.0, 1.0), (0.0095, 0.0252), (2.287, 3.257), (0.5, 0.01), (0.3, 2.0)])
def test_seeds_needed_is_the_fewest_whose_t_interval_clears_the_threshold(gap, sd):
    from kqv_lab.experiments.statistics import units_to_clear

    assert units_to_clear(gap, sd) == _reference_n(gap, sd)
    assert units_to_clear(1.0, 1.0) == 7  # t(5) / sqrt(6) = 1.05 > 1 > t(6) / sqrt(7) = 0.92
    assert units_to_clear(-gap, sd) is None and units_to_clear(0.0, sd) is None and units_to_clear(gap, None) is None


def test_an_undecided_check_says_how_many_seeds_would_decide_it_which_way():
    """From 3 seeds of mean 0.05 and sd 0.04 against 0.02: at the n it names, values of the same mean and spread
    give an interval that clears 0.02, and at n - 1 they do not; a mean below the threshold cannot clear it."""
    from kqv_lab.experiments.statistics import judge, units_to_clear

    def checks(results):
        gap = mean_interval(results["gap"])
        return [interval_check("better", "> 0.02", gap, 0.02, detail="arms 2.10 and 2.05")]

    (check,) = judge(checks, {"gap": _sample(0.05, 0.04, 3)})
    assert check.outcome == INCONCLUSIVE
    n = check.to_decide["n"]
    assert check.to_decide == {"n": n, "now": 3, "as": HOLDS, "reason": ""} and n == _reference_n(0.03, 0.04)
    assert decide(mean_interval(_sample(0.05, 0.04, n)), 0.02) == HOLDS
    assert decide(mean_interval(_sample(0.05, 0.04, n - 1)), 0.02) == INCONCLUSIVE
    (entry,) = check.intervals
    assert entry["shown"] in check.figure and entry["n"] == 3 and entry["sd"] == pytest.approx(0.04)
    assert entry["judged"] == [
        {
            "threshold": 0.02,
            "claimed": "above",
            "outcome": INCONCLUSIVE,
            "to_decide": {"n": n, "as": HOLDS, "reason": ""},
        }
    ]
    (below,) = judge(checks, {"gap": _sample(0.015, 0.01, 3)})
    assert below.outcome == INCONCLUSIVE and below.to_decide["reason"].startswith("cannot clear")
    assert below.to_decide["as"] == FAILS and below.to_decide["n"] == units_to_clear(0.005, 0.01)
    collapsed = lambda results: [interval_check("b", "> 0.02", mean_interval(results), 0.02, failed_arm="BLEU 0")]
    (dead,) = judge(collapsed, _sample(0.05, 0.04, 3))
    assert dead.to_decide["n"] is None and "BLEU 0" in dead.to_decide["reason"], "seeds do not revive an arm"
    assert dead.intervals[0]["judged"][0]["failed_arm"] == "BLEU 0"


def test_judge_finds_each_decision_s_check_even_when_figures_share_an_interval_or_hide_one():
    """The shapes the experiments use: one interval judged by two checks against different bars (scaling-laws'
    alpha), several gaps against one bar of which the figure shows the worst (norm-placement), a band, a ratio."""
    from kqv_lab.experiments.statistics import decide_within, judge

    def checks(results):
        alpha = mean_interval(results["alpha"])
        fits = Check("fits", "> 0", f"alpha {alpha.text()}", False, decide(alpha, 0.0))
        gaps = [paired_difference(a, b) for a, b in results["pairs"]]
        small = [decide(gap, 0.1, above=False) for gap in gaps]
        worst = max(gaps, key=lambda gap: gap.mean)
        size = [decide(alpha, 0.1), decide(alpha, 0.2, above=False)]
        ratio = paired_ratio(results["slow"], results["fast"])
        return [
            fits,
            Check("sized", "0.1 < alpha < 0.2", f"alpha {alpha.text()}", False, FAILS if FAILS in size else HOLDS),
            Check("small", "< 0.1", f"worst {worst.text(2)}", False, FAILS if FAILS in small else HOLDS),
            Check("band", "[1.5, 2.5]", f"{ratio.text()}", False, decide_within(ratio, 1.5, 2.5)),
        ]

    results = {
        "alpha": [0.12, 0.15, 0.18],
        "pairs": [([1.0, 1.1, 0.9], [1.0, 1.05, 0.92]), ([1.3, 1.4, 1.2], [1.0, 1.0, 1.0])],
        "slow": [2.0, 2.1, 1.9],
        "fast": [1.0, 1.0, 1.0],
    }
    fits, sized, small, band = judge(checks, results)
    assert [j["threshold"] for e in fits.intervals for j in e["judged"]] == [0.0]
    assert [(j["threshold"], j["claimed"]) for e in sized.intervals for j in e["judged"]] == [
        (0.1, "above"),
        (0.2, "below"),
    ]
    assert [e["shown"] is not None for e in small.intervals] == [True, False], "the hidden gap is kept, unshown"
    assert small.intervals[0]["estimate"] == pytest.approx(0.3) and small.intervals[0]["digits"] == 2
    assert band.intervals[0]["judged"] == [{"band": [1.5, 2.5], "claimed": "within", "outcome": HOLDS}]
    assert band.intervals[0]["ratio"] and band.intervals[0]["sd"] > 0


def _committed_records():
    for name in names():
        path = ROOT / "docs" / "experiments" / name / RESULTS_FILE
        if path.is_file():
            yield json.loads(path.read_text())


def test_every_committed_check_stores_its_intervals_as_numbers_that_agree_with_its_figure():
    """Each interval a committed figure shows is stored as numbers that print as that text, each decision on it
    decides again to the stored outcome, and each inconclusive check says what would decide it."""
    from kqv_lab.experiments.statistics import decide_within, interval_from

    records = list(_committed_records())
    assert records, "no committed results"
    for record in records:
        for check in record["checks"]:
            where = f"{record['experiment']}: {check['what']}"
            shown = [e for e in check["intervals"] if e["shown"] is not None]
            assert [e["shown"] for e in shown] == INTERVAL_TEXT.findall(check["figure"]), where
            for entry in check["intervals"]:
                interval = interval_from(entry)
                assert entry["low"] <= entry["estimate"] <= entry["high"], where
                if entry["shown"] is not None:
                    assert interval.text(entry["digits"]) == entry["shown"], where
                for judged in entry["judged"]:
                    again = (
                        decide_within(interval, *judged["band"])
                        if judged["claimed"] == "within"
                        else decide(interval, judged["threshold"], above=judged["claimed"] == "above")
                    )
                    assert again == judged["outcome"], where
            assert (check["to_decide"] is not None) == (check["outcome"] == INCONCLUSIVE), where


def test_committed_checks_are_what_today_s_judging_makes_of_their_numbers():
    from kqv_lab.experiments.runner import checks_from_record

    for record in _committed_records():
        recomputed = json.loads(json.dumps([dataclasses.asdict(c) for c in checks_from_record(record)]))
        assert recomputed == record["checks"], (
            f"{record['experiment']}: run `kqv experiment rejudge {record['experiment']} --dir docs/experiments`"
        )


def test_the_gallery_and_reports_give_the_seeds_and_command_that_would_decide_each_inconclusive_check(tmp_path):
    from kqv_lab.experiments.gallery import gallery

    page = gallery(ROOT / "docs" / "experiments", tmp_path / "experiments.md")
    undecided = 0
    for record in _committed_records():
        report = (ROOT / "docs" / "experiments" / record["experiment"] / "report.md").read_text()
        for check in record["checks"]:
            if check["outcome"] != INCONCLUSIVE:
                continue
            undecided += 1
            plan = check["to_decide"]
            if plan["n"] is None:
                line = re.escape(f"- *{check['what']}*: {plan['reason']}")
            else:
                assert plan["now"] == record["config"]["seeds"], "every committed undecided interval is over seeds"
                gpu = record["seconds"] * plan["n"] / plan["now"] > 3600  # over an hour on its CPU: a GPU
                command = f"kqv experiment run {record['experiment']} --seeds {plan['n']} --out docs/experiments"
                said = f"{plan['n']} seeds (now {plan['now']}) would decide that it {plan['as']}"
                line = re.escape(f"{said}: `{command}{' --device cuda' if gpu else ''}` (about ")
                line += r"\d+\.\d h on the 2-core CPU it ran on; so on a GPU\)" if gpu else r"\d+ min on the 2-core CPU"
            assert re.search(line, page) and re.search(line, report), f"{record['experiment']}: {check['what']}"
    assert undecided >= 5


def test_a_deciding_run_of_timed_repeats_sets_the_repeats_and_keeps_the_other_options():
    from kqv_lab.experiments.report import deciding_runs

    plan = {"n": 40, "now": 5, "as": HOLDS, "reason": ""}
    check = {"what": "faster", "holds": False, "outcome": INCONCLUSIVE, "to_decide": plan}
    record = {
        "experiment": "long-attention",
        "command": "kqv experiment run long-attention --quick --set timing_repeats=5 --out runs",
        "config": {"seeds": 1, "timing_repeats": 5},
        "seconds": 600.0,
        "machine": {"cpus": 2},
        "checks": [check, {**check, "outcome": HOLDS}],
    }
    (line,) = deciding_runs(record)
    command = "kqv experiment run long-attention --quick --set timing_repeats=40 --out runs --device cuda"
    assert f"40 repeats (timing_repeats) (now 5) would decide that it holds: `{command}`" in line
    assert "about 1.3 h on the 2-core CPU it ran on; so on a GPU" in line
    record["config"]["timing_repeats"] = 7
    assert "counts neither the seeds nor the repeats" in deciding_runs(record)[0]


@pytest.mark.parametrize("kernels", ["default", "avx2"])
def test_a_committed_fingerprint_holds_under_other_cpu_kernels(kernels, tmp_path):
    """What another CPU kind would compute: norm-placement's quick run (whose diverging arm once moved a number by
    2e-3 between the AVX2 and AVX-512 kernels) in a process with torch's kernels capped to `kernels`, against its
    committed fingerprint, which keeps only what every kernel set computed alike."""
    from kqv_lab.experiments.reproduction import KERNEL_SETS, differences, quick_run

    record = json.loads((ROOT / "docs" / "experiments" / "norm-placement" / RESULTS_FILE).read_text())
    expected = record["code"]["quick"]["numbers"]
    run = quick_run("norm-placement", ROOT / "src", 0, KERNEL_SETS[kernels], tmp_path)
    assert run["capability"] == kernels.upper(), "the cap took effect"
    assert expected and differences(expected, run["results"]) == []


def test_the_shipped_full_minutes_weigh_every_committed_experiment_as_its_record_says():
    """A run of several weighs each experiment by its minutes, shipped with the package (`FULL_MINUTES`), not read
    from a checkout: every committed experiment has them, within a factor of two of what its record took."""
    from kqv_lab.experiments.runner import FULL_MINUTES, expected_minutes

    committed = {path.parent.name: path for path in (ROOT / "docs" / "experiments").glob(f"*/{RESULTS_FILE}")}
    assert committed and set(committed) <= set(FULL_MINUTES)
    for name, path in committed.items():
        minutes = json.loads(path.read_text())["seconds"] / 60
        assert minutes / 2 <= expected_minutes(name, quick=False) <= max(2 * minutes, 0.01), name
    assert expected_minutes("not-an-experiment", quick=False) == 30.0
