"""The fine-tuning measurements of docs/fine-tuning.md run end to end at their --quick sizes (seconds; the figures
mean nothing at these sizes) and write JSON of the shape docs/gen_tables.py reads: exact matches are proportions
whose Wilson intervals hold them, the three arms, the probe and the baselines are there, every interval of an arm
is over the questions (two seeds, and n is still the number of questions), every run trained its updates."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def assert_proportion(figure, n=None):
    low, high = figure["exact_match_95"]
    assert 0 <= low <= figure["exact_match"] + 1e-12 and figure["exact_match"] - 1e-12 <= high <= 1  # 0/n: low ~1e-17
    assert figure["exact_match"] == figure["correct"] / figure["n"]
    assert n is None or figure["n"] == n


def test_qa_and_corpus_measurements_write_the_json_the_docs_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    qa = script("finetune_qa")
    assert qa.main(["--quick", "--seeds", "1,2", "--in-process", "--output", str(tmp_path / "qa.json")]) == 0
    record = json.loads((tmp_path / "qa.json").read_text())
    held_out = record["world"]["held_out_people"]
    assert_proportion(record["probe"]["held_out"], n=2 * held_out)  # two facts per person
    baselines = record["baselines"]
    for name in ("constant", "per_kind"):
        assert_proportion(baselines[name], n=2 * held_out)
    assert baselines["per_kind"]["exact_match"] >= baselines["constant"]["exact_match"]  # the stronger constant
    assert 0 < baselines["uniform"]["exact_match"] <= baselines["uniform_per_kind"]["exact_match"] < 1
    arms = record["summary"]["arms"]
    assert list(arms) == ["pretrained, full", "random init, full", "pretrained, LoRA"]
    for arm in arms.values():
        held = arm["held_out_questions"]
        assert held["questions"] == len(held["per_question"]) == 2 * held_out and held["seeds"] == 2
        assert held["exact_match"] == pytest.approx(sum(held["per_seed"]) / 2)
        assert arm["seen_questions"]["questions"] == 2 * record["world"]["seen_people"]
        assert arm["versus_constant_per_kind"]["questions"] == 2 * held_out  # never 2 seeds x the questions
        assert arm["peak_rss_mb"] > 0 and arm["tokens_per_s"] > 0
    lora, full = arms["pretrained, LoRA"], arms["pretrained, full"]
    assert 0 < lora["trainable_parameters"] < full["trainable_parameters"] == full["parameters"]
    gaps = [arm["versus_constant_per_kind"] for arm in arms.values()]
    for comparison in [*record["summary"]["comparisons"].values(), *gaps]:
        low, high = comparison["difference_95"]
        assert -1 <= low <= comparison["difference"] + 1e-12 and comparison["difference"] - 1e-12 <= high <= 1
        assert comparison["verdict"] == ("inconclusive" if low <= 0 <= high else comparison["verdict"])
        assert comparison["questions"] == 2 * held_out
    assert all(run["steps"] == record["sizes"]["finetune_steps"] for runs in record["runs"].values() for run in runs)

    corpus = script("finetune_corpus")
    assert corpus.main(["--quick", "--seeds", "1,2", "--output", str(tmp_path / "corpus.json")]) == 0
    record = json.loads((tmp_path / "corpus.json").read_text())
    assert [run["arm"] for run in record["runs"]] == ["fine-tuned", "from scratch"] * 2
    assert all(run["steps"] == record["sizes"]["finetune_steps"] for run in record["runs"])
    difference = record["difference_finetuned_minus_scratch"]
    low, high = difference["ci95"]
    assert low <= difference["mean"] <= high
    paired = [f - s for f, s in zip(*(record["val_loss"][arm]["values"] for arm in ("fine-tuned", "from scratch")))]
    assert difference["values"] == paired
    assert record["pretrained_val_loss_before_finetuning"] > 0 and record["load_average_end"]
