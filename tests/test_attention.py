import math

import pytest
import torch

from conftest import tiny_config
from kqv import Attention, DecoderLM, MultiHeadAttention, causal_mask, scaled_dot_product_attention
from kqv.nn.attention import fused_attention


def test_causal_mask_lets_each_query_see_only_itself_and_the_past():
    assert torch.equal(causal_mask(3, 3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool())


def test_causal_mask_with_cached_keys_aligns_queries_to_the_end():
    # two new queries after three cached keys: positions 3 and 4 of 5
    assert torch.equal(causal_mask(2, 5), torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]).bool())


def test_dot_score_attention_is_softmax_of_dot_products_times_values():
    q, k, v = torch.randn(1, 1, 4), torch.randn(1, 5, 4), torch.randn(1, 5, 3)
    out, weights = Attention(4, score="dot")(q, k, v)
    expected_weights = torch.softmax(torch.tensor([[float(q[0, 0] @ k[0, i]) for i in range(5)]]), -1)
    torch.testing.assert_close(weights[0], expected_weights)
    torch.testing.assert_close(out[0, 0], (expected_weights[0, :, None] * v[0]).sum(0))


def test_multiplicative_score_is_the_bilinear_form():
    attention = Attention(4, 6, score="multiplicative")
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 6)
    expected = torch.einsum("bqi,ij,bkj->bqk", q, attention.score.weight, k)
    torch.testing.assert_close(attention.score(q, k), expected)


def test_multiplicative_score_with_identity_weight_equals_dot_product():
    attention = Attention(4, score="multiplicative")
    with torch.no_grad():
        attention.score.weight.copy_(torch.eye(4))
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    torch.testing.assert_close(attention.score(q, k), q @ k.transpose(1, 2))


def test_reduced_rank_score_is_a_bilinear_form_of_rank_r():
    attention = Attention(8, 6, score="reduced_rank", rank=2)
    u, w = attention.score.query_map.weight, attention.score.key_map.weight  # (2, 8), (2, 6)
    q, k = torch.randn(1, 3, 8), torch.randn(1, 4, 6)
    bilinear = u.T @ w  # (8, 6)
    assert torch.linalg.matrix_rank(bilinear) == 2
    torch.testing.assert_close(attention.score(q, k), q @ bilinear @ k.transpose(1, 2))


def test_additive_score_is_v_tanh_of_projected_sum():
    attention = Attention(4, 6, score="additive", hidden=5)
    s = attention.score
    q, k = torch.randn(1, 2, 4), torch.randn(1, 3, 6)
    for i in range(2):
        for j in range(3):
            expected = s.v.weight[0] @ torch.tanh(s.query_map.weight @ q[0, i] + s.key_map.weight @ k[0, j])
            torch.testing.assert_close(s(q, k)[0, i, j], expected)


def test_masked_keys_get_zero_weight_for_every_score():
    mask = torch.tensor([[True, True, False, False]])[:, None, :]
    for score in ["dot", "multiplicative", "reduced_rank", "additive"]:
        out, weights = Attention(4, score=score)(torch.randn(1, 2, 4), torch.randn(1, 4, 4), torch.randn(1, 4, 3), mask)
        assert torch.all(weights[..., 2:] == 0)
        torch.testing.assert_close(weights.sum(-1), torch.ones(1, 2))


def test_dot_score_rejects_mismatched_sizes_and_suggests_multiplicative():
    with pytest.raises(ValueError, match="score='multiplicative'"):
        Attention(4, 6, score="dot")


def test_unknown_score_is_rejected():
    with pytest.raises(ValueError, match="unknown score 'cosine'"):
        Attention(4, score="cosine")


def test_scaled_dot_product_divides_scores_by_sqrt_head_dim():
    q, k, v = torch.randn(1, 1, 3, 16), torch.randn(1, 1, 5, 16), torch.randn(1, 1, 5, 16)
    _, weights = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(weights, torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_plain_reference_equals_torch_sdpa(with_bias, with_mask):
    q, k, v = torch.randn(2, 3, 6, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    bias = torch.randn(3, 6, 7) if with_bias else None
    mask = torch.rand(2, 1, 6, 7) > 0.3 if with_mask else None
    if mask is not None:
        mask[..., 0] = True  # every query keeps at least one key
    plain, _ = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)
    torch.testing.assert_close(fused_attention(q, k, v, mask=mask, bias=bias), plain, atol=1e-6, rtol=1e-5)


def test_multi_head_attention_equals_a_loop_over_heads():
    config = tiny_config(position="none")
    mha = MultiHeadAttention(config).eval()
    x = torch.randn(2, 5, config.d_model)
    out, _ = mha(x)
    q = mha.to_queries(x)
    k, v = mha.to_keys_values(x).chunk(2, -1)
    d = config.head_dim
    heads = []
    for h in range(config.n_heads):
        part = slice(h * d, (h + 1) * d)
        weights = torch.softmax(q[..., part] @ k[..., part].transpose(1, 2) / math.sqrt(d), -1)
        heads.append(weights @ v[..., part])
    torch.testing.assert_close(out, mha.to_output(torch.cat(heads, -1)), atol=1e-6, rtol=1e-5)


def test_attention_weights_are_returned_per_head_and_sum_to_one():
    config = tiny_config(position="rope")
    mha = MultiHeadAttention(config).eval()
    out, weights = mha(torch.randn(2, 5, config.d_model), causal=True, need_weights=True)
    assert weights.shape == (2, config.n_heads, 5, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, config.n_heads, 5))
    assert torch.all(weights.triu(1) == 0)


