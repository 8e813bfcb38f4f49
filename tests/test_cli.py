"""The command line end to end on a tiny corpus: train, resume, generate, eval, attention, and its errors."""

import json
from pathlib import Path

import pytest
import torch

from kqv.cli.main import main
from kqv.nn import generation
from kqv.train.layout import MODEL_FILE
from kqv.train.update import Updater

TINY = """
[data]
tokenizer = "char"
context = 16

[model]
d_model = 16
n_heads = 2
n_layers = 1
d_ff = 32
dropout = 0.0
position = "{position}"

[train]
steps = 6
batch_size = 4
warmup_steps = 2
eval_every = 3
eval_batches = 2
checkpoint_every = 3
log_every = 1
precision = "fp32"

[sample]
prompt = "To"
count = 1
max_new_tokens = 8
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "tiny.txt"
    path.write_text("To be, or not to be, that is the question.\n" * 40)
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory, corpus):
    """One trained tiny run shared by the tests that only read it."""
    root = tmp_path_factory.mktemp("run")
    config = root / "tiny.toml"
    config.write_text(TINY.format(position="learned"))
    out = root / "run"
    assert main(["train", "lm", "--config", str(config), "--data", str(corpus), "--out", str(out), "--quiet"]) == 0
    return out


def test_training_writes_the_whole_run_directory(run):
    for name in [
        "run.toml",
        "tokenizer",
        "tokens.safetensors",
        "checkpoint",
        "metrics.jsonl",
        "loss.png",
        "samples.txt",
        "summary.json",
    ]:
        assert (run / name).exists(), name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["val"]["bits_per_char"] > 0
    assert (run / "samples.txt").read_text().startswith("To")


def test_validation_loss_is_logged_at_every_evaluation(run):
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_loss" in r] == [3, 6]


def test_generate_continues_the_prompt(run, capsys):
    assert main(["generate", str(run), "--prompt", "To be", "--max-new-tokens", "5", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("To be") and len(out.rstrip("\n")) == len("To be") + 5


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_generate_in_lower_precision_continues_the_prompt(run, capsys, dtype):
    assert (
        main(
            ["generate", str(run), "--prompt", "To be", "--max-new-tokens", "5", "--temperature", "0", "--dtype", dtype]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("To be") and len(out.rstrip("\n")) == len("To be") + 5


def test_int8_generation_on_a_gpu_is_one_clear_line_not_a_traceback(run, capsys, monkeypatch):
    """device auto is a GPU where there is one; torch's dynamic quantisation has CPU kernels only."""
    monkeypatch.setattr(generation, "model_device", lambda model: torch.device("cuda", 0))
    command = ["generate", str(run), "--prompt", "To be", "--max-new-tokens", "5", "--dtype", "int8"]
    assert main(command) != 0
    err = capsys.readouterr().err.strip()
    assert "int8 generation runs on the CPU only" in err and "--device cpu" in err and "Traceback" not in err


