import math

import pytest
import torch

from conftest import tiny_config
from kqv import DecoderLM
from kqv.nn.attention import scaled_dot_product_attention
from kqv.nn.sparse import (
    BigBirdAttention,
    LinformerAttention,
    LinformerProjection,
    bigbird_layout,
    bigbird_mask,
    gather_index,
    share_linformer_projection,
)

BATCH, HEADS, TIME, HEAD_DIM = 2, 3, 150, 8


def inputs(time=TIME, requires_grad=False):
    return [torch.randn(BATCH, HEADS, time, HEAD_DIM, requires_grad=requires_grad) for _ in range(3)]


def key_padding(time=TIME):
    keep = torch.ones(BATCH, time, dtype=torch.bool)
    keep[0, time - 30 :] = False
    keep[1, 3:9] = False
    return keep


# ---------------------------------------------------------------------------------------------------------------
# BigBird

# (block, window, global_blocks, random_blocks): the last one has no global block and no random ones
BIGBIRD_SHAPES = [(16, 1, 1, 2), (8, 2, 2, 3), (10, 0, 1, 0), (32, 1, 0, 1)]


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", BIGBIRD_SHAPES)
def test_bigbird_equals_dense_attention_with_its_mask_in_values_and_gradients(shape, causal, padding):
    block, window, global_blocks, random_blocks = shape
    keep = key_padding() if padding else None
    q, k, v = inputs(requires_grad=True)
    mask = bigbird_mask(TIME, block, window, global_blocks, random_blocks, causal, seed=3)
    if keep is not None:
        mask = mask & keep[:, None, None, :]
    expected, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    actual = BigBirdAttention(block, window, global_blocks, random_blocks, seed=3)(
        q, k, v, causal=causal, key_padding=keep
    )
    weights = torch.randn_like(expected)
    for a, e in zip(
        [actual, *torch.autograd.grad((actual * weights).sum(), (q, k, v))],
        [expected, *torch.autograd.grad((expected * weights).sum(), (q, k, v))],
    ):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)


def test_bigbird_mask_has_global_window_and_random_blocks():
    block, window, global_blocks, random_blocks = 4, 1, 2, 3
    n_blocks = 12
    blocks = bigbird_mask(n_blocks * block, block, window, global_blocks, random_blocks)[::block, ::block]
    assert blocks[:global_blocks].all() and blocks[:, :global_blocks].all()  # global rows and columns
    for i in range(global_blocks, n_blocks):
        neighbours = set(range(max(0, i - window), min(n_blocks, i + window + 1)))
        assert all(blocks[i, j] for j in neighbours)
        others = set(range(n_blocks)) - neighbours - set(range(global_blocks))
        assert sum(bool(blocks[i, j]) for j in others) == random_blocks
    assert bigbird_mask(40, 4, 1, 1, 2, causal=True).triu(1).sum() == 0


def test_bigbird_random_blocks_are_fixed_by_the_seed():
    assert bigbird_layout(30, 1, 1, 3, False, 7) == bigbird_layout(30, 1, 1, 3, False, 7)
    assert bigbird_layout(30, 1, 1, 3, False, 7) != bigbird_layout(30, 1, 1, 3, False, 8)


def test_bigbird_causal_future_tokens_never_change_past_outputs():
    attention = BigBirdAttention(block=8, window=1, global_blocks=1, random_blocks=2)
    q, k, v = inputs()
    short = attention(q[:, :, :70], k[:, :, :70], v[:, :, :70], causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 70:] = 100 * torch.randn_like(k2[:, :, 70:])
    v2[:, :, 70:] = 100 * torch.randn_like(v2[:, :, 70:])
    long = attention(q, k2, v2, causal=True)  # a longer sequence: more blocks, new random choices for them only
    torch.testing.assert_close(long[:, :, :70], short, atol=0, rtol=0)


def test_bigbird_never_builds_an_n_by_n_matrix(monkeypatch):
    """Checked on the softmax inputs: at 4096 tokens with 64-token blocks, a non-global query scores at most
    (1 + 2 + 1 + 2) blocks of 64 keys; only the one global block of queries scores all 4096."""
    sizes = []
    softmax = torch.Tensor.softmax

    def recording_softmax(self, *args, **kwargs):
        sizes.append(self.numel())
        return softmax(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "softmax", recording_softmax)
    BigBirdAttention(block=64, window=1, global_blocks=1, random_blocks=2)(
        *(torch.randn(1, 1, 4096, 8) for _ in range(3))
    )
    assert sizes and max(sizes) <= 4096 * 6 * 64
    assert sum(sizes) < 4096 * 4096 // 5


# ---------------------------------------------------------------------------------------------------------------
# Linformer


def linformer_by_definition(q, k, v, e, f, causal):
    """softmax(q (E^T K)^T / sqrt d) F^T V, with causal query i using only rows 0..i of E, F, K and V."""
    if not causal:
        scores = q @ (e.transpose(1, 2) @ k).transpose(-2, -1) / math.sqrt(q.shape[-1])
        return scores.softmax(-1) @ (f.transpose(1, 2) @ v)
    rows = []
    for i in range(q.shape[2]):
        keys = e[:, : i + 1].transpose(1, 2) @ k[:, :, : i + 1]
        scores = q[:, :, i : i + 1] @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])
        rows.append(scores.softmax(-1) @ (f[:, : i + 1].transpose(1, 2) @ v[:, :, : i + 1]))
    return torch.cat(rows, dim=2)


