"""LoRA (kqv.nn.lora): an adapted projection computes x W^T + b + (alpha/r) x A^T B^T; with rank r only the adapters
train (every other weight bit-identical after updates); the merged model has the unmerged one's logits."""

import copy

import pytest
import torch

from conftest import tiny_config
from kqv.errors import ConfigError
from kqv.nn.lora import PROJECTIONS, LoRAConfig, LoRALinear, add_lora, lora_state_dict, merge_lora
from kqv.nn.models import DecoderLM


def trained_lora_model(config=None, steps=3, activation="gelu"):
    torch.manual_seed(0)
    model = DecoderLM(tiny_config(position="learned", activation=activation))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    add_lora(model, config or LoRAConfig(rank=2, alpha=4.0, targets=PROJECTIONS))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2, weight_decay=0.1)
    ids = torch.randint(0, 37, (4, 17))
    for _ in range(steps):
        loss = model(ids[:, :-1], ids[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, before, ids


def test_an_adapted_projection_is_the_lora_formula():
    torch.manual_seed(0)
    base = torch.nn.Linear(6, 5)
    layer = LoRALinear(base, LoRAConfig(rank=3, alpha=6.0))
    torch.nn.init.normal_(layer.lora_b)
    x = torch.randn(4, 6)
    expected = x @ base.weight.T + base.bias + 2.0 * (x @ layer.lora_a.T @ layer.lora_b.T)
    torch.testing.assert_close(layer(x), expected)
    fresh = LoRALinear(torch.nn.Linear(6, 5), LoRAConfig(rank=3))
    assert torch.equal(fresh(x), torch.nn.functional.linear(x, fresh.weight, fresh.bias))  # B = 0: no update


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_with_rank_r_only_the_adapters_train(activation):
    model, before, _ = trained_lora_model(activation=activation)
    state = model.state_dict()
    adapters = lora_state_dict(model)
    assert adapters and all(name.endswith(("lora_a", "lora_b")) for name in adapters)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == set(adapters)
    for name, original in before.items():
        assert torch.equal(state[name], original), f"{name} changed"
    assert all(state[name].abs().sum() > 0 for name in adapters if name.endswith("lora_b"))  # B moved off zero
    rank, d = 2, 32
    per_layer = rank * (d + d) + rank * (d + 2 * d) + rank * (d + d)  # q, [k; v], output
    ffn = {"gelu": rank * (d + 64) + rank * (64 + d), "swiglu": rank * (d + 128) + rank * (64 + d)}[activation]
    assert sum(t.numel() for t in adapters.values()) == 2 * (per_layer + ffn)


def test_merged_lora_gives_the_unmerged_logits():
    model, _, ids = trained_lora_model()
    model.eval()
    merged = merge_lora(copy.deepcopy(model))
    assert not any(isinstance(m, LoRALinear) for m in merged.modules()) and not lora_state_dict(merged)
    assert set(merged.state_dict()) == set(DecoderLM(tiny_config(position="learned")).state_dict())
    with torch.no_grad():
        torch.testing.assert_close(merged(ids), model(ids), atol=1e-5, rtol=1e-5)
        greedy = model.generate(ids[:1, :4], 6, temperature=0)  # fast decoding calls the adapters' own forward
        assert torch.equal(greedy, merged.generate(ids[:1, :4], 6, temperature=0))


def test_bad_lora_options_are_refused_by_name():
    with pytest.raises(ConfigError, match="lora.rank must be an integer of at least 1, got 0"):
        LoRAConfig(rank=0)
    with pytest.raises(ConfigError, match=r"lora.targets must name some of .*got \['query'\]"):
        LoRAConfig(targets=("query",))


def test_kqvs_trainer_updates_only_the_adapters(tmp_path):
    """The Trainer's optimizer takes the parameters that require gradients: a LoRA model trains its adapters alone,
    through kqv's updates, weight decay, clipping and checkpoints."""
    from test_training import config, make_model, trainer

    model = make_model(dropout=0.0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    add_lora(model, LoRAConfig(rank=2, targets=PROJECTIONS))
    trainer(tmp_path / "run", config(steps=3, weight_decay=0.1, grad_clip=1.0), model=model).train()
    state = model.state_dict()
    assert all(torch.equal(state[name], original) for name, original in before.items())
    assert all(t.abs().sum() > 0 for name, t in lora_state_dict(model).items() if name.endswith("lora_b"))


def test_the_adapters_get_the_runs_weight_decay_as_every_other_matrix_does():
    """A and B are matrices, so the optimizer's decay group holds them, with train.weight_decay (as peft's adapters
    under transformers' Trainer, litgpt's and torchtune's get the optimizer's decay); the frozen weights are in no
    group. train.weight_decay=0 trains them without."""
    from kqv.train.config import TrainConfig
    from kqv.train.optimizer import make_optimizer

    model = DecoderLM(tiny_config(position="learned"))
    add_lora(model, LoRAConfig(rank=2, targets=PROJECTIONS))
    adapters = {name: id(p) for name, p in model.named_parameters() if name.endswith(("lora_a", "lora_b"))}
    assert len(adapters) == 2 * 2 * len(PROJECTIONS)  # 2 blocks, 5 projections each
    for decay in (0.1, 0.0):
        (group,) = make_optimizer(model, TrainConfig(steps=1, batch_size=1, weight_decay=decay)).param_groups
        assert group["weight_decay"] == decay and {id(p) for p in group["params"]} == set(adapters.values())
