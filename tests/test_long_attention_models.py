"""The long-input attention cores chosen from ModelConfig, inside the three architectures.

Linformer and BigBird are checked against full attention where they must coincide with it (a BigBird window
that covers every block; a Linformer whose projection is the identity), and the blockwise path against the
dense one with the same weights.
"""

import typing

import pytest
import torch
from safetensors.torch import load_model, save_model

import kqv.nn.attention
import kqv.nn.cores
from conftest import tiny_config
from kqv import ModelConfig
from kqv.nn.cores import FullAttention
from kqv.nn.models import DecoderLM, Encoder, EncoderDecoder
from kqv.nn.sparse import BigBirdAttention, LinformerAttention

TIME = 40


def padded_mask(batch=2, time=TIME):
    mask = torch.ones(batch, time, dtype=torch.long)
    mask[0, time - 7 :] = 0
    return mask


def outputs(model, ids, mask=None):
    """The model's output for each architecture: hidden states, or logits."""
    if isinstance(model, Encoder):
        return model(ids, mask)
    if isinstance(model, EncoderDecoder):
        return model(ids, ids[:, :25], src_mask=mask)
    return model(ids)


def copy_of(model_class, config, weights_from):
    model = model_class(config)
    missing, unexpected = model.load_state_dict(weights_from.state_dict(), strict=False)
    assert not unexpected and all("projection" in name for name in missing)
    return model.eval()


# ---------------------------------------------------------------------------------------------------------------
# The config


@pytest.mark.parametrize("attention", ["linformer", "bigbird"])
@pytest.mark.parametrize("position", ["relative", "alibi"])
def test_sparse_attention_with_a_pair_bias_position_is_a_clear_error(attention, position):
    with pytest.raises(ValueError, match=f"cannot take position='{position}'.*attention='full'"):
        tiny_config(attention=attention, position=position)


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            dict(attention="sparse"),
            r"attention must be one of \['full', 'linformer', 'bigbird', 'local', 'memory_compressed'\]",
        ),
        (dict(blockwise="yes"), r"blockwise must be one of \['auto', 'always', 'never'\]"),
        (dict(attention="linformer", linformer={"k": 65}), r"linformer.k \(65\) must be at most max_len \(64\)"),
        (dict(linformer={"k": 0}), "model.linformer.k must be positive"),
        (dict(bigbird={"block": 0}), "model.bigbird.block must be positive"),
        (dict(bigbird={"window": -1}), "model.bigbird.window must be >= 0"),
        (dict(linformer={"sharing": "all"}), "model.linformer.sharing must be one of"),
    ],
)
def test_bad_long_attention_options_are_clear_errors(changes, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**changes)


def test_long_attention_options_round_trip_through_toml():
    config = tiny_config(attention="bigbird", bigbird={"block": 8, "random_blocks": 1}, blockwise="never")
    assert ModelConfig.from_toml(config.to_toml()) == config


# ---------------------------------------------------------------------------------------------------------------
# BigBird and Linformer against full attention


