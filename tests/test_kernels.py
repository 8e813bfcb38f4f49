"""Kernels per device: `train.compile` (kqv.train.compiling) and flex_attention for the cores and position schemes
that add a score bias or a mask (kqv.nn.flex).

torch.compile runs here with the "aot_eager" backend (`compiling.BACKEND`): Dynamo captures the same forward and
AOTAutograd the same joint forward-backward graph as inductor would, without inductor's C++ code generation, which
takes about a minute per graph on this machine's two shared cores.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from kqv.cli.main import main
from kqv.nn.models import DecoderLM
from kqv.train import compiling
from kqv.train.checkpoints import MODEL_FILE, load_weights, read_checkpoint
from kqv.train.config import TrainConfig
from kqv.train.trainer import Trainer
from test_devices import tiny_lm_trainer


@pytest.fixture
def quick_compile(monkeypatch):
    monkeypatch.setattr(compiling, "BACKEND", "aot_eager")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _losses(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["train_loss"] for r in records if "train_loss" in r]


def test_a_compiled_run_has_the_losses_and_the_checkpoint_of_an_uncompiled_one(tmp_path, quick_compile):
    eager = tiny_lm_trainer(tmp_path / "eager", steps=3)
    eager.train()
    compiled = tiny_lm_trainer(tmp_path / "compiled", steps=3, compile=True)
    assert isinstance(compiled.ddp_model, torch._dynamo.eval_frame.OptimizedModule)
    compiled.train()
    losses = _losses(tmp_path / "compiled")
    assert len(losses) == 3
    assert losses == pytest.approx(_losses(tmp_path / "eager"), abs=1e-4)
    saved = load_file(tmp_path / "compiled" / "checkpoint" / MODEL_FILE)
    assert not any("_orig_mod" in name for name in saved)
    fresh = DecoderLM(eager.home.config)  # an uncompiled model loads it (load_weights is strict)
    assert set(saved) <= set(fresh.state_dict())
    checkpoint = read_checkpoint(tmp_path / "compiled")
    load_weights(fresh, checkpoint)
    checkpoint.close()
    for a, b in zip(fresh.parameters(), eager.model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_a_compiled_run_resumes_uncompiled(tmp_path, quick_compile):
    tiny_lm_trainer(tmp_path, steps=2, compile=True).train()
    resumed = tiny_lm_trainer(tmp_path, steps=3)
    assert resumed.step == 2 and resumed.ddp_model is resumed.model
    resumed.train()


def test_compile_must_be_a_bool():
    from kqv.errors import ConfigError

    with pytest.raises(ConfigError, match="compile"):
        TrainConfig(steps=1, batch_size=1, compile="yes")


def test_compile_is_set_from_the_command_line(tmp_path, quick_compile, monkeypatch):
    from test_cli import TINY

    seen = []
    built = Trainer.__init__

    def spy(self, model, config, *args, **kwargs):
        seen.append(config.compile)
        built(self, model, config, *args, **kwargs)

    monkeypatch.setattr(Trainer, "__init__", spy)
    corpus = tmp_path / "tiny.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 40)
    (tmp_path / "tiny.toml").write_text(TINY.format(position="rope"))
    command = ["train", "lm", "--config", str(tmp_path / "tiny.toml"), "--data", str(corpus), "--quiet"]
    assert main([*command, "--out", str(tmp_path / "lm"), "--steps", "2", "--set", "train.compile=true"]) == 0
    assert seen == [True]
    assert "compile = true" in (tmp_path / "lm" / "run.toml").read_text()
