"""The mixture-of-experts feed-forward (kqv.nn.experts): Switch (top-1) and top-2 routing, capacity, the
load-balancing loss. The model-level families (causality, padding, cache, gradients) run it through
conftest.VARIANTS; these tests hold the claims particular to experts."""

import math

import pytest
import torch

from conftest import tiny_config
from kqv import DecoderLM, Encoder, EncoderDecoder, ModelConfig
from kqv.nn.experts import MixtureOfExperts, Routing, auxiliary_loss, load_balancing_loss, routing_metrics
from kqv.nn.layers import FeedForward, Residual


def moe_layer(config: ModelConfig) -> MixtureOfExperts:
    return MixtureOfExperts(config, lambda: FeedForward(config))


def copy_into_experts(layer: MixtureOfExperts, dense: FeedForward) -> None:
    for expert in layer.experts:
        expert.load_state_dict(dense.state_dict())


def dense_state_as_experts(dense_state: dict, n_experts: int) -> dict:
    """A dense model's state dict with each feed_forward.* tensor copied to feed_forward.experts.{i}.*."""
    state = {}
    for name, tensor in dense_state.items():
        if ".feed_forward." not in name:
            state[name] = tensor
            continue
        prefix, rest = name.split(".feed_forward.")
        for i in range(n_experts):
            state[f"{prefix}.feed_forward.experts.{i}.{rest}"] = tensor
    return state


# ---------------------------------------------------------------------------------------------------------------
# Equivalences with the dense feed-forward network


@pytest.mark.parametrize("training", [False, True])
def test_one_switch_expert_equals_the_dense_feed_forward(training):
    config = tiny_config(ffn="switch", experts={"count": 1})
    dense, layer = FeedForward(config), moe_layer(config)
    copy_into_experts(layer, dense)
    layer.train(training)
    x = torch.randn(3, 5, config.d_model)
    torch.testing.assert_close(layer(x), dense(x))  # the router's one probability is exactly 1
    assert layer.stats.dropped_fraction() == 0


def test_top_2_of_identical_experts_equals_the_dense_feed_forward():
    config = tiny_config(ffn="moe", experts={"count": 3})
    dense, layer = FeedForward(config), moe_layer(config)
    copy_into_experts(layer, dense)
    x = torch.randn(2, 6, config.d_model)
    torch.testing.assert_close(layer.eval()(x), dense(x))  # the two gates sum to 1


@pytest.mark.parametrize("model_class", [DecoderLM, Encoder, EncoderDecoder])
def test_a_one_expert_switch_model_is_the_dense_model_and_its_training_loss_adds_the_coefficient(model_class):
    dense = model_class(tiny_config()).eval()
    switch = model_class(tiny_config(ffn="switch", experts={"count": 1, "aux_loss_coefficient": 0.25}))
    missing, unexpected = switch.load_state_dict(dense_state_as_experts(dense.state_dict(), 1), strict=False)
    assert unexpected == [] and all(name.endswith("router.weight") for name in missing)
    switch.eval()
    ids, tgt = torch.randint(0, 37, (2, 6)), torch.randint(0, 37, (2, 5))
    inputs = (ids, tgt) if model_class is EncoderDecoder else (ids,)
    torch.testing.assert_close(switch(*inputs), dense(*inputs))
    if model_class is Encoder:
        return
    # one expert: f = P = 1, so every layer's loss is coefficient * 1 * 1 * 1, added in training only
    layers = 4 if model_class is EncoderDecoder else 2
    torch.testing.assert_close(switch(*inputs, inputs[-1]), dense(*inputs, inputs[-1]))
    switch.train()
    torch.testing.assert_close(switch(*inputs, inputs[-1]), dense(*inputs, inputs[-1]) + 0.25 * layers)


# ---------------------------------------------------------------------------------------------------------------
# Routing is per token


@pytest.mark.parametrize("ffn, training", [("switch", False), ("moe", False), ("switch", True), ("moe", True)])
def test_a_tokens_output_depends_only_on_its_own_routing(ffn, training):
    # in training, a capacity large enough that nothing is dropped
    layer = moe_layer(tiny_config(ffn=ffn, experts={"count": 4, "capacity_factor": 100.0})).train(training)
    x = torch.randn(3, 7, 32)
    changed = x.clone()
    changed[:, 3:] = torch.randn(3, 4, 32)  # every other token of the batch, in every row
    changed[1:, :3] = torch.randn(2, 3, 32)
    before = layer(x)
    assert layer.stats.dropped_fraction() == 0
    # equal up to rounding: the experts' matrix products run on different sets of rows, and BLAS may block them
    # differently (last-bit differences on some CPUs, e.g. AMD Zen 4); a leak between tokens would be ~1e-2
    torch.testing.assert_close(layer(changed)[0, :3], before[0, :3], rtol=1e-5, atol=1e-6)