def test_eval_reports_bits_per_character_of_the_validation_split(run, capsys):
    assert main(["eval", str(run), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert result["bits_per_char"] > 0 and result["perplexity"] > 1


def test_eval_scores_a_user_file(run, corpus, capsys):
    assert main(["eval", str(run), "--data", str(corpus)]) == 0
    assert str(corpus) in capsys.readouterr().out


def test_attention_writes_a_png(run, tmp_path, capsys):
    out = tmp_path / "att.png"
    assert main(["attention", str(run), "--text", "To be, or", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "1 layers x 2 heads over 9 tokens" in capsys.readouterr().out


def test_empty_prompt_is_a_clear_error(run, capsys):
    assert main(["generate", str(run), "--prompt", ""]) == 2
    assert "prompt is empty" in capsys.readouterr().err


def test_unknown_character_in_prompt_is_named(run, capsys):
    assert main(["generate", str(run), "--prompt", "Zebra"]) == 2
    assert "Z" in capsys.readouterr().err


def test_missing_run_directory_says_how_to_make_one(tmp_path, capsys):
    assert main(["generate", str(tmp_path / "nope"), "--prompt", "To"]) == 2
    assert "no run directory" in capsys.readouterr().err


def test_corrupt_checkpoint_is_reported_not_loaded(run, tmp_path, capsys):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(run, broken)
    weights = broken / "checkpoint" / MODEL_FILE
    weights.write_bytes(weights.read_bytes()[:-10] + b"0123456789")
    assert main(["generate", str(broken), "--prompt", "To"]) == 2
    err = capsys.readouterr().err
    assert "corrupt" in err and "`--overwrite`" in err  # the flag (tests/test_error_wording.py: Python's words)
    assert main(["train", "lm", "--out", str(broken), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "corrupt" in err and "`--overwrite`" in err


def test_training_into_an_existing_run_refuses_and_keeps_it(run, corpus, capsys):
    before = (run / "checkpoint" / MODEL_FILE).read_bytes()
    assert (
        main(["train", "lm", "--config", str(run / "run.toml"), "--data", str(corpus), "--out", str(run), "--quiet"])
        == 2
    )
    assert "already holds a run" in capsys.readouterr().err
    assert (run / "checkpoint" / MODEL_FILE).read_bytes() == before


def test_ctrl_c_then_resume_matches_an_uninterrupted_run(tmp_path, corpus, monkeypatch):
    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(position="rope").replace("dropout = 0.0", "dropout = 0.1"))
    common = ["--config", str(config), "--data", str(corpus), "--quiet"]
    assert main(["train", "lm", *common, "--out", str(tmp_path / "full")]) == 0

    update = Updater.__call__

    def interrupted_at_step_4(self, module, step, lr):
        if step == 3:
            raise KeyboardInterrupt
        return update(self, module, step, lr)

    with monkeypatch.context() as patch:
        patch.setattr(Updater, "__call__", interrupted_at_step_4)
        assert main(["train", "lm", *common, "--out", str(tmp_path / "half")]) == 130
    assert main(["train", "lm", "--out", str(tmp_path / "half"), "--resume", "--quiet"]) == 0

    def losses(name):
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return {r["step"]: r["train_loss"] for r in map(json.loads, lines) if "train_loss" in r}

    assert losses("half") == losses("full")


def test_unknown_config_option_is_named(tmp_path, corpus, capsys):
    config = tmp_path / "bad.toml"
    config.write_text(TINY.format(position="rope").replace("d_ff = 32", "d_ff = 32\nn_head = 2"))
    assert main(["train", "lm", "--config", str(config), "--data", str(corpus), "--out", str(tmp_path / "r")]) == 2
    assert "n_head" in capsys.readouterr().err


def test_missing_data_file_is_reported(tmp_path, capsys):
    assert main(["train", "lm", "--data", str(tmp_path / "none.txt"), "--out", str(tmp_path / "r")]) == 2
    assert "none.txt" in capsys.readouterr().err


def _high_water_mark_mb() -> float:
    """The kernel's peak resident set size of this process (VmHWM in /proc/self/status, kB), in MB."""
    line = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024 / 1e6


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc")
def test_summary_reports_the_peak_resident_memory(tmp_path, corpus):
    """summary.json's peak_rss_mb lies between the kernel's high-water mark before the job and after it (within
    2 MB: the kernel batches its per-thread RSS counts); a 200 MB array held through the job shows in it."""
    import torch

    from kqv.train.runs import read_summary

    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(position="rope"))
    ballast = torch.ones(50_000_000)  # 200 MB, touched
    before = _high_water_mark_mb()
    assert (
        main(["train", "lm", "--config", str(config), "--data", str(corpus), "--out", str(tmp_path / "run"), "--quiet"])
        == 0
    )
    after = _high_water_mark_mb()
    peak = read_summary(tmp_path / "run")["peak_rss_mb"]
    assert before - 2 <= peak <= after + 2 and peak > ballast.numel() * 4 / 1e6


@pytest.mark.parametrize(("platform", "ru_maxrss", "expected"), [("linux", 2_000_000, 2048.0), ("darwin", 2e9, 2000.0)])
def test_peak_rss_reads_getrusage_in_the_platforms_unit(monkeypatch, platform, ru_maxrss, expected):
    """getrusage's ru_maxrss is in KiB on Linux and in bytes on macOS: both give the same MB (10^6 bytes)."""
    import resource
    import sys
    from types import SimpleNamespace

    from kqv.jobs.base import peak_rss_mb

    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(resource, "getrusage", lambda who: SimpleNamespace(ru_maxrss=ru_maxrss))
    assert peak_rss_mb() == pytest.approx(expected)
