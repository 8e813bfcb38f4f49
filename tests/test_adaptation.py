"""What a fine-tune trains is one object (issue 44): `FinetuneConfig.adaptation` builds an `Adaptation` (every
weight, frozen parts, or LoRA) that applies itself to a model, says which part of the state dict a checkpoint
saves and counts what trains; nothing else in kqv reads the LoRA options to decide."""

import ast
from pathlib import Path

import pytest

import kqv
from conftest import tiny_config
from kqv.errors import ConfigError
from kqv.jobs.finetune import EveryWeight, FinetuneConfig, Frozen, LoRA
from kqv.nn.models import count_parameters

SRC = Path(__file__).resolve().parents[1] / "src" / "kqv"


def test_the_options_build_one_adaptation_and_refuse_lora_with_freezing():
    assert isinstance(FinetuneConfig().adaptation, EveryWeight) and not FinetuneConfig().adaptation.active
    assert FinetuneConfig(freeze_blocks=1).adaptation == Frozen(embeddings=False, blocks=1)
    lora = FinetuneConfig(lora_rank=2, lora_targets=("up",)).adaptation
    assert isinstance(lora, LoRA) and (lora.lora.rank, lora.lora.targets) == (2, ("up",))
    with pytest.raises(ConfigError, match="LoRA already freezes every weight"):
        FinetuneConfig(lora_rank=2, freeze_embeddings=True)


@pytest.mark.parametrize(
    "options, trains, saved",
    [
        ({}, lambda name: True, None),
        (
            {"freeze_embeddings": True, "freeze_blocks": 1},
            lambda name: "embeddings" not in name and ".0." not in name,
            None,
        ),
        ({"lora_rank": 2, "lora_targets": ["up"]}, lambda name: "lora_" in name, "lora_"),
    ],
)
def test_each_adaptation_trains_what_it_says_and_saves_its_part(options, trains, saved):
    adaptation = FinetuneConfig.from_dict(options).adaptation
    model = kqv.DecoderLM(tiny_config())
    adaptation.apply(model)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {name for name, _ in model.named_parameters() if trains(name)} and trainable
    counts = adaptation.counts(model)
    assert counts["trainable_parameters"] == count_parameters(model) <= counts["total_parameters"]
    if saved is None:
        assert adaptation.saved_weights is None  # the checkpoint holds the whole model
    else:
        part = adaptation.saved_weights(model.state_dict())
        assert part and all(saved in name for name in part) and set(part) == trainable


def test_no_module_but_the_finetune_options_decides_by_the_lora_options():
    """`if ... lora_rank` (or any test of a `[finetune]` LoRA option) outside FinetuneConfig is a second place that
    decides what trains: ask the adaptation instead."""
    found = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        allowed = {
            id(node)
            for cls in ast.walk(tree)
            if isinstance(cls, ast.ClassDef) and cls.name == "FinetuneConfig"
            for node in ast.walk(cls)
        }
        for node in ast.walk(tree):
            test = getattr(node, "test", None) if isinstance(node, (ast.If, ast.IfExp, ast.While)) else None
            if test is not None and id(node) not in allowed and "lora_rank" in ast.unparse(test):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, found