def test_routing_uses_every_expert_and_changes_with_the_token():
    layer = moe_layer(tiny_config(ffn="switch", experts={"count": 4})).eval()
    layer(torch.randn(4, 16, 32))
    assert (layer.stats.load() > 0).all()


# ---------------------------------------------------------------------------------------------------------------
# The load-balancing loss


def test_aux_loss_equals_its_closed_form_on_a_hand_built_routing():
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    experts = probs.argmax(-1, keepdim=True)  # top-1: [0, 0, 1, 0]
    real = torch.ones(4, dtype=torch.bool)
    # f = (3/4, 1/4), P = (0.65, 0.35): 0.1 * 2 * (0.75 * 0.65 + 0.25 * 0.35) = 0.115
    torch.testing.assert_close(load_balancing_loss(probs, experts, real, 0.1), torch.tensor(0.115))
    # the last token is padding: f = (2/3, 1/3), P = (2/3, 1/3): 2 * (4/9 + 1/9) = 10/9
    real[3] = False
    torch.testing.assert_close(load_balancing_loss(probs, experts, real), torch.tensor(10 / 9))


def test_top_2_aux_loss_counts_both_choices():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    experts = torch.tensor([[0, 1], [1, 2]])
    # f = (1/4, 2/4, 1/4), P = (0.3, 0.45, 0.25): 3 * (0.075 + 0.225 + 0.0625) = 1.0875
    torch.testing.assert_close(
        load_balancing_loss(probs, experts, torch.ones(2, dtype=torch.bool)), torch.tensor(1.0875)
    )


def test_a_uniform_router_scores_exactly_the_coefficient():
    probs = torch.full((4, 4), 0.25)
    experts = torch.tensor([[0], [1], [2], [3]])
    torch.testing.assert_close(
        load_balancing_loss(probs, experts, torch.ones(4, dtype=torch.bool), 0.01), torch.tensor(0.01)
    )


def test_the_layer_computes_the_closed_form_from_its_router():
    """Router = identity on log-probabilities, so the layer's softmax reproduces the hand-built table."""
    config = tiny_config(d_model=4, n_heads=1, ffn="switch", experts={"count": 4, "aux_loss_coefficient": 0.5})
    layer = moe_layer(config).eval()
    with torch.no_grad():
        layer.router.weight.copy_(torch.eye(4))
    probs = torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1], [0.4, 0.3, 0.2, 0.1]])
    layer(probs.log()[None])  # (1, 3, 4): one row of three tokens
    # f = (2/3, 1/3, 0, 0), P = (0.4, 0.3667, 0.1333, 0.1): 0.5 * 4 * (0.2667 + 0.1222) = 0.7778
    expected = 0.5 * 4 * (2 / 3 * 1.2 / 3 + 1 / 3 * 1.1 / 3)
    torch.testing.assert_close(layer.stats.aux_loss, torch.tensor(expected))
    torch.testing.assert_close(layer.stats.gates[:, 0], torch.tensor([0.7, 0.7, 0.4]))
    assert auxiliary_loss(layer).item() == pytest.approx(expected)


def test_the_aux_loss_trains_the_router():
    layer = moe_layer(tiny_config(ffn="switch", experts={"count": 4}))
    layer(torch.randn(2, 8, 32))
    layer.stats.aux_loss.backward()
    assert layer.router.weight.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------------------------------
# Capacity


def all_to_expert_zero(layer: MixtureOfExperts) -> torch.Tensor:
    """Inputs whose first feature is positive and a router that scores expert 0 by it: every token picks 0."""
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0, 0] = 10.0
    x = torch.randn(2, 4, 32)
    x[..., 0] = x[..., 0].abs() + 1
    return x


