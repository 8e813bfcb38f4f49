"""Runs written by kqv before its subpackages (tests/data/runs-0.1, made by commit 96070dd) still load and work."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kqv import DecoderLM, EncoderDecoder, MaskedLM, SequenceClassifier
from kqv.cli.main import main
from kqv.jobs import get_job, load_run
from kqv.train.checkpoints import read_checkpoint

OLD_RUNS = Path(__file__).with_name("data") / "runs-0.1"
MODELS = {"lm": DecoderLM, "mt": EncoderDecoder, "mlm": MaskedLM, "cls": SequenceClassifier}


@pytest.mark.parametrize("task", sorted(MODELS))
def test_an_old_run_loads_with_its_job_model_weights_and_config(task):
    run = load_run(OLD_RUNS / task)
    assert run.job is get_job(task) and isinstance(run.model, MODELS[task]) and not run.model.training
    saved = read_checkpoint(OLD_RUNS / task)
    assert saved.step == run.config.train.steps == 2
    weights = run.model.state_dict()
    stored = load_file(str(OLD_RUNS / task / "checkpoint" / "model.safetensors"))
    assert all(torch.equal(weights[name], tensor) for name, tensor in stored.items())


def test_an_old_classifier_run_keeps_its_labels():
    assert load_run(OLD_RUNS / "cls").labels == ["neg", "pos"]


def test_an_old_lm_run_generates_and_evaluates_through_the_cli(capsys):
    assert main(["generate", str(OLD_RUNS / "lm"), "--prompt", "First", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("First")
    assert main(["eval", str(OLD_RUNS / "lm"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["tokens"] > 0


def test_an_old_mt_run_translates_and_scores_its_test_split_as_it_did(capsys):
    assert main(["translate", str(OLD_RUNS / "mt"), "eins zwei"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert main(["eval", str(OLD_RUNS / "mt"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    summary = json.loads((OLD_RUNS / "mt" / "summary.json").read_text())
    assert result["sentences"] == summary["test_sentences"]
    assert result["chrf"] == pytest.approx(summary["test_chrf"])  # the same model decodes the same way


@pytest.mark.parametrize("task", ["lm", "mlm"])
def test_an_old_run_resumes_for_more_steps(task, tmp_path):
    run_dir = tmp_path / task
    shutil.copytree(OLD_RUNS / task, run_dir)
    config = get_job(task).read_config(run_dir)
    config.train.steps = 3
    config.train.eval_every = 3
    get_job(task).train(config, run_dir, resume=True, quiet=True)
    assert read_checkpoint(run_dir).step == 3
    assert [r["step"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())][-1] == 3
