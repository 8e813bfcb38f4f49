"""benchmarks/cs224n_a5.py, the birthplace task's benchmark, on a tiny stand-in for the assignment's files: its
development split keeps people apart, its recipes train and are scored by kqv's own commands, and its references
(the constant, the rule reader) are computed from the files, not assumed."""

from __future__ import annotations

import random

import pytest

import cs224n_a5 as bench

TOWNS = ["Paris", "London", "Oslo", "Lima", "Quito", "Accra"]


def people(n: int) -> list[tuple[str, str]]:
    rng = random.Random(3)
    return [(f"Person {chr(65 + k % 26)}{chr(65 + k // 26)}x", rng.choice(TOWNS)) for k in range(n)]


@pytest.fixture
def data(tmp_path):
    folder = tmp_path / "a5"
    folder.mkdir()
    cast = people(40)
    wiki = [f"{name}. {name} is a writer born in {town} , who wrote books ." for name, town in cast]
    (folder / "wiki.txt").write_text("\n".join(wiki) + "\n", encoding="utf-8")
    (folder / "birth_places_train.tsv").write_text(
        "".join(f"Where was {name} born?\t{town}\n" for name, town in cast), encoding="utf-8"
    )
    return folder


def test_the_development_split_holds_other_people_than_the_training_questions(data, tmp_path):
    files = bench.split(data, tmp_path, seed=0, size=10)
    train, dev = bench.read_pairs(files["train"]), bench.read_pairs(files["dev"])
    assert len(dev) == 10 and len(train) == 30
    assert not {q for q, _ in dev} & {q for q, _ in train}
    assert bench.read_pairs(files["dev_masked"])[0] == (dev[0][0] + bench.MASK, dev[0][1] + bench.MASK)
    other = bench.read_pairs(bench.split(data, tmp_path, seed=1, size=10)["dev"])
    assert other != dev


def test_the_rule_reader_answers_what_the_line_states_and_nothing_else(data):
    cast = people(40)
    dev = [(f"Where was {name} born?", town) for name, town in cast[:5]]
    assert bench.rule_reader(data, dev) == [town for _, town in cast[:5]]
    assert bench.rule_reader(data, [("Where was Nobody born?", "Paris")]) == [""]


def test_the_assignment_s_corruption_keeps_an_opening_and_moves_one_span_to_the_end():
    rng = random.Random(0)
    line = "Khatchig Mouradian. Khatchig Mouradian is a journalist born in Lebanon ."
    for _ in range(50):
        text = bench.corrupted(line, rng)
        before, middle, span = text.split(bench.MASK)
        assert 4 <= len(before) + len(middle) + len(span) <= 112
        assert line.startswith(before + span + middle)


def test_the_summary_compares_each_arm_with_the_training_split_s_constant_over_questions():
    dev = [("q1", "Paris"), ("q2", "Oslo"), ("q3", "Paris"), ("q4", "Lima")]
    train = [("a", "Paris"), ("b", "Paris"), ("c", "Oslo")]
    runs = [
        {"arm": "x", "seed": 0, "exact_match": 0.5, "answers": ["Paris", "Oslo", "Lima", "Oslo"], "minutes": 1.0},
        {"arm": "x", "seed": 1, "exact_match": 0.75, "answers": ["Paris", "Oslo", "Paris", "Oslo"], "minutes": 1.0},
    ]
    summary = bench.summarise(runs, dev, train)
    assert summary["constant"] == "Paris" and summary["constant_exact_match"] == 0.5
    arm = summary["arms"]["x"]
    assert arm["exact_match"] == 0.625 and arm["per_seed"] == [0.5, 0.75]
    assert arm["versus_constant"]["versus_constant"] == pytest.approx(0.625 - 0.5)  # seeds averaged per question
    assert arm["seed_95"][0] < 0.625 < arm["seed_95"][1]


def test_the_quick_benchmark_trains_kqv_s_recipes_and_scores_them_on_the_development_people(data, tmp_path):
    out = tmp_path / "record.json"
    args = ["--data", str(data), "--quick", "--dev-size", "10", "--seeds", "0", "--parallel", "1"]
    args += ["--arm", bench.KQV_ARM, "--arm", bench.TEXT_ARM, "--output", str(out), "--work", str(tmp_path / "w")]
    record = bench.main(args)
    assert set(record["arms"]) == {bench.KQV_ARM, bench.TEXT_ARM}
    for run in record["runs"]:
        assert run["n"] == 10 and len(run["answers"]) == 10 and 0 <= run["exact_match"] <= 1
        assert run["updates"] == 4 and run["tokens"] > 0
    assert record["rule_reader_exact_match"] == 1.0  # every stand-in line says "born in TOWN"
    assert out.is_file()


def test_a_finished_run_in_the_work_folder_is_scored_again_not_trained_again(data, tmp_path):
    args = ["--data", str(data), "--quick", "--dev-size", "10", "--seeds", "0", "--parallel", "1"]
    args += ["--arm", bench.KQV_ARM, "--output", str(tmp_path / "r.json"), "--work", str(tmp_path / "w")]
    first = bench.main(args)
    run = tmp_path / "w" / "kqv-0"
    stamp = (run / "summary.json").stat().st_mtime_ns
    again = bench.main(args)
    assert (run / "summary.json").stat().st_mtime_ns == stamp
    assert again["runs"][0]["answers"] == first["runs"][0]["answers"]


def test_a_curve_scores_the_run_after_every_so_many_updates_from_copies_of_its_checkpoints(data, tmp_path):
    args = ["--data", str(data), "--quick", "--dev-size", "10", "--seeds", "0", "--parallel", "1", "--steps", "40"]
    args += [
        "--every",
        "20",
        "--arm",
        bench.KQV_ARM,
        "--output",
        str(tmp_path / "r.json"),
        "--work",
        str(tmp_path / "w"),
    ]
    bench.SNAPSHOT_POLL_S = 0.01
    run = bench.main(args)["runs"][0]
    assert run["updates"] == 40
    assert [point["updates"] for point in run["curve"]] == [20, 40]
    assert 0 < run["curve"][0]["tokens"] < run["curve"][1]["tokens"] == run["tokens"]
    assert run["curve"][1]["exact_match"] == run["exact_match"]  # the last copy is the finished run's checkpoint


def test_minGPT_s_budget_is_given_to_its_driver_as_passes_or_minutes():
    assert bench.mingpt_budget(bench.argparse.Namespace(quick=False, mingpt_epochs=8.6, mingpt_minutes=28.0)) == [
        "--epochs",
        "8.6",
    ]
    assert bench.mingpt_budget(bench.argparse.Namespace(quick=False, mingpt_epochs=None, mingpt_minutes=28.0)) == [
        "--minutes",
        "28.0",
    ]
    assert (
        bench.mingpt_budget(bench.argparse.Namespace(quick=True, mingpt_epochs=8.6, mingpt_minutes=28.0))[0]
        == "--minutes"
    )