def test_over_capacity_tokens_pass_through_the_residual_unchanged_and_are_counted():
    config = tiny_config(ffn="switch", experts={"count": 2, "capacity_factor": 1.0})
    layer = moe_layer(config).train()
    x = all_to_expert_zero(layer)
    output = layer(x)  # 8 tokens, capacity ceil(1.0 * 8 / 2) = 4 slots at expert 0, none used at expert 1
    # slots go in position order, batch rows within a position: positions 0 and 1 of both rows keep theirs
    dropped = torch.tensor([[False, False, True, True]] * 2)
    assert (output[dropped] == 0).all() and (output[~dropped] != 0).all()
    residual = Residual(config)
    torch.testing.assert_close(residual(x, layer)[dropped], x[dropped], rtol=0, atol=0)
    assert layer.stats.dropped_fraction() == 0.5
    metrics = routing_metrics(layer)
    assert metrics["dropped_fraction"] == 0.5 and metrics["expert_load"] == [[1.0, 0.0]]


def test_eval_mode_has_no_capacity_limit():
    layer = moe_layer(tiny_config(ffn="switch", experts={"count": 2, "capacity_factor": 1.0})).eval()
    assert (layer(all_to_expert_zero(layer)) != 0).all() and layer.stats.dropped_fraction() == 0


def test_a_token_keeps_its_second_choice_when_its_first_is_full():
    layer = moe_layer(tiny_config(ffn="moe", experts={"count": 3, "capacity_factor": 0.75})).train()
    x = all_to_expert_zero(layer)  # first choice 0 for every token
    with torch.no_grad():  # second choice 1 at positions 0-1, 2 at positions 2-3
        layer.router.weight[1, 1], layer.router.weight[2, 1] = 5.0, -5.0
    x[..., 1] = torch.tensor([1.0, 1.0, -1.0, -1.0])
    layer(x)  # 8 tokens x 2 choices; capacity ceil(0.75 * 16 / 3) = 4 slots per expert
    kept = layer.stats.kept.view(4, 2, 2)  # (position, row, choice)
    assert kept[:2, :, 0].all() and not kept[2:, :, 0].any() and kept[..., 1].all()
    assert layer.stats.dropped_fraction() == 0.25


@pytest.mark.parametrize("ffn", ["switch", "moe"])
def test_capacity_never_lets_a_future_token_change_a_past_logit(ffn):
    model = DecoderLM(tiny_config(ffn=ffn, experts={"count": 3, "capacity_factor": 0.5})).train()  # dropout 0
    ids = torch.randint(0, 37, (3, 10))
    changed = ids.clone()
    changed[:, 6:] = torch.randint(0, 37, (3, 4))
    before = model(ids)
    assert routing_metrics(model)["dropped_fraction"] > 0.2
    torch.testing.assert_close(model(changed)[:, :6], before[:, :6])


def test_padding_takes_no_capacity():
    model = Encoder(tiny_config(ffn="switch", experts={"count": 2, "capacity_factor": 0.75})).train()
    ids = torch.randint(0, 37, (2, 7))
    padded = torch.cat([ids, torch.randint(0, 37, (2, 5))], dim=1)
    mask = torch.cat([torch.ones(2, 7), torch.zeros(2, 5)], dim=1).long()
    unpadded = model(ids)
    drops = routing_metrics(model)["dropped_fraction"]
    torch.testing.assert_close(model(padded, mask)[:, :7], unpadded, atol=1e-5, rtol=1e-5)
    assert drops > 0 and routing_metrics(model)["dropped_fraction"] == drops


# ---------------------------------------------------------------------------------------------------------------
# Precision, generation, metrics


def test_the_router_runs_in_float32_under_bf16_autocast():
    layer = moe_layer(tiny_config(ffn="moe", experts={"count": 4})).eval()
    x = torch.randn(2, 8, 32)
    reference = layer(x)
    experts = layer.stats.experts.clone()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = layer(x)
    assert layer.stats.probs.dtype == torch.float32 and torch.equal(layer.stats.experts, experts)
    torch.testing.assert_close(output.float(), reference, atol=0.02, rtol=0.05)


def test_a_bf16_switch_model_generates():
    model = DecoderLM(tiny_config(ffn="switch", experts={"count": 4})).eval()
    out = model.generate(torch.randint(0, 37, (2, 3)), 6, temperature=0, dtype=torch.bfloat16)
    assert out.shape == (2, 9) and ((0 <= out) & (out < 37)).all()


