"""Local and memory-compressed attention (kqv.nn.dmca, Liu et al. 2018) and layer_pattern.

Causality, padding, cache == uncached and gradients run over conftest.VARIANTS ("local", "memory_compressed",
"dmca"); here: the cores against independent references (full attention for one local block; a Conv1d with
kernel = stride = c and an explicitly masked dense softmax for memory-compressed attention), causality at every
cut across block edges, the layer pattern and the config errors.
"""

import pytest
import torch

from conftest import tiny_config
from kqv.nn.cores import scaled_dot_product_attention
from kqv.nn.dmca import LocalAttention, MemoryCompressedAttention
from kqv.nn.models import DecoderLM, Encoder


def qkv(batch=2, heads=3, time=11, head_dim=4, q_time=None):
    q = torch.randn(batch, heads, q_time or time, head_dim)
    return q, torch.randn(batch, heads, time, head_dim), torch.randn(batch, heads, time, head_dim)


@pytest.mark.parametrize("causal", [False, True])
def test_local_attention_with_one_block_is_full_attention(causal):
    q, k, v = qkv(time=12)
    padding = torch.ones(2, 12, dtype=torch.bool)
    padding[1, 9:] = False
    mask = padding[:, None, None, :]
    expected, _ = scaled_dot_product_attention(q, k, v, mask=mask, causal=causal)
    torch.testing.assert_close(LocalAttention(16)(q, k, v, causal=causal, key_padding=padding), expected)