@pytest.mark.parametrize("position", ["rope", "sinusoidal", "learned", "none"])
@pytest.mark.parametrize("model_class", [Encoder, DecoderLM, EncoderDecoder])
def test_bigbird_whose_window_covers_every_block_is_full_attention(model_class, position):
    full = model_class(tiny_config(position=position)).eval()
    bigbird = copy_of(
        model_class,
        tiny_config(
            position=position, attention="bigbird", bigbird={"block": 8, "window": TIME // 8, "random_blocks": 0}
        ),
        full,
    )
    ids = torch.randint(0, 37, (2, TIME))
    mask = padded_mask() if model_class is not DecoderLM else None
    with torch.no_grad():
        expected, actual = outputs(full, ids, mask), outputs(bigbird, ids, mask)
    if mask is not None and model_class is Encoder:  # padding positions' own outputs are unspecified
        expected, actual = expected[mask.bool()], actual[mask.bool()]
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_bigbird_with_a_small_window_is_not_full_attention():
    full = Encoder(tiny_config()).eval()
    bigbird = copy_of(Encoder, tiny_config(attention="bigbird", bigbird={"block": 4, "random_blocks": 0}), full)
    ids = torch.randint(0, 37, (2, TIME))
    with torch.no_grad():
        assert (full(ids) - bigbird(ids)).abs().max() > 1e-3


@pytest.mark.parametrize("position", ["rope", "learned"])
def test_linformer_with_identity_projections_is_full_attention_in_the_encoder(position):
    config = tiny_config(position=position, max_len=TIME)
    full = Encoder(config).eval()
    linformer = copy_of(Encoder, config.replace(attention="linformer", linformer={"k": TIME, "sharing": "none"}), full)
    with torch.no_grad():
        for module in linformer.modules():
            if isinstance(module, LinformerAttention):
                module.projection.keys.copy_(torch.eye(TIME).expand_as(module.projection.keys))
                module.projection.values.copy_(torch.eye(TIME).expand_as(module.projection.values))
        ids = torch.randint(0, 37, (2, TIME))
        torch.testing.assert_close(linformer(ids), full(ids), atol=1e-5, rtol=1e-5)


def test_every_self_attention_gets_the_chosen_core_and_cross_attention_stays_full():
    model = EncoderDecoder(tiny_config(attention="bigbird"))
    cores = [
        (name, type(m.core)) for name, m in model.named_modules() if isinstance(m, kqv.nn.attention.MultiHeadAttention)
    ]
    assert all(core is BigBirdAttention for name, core in cores if "self_attention" in name)
    assert all(core is FullAttention for name, core in cores if "cross_attention" in name)
    assert len(cores) == 3 * 2  # 2 encoder self, 2 decoder self, 2 cross


@pytest.mark.parametrize("attention", ["linformer", "bigbird"])
def test_sparse_decoder_lm_future_tokens_never_change_past_logits(attention):
    model = DecoderLM(
        tiny_config(attention=attention, position="rope", linformer={"k": 16}, bigbird={"block": 8})
    ).eval()
    ids = torch.randint(0, 37, (2, TIME))
    changed = ids.clone()
    changed[:, 25:] = torch.randint(0, 37, (2, TIME - 25))
    with torch.no_grad():
        assert torch.equal(model(ids)[:, :25], model(changed)[:, :25])
        assert not torch.allclose(model(ids)[:, 25:], model(changed)[:, 25:])


@pytest.mark.parametrize("attention", ["linformer", "bigbird"])
def test_sparse_decoder_lm_cached_logits_equal_uncached(attention):
    model = DecoderLM(
        tiny_config(attention=attention, position="rope", linformer={"k": 16}, bigbird={"block": 8})
    ).eval()
    ids = torch.randint(0, 37, (2, 30))
    with torch.no_grad():
        cache = model.new_cache()
        stepwise = torch.cat(
            [model(ids[:, :10], cache=cache)] + [model(ids[:, t : t + 1], cache=cache) for t in range(10, 30)], dim=1
        )
        torch.testing.assert_close(stepwise, model(ids), atol=1e-5, rtol=1e-5)
        prompt = ids[:, :5]
        assert torch.equal(
            model.generate(prompt, 10, temperature=0, use_cache=True),
            model.generate(prompt, 10, temperature=0, use_cache=False),
        )


def test_layerwise_linformer_has_one_projection_that_survives_a_checkpoint(tmp_path):
    config = tiny_config(attention="linformer", linformer={"k": 16, "sharing": "layerwise"})
    model = Encoder(config)
    projections = {id(m.projection) for m in model.modules() if isinstance(m, LinformerAttention)}
    assert len(projections) == 1
    headwise = Encoder(config.replace(linformer={"sharing": "headwise"}))
    assert (
        sum(p.numel() for p in headwise.parameters()) - sum(p.numel() for p in model.parameters())
        == (2 * config.n_layers - 1) * config.max_len * config.linformer.k
    )
    save_model(model, str(tmp_path / "model.safetensors"))
    loaded = Encoder(config)
    load_model(loaded, str(tmp_path / "model.safetensors"))
    ids = torch.randint(0, 37, (2, TIME))
    torch.testing.assert_close(loaded.eval()(ids), model.eval()(ids))


def test_attention_maps_of_a_sparse_model_are_a_clear_error():
    model = DecoderLM(tiny_config(attention="bigbird"))
    with pytest.raises(ValueError, match="attention weights exist only for attention='full'"):
        model.attention_weights(torch.randint(0, 37, (1, 10)))


def test_linformer_input_longer_than_max_len_is_a_clear_error():
    model = Encoder(tiny_config(attention="linformer", position="rope", linformer={"k": 16}))
    with pytest.raises(ValueError, match="Linformer projects at most max_len=64 positions, got 70"):
        model(torch.randint(0, 37, (1, 70)))


# ---------------------------------------------------------------------------------------------------------------
# Exact blockwise attention inside the models


@pytest.mark.parametrize("position", ["relative", "alibi", "rope"])
@pytest.mark.parametrize("model_class", [Encoder, DecoderLM, EncoderDecoder])
def test_blockwise_path_equals_dense_path_in_values_and_gradients(model_class, position):
    dense = model_class(tiny_config(position=position, blockwise="never"))
    blockwise = copy_of(model_class, tiny_config(position=position, blockwise="always"), dense)
    ids = torch.randint(0, 37, (2, TIME))
    mask = padded_mask() if model_class is not DecoderLM else None
    results = []
    for model in (dense, blockwise):
        out = outputs(model, ids, mask)
        if mask is not None and model_class is Encoder:
            out = out[mask.bool()]
        loss = (out * torch.linspace(-1, 1, out.shape[-1])).sum()
        results.append([out, *torch.autograd.grad(loss, list(model.parameters()))])
    for actual, expected in zip(*results, strict=True):
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "position, time, takes_blockwise",
    [("relative", 2048, True), ("alibi", 2048, True), ("relative", 64, False), ("rope", 2048, False)],
)
def test_auto_takes_the_blockwise_path_only_where_sdpa_would_build_n_by_n(monkeypatch, position, time, takes_blockwise):
    calls = []
    real = kqv.nn.cores.blockwise_attention
    monkeypatch.setattr(kqv.nn.cores, "blockwise_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = DecoderLM(tiny_config(position=position, d_model=8, n_heads=1, n_layers=1, max_len=time)).eval()
    with torch.no_grad():
        model(torch.randint(0, 37, (1, time)))
    assert bool(calls) == takes_blockwise


@pytest.mark.parametrize("device_kernels, takes_blockwise", [("cpu", True), ("cuda", False)])
def test_a_padded_encoder_input_takes_blockwise_only_where_sdpa_cannot_stream_the_padding(
    monkeypatch, device_kernels, takes_blockwise
):
    """A padding mask is (batch, 1, 1, time), never n x n: CUDA's memory-efficient SDPA kernel streams it, so only
    the CPU's kernels (kqv's choice there) take the blockwise path for a long padded input."""
    from kqv.nn.devices import CPU_KERNELS, CUDA_KERNELS

    chosen = {"cpu": CPU_KERNELS, "cuda": CUDA_KERNELS}[device_kernels]
    monkeypatch.setattr(kqv.nn.cores, "kernels", lambda device: chosen)
    calls = []
    real = kqv.nn.cores.blockwise_attention
    monkeypatch.setattr(kqv.nn.cores, "blockwise_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = Encoder(tiny_config(position="rope", d_model=8, n_heads=1, n_layers=1, max_len=2048)).eval()
    mask = torch.ones(1, 2048, dtype=torch.long)
    mask[0, 2000:] = 0
    with torch.no_grad():
        model(torch.randint(0, 37, (1, 2048)), mask)
    assert bool(calls) == takes_blockwise


def test_auto_keeps_the_dense_path_while_attention_dropout_is_on(monkeypatch):
    monkeypatch.setattr(kqv.nn.cores, "blockwise_attention", lambda *a, **k: pytest.fail("blockwise taken"))
    model = DecoderLM(tiny_config(position="alibi", d_model=8, n_heads=1, n_layers=1, max_len=2048, dropout=0.1))
    model.train()(torch.randint(0, 37, (1, 2048)))


def test_sparse_core_with_a_mask_that_is_not_padding_is_a_clear_error():
    attention = kqv.nn.attention.MultiHeadAttention(tiny_config(attention="bigbird"))
    x = torch.randn(2, 10, 32)
    with pytest.raises(
        ValueError, match=r"padding masks, \(batch, 1, 1, k_time\), only; got a mask of shape \(10, 10\)"
    ):
        attention(x, mask=torch.ones(10, 10, dtype=torch.bool))


def test_every_attention_kind_the_config_accepts_has_a_core_and_no_core_is_unreachable():
    assert list(kqv.nn.attention.CORES) == list(typing.get_args(kqv.nn.config.AttentionKind))
    for name, build in kqv.nn.attention.CORES.items():
        assert isinstance(build(tiny_config(attention=name, max_len=256)), kqv.nn.cores.AttentionCore), name