def test_cross_attention_reads_keys_and_values_from_memory():
    config = tiny_config()
    cross = MultiHeadAttention(config, cross_attention=True).eval()
    x, memory = torch.randn(1, 3, config.d_model), torch.randn(1, 6, config.d_model)
    out, weights = cross(x, memory, need_weights=True)
    assert weights.shape == (1, config.n_heads, 3, 6)
    changed, _ = cross(x, memory + torch.randn_like(memory))
    assert not torch.allclose(out, changed)


def test_cross_attention_without_memory_is_a_clear_error():
    cross = MultiHeadAttention(tiny_config(), cross_attention=True)
    with pytest.raises(ValueError, match="needs the encoder memory"):
        cross(torch.randn(1, 3, 32))


def test_fully_masked_query_attends_to_nothing_instead_of_nan():
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    mask = torch.tensor([[True, True, True], [False, False, False]])
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert not out.isnan().any()
    assert torch.all(out[0, 0, 1] == 0)


# ---------------------------------------------------------------------------------------------------------------
# The plain path's causal flag, and the short-bf16 route of the fused path through it


@pytest.mark.parametrize("q_time", [12, 5])
def test_plain_causal_flag_equals_torch_sdpa_with_a_causal_mask(q_time):
    import torch.nn.functional as F

    queries, keys, values = torch.randn(2, 3, q_time, 8), torch.randn(2, 3, 12, 8), torch.randn(2, 3, 12, 8)
    keep = torch.ones(2, 1, 1, 12, dtype=torch.bool)
    keep[0, ..., -4:] = False
    for mask in (None, keep):
        expected = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=causal_mask(q_time, 12) & (True if mask is None else mask)
        )
        actual, _ = scaled_dot_product_attention(queries, keys, values, mask=mask, causal=True)
        torch.testing.assert_close(actual, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("time, takes_plain", [(64, True), (600, False)])
def test_short_bf16_attention_takes_the_plain_path_and_matches_fp32(monkeypatch, time, takes_plain):
    import kqv.nn.cores as attention

    calls = []
    real = attention.masked_attention
    monkeypatch.setattr(attention, "masked_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = DecoderLM(tiny_config(position="rope", max_len=time)).eval()
    ids = torch.randint(0, 37, (2, time))
    with torch.no_grad():
        expected = model(ids)
        assert not calls  # fp32 goes to SDPA
        with torch.autocast("cpu", dtype=torch.bfloat16):
            actual = model(ids).float()
    assert bool(calls) == takes_plain
    assert (actual - expected).abs().max() < 0.05 * expected.abs().max()


@pytest.mark.parametrize("causal", [False, True])
def test_masked_attention_is_the_reference_with_zeros_for_a_query_that_sees_no_key(causal):
    """The plain path's additive mask against torch's SDPA where every query sees a key, and against the readable
    reference's zeros where one sees none: a packed row's block-diagonal mask, padding, and an empty row."""
    import torch.nn.functional as F

    from kqv.nn.cores import masked_attention, packed_mask

    queries, keys, values = torch.randn(3, 2, 10, 8), torch.randn(3, 2, 10, 8), torch.randn(3, 2, 10, 8)
    bias = torch.randn(2, 10, 10)
    sequences = torch.tensor([[0] * 4 + [1] * 6, [0] * 10, [0] * 3 + [1] * 3 + [2] * 2 + [-1] * 2])
    packed = packed_mask(sequences)  # (3, 1, 10, 10): every query sees itself
    padding = torch.ones(3, 1, 1, 10, dtype=torch.bool)
    padding[0, ..., :3] = False  # with causal, queries 0-2 of row 0 see no key
    for mask in (packed, padding, None):
        for b in (None, bias):
            actual = masked_attention(queries, keys, values, mask=mask, bias=b, causal=causal)
            expected, _ = scaled_dot_product_attention(queries, keys, values, mask=mask, bias=b, causal=causal)
            torch.testing.assert_close(actual, expected, atol=1e-6, rtol=1e-5)
            if mask is packed:
                full = packed & causal_mask(10, 10) if causal else packed
                sdpa = F.scaled_dot_product_attention(
                    queries, keys, values, attn_mask=full if b is None else b.masked_fill(~full, float("-inf"))
                )
                torch.testing.assert_close(actual, sdpa, atol=1e-6, rtol=1e-5)
    empty = masked_attention(queries, keys, values, mask=padding, causal=True)
    assert torch.equal(empty[0, :, :3], torch.zeros(2, 3, 8))  # the reference's zeros, not a NaN or an average