def test_routing_metrics_cover_every_expert_layer():
    model = EncoderDecoder(tiny_config(ffn="switch", experts={"count": 4, "every": 2})).train()
    model(torch.randint(0, 37, (2, 6)), torch.randint(0, 37, (2, 5)))
    metrics = routing_metrics(model)
    assert len(metrics["expert_load"]) == 2  # layer 2 of the encoder and of the decoder
    assert all(math.isclose(sum(load), 1.0, abs_tol=1e-4) for load in metrics["expert_load"])
    assert 0 <= metrics["dropped_fraction"] <= 1 and metrics["aux_loss"] >= 0.01 * 2 * 0.999
    assert routing_metrics(EncoderDecoder(tiny_config())) == {}


def test_moe_every_puts_experts_in_every_kth_block():
    model = DecoderLM(tiny_config(ffn="switch", n_layers=4, experts={"every": 2}))
    kinds = [type(block.feed_forward).__name__ for block in model.decoder.blocks]
    assert kinds == ["FeedForward", "MixtureOfExperts", "FeedForward", "MixtureOfExperts"]


def test_experts_share_no_parameters_and_the_count_grows_with_them():
    from kqv import count_parameters

    dense, switch = DecoderLM(tiny_config()), DecoderLM(tiny_config(ffn="switch", experts={"count": 4}))
    feed_forward = 32 * 64 + 64 + 64 * 32 + 32
    assert count_parameters(switch) - count_parameters(dense) == 2 * (3 * feed_forward + 4 * 32)


# ---------------------------------------------------------------------------------------------------------------
# Config errors


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(ffn="experts"), r"ffn must be one of \['dense', 'switch', 'moe'\], got 'experts'"),
        (dict(ffn="moe", experts={"count": 2, "top_k": 3}), r"experts.top_k \(3\) cannot exceed experts.count \(2\)"),
        (dict(ffn="moe", experts={"count": 1}), r"experts.top_k \(2\) cannot exceed experts.count \(1\)"),
        (dict(ffn="switch", experts={"top_k": 2}), "ffn='switch' sends each token to one expert.*use ffn='moe'"),
        (dict(ffn="moe", experts={"top_k": 1}), "use ffn='switch'"),
        (dict(ffn="switch", experts={"capacity_factor": 0.0}), "model.experts.capacity_factor must be positive"),
        (dict(ffn="switch", experts={"count": 0}), "model.experts.count must be positive"),
        (dict(ffn="switch", experts={"aux_loss_coefficient": -1.0}), "model.experts.aux_loss_coefficient must be >= 0"),
        (dict(ffn="switch", experts={"every": 3}), r"experts.every \(3\) exceeds the number of layers \(2\)"),
    ],
)
def test_bad_expert_options_are_clear_errors(changes, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**changes)


def test_expert_options_round_trip_through_toml():
    config = tiny_config(
        ffn="moe", experts={"count": 4, "top_k": 2, "capacity_factor": 2.0, "aux_loss_coefficient": 0.02}
    )
    assert ModelConfig.from_toml(config.to_toml()) == config


def test_routing_record_is_what_the_layer_used():
    layer = moe_layer(tiny_config(ffn="moe", experts={"count": 4})).eval()
    layer(torch.randn(1, 5, 32))
    assert isinstance(layer.stats, Routing) and layer.stats.experts.shape == (5, 2)
    assert (layer.stats.experts[:, 0] != layer.stats.experts[:, 1]).all()


def test_the_trainer_logs_the_routing_of_every_expert_layer(tmp_path):
    from kqv.train.config import TrainConfig
    from kqv.train.metrics import read_metrics
    from kqv.train.trainer import Trainer

    model = DecoderLM(tiny_config(ffn="switch", experts={"count": 2}))
    config = TrainConfig(
        steps=4, batch_size=2, warmup_steps=1, precision="fp32", log_every=2, eval_every=4, checkpoint_every=4
    )
    ids = torch.randint(0, 37, (2, 12))
    Trainer(model, config, tmp_path, train_batches=lambda i: (ids, ids), loss_fn=lambda m, b: m(*b), quiet=True).train()
    logged = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "train_loss" in r]
    assert [r["step"] for r in logged] == [2, 4]
    for record in logged:
        assert len(record["expert_load"]) == 2  # one per layer, each a split of the batch's tokens
        assert all(math.isclose(sum(load), 1.0, abs_tol=1e-4) for load in record["expert_load"])
        assert 0.0 <= record["dropped_fraction"] <= 1.0 and record["aux_loss"] > 0
