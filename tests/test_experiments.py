"""`kqv experiment`: the quick set end to end, each experiment's results against its own contract, the surgery
the experiments do on kqv's models against hand-written references, and bad input."""

import dataclasses
import json
import math
import os
import re
import statistics
from pathlib import Path

import pytest
import torch

import kqv
from conftest import tiny_config
from kqv.cli.main import main
from kqv.nn.cores import causal_mask
from kqv_lab.experiments import ablations, get, names
from kqv_lab.experiments.base import (
    INCONCLUSIVE,
    Check,
    ExperimentError,
    by_construction,
    control,
    verdict,
    with_overrides,
)
from kqv_lab.experiments.lm import head_statistics
from kqv_lab.experiments.records import REPORT_FILE, RESULTS_FILE
from kqv_lab.experiments.runner import checks_from_record

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory):
    """`kqv experiment run all --quick`, once for the module (the whole quick set: about two minutes)."""
    out = tmp_path_factory.mktemp("experiments")
    assert main(["experiment", "run", "all", "--quick", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.parametrize("name", names())
def test_quick_run_writes_results_plots_and_a_report_whose_verdict_its_numbers_imply(quick_runs, name):
    experiment = get(name)
    directory = quick_runs / name
    record = json.loads((directory / RESULTS_FILE).read_text())
    assert record["experiment"] == name and record["quick"] is True
    assert record["config"] == json.loads(json.dumps(dataclasses.asdict(experiment.quick)))
    assert set(experiment.fields) <= set(record["results"]), "results.json lacks fields the experiment declares"
    assert record["seeds"] == list(range(experiment.quick.seeds))
    assert {"torch", "numpy", "matplotlib", "python"} <= set(record["versions"])
    assert record["machine"]["cpus"] >= 1 and record["seconds"] > 0
    assert record["plots"], "an experiment draws at least one plot"
    for plot in record["plots"]:
        assert (directory / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    recomputed = checks_from_record(record)
    assert [dataclasses.asdict(c) for c in recomputed] == record["checks"]
    assert record["verdict"] == verdict(recomputed)
    report = (directory / REPORT_FILE).read_text()
    assert f"# `{name}`: smoke test, not a test of the claim (checks at quick size: {record['verdict']})" in report
    assert record["lecture"] in report and all(f"]({plot})" in report for plot in record["plots"])
    assert record["command"].startswith(f"kqv experiment run {name} --quick")


@pytest.mark.parametrize("name", names())
def test_committed_results_describe_todays_code(quick_runs, name):
    """A committed results.json must describe today's code and config: made with today's FULL config (and its
    command's overrides), and vouched for by a quick-size fingerprint of numbers it computed (non-empty), which
    today's quick run reproduces (kqv_lab.experiments.reproduction) on whatever CPU kernels this machine has, or
    today's code hash. A timing claim (reproduction.TIMED) cannot be fingerprinted: it names the CPU it was
    measured on, in its record, its report and the gallery, and stands only on today's hash; when the code it
    times changes, its report and the gallery must say it needs a rerun (until it is rerun, this test reads them)."""
    from kqv_lab.experiments.provenance import TIMED, code_hash
    from kqv_lab.experiments.reproduction import standing

    committed = ROOT / "docs" / "experiments" / name / RESULTS_FILE
    assert committed.is_file(), f"{name} has no committed results: `kqv experiment run {name} --out docs/experiments`"
    record = json.loads(committed.read_text())
    rerun = f"rerun `kqv experiment run {name} --out docs/experiments`"
    assert record["code"].get("hash"), f"{name}: its results.json has no code hash: {rerun}"
    quick = json.loads((quick_runs / name / RESULTS_FILE).read_text())["results"]
    stale = standing(record, code_hash(get(name).module)["hash"], quick, get(name))
    if name not in TIMED:
        assert record["code"].get("quick", {}).get("numbers"), f"{name}: its fingerprint vouches for nothing: {rerun}"
        assert stale is None, f"{name}: {stale}; {rerun}"
        return
    cpu = (record.get("provenance") or {}).get("cpu", {}).get("model")
    report = (committed.parent / "report.md").read_text()
    gallery_page = (ROOT / "docs" / "experiments.md").read_text()
    section = gallery_page.split(f"## `{name}`: ", 1)[1].split("\n## ", 1)[0]
    assert cpu and f"measured on {cpu}" in report and f"measured on {cpu}" in section, (
        f"{name}: its timings do not name the CPU they were measured on: {rerun}"
    )
    if stale is not None:
        assert f"**Needs a rerun: {stale}.**" in report and f"**Needs a rerun: {stale}.**" in section, (
            f"{name}: {stale}, and neither its report nor the gallery says so: {rerun}, or regenerate them "
            "(`kqv experiment gallery`)"
        )


def test_verdict_follows_the_checks_of_the_claim_alone():
    yes, no = Check("a", "t", "1", True), Check("b", "t", "2", False)
    undecided = Check("c", "t", "3", False, INCONCLUSIVE)
    assert verdict([yes, yes]) == "holds"
    assert verdict([yes, no]) == "holds in part"
    assert verdict([no, no]) == "does not hold here"
    assert verdict([yes, undecided]) == "inconclusive"
    counted = by_construction(Check("flops", "t", "1", True))
    assert verdict([no, counted]) == "does not hold here", "a check that holds by construction never decides"
    assert verdict([no, no, control(Check("learns", "t", "1", True))]) == "does not hold here"
    assert verdict([yes, control(Check("learns", "t", "1", False))]) == "inconclusive", "a failed control"
    assert verdict([no, control(Check("learns", "t", "1", False, INCONCLUSIVE))]) == "inconclusive"
    for checks in ([], [counted], [control(Check("learns", "t", "1", True))]):
        with pytest.raises(ValueError, match="check of the claim"):
            verdict(checks)
    with pytest.raises(ValueError, match="role"):
        Check("a", "t", "1", True, role="decoration")


@pytest.mark.parametrize("name", names())
def test_every_experiment_decides_by_a_check_of_the_lecture_s_claim(quick_runs, name):
    """Every experiment has at least one claim check; controls and by-construction checks are tagged as such."""
    record = json.loads((quick_runs / name / RESULTS_FILE).read_text())
    roles = [check["role"] for check in record["checks"]]
    assert "claim" in roles and set(roles) <= {"claim", "control", "by construction"}


def test_no_causal_mask_verdict_moves_with_the_numbers(quick_runs):
    """The verdict is computed from the numbers: the same record with numbers on either side of the thresholds."""
    record = json.loads((quick_runs / "no-causal-mask" / RESULTS_FILE).read_text())
    results, checks = record["results"], get("no-causal-mask").checks
    ln_v = results["ln_vocab"]
    arms, control = results["arms"], results["control"]
    arms["causal"].update(train_loss=[2.0, 2.1, 1.9], val_loss_causal=[2.0, 2.1, 1.9])  # three seeds: decided
    arms["no mask"].update(train_loss=[0.1, 0.12, 0.09], val_loss_causal=[4.0, 4.1, 3.95])
    control["causal"]["train_loss"], control["no mask"]["train_loss"] = [ln_v], [0.2]
    assert verdict(checks(results)) == "holds"
    arms["no mask"].update(train_loss=[1.9, 2.0, 1.85], val_loss_causal=[2.1, 2.2, 2.0])
    assert verdict(checks(results)) == "does not hold here"
    control["no mask"]["train_loss"] = [ln_v]  # the no-mask model cannot even copy the future: the set-up failed
    assert verdict(checks(results)) == "inconclusive"


# ---------------------------------------------------------------------------------------------------------------
# The command line: listing and bad input


def test_list_names_every_experiment_with_its_claim(capsys):
    assert main(["experiment", "list"]) == 0
    out = capsys.readouterr().out
    for name in names():
        assert name in out and get(name).claim in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["experiment", "run", "no-such-thing"], "parallelism, scaling, no-causal-mask"),
        (["experiment", "run", "heads", "--seeds", "0"], "--seeds must be at least 1"),
        (["experiment", "run", "heads", "--quick", "--set", "steps=-5"], "steps must be positive"),
        (["experiment", "run", "heads", "--quick", "--set", "d_model=0"], "d_model must be positive"),
        (["experiment", "run", "heads", "--quick", "--set", "colour=3"], "unknown option 'colour'"),
        (["experiment", "run", "heads", "--quick", "--set", "steps=many"], "steps must be int"),
        (["experiment", "run", "all", "--quick", "--set", "steps=-1"], "must be positive"),
    ],
)
def test_bad_input_is_a_clear_error_with_exit_status_2(argv, message, capsys, tmp_path):
    assert main(argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kqv: error:") and message in err
    assert not any(tmp_path.iterdir()), "nothing may run before the input is checked"


def test_the_command_prints_what_the_python_actions_return(tmp_path, capsys):
    """`kqv experiment run/list` only parse and print: `kqv_lab.experiments.actions` runs the same experiment to the
    same record, and its summary is the printed text."""
    from kqv_lab.experiments.actions import claims, planned_runs, run_experiments, summary

    assert main(["experiment", "run", "parallelism", "--quick", "--out", str(tmp_path / "cli"), "--quiet"]) == 0
    printed = capsys.readouterr().out
    ((position, record),) = list(run_experiments("parallelism", quick=True, out=tmp_path / "py", progress=False))
    cli = json.loads((tmp_path / "cli" / "parallelism" / RESULTS_FILE).read_text())
    same = ("experiment", "quick", "config", "seeds")  # the timings differ, the run does not
    assert position == (1, 1) and json.loads(json.dumps({k: record[k] for k in same})) == {k: cli[k] for k in same}
    assert [c["what"] for c in record["checks"]] == [c["what"] for c in cli["checks"]]
    assert summary(cli, (1, 1), tmp_path / "cli") in printed
    assert printed.startswith("kqv: smoke test (--quick)")
    assert [name for name, _ in claims()] == names()
    assert main(["experiment", "list"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[0] == names()[0]
    plan = planned_runs("all", True, ["repeats=2"], None)  # with `all`, each experiment takes the options it has
    assert list(plan) == names() and plan["parallelism"] == ["repeats=2"] and plan["heads"] == []


def test_a_bad_experiment_option_is_refused_by_python_before_anything_runs(tmp_path):
    from kqv.errors import ConfigError
    from kqv_lab.experiments.actions import rejudge_runs, run_experiments

    with pytest.raises(ConfigError, match="seeds must be at least 1"):
        run_experiments("heads", quick=True, seeds=0, out=tmp_path)
    with pytest.raises(ConfigError, match=r"no experiment has the option\(s\) of \['colour=3'\]"):
        run_experiments("all", quick=True, overrides=["colour=3"], out=tmp_path)
    with pytest.raises(ConfigError, match="no experiment results in"):
        rejudge_runs("all", tmp_path)
    assert not any(tmp_path.iterdir())


def test_overrides_are_typed_and_validated():
    config = get("parallelism").full
    changed = with_overrides(config, ["lengths=[64, 128]", "tokens=256", "threads=1"])
    assert changed.lengths == (64, 128) and changed.threads == (1,) and changed.tokens == 256
    with pytest.raises(ExperimentError, match="lengths must be positive"):
        with_overrides(config, ["lengths=[64, -128]"])
    with pytest.raises(ValueError, match="multiple of every length"):
        with_overrides(config, ["tokens=100"])


# ---------------------------------------------------------------------------------------------------------------
# The surgery, against references written out by hand


def _attention_layer(**changes):
    config = tiny_config(n_layers=1, position="none", **changes)
    return config, kqv.MultiHeadAttention(config).eval()


def _by_hand(layer, x, queries, keys, scale):
    """softmax(queries keys^T * scale, causal) (W_V x), per head, then the output projection."""
    heads, head_dim = layer.n_heads, layer.head_dim
    split = lambda t: t.view(*t.shape[:2], heads, head_dim).transpose(1, 2)
    values = layer.to_keys_values(x)[..., -x.shape[-1] :]
    scores = split(queries) @ split(keys).transpose(-2, -1) * scale
    scores = scores.masked_fill(~causal_mask(x.shape[1], x.shape[1]), float("-inf"))
    output = scores.softmax(-1) @ split(values)
    return layer.to_output(output.transpose(1, 2).reshape(x.shape)), scores.softmax(-1)


def test_unscaled_attention_computes_softmax_of_raw_dot_products():
    config, layer = _attention_layer()
    x = torch.randn(2, 9, config.d_model)
    keys = layer.to_keys_values(x)[..., : config.d_model]
    scaled, _ = _by_hand(layer, x, layer.to_queries(x), keys, config.head_dim**-0.5)
    torch.testing.assert_close(layer(x, causal=True)[0], scaled)
    ablations.without_scaling(layer)
    unscaled, _ = _by_hand(layer, x, layer.to_queries(x), keys, 1.0)
    torch.testing.assert_close(layer(x, causal=True)[0], unscaled)
    torch.testing.assert_close(layer(x, causal=True, need_weights=True)[0], unscaled)  # the plain kernel too


def test_without_query_key_maps_scores_are_dot_products_of_the_input():
    config, layer = _attention_layer()
    ablations.without_query_key_maps(layer)
    x = torch.randn(2, 9, config.d_model)
    expected, weights = _by_hand(layer, x, x, x, config.head_dim**-0.5)
    output, measured = layer(x, causal=True, need_weights=True)
    torch.testing.assert_close(output, expected)
    torch.testing.assert_close(measured, weights)
    assert sum(p.numel() for p in layer.parameters()) == 2 * (config.d_model**2 + config.d_model)


def test_peeking_model_sees_the_future_until_switched_off():
    torch.manual_seed(0)
    honest = kqv.DecoderLM(tiny_config(n_layers=2)).eval()
    peeking = ablations.peeking(kqv.DecoderLM(tiny_config(n_layers=2))).eval()
    peeking.load_state_dict(honest.state_dict())
    ids = torch.randint(0, 37, (1, 12))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 37
    assert not torch.allclose(peeking(ids)[0, :-1], peeking(changed)[0, :-1]), "the past should see the future"
    ablations.set_peeking(peeking, False)
    torch.testing.assert_close(peeking(ids), honest(ids))
    torch.testing.assert_close(peeking(changed)[0, :-1], peeking(ids)[0, :-1])


def _zero_sublayers(model):
    for name, parameter in model.named_parameters():
        if "to_output" in name or "feed_forward.down" in name:
            parameter.data.zero_()


def test_without_residuals_the_stream_is_the_sublayer_output_alone():
    torch.manual_seed(0)
    model = kqv.DecoderLM(tiny_config(position="learned"))
    _zero_sublayers(model)  # every sublayer now outputs 0: a residual stream keeps the embeddings, no stream is 0
    ids = torch.randint(0, 37, (2, 7))
    embedded = model.decoder.embeddings(ids, torch.arange(7))
    torch.testing.assert_close(model.decoder(ids)[0], model.decoder.final_norm(embedded))
    ablations.without_residuals(model)
    torch.testing.assert_close(model.decoder(ids)[0], model.decoder.final_norm(torch.zeros_like(embedded)))


def test_without_norms_no_normalisation_is_left():
    model = ablations.without_norms(kqv.DecoderLM(tiny_config(norm="rmsnorm")))
    assert not any(isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm)) for m in model.modules())
    _zero_sublayers(model)
    ids = torch.randint(0, 37, (2, 7))
    torch.testing.assert_close(model.decoder(ids)[0], model.decoder.embeddings(ids, torch.arange(7)))


def test_head_statistics_of_uniform_causal_attention_match_the_closed_form():
    time = 6
    weights = causal_mask(time, time).float()
    weights = (weights / weights.sum(-1, keepdim=True))[None, None]  # (1, 1, time, time): uniform over the past
    stats = head_statistics(weights)
    assert stats["entropy"][0] == pytest.approx(sum(math.log(i + 1) for i in range(time)) / time)
    assert stats["distance"][0] == pytest.approx(sum(i / 2 for i in range(time)) / time)
    assert stats["diagonal"][0] == pytest.approx(sum(1 / (i + 1) for i in range(time)) / time)


# ---------------------------------------------------------------------------------------------------------------
# Part 2's pieces: the needle task, the power-law fit, the compute frontier, parameter-matched GLU rows


def test_needle_batch_hides_the_answer_in_the_first_quarter_and_asks_in_the_last():
    from kqv.data.needle import MARKER, QUERIES, QUERY, VALUES, needle_batch

    ids, queries, answers = needle_batch(32, 128, torch.Generator().manual_seed(0))
    assert ids.shape == (32, 128) and queries.shape == (32, QUERIES) and answers.shape == (32,)
    for row, question, answer in zip(ids, queries, answers):
        where = int((row == MARKER).nonzero()[0])
        assert where < 32 and row[where + 1] == answer < VALUES
        assert (question >= 96).all() and (row[question] == QUERY).all() and len(set(question.tolist())) == QUERIES
    with pytest.raises(ValueError, match="multiple of 4"):
        needle_batch(2, 63, torch.Generator())


def test_power_law_fit_recovers_a_known_exponent_and_floor():
    from kqv_lab.experiments.scaling_laws import fit_power_law

    sizes = [2e4, 6e4, 2e5, 6e5, 2e6, 5e6]
    fit = fit_power_law(sizes, [(3e3 / n) ** 0.3 + 1.5 for n in sizes])
    assert fit["ok"]
    assert fit["alpha"] == pytest.approx(0.3, rel=1e-3) and fit["floor"] == pytest.approx(1.5, abs=1e-3)
    assert max(abs(r) for r in fit["residuals"]) < 1e-6


def test_compute_frontier_is_the_lowest_curve_at_each_compute():
    from kqv_lab.experiments.scaling_laws import frontier

    small = [(1e9, 3.0), (1e10, 2.0), (1e11, 1.9)]  # fast early, then flat
    large = [(1e10, 3.5), (1e11, 1.5), (1e12, 1.0)]  # slow early, better late
    edge = dict(frontier([small, large], points=4))  # computes 1e9, 1e10, 1e11, 1e12
    assert [round(math.log10(c)) for c in edge] == [9, 10, 11, 12]
    assert list(edge.values()) == pytest.approx([3.0, 2.0, 1.5, 1.0])


def test_compute_frontier_keeps_a_finished_curve_s_final_loss():
    """A small model that finished at less compute still bounds the frontier beyond its end: more compute can
    always buy the same loss, so the frontier never rises."""
    from kqv_lab.experiments.scaling_laws import frontier

    small = [(1e9, 3.0), (1e10, 2.0)]
    large = [(1e9, 3.5), (1e10, 3.0), (1e11, 2.5), (1e12, 1.5)]
    edge = dict(frontier([small, large], points=4))
    assert list(edge.values()) == pytest.approx([3.0, 2.0, 2.0, 1.5])


def test_glu_rows_keep_the_feed_forward_parameter_count():
    from kqv_lab.experiments.modifications import FULL, arms

    config = FULL
    counts = {}
    for name in ("vanilla (ReLU)", "SwiGLU", "GeGLU"):
        model_config = config.model_config(65, **arms(config)[name].model)
        counts[name] = sum(p.numel() for p in kqv.FeedForward(model_config).parameters())
    assert counts["SwiGLU"] == counts["GeGLU"] == pytest.approx(counts["vanilla (ReLU)"], rel=0.01)


# ---------------------------------------------------------------------------------------------------------------
# The gallery


def test_gallery_shows_every_run_with_its_verdict_table_and_plots(quick_runs, tmp_path):
    from kqv_lab.experiments.gallery import gallery

    page = gallery(quick_runs, tmp_path / "page.md")
    for name in names():
        record = json.loads((quick_runs / name / RESULTS_FILE).read_text())
        heading = f"## `{name}`: smoke test, not a test of the claim (checks at quick size: {record['verdict']})"
        assert heading in page and record["command"] in page
        for plot in record["plots"]:
            assert f"]({os.path.relpath(quick_runs / name / plot, tmp_path)})" in page


def test_committed_gallery_agrees_with_the_committed_results():
    """docs/experiments.md is generated from docs/experiments/*/results.json: regenerate it and compare."""
    from pathlib import Path

    from kqv_lab.experiments.gallery import gallery

    root = Path(__file__).resolve().parents[1]
    page = root / "docs" / "experiments.md"
    assert page.is_file(), "docs/experiments.md is missing: run `kqv experiment gallery`"
    assert gallery(root / "docs" / "experiments", page) == page.read_text(encoding="utf-8"), (
        "docs/experiments.md is out of date with docs/experiments/: run `kqv experiment gallery`"
    )


_DECIMAL = re.compile(r"(?<![\w.])[-+]?\d[\d,]*\.\d+(?:e[-+]?\d+)?")


def _figures(node, found: set[str]) -> set[str]:
    """Every way a number of a results.json may be written by hand: each value (and the mean and standard deviation
    of each list of values) rounded to 0-4 decimals or as 1.4e-06, and every decimal in its text."""

    def forms(x: float) -> set[str]:
        return {f"{x:.{d}f}" for d in range(5)} | {f"{x:.1e}", f"{x:,.0f}"}

    if isinstance(node, (int, float)) and not isinstance(node, bool):
        found |= forms(abs(float(node)))
    elif isinstance(node, str):
        found |= {n.lstrip("+-") for n in _DECIMAL.findall(node)}
    elif isinstance(node, dict):
        for value in node.values():
            _figures(value, found)
    elif isinstance(node, list):
        values = [v for v in node if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(values) > 1:
            found |= forms(abs(statistics.fmean(values))) | forms(statistics.stdev(values))
        for value in node:
            _figures(value, found)
    return found


def _unsupported(text: str, record: dict) -> list[str]:
    """The decimals of `text` that no number of `record` rounds to."""
    found = _figures(record, set())
    return [
        n
        for n in _DECIMAL.findall(text)
        if n.lstrip("+-") not in found and n.lstrip("+-").replace(",", "") not in found
    ]


def test_figures_written_by_hand_are_the_committed_results():
    """Every decimal in a hand-written discussion (docs/experiments/NAME/discussion.md), and in the README's example,
    is a number of that experiment's committed results.json: a rerun that changes the numbers fails here until the
    text is updated."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    runs = sorted(path.parent for path in (root / "docs" / "experiments").glob(f"*/{RESULTS_FILE}"))
    assert runs, "no committed results"
    for run in runs:
        discussion = run / "discussion.md"
        assert discussion.is_file(), f"{run.name} has results but no discussion.md saying what they show"
        record = json.loads((run / RESULTS_FILE).read_text())
        text = discussion.read_text()
        # a discussion may also quote a committed JSON result it links (links are relative to docs/experiments.md)
        quoted = [json.loads((root / "docs" / link).read_text()) for link in re.findall(r"\]\(([^)]+\.json)\)", text)]
        assert not _unsupported(text, [record, *quoted]), f"{run.name}: figures not in results.json"
    readme = (root / "README.md").read_text()
    example = readme.split("## The lecture's claims, tested", 1)[1].split("\n## ", 1)[0]
    record = json.loads((root / "docs" / "experiments" / "no-causal-mask" / RESULTS_FILE).read_text())
    assert _DECIMAL.findall(example) and not _unsupported(example, record)


def test_unsupported_figures_are_found():
    record = {"results": {"loss": [2.0, 2.2]}, "checks": [{"figure": "gap +0.218"}]}
    assert _unsupported("loss 2.100 ± 0.141, gap +0.218, 2.1", record) == []
    assert _unsupported("loss 2.150 and 0.3", record) == ["2.150", "0.3"]


def test_long_attention_memory_check_needs_a_measured_full_attention_peak():
    """A peak that rounds to nothing cannot show that a cheaper core saves memory: the check fails, never passes."""
    from kqv_lab.experiments import long_attention

    results = {
        "methods": ["full", "linformer"],
        "stages": [[128, 10]],
        "measure_lengths": [4096],
        "accuracy": {"full": [[1.0]], "linformer": [[0.2]]},
        "seconds": {"full": [1.0], "linformer": [0.5]},
        "peak_mb": {"full": [0.0], "linformer": [0.0]},
    }
    memory = lambda: next(c for c in long_attention.checks(results) if "memory" in c.what)
    assert not memory().holds
    results["peak_mb"] = {"full": [60.0], "linformer": [20.0]}
    assert memory().holds and "0.33x" in memory().figure


def test_a_result_stands_only_on_a_fingerprint_of_computed_numbers_or_for_timings_on_its_code():
    """Without a fingerprint number, today's hash does not keep a result; a timing keeps it only at today's hash
    and only when it names its CPU (reproduction.standing)."""
    from kqv_lab.experiments.reproduction import RULE, standing

    numbers = {"rule": RULE, "numbers": {"/loss[0]": 2.5}}
    computed = {"experiment": "heads", "code": {"hash": "today", "quick": numbers}}
    assert standing(computed, "today", None) is None
    assert "vouches for nothing" in standing(
        {**computed, "code": {"hash": "today", "quick": {"rule": RULE}}}, "today", None
    )
    timed = {"experiment": "quadratic-cost", "code": {"hash": "today"}, "provenance": {"cpu": {"model": "A CPU"}}}
    assert standing(timed, "today", None) is None
    assert "code it times changed" in standing(timed, "tomorrow", None)
    assert "name no machine" in standing({**timed, "provenance": {}}, "today", None)


def test_gallery_leads_with_the_claims_and_marks_a_timing_of_changed_code(tmp_path):
    """The gallery opens with one table of every claim, its verdict and deciding number, before the method and the
    verdicts that changed; a timing whose code changed since it ran says it needs a rerun, in its report too."""
    import shutil
    from pathlib import Path

    from kqv_lab.experiments.gallery import gallery
    from kqv_lab.experiments.records import load_record, write_record

    root = Path(__file__).resolve().parents[1] / "docs" / "experiments"
    for name in ("heads", "quadratic-cost"):
        shutil.copytree(root / name, tmp_path / name)
    shutil.copy(root / "verdict-changes.md", tmp_path)
    record = load_record(tmp_path / "quadratic-cost")
    record["code"]["hash"] = "0" * 64  # code that is not today's
    write_record(tmp_path / "quadratic-cost", record)
    page = gallery(tmp_path, tmp_path / "page.md")
    table = page.index("| experiment | the claim | verdict | the deciding number |")
    assert table < page.index("## How the experiments were run") < page.index("## Verdicts that changed")
    assert page.index("[`heads`](#heads-holds)") > table and "**holds in part; needs a rerun**" in page
    rerun = "**Needs a rerun: the code it times changed since it ran"
    assert rerun in page and rerun in (tmp_path / "quadratic-cost" / "report.md").read_text()
    assert page.count(rerun) == 1  # heads stands on its fingerprint
