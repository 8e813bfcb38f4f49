"""Grouped-query and multi-query attention (`ModelConfig.n_kv_heads`; Ainslie et al. 2023, Shazeer 2019).

The reference throughout is plain multi-head attention on keys and values repeated for each query head with
`repeat_interleave` on the head axis: for one attention call, the same core on the repeated tensors; for a whole
model, a multi-head copy of it whose key/value projection rows are repeated that way. Every core and kernel path
(the readable reference, SDPA with and without `enable_gqa`, the bf16 plain path, blockwise, flex_attention, the
sparse cores), position scheme and mask (padding, causal, packed, a cache's queries) must match it; the KV cache
keeps n_kv_heads heads; cached decoding gives what the full forward gives.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from conftest import tiny_config
from kqv import DecoderLM, Encoder, EncoderDecoder, KVCache, ModelConfig
from kqv.errors import ConfigError, RunError
from kqv.nn import cores, flex
from kqv.nn.attention import MultiHeadAttention
from kqv.nn.cores import AttentionCall, FullAttention, packed_mask, padding_mask, repeat_kv
from kqv.nn.decoding import DecodeStep
from kqv.nn.devices import CPU_KERNELS, CUDA_KERNELS, TORCH_KERNELS
from kqv.nn.lora import LoRAConfig, add_lora, merge_lora
from kqv.nn.positions import attention_positions
from kqv.train.checkpoints import load_weights
from kqv.train.config import TrainConfig
from kqv.train.flops import model_flops_per_token, training_flops_per_token
from kqv.train.preflight import TRAINING_BYTES_PER_PARAMETER, batch_memory
from kqv.train.trainer import Trainer
from test_fast_decoding import assert_lean_step_is_the_general_path

ATOL = 1e-5


def repeated(x: torch.Tensor, heads: int) -> torch.Tensor:
    """The reference's keys or values: each of x's heads repeated for its group of query heads."""
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def as_multi_head(model: torch.nn.Module) -> torch.nn.Module:
    """A plain multi-head copy of `model` (n_kv_heads unset) computing the same function: each key/value head's
    rows of every `to_keys_values` repeated (repeat_interleave) for the query heads that share it."""
    config = model.config
    groups, heads, head_dim = config.n_heads // config.kv_heads, config.n_heads, config.head_dim
    reference = type(model)(config.replace(n_kv_heads=None))
    state = {}
    for name, tensor in model.state_dict().items():
        if "to_keys_values" in name:  # (2 * kv_heads * head_dim[, d_model]): keys then values, head by head
            by_head = tensor.reshape(2, config.kv_heads, head_dim, *tensor.shape[1:])
            tensor = by_head.repeat_interleave(groups, dim=1).reshape(2 * heads * head_dim, *tensor.shape[1:])
        state[name] = tensor
    reference.load_state_dict(state)
    return reference.train(model.training)


def gqa_config(n_heads: int = 4, n_kv_heads: int = 2, **changes) -> ModelConfig:
    return tiny_config(n_heads=n_heads, n_kv_heads=n_kv_heads, d_model=8 * n_heads, **changes)


# ---------------------------------------------------------------------------------------------------------------
# One attention call: every path of full attention against the same core on repeated keys and values

PATHS = ["sdpa", "sdpa-repeating", "reference", "weights", "blockwise", "bf16-plain"]
MASKS = ["none", "causal", "padding", "packed", "cached"]
SCHEMES = ["none", "alibi", "relative"]


def call_inputs(mask_kind: str, heads: int, kv_heads: int, dtype: torch.dtype):
    batch, k_time, head_dim = 2, 11, 8
    q_time = 3 if mask_kind == "cached" else k_time
    queries = torch.randn(batch, heads, q_time, head_dim, dtype=dtype)
    keys, values = (torch.randn(batch, kv_heads, k_time, head_dim, dtype=dtype) for _ in range(2))
    mask = None
    if mask_kind == "padding":
        real = torch.ones(batch, k_time, dtype=torch.long)
        real[0, -4:] = 0
        mask = padding_mask(real)
    elif mask_kind == "packed":
        mask = packed_mask(torch.tensor([[0] * 4 + [1] * 7, [0] * 6 + [1] * 3 + [2] * 2]))
    return queries, keys, values, mask, mask_kind in ("causal", "packed", "cached")


@pytest.mark.parametrize("kv_heads", [1, 2], ids=["MQA", "GQA"])
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("path", PATHS)
def test_full_attention_on_grouped_keys_is_multi_head_attention_on_repeated_ones(
    path, mask_kind, scheme, kv_heads, monkeypatch
):
    heads = 8
    if path == "sdpa-repeating":  # a device whose fused kernels take no groups: repeated before SDPA
        monkeypatch.setattr(cores, "kernels", lambda device: TORCH_KERNELS)
    core = FullAttention(blockwise="always" if path == "blockwise" else "never", fused=path != "reference")
    dtype = torch.bfloat16 if path == "bf16-plain" else torch.float32
    queries, keys, values, mask, causal = call_inputs(mask_kind, heads, kv_heads, dtype)
    positions = attention_positions(tiny_config(n_heads=heads, d_model=8 * heads, position=scheme)).to(dtype)
    call = AttentionCall(positions, None, mask, causal, 0.0, path == "weights")
    with torch.no_grad():
        output, weights = core.attend(queries, keys, values, call)
        expected, expected_weights = core.attend(queries, repeated(keys, heads), repeated(values, heads), call)
    assert output.shape == (2, heads, queries.shape[2], 8)
    torch.testing.assert_close(output, expected, atol=ATOL, rtol=0)
    if path == "weights":  # per query head, as multi-head attention gives them
        assert weights.shape == (2, heads, queries.shape[2], 11)
        torch.testing.assert_close(weights, expected_weights, atol=ATOL, rtol=0)


def test_repeat_kv_is_repeat_interleave_and_a_view_for_one_key_value_head():
    x = torch.randn(2, 3, 5, 4)
    assert torch.equal(repeat_kv(x, 12), x.repeat_interleave(4, dim=1))
    assert repeat_kv(x, 3) is x
    one = torch.randn(2, 1, 5, 4)
    assert repeat_kv(one, 6).untyped_storage().data_ptr() == one.untyped_storage().data_ptr()  # no copy (MQA)


def test_sdpa_takes_the_groups_where_a_fused_kernel_does_and_repeats_them_elsewhere(monkeypatch):
    queries = torch.randn(1, 4, 3, 8)
    assert cores.sdpa_takes_groups(queries, None) and cores.sdpa_takes_groups(queries, torch.ones(3, 3).bool())
    monkeypatch.setattr(cores, "kernels", lambda device: CUDA_KERNELS)  # CUDA: the flash kernel (half, unmasked)
    assert not cores.sdpa_takes_groups(queries, None)
    assert cores.sdpa_takes_groups(queries.bfloat16(), None)
    assert not cores.sdpa_takes_groups(queries.bfloat16(), torch.ones(3, 3).bool())
    assert CPU_KERNELS.sdpa_groups == "always" and TORCH_KERNELS.sdpa_groups == "never"


# ---------------------------------------------------------------------------------------------------------------
# Whole models against their multi-head copies

MODEL_CASES = {
    **{p: dict(position=p) for p in ("sinusoidal", "learned", "rope", "alibi", "relative", "none")},
    "linformer": dict(attention="linformer", linformer={"k": 8, "sharing": "none"}, position="rope"),
    "bigbird": dict(attention="bigbird", bigbird={"block": 4, "window": 1, "global_blocks": 1, "random_blocks": 1}),
    "local": dict(attention="local", local={"block": 4}, position="rope"),
    "memory_compressed": dict(attention="memory_compressed", memory_compressed={"compression": 3}),
    "blockwise relative": dict(blockwise="always", position="relative"),
    "rmsnorm swiglu": dict(norm="rmsnorm", activation="swiglu", position="rope", bias=False),
}
HEADS = {"MQA": (4, 1), "GQA": (4, 2), "GQA 8/2": (8, 2)}


@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
@pytest.mark.parametrize("case", MODEL_CASES.values(), ids=MODEL_CASES.keys())
def test_a_grouped_decoder_and_encoder_compute_their_multi_head_copies(case, heads):
    ids, real = torch.randint(1, 37, (2, 12)), torch.ones(2, 12, dtype=torch.long)
    real[0, -3:] = 0
    for cls in (DecoderLM, Encoder):
        model = cls(gqa_config(*heads, **case)).eval()
        reference = as_multi_head(model)
        with torch.no_grad():
            run = (lambda m: m(ids)) if cls is DecoderLM else (lambda m: m(ids, real))
            torch.testing.assert_close(run(model), run(reference), atol=ATOL, rtol=0)
    kv = model.blocks[0].self_attention.to_keys_values
    assert kv.out_features == 2 * heads[1] * model.config.head_dim


def test_a_packed_row_and_training_with_gradients_match_the_multi_head_copy():
    model = DecoderLM(gqa_config(8, 2, position="rope"))
    reference = as_multi_head(model)
    ids, sequences = torch.randint(1, 37, (1, 12)), torch.tensor([[0] * 5 + [1] * 7])
    positions = torch.tensor([list(range(5)) + list(range(7))])
    for m in (model, reference):
        m(ids, ids, attention_mask=packed_mask(sequences), positions=positions).backward()
    torch.testing.assert_close(model(ids, attention_mask=packed_mask(sequences), positions=positions),
                               reference(ids, attention_mask=packed_mask(sequences), positions=positions),
                               atol=ATOL, rtol=0)  # fmt: skip
    # the grouped projection's gradient is its copy's summed over each group of repeated rows
    grad, reference_grad = (m.decoder.blocks[0].self_attention.to_keys_values.weight.grad for m in (model, reference))
    summed = reference_grad.reshape(2, 2, 4, 8, -1).sum(2).reshape(grad.shape)
    torch.testing.assert_close(grad, summed, atol=ATOL, rtol=0)


def test_an_encoder_decoders_self_and_cross_attention_take_the_groups_and_translate_with_the_cache():
    model = EncoderDecoder(gqa_config(4, 1, position="rope")).eval()
    reference = as_multi_head(model)
    src, tgt = torch.randint(1, 37, (2, 9)), torch.randint(1, 37, (2, 7))
    src_mask = torch.ones_like(src)
    src_mask[1, -2:] = 0
    with torch.no_grad():
        torch.testing.assert_close(
            model(src, tgt, src_mask=src_mask), reference(src, tgt, src_mask=src_mask), atol=ATOL, rtol=0
        )
        cached = model.generate(src, 6, src_mask=src_mask, bos_id=1, eos_id=2)
        uncached = model.generate(src, 6, src_mask=src_mask, bos_id=1, eos_id=2, use_cache=False)
    assert torch.equal(cached, uncached)
    assert model.decoder.blocks[0].cross_attention.to_keys_values.out_features == 2 * 1 * 8


@pytest.mark.parametrize("case", ["alibi", "relative-keys", "local", "bigbird"])
def test_flex_attention_takes_grouped_keys_and_matches_the_multi_head_copy(case, monkeypatch):
    """flex_attention runs uncompiled on the CPU here (forward only), as tests/test_kernels.py runs it."""
    changes = {
        "alibi": dict(position="alibi"),
        "relative-keys": dict(position="relative", relative={"max_distance": 4, "values": False}),
        "local": dict(attention="local", local={"block": 4}, position="rope"),
        "bigbird": MODEL_CASES["bigbird"],
    }[case]
    model = DecoderLM(tiny_config(d_model=64, n_heads=4, n_kv_heads=2, **changes)).eval()  # head_dim 16
    reference = as_multi_head(model)
    ids = torch.randint(1, 37, (2, 13))
    with torch.no_grad():
        expected = reference(ids)  # today's CPU cores
        calls = []
        attend = flex.attend
        monkeypatch.setattr(flex, "attend", lambda *a, **k: calls.append(a[1].shape[1]) or attend(*a, **k))
        monkeypatch.setattr(flex, "kernels", lambda device: CUDA_KERNELS)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention.*")
            output = model(ids)
    assert len(calls) == model.config.n_layers
    torch.testing.assert_close(output, expected, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# The KV cache and decoding


@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
@pytest.mark.parametrize("position", ["rope", "alibi", "learned"])
def test_the_cache_keeps_n_kv_heads_and_token_by_token_logits_are_the_full_forwards(position, heads):
    model = DecoderLM(gqa_config(*heads, position=position)).eval()
    ids = torch.randint(1, 37, (2, 10))
    cache = model.new_cache()
    with torch.no_grad():
        full = model(ids)
        steps = [model(ids[:, :4], cache=cache)] + [model(ids[:, t : t + 1], cache=cache) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)
    for self_cache, _ in cache:
        assert self_cache.keys.shape == self_cache.values.shape == (2, heads[1], 10, model.config.head_dim)


def cache_bytes(cache: list[tuple[KVCache, KVCache]]) -> int:
    return sum(c.keys.numel() * c.keys.element_size() + c.values.numel() * c.values.element_size() for c, _ in cache)


def test_the_cache_shrinks_by_n_heads_over_n_kv_heads():
    ids = torch.randint(1, 37, (1, 9))
    sizes = {}
    for kv_heads in (8, 2, 1):
        model = DecoderLM(gqa_config(8, kv_heads)).eval()
        cache = model.new_cache()
        with torch.no_grad():
            model(ids, cache=cache)
        sizes[kv_heads] = cache_bytes(cache)
    # layers x (keys and values) x batch x kv_heads x tokens x head_dim x 4 bytes
    assert sizes == {kv: 2 * 2 * 1 * kv * 9 * 8 * 4 for kv in (8, 2, 1)}
    assert sizes[8] // sizes[2] == 4 and sizes[8] // sizes[1] == 8


@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
@pytest.mark.parametrize("position", ["rope", "alibi"])  # the lean decoding step, and the general path
def test_greedy_generation_with_the_cache_is_generation_without_it(position, heads):
    model = DecoderLM(gqa_config(*heads, position=position)).eval()
    assert DecodeStep.supports(model) == (position == "rope")
    ids = torch.randint(1, 37, (3, 5))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    for prompts, prompt_mask in ((ids[:1], None), (ids, mask)):
        cached = model.generate(prompts, 12, temperature=0, attention_mask=prompt_mask)
        uncached = model.generate(prompts, 12, temperature=0, attention_mask=prompt_mask, use_cache=False)
        assert torch.equal(cached, uncached)
        reference = as_multi_head(model).generate(prompts, 12, temperature=0, attention_mask=prompt_mask)
        assert torch.equal(cached, reference)


@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
def test_the_lean_decoding_step_of_a_grouped_model_gives_the_general_paths_logits(heads):
    model = DecoderLM(gqa_config(*heads, position="rope")).eval()
    assert_lean_step_is_the_general_path(model)  # several rows: bit for bit
    assert_lean_step_is_the_general_path(model, batch=1, exact=False)  # one row: its stacked projection


# ---------------------------------------------------------------------------------------------------------------
# The config, parameters, FLOPs, LoRA, checkpoints and the explorer


@pytest.mark.parametrize("n_kv_heads", [3, 0, -2, 16])
def test_n_kv_heads_must_divide_n_heads_and_the_error_names_the_valid_values(n_kv_heads):
    with pytest.raises(
        ConfigError, match=r"n_kv_heads \(.*\) must be a positive divisor of n_heads \(8\).*\[1, 2, 4, 8\]"
    ):
        tiny_config(n_heads=8, n_kv_heads=n_kv_heads)


def test_n_kv_heads_defaults_to_multi_head_attention_and_survives_toml():
    assert tiny_config().kv_heads == 4 and tiny_config(n_kv_heads=4).kv_heads == 4
    config = gqa_config(8, 2)
    assert ModelConfig.from_toml(config.to_toml()) == config and config.kv_heads == 2
    with pytest.raises(ConfigError, match="n_kv_heads"):
        ModelConfig.from_toml('n_heads = 4\nn_kv_heads = "two"')


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (8, 1)])
def test_an_attention_layers_parameters_are_the_closed_form(heads, bias):
    n_heads, kv_heads = heads
    config = ModelConfig(d_model=64, n_heads=n_heads, n_kv_heads=kv_heads, bias=bias)
    layer = MultiHeadAttention(config)
    d, head_dim = 64, 8
    queries_and_output = 2 * (d * d + bias * d)
    keys_and_values = 2 * (d * kv_heads * head_dim + bias * kv_heads * head_dim)
    assert sum(p.numel() for p in layer.parameters()) == queries_and_output + keys_and_values


def test_the_memory_check_counts_the_parameters_of_the_smaller_key_value_projection():
    config = ModelConfig(vocab_size=50304, d_model=768, n_heads=12, n_kv_heads=3, n_layers=12, d_ff=3072)
    with torch.device("meta"):
        counted = sum(p.numel() for p in DecoderLM(config).parameters())
    estimated = batch_memory(config, 1, 512, 50304)["parameters"] / TRAINING_BYTES_PER_PARAMETER
    assert estimated == pytest.approx(counted, rel=0.01)


def test_the_flops_estimate_counts_the_smaller_key_value_projection_as_torch_does():
    config = ModelConfig(vocab_size=96, d_model=48, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=192, max_len=40,
                         dropout=0.0, position="learned", bias=False)  # fmt: skip
    model = DecoderLM(config)
    ids = torch.randint(0, 96, (2, 41))
    with sdpa_kernel(SDPBackend.MATH):
        counted = training_flops_per_token(model, [(ids[:, :-1], ids[:, 1:])], lambda m, b: m(*b), 2 * 40)
    assert model_flops_per_token(model) == pytest.approx(counted, rel=0.01)
    assert model_flops_per_token(as_multi_head(model)) - model_flops_per_token(model) == 6 * 2 * 2 * 48 * 24


def test_lora_adapts_the_grouped_key_value_projection_and_merges_exactly():
    model = DecoderLM(gqa_config(4, 1, position="rope")).eval()
    add_lora(model, LoRAConfig(rank=2, targets=("to_queries", "to_keys_values")))
    for name, parameter in model.named_parameters():
        if "lora_b" in name:
            torch.nn.init.normal_(parameter, std=0.1)  # an adapter that changes something
    ids = torch.randint(1, 37, (2, 8))
    with torch.no_grad():
        adapted = model(ids)
        assert model.decoder.blocks[0].self_attention.to_keys_values.lora_b.shape == (2 * 8, 2)
        torch.testing.assert_close(merge_lora(model)(ids), adapted, atol=ATOL, rtol=0)


def test_a_grouped_models_checkpoint_loads_into_a_model_of_its_config_and_not_into_a_multi_head_one(tmp_path):
    model = DecoderLM(gqa_config(8, 2, position="rope"))
    batch = lambda i: (torch.randint(1, 37, (2, 8)),) * 2  # noqa: E731
    config = TrainConfig(steps=2, batch_size=2, warmup_steps=1, checkpoint_every=2, precision="fp32")
    Trainer(model, config, tmp_path, train_batches=batch, loss_fn=lambda m, b: m(*b), quiet=True).train()
    model.eval()
    loaded = DecoderLM(ModelConfig.from_toml(model.config.to_toml())).eval()
    load_weights(loaded, tmp_path).close()
    ids = torch.randint(1, 37, (1, 6))
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))
    with pytest.raises(RunError, match="does not fit the model"):
        load_weights(DecoderLM(model.config.replace(n_kv_heads=None)), tmp_path).close()


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_the_explorers_neuron_view_reads_the_key_head_its_query_head_shares(position):
    from kqv.explore.interventions import neuron_view
    from test_explore_interventions import TEXT, ids_of, lm_subject

    subject = lm_subject(position=position, n_kv_heads=2)
    with torch.no_grad():
        weights = subject.model.attention_weights(ids_of(subject))  # per layer (1, heads: 4, time, time)
        assert weights[0].shape[1] == 4
        for head in range(4):
            view = neuron_view(subject, {"text": TEXT, "layer": 1, "head": head, "token": 6})
            torch.testing.assert_close(torch.tensor(view["weights"]), weights[1][0, head, 6], atol=ATOL, rtol=0)