@pytest.mark.parametrize("causal", [False, True])
def test_linformer_is_attention_over_projected_keys_and_values(causal):
    attention = LinformerAttention(max_len=200, k=12, heads=HEADS, shared_heads=False, chunk=32)
    q, k, v = inputs()
    e, f = attention.projection(TIME)  # a shorter input uses the first TIME rows of E and F
    assert e.shape == (HEADS, TIME, 12) and not torch.equal(e, f)
    torch.testing.assert_close(
        attention(q, k, v, causal=causal), linformer_by_definition(q, k, v, e, f, causal), atol=1e-5, rtol=1e-5
    )


def test_linformer_causal_future_tokens_never_change_past_outputs():
    attention = LinformerAttention(max_len=TIME, k=16, chunk=40)
    q, k, v = inputs()
    before = attention(q, k, v, causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 90:] = 100 * torch.randn_like(k2[:, :, 90:])
    v2[:, :, 90:] = 100 * torch.randn_like(v2[:, :, 90:])
    after = attention(q, k2, v2, causal=True)
    torch.testing.assert_close(after[:, :, :90], before[:, :, :90], atol=0, rtol=0)
    assert not torch.allclose(after[:, :, 90:], before[:, :, 90:])


def test_noncausal_linformer_lets_every_token_change_every_output():
    """The published Linformer is not causal: this is why it needs the cumulative variant in a decoder."""
    attention = LinformerAttention(max_len=TIME, k=16)
    q, k, v = inputs()
    k2 = k.clone()
    k2[:, :, -1] += 1.0
    assert not torch.allclose(attention(q, k2, v)[:, :, 0], attention(q, k, v)[:, :, 0])


def test_linformer_sharing_options_share_parameters():
    separate = LinformerProjection(64, 8, heads=4, shared_heads=False)
    headwise = LinformerProjection(64, 8, heads=4)
    key_value = LinformerProjection(64, 8, heads=4, share_kv=True)

    def count(module):
        return sum(p.numel() for p in module.parameters())

    assert (count(separate), count(headwise), count(key_value)) == (2 * 4 * 64 * 8, 2 * 64 * 8, 64 * 8)
    e, f = key_value(30)
    assert e is f or torch.equal(e, f)
    layerwise = [LinformerAttention(64, 8, projection=headwise) for _ in range(3)]
    assert all(layer.projection.keys is headwise.keys for layer in layerwise)
    model = torch.nn.ModuleList(LinformerAttention(64, 8) for _ in range(3))
    share_linformer_projection(model)
    assert len({id(layer.projection) for layer in model}) == 1
    assert count(model) == count(model[0])


def test_linformer_rejects_inputs_longer_than_max_len():
    with pytest.raises(ValueError, match="at most max_len=32"):
        LinformerAttention(max_len=32, k=4)(*inputs(time=33))


@pytest.mark.parametrize("causal", [False, True])
def test_linformer_padding_keys_and_values_do_not_change_outputs(causal):
    attention = LinformerAttention(max_len=TIME, k=16, chunk=64)
    keep = key_padding()
    q, k, v = inputs()
    k2, v2 = k.clone(), v.clone()
    k2[~keep[:, None, :].expand(-1, HEADS, -1)] = 50.0
    v2[~keep[:, None, :].expand(-1, HEADS, -1)] = -50.0
    torch.testing.assert_close(
        attention(q, k2, v2, causal=causal, key_padding=keep), attention(q, k, v, causal=causal, key_padding=keep)
    )


@pytest.mark.parametrize(
    "module",
    [
        LinformerAttention(max_len=TIME, k=16, chunk=32),
        BigBirdAttention(block=16, window=1, global_blocks=2, random_blocks=2),
    ],
)
def test_decoding_with_a_cache_gives_the_rows_of_the_full_causal_pass(module):
    """Queries for only the last positions (keys and values of the whole sequence, as a KV cache holds them)
    give exactly the last rows of the full causal computation, so generation matches training."""
    q, k, v = inputs()
    keep = key_padding()
    full = module(q, k, v, causal=True, key_padding=keep)
    for new in (1, 5, 16, 17, 100):
        torch.testing.assert_close(module(q[:, :, -new:], k, v, causal=True, key_padding=keep), full[:, :, -new:])


@pytest.mark.parametrize("module", [LinformerAttention(max_len=TIME, k=16), BigBirdAttention(block=16)])
def test_sparse_attention_takes_and_returns_multihead_shapes(module):
    q, k, v = inputs()
    for causal in (False, True):
        assert module(q, k, v, causal=causal).shape == (BATCH, HEADS, TIME, HEAD_DIM)


def test_bigbird_builds_its_layout_once_per_length_not_every_forward():
    """The layout and its gather index are copied to the device once per length (`gather_index`), not per call."""
    model = DecoderLM(tiny_config(attention="bigbird", bigbird={"block": 4})).eval()
    ids = torch.randint(0, 37, (2, 16))
    gather_index.cache_clear()
    with torch.no_grad():
        first = model(ids)
        torch.testing.assert_close(model(ids), first)
    assert gather_index.cache_info().misses == 1 and gather_index.cache_info().hits >= 3