def test_a_local_lm_with_one_block_equals_the_full_lm_with_the_same_weights():
    full = DecoderLM(tiny_config(position="rope")).eval()
    local = DecoderLM(tiny_config(position="rope", attention="local", local={"block": 64})).eval()
    local.load_state_dict(full.state_dict())  # local attention has no parameters of its own
    ids = torch.randint(0, 37, (2, 30))
    torch.testing.assert_close(local(ids), full(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_local_attention_is_full_attention_within_each_block(causal):
    q, k, v = qkv(time=10)
    out = LocalAttention(4)(q, k, v, causal=causal)
    for start in range(0, 10, 4):  # blocks 0-3, 4-7, 8-9
        part = slice(start, start + 4)
        expected, _ = scaled_dot_product_attention(q[:, :, part], k[:, :, part], v[:, :, part], causal=causal)
        torch.testing.assert_close(out[:, :, part], expected)


def reference_memory_compressed(core, q, k, v, causal):
    """A dense, loop-free restatement: keys compressed by torch's Conv1d (kernel = stride = c), then each query
    scores [every compressed block | every raw key] under an explicit mask, one softmax."""
    batch, heads, time, d = k.shape
    c = core.compression
    conv_k, conv_v = (torch.nn.Conv1d(d, d, c, stride=c) for _ in range(2))
    with torch.no_grad():
        for conv, linear in ((conv_k, core.compress_keys), (conv_v, core.compress_values)):
            conv.weight.copy_(linear.weight.view(d, c, d).permute(0, 2, 1))  # (out, in, kernel)
            conv.bias.copy_(linear.bias)
    pad = -time % c

    def compress(conv, x):  # (batch, heads, time, d) -> (batch, heads, m, d)
        x = torch.nn.functional.pad(x, (0, 0, 0, pad)).flatten(0, 1).transpose(1, 2)  # (b*h, d, time + pad)
        return conv(x).transpose(1, 2).unflatten(0, (batch, heads))

    ck, cv = compress(conv_k, k), compress(conv_v, v)
    m = ck.shape[2]
    if not causal:
        return scaled_dot_product_attention(q, ck, cv)[0]
    i = torch.arange(time)[:, None]
    sees_block = torch.arange(m)[None, :] < i // c  # wholly earlier blocks
    sees_raw = (torch.arange(time)[None, :] // c == i // c) & (torch.arange(time)[None, :] <= i)
    mask = torch.cat([sees_block, sees_raw], dim=1)  # (time, m + time)
    return scaled_dot_product_attention(q, torch.cat([ck, k], 2), torch.cat([cv, v], 2), mask=mask)[0]


@pytest.mark.parametrize("time", [9, 11, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_memory_compressed_attention_equals_a_strided_convolution_and_a_masked_softmax(causal, time):
    core = MemoryCompressedAttention(4, 3)
    q, k, v = qkv(time=time)
    expected = reference_memory_compressed(core, q, k, v, causal)
    torch.testing.assert_close(core(q, k, v, causal=causal), expected, atol=1e-5, rtol=1e-5)


def test_memory_compressed_attention_over_several_query_chunks(monkeypatch):
    monkeypatch.setattr("kqv.nn.dmca.QUERY_CHUNK", 6)  # two query blocks of 3 per chunk
    core = MemoryCompressedAttention(4, 3)
    q, k, v = qkv(time=20)
    torch.testing.assert_close(
        core(q, k, v, causal=True), reference_memory_compressed(core, q, k, v, True), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("core", [LocalAttention(4), MemoryCompressedAttention(4, 3)], ids=["local", "compressed"])
def test_no_future_key_ever_reaches_an_earlier_query_at_any_cut(core):
    """Every cut 1..time-1, so cuts inside a block, at its edges and one before them are all tried: keys and
    values at and after the cut are replaced, and outputs before it must not move."""
    q, k, v = qkv(time=13)
    out = core(q, k, v, causal=True)
    for cut in range(1, 13):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, cut:], v2[:, :, cut:] = torch.randn_like(k2[:, :, cut:]), torch.randn_like(v2[:, :, cut:])
        changed = core(q, k2, v2, causal=True)
        assert torch.equal(changed[:, :, :cut], out[:, :, :cut]), cut
        assert not torch.allclose(changed[:, :, cut:], out[:, :, cut:])


@pytest.mark.parametrize("core", [LocalAttention(4), MemoryCompressedAttention(4, 3)], ids=["local", "compressed"])
def test_the_newest_queries_against_a_cache_equal_their_rows_of_the_whole_sequence(core):
    q, k, v = qkv(time=14)
    whole = core(q, k, v, causal=True)
    for new in (1, 2, 5):
        torch.testing.assert_close(core(q[:, :, -new:], k, v, causal=True), whole[:, :, -new:])


def test_layer_pattern_cycles_the_attention_kinds_over_the_layers():
    model = Encoder(tiny_config(n_layers=5, layer_pattern="local, memory_compressed", local={"block": 8}))
    kinds = [type(block.self_attention.core).__name__ for block in model.blocks]
    assert kinds == ["LocalAttention", "MemoryCompressedAttention"] * 2 + ["LocalAttention"]


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            dict(attention="compressed"),
            r"attention must be one of \['full', 'linformer', 'bigbird', 'local', "
            r"'memory_compressed'\]",
        ),
        (
            dict(layer_pattern="local,compressed"),
            r"layer_pattern 'local,compressed' has unknown attention kind\(s\) "
            r"\['compressed'\].*\['full', 'linformer', 'bigbird', 'local', "
            r"'memory_compressed'\]",
        ),
        (
            dict(attention="memory_compressed", memory_compressed={"compression": 1}),
            "model.memory_compressed.compression must be at least 2",
        ),
        (
            dict(attention="local", local={"block": 5}),
            r"local.block \(5\) must divide max_len \(64\).*\[1, 2, 4, 8, 16",
        ),
        (dict(layer_pattern="full,local", local={"block": 48}), r"local.block \(48\) must divide max_len"),
        (dict(attention="local", position="alibi"), "attention='local' cannot take position='alibi'"),
        (dict(local={"block": 0}), "model.local.block must be positive"),
    ],
)
def test_bad_dmca_options_are_clear_errors_at_config_time(changes, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**changes)
