import dataclasses
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from kqv.nn import blockwise as efficient
from kqv.nn.attention import causal_mask, scaled_dot_product_attention
from kqv.nn.blockwise import blockwise_attention
from kqv.nn.positions import ALiBiPositions, AttentionPositions, RelativePositions, RotaryPositions

BATCH, HEADS, TIME, HEAD_DIM = 2, 2, 40, 8
BLOCKS = (16, 8)  # several query and key blocks, the last ones partial, and key blocks far outside Shaw's window


def make_positions(name: str) -> AttentionPositions:
    return {
        "none": AttentionPositions(),
        "alibi": ALiBiPositions(HEADS),
        "relative": RelativePositions(HEAD_DIM, max_distance=4, values=True),
        "relative_keys_only": RelativePositions(HEAD_DIM, max_distance=4, values=False),
        "rope": RotaryPositions(HEAD_DIM),
    }[name]


def key_padding(batch: int, time: int) -> torch.Tensor:
    """Right padding of different lengths, and a hole: every query still sees key 0."""
    keep = torch.ones(batch, time, dtype=torch.bool)
    keep[0, time - 9 :] = False
    keep[1, 5:12] = False
    return keep


def reference(queries, keys, values, positions, causal=False, keep=None):
    """kqv's plain attention: rotate, dense bias from score_bias, dense mask, value_bias from the weights."""
    q_time, k_time = queries.shape[2], keys.shape[2]
    q_pos, k_pos = torch.arange(k_time - q_time, k_time), torch.arange(k_time)
    queries, keys = positions.rotate(queries, q_pos), positions.rotate(keys, k_pos)
    mask = causal_mask(q_time, k_time) if causal else None
    if keep is not None:
        mask = keep[:, None, None, :] if mask is None else mask & keep[:, None, None, :]
    output, weights = scaled_dot_product_attention(
        queries, keys, values, mask=mask, bias=positions.score_bias(queries, q_pos, k_pos)
    )
    extra = positions.value_bias(weights, q_pos, k_pos)
    return output if extra is None else output + extra


def blockwise(queries, keys, values, positions, causal=False, keep=None, block_size=BLOCKS, fused=True, trace=None):
    q_time, k_time = queries.shape[2], keys.shape[2]
    q_pos, k_pos = torch.arange(k_time - q_time, k_time), torch.arange(k_time)
    queries, keys = positions.rotate(queries, q_pos), positions.rotate(keys, k_pos)
    return blockwise_attention(
        queries,
        keys,
        values,
        positions=positions,
        q_pos=q_pos,
        k_pos=k_pos,
        causal=causal,
        key_padding=keep,
        block_size=block_size,
        fused=fused,
        trace=trace,
    )


def values_and_gradients(attend, inputs, positions):
    output = attend(*inputs)
    parameters = [p for p in positions.parameters() if p.requires_grad]
    grads = torch.autograd.grad(
        (output * torch.linspace(-1, 1, output.numel()).view_as(output)).sum(), [*inputs, *parameters]
    )
    return [output.detach(), *grads]


def assert_all_close(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)


def inputs(q_time=TIME, k_time=TIME):
    return [torch.randn(BATCH, HEADS, t, HEAD_DIM, requires_grad=True) for t in (q_time, k_time, k_time)]


@pytest.mark.parametrize("mask", ["none", "causal", "padding", "causal_and_padding"])
@pytest.mark.parametrize("scheme", ["none", "alibi", "relative", "relative_keys_only", "rope"])
def test_blockwise_equals_dense_reference_in_values_and_gradients(scheme, mask):
    positions = make_positions(scheme)
    causal = mask.startswith("causal")
    keep = key_padding(BATCH, TIME) if mask.endswith("padding") else None
    x = inputs()
    expected = values_and_gradients(lambda q, k, v: reference(q, k, v, positions, causal, keep), x, positions)
    actual = values_and_gradients(lambda q, k, v: blockwise(q, k, v, positions, causal, keep), x, positions)
    assert_all_close(actual, expected)


@pytest.mark.parametrize("block_size", [1, 7, (5, 40), (40, 3), 64])
def test_blockwise_result_does_not_depend_on_block_size(block_size):
    positions = make_positions("relative")
    x = inputs()
    expected = values_and_gradients(lambda q, k, v: reference(q, k, v, positions, True), x, positions)
    actual = values_and_gradients(
        lambda q, k, v: blockwise(q, k, v, positions, True, block_size=block_size), x, positions
    )
    assert_all_close(actual, expected)


class LearnedSlopes(AttentionPositions):
    """A scheme blockwise attention has no fast path for: ALiBi with learned slopes, and a learned value offset
    per distance sign (value_bias linear in the weights)."""

    has_score_bias = has_value_bias = True

    def __init__(self):
        super().__init__()
        self.slopes = torch.nn.Parameter(torch.rand(HEADS, 1, 1))
        self.offsets = torch.nn.Parameter(torch.randn(2, HEAD_DIM))

    def score_bias(self, queries, q_pos, k_pos):
        return -self.slopes * (k_pos[None, :] - q_pos[:, None]).abs().to(queries.dtype)

    def value_bias(self, weights, q_pos, k_pos):
        past = (k_pos[None, :] <= q_pos[:, None]).to(weights.dtype)
        return (weights * past).sum(-1, keepdim=True) * self.offsets[0] + (weights * (1 - past)).sum(
            -1, keepdim=True
        ) * self.offsets[1]


def test_any_position_scheme_works_through_the_generic_route_with_parameter_gradients():
    positions = LearnedSlopes()
    x = inputs()
    keep = key_padding(BATCH, TIME)
    expected = values_and_gradients(lambda q, k, v: reference(q, k, v, positions, False, keep), x, positions)
    actual = values_and_gradients(lambda q, k, v: blockwise(q, k, v, positions, False, keep), x, positions)
    assert len(actual) == 6 and all(grad.abs().sum() > 0 for grad in actual[-2:])  # both parameters have gradients
    assert_all_close(actual, expected)


class SteeperALiBi(ALiBiPositions):
    """ALiBi with three times the slopes: it keeps ALiBi's score_bias, so the closed form (which reads the slopes)
    computes it."""

    def __init__(self, n_heads):
        super().__init__(n_heads)
        self.slopes = self.slopes * 3


class SquaredALiBi(ALiBiPositions):
    """A penalty growing with the squared distance: it overrides score_bias, which ALiBi's closed form ignores."""

    def score_bias(self, queries, q_pos, k_pos):
        return -self.slopes.to(queries.dtype) * (k_pos[None, :] - q_pos[:, None]).to(queries.dtype) ** 2 / 8


class DoubledRelativeValues(RelativePositions):
    """Shaw's relative positions with the value term doubled: it overrides value_bias."""

    def value_bias(self, weights, q_pos, k_pos):
        return 2 * super().value_bias(weights, q_pos, k_pos)


@pytest.mark.parametrize(
    "positions,route",
    [
        (SteeperALiBi(HEADS), efficient.bias.ALiBiBias),
        (SquaredALiBi(HEADS), efficient.bias.BlockBias),
        (DoubledRelativeValues(HEAD_DIM, max_distance=4), efficient.bias.BlockBias),
    ],
    ids=lambda x: type(x).__name__,
)
def test_a_subclass_takes_the_closed_form_only_when_it_keeps_the_methods_the_closed_form_computes(positions, route):
    """The route is chosen by the methods a closed form relies on, not by the exact type; either way the result
    (values and gradients) is the dense reference's, which calls the subclass's own methods."""
    assert type(efficient.bias.block_bias(positions, BATCH, HEADS, torch.float32)) is route
    x = inputs()
    keep = key_padding(BATCH, TIME)
    expected = values_and_gradients(lambda q, k, v: reference(q, k, v, positions, True, keep), x, positions)
    actual = values_and_gradients(lambda q, k, v: blockwise(q, k, v, positions, True, keep), x, positions)
    assert_all_close(actual, expected)


@pytest.mark.parametrize(
    "name,route",
    [
        ("none", "NoBias"),
        ("rope", "NoBias"),
        ("alibi", "ALiBiBias"),
        ("relative", "RelativeBias"),
        ("relative_keys_only", "RelativeBias"),
    ],
)
def test_kqvs_own_schemes_take_the_routes_they_always_took(name, route):
    assert type(efficient.bias.block_bias(make_positions(name), BATCH, HEADS, torch.float32)).__name__ == route
    assert type(efficient.bias.block_bias(LearnedSlopes(), BATCH, HEADS, torch.float32)) is efficient.bias.BlockBias


@pytest.mark.parametrize("scheme", ["alibi", "relative"])
def test_cached_queries_attend_to_all_earlier_keys_like_the_reference(scheme):
    positions = make_positions(scheme)
    x = inputs(q_time=11, k_time=TIME)  # the last 11 positions, as when decoding with a cache
    expected = values_and_gradients(lambda q, k, v: reference(q, k, v, positions, True), x, positions)
    actual = values_and_gradients(lambda q, k, v: blockwise(q, k, v, positions, True), x, positions)
    assert_all_close(actual, expected)


@pytest.mark.parametrize("scheme", ["none", "relative"])
def test_fused_kernel_runs_and_the_blockwise_path_give_the_same_result(scheme):
    """Plain blocks go through torch's fused kernel when it is available; switching it off changes nothing."""
    positions = make_positions(scheme)
    x = inputs()
    fused = values_and_gradients(lambda q, k, v: blockwise(q, k, v, positions, True), x, positions)
    blockwise_only = values_and_gradients(
        lambda q, k, v: blockwise(q, k, v, positions, True, fused=False), x, positions
    )
    assert efficient.FUSED is not None
    assert_all_close(fused, blockwise_only)


def test_future_tokens_never_change_past_outputs_bit_for_bit():
    positions = make_positions("relative")
    q, k, v = (t.detach() for t in inputs())
    before = blockwise(q, k, v, positions, causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 25:] = 1e4 * torch.randn_like(k2[:, :, 25:])
    v2[:, :, 25:] = 1e4 * torch.randn_like(v2[:, :, 25:])
    after = blockwise(q, k2, v2, positions, causal=True)
    assert torch.equal(before[:, :, :25], after[:, :, :25])


def test_a_query_that_sees_no_key_outputs_zero_with_zero_gradients():
    keep = torch.ones(BATCH, TIME, dtype=torch.bool)
    keep[1] = False  # the second sequence is all padding
    x = inputs()
    output = blockwise(*x, make_positions("alibi"), keep=keep)
    output.sum().backward()
    assert torch.equal(output[1], torch.zeros_like(output[1]))
    assert all(torch.equal(t.grad[1], torch.zeros_like(t.grad[1])) for t in x)
    assert torch.isfinite(output).all()


def test_alibi_blocks_too_far_to_matter_are_skipped_and_the_result_stays_exact():
    """Steep slopes: far keys score below -50 (the clamp) and whole key blocks below e^-50 of the row's largest
    weight, provably, so they are skipped, forward and backward (on the CPU, where reading each proof costs
    nothing); the values and gradients must still equal the reference."""
    positions = ALiBiPositions(HEADS)
    positions.slopes.fill_(4.0)  # 16 positions away is already -64
    x = inputs()
    for causal in (False, True):
        expected = values_and_gradients(lambda q, k, v, c=causal: reference(q, k, v, positions, c), x, positions)
        trace = efficient.Trace()
        actual = values_and_gradients(
            lambda q, k, v, c=causal, trace=trace: blockwise(q, k, v, positions, c, trace=trace), x, positions
        )
        assert trace.skipped_blocks > 0
        assert_all_close(actual, expected)


def test_where_host_reads_are_not_free_blockwise_training_reads_nothing_and_skips_nothing(monkeypatch):
    """On a device whose host reads wait for it (a GPU: `Kernels.free_host_reads` False), a training step's
    forward and backward compute every block rather than read a proof per block: no host sync
    (`tests/syncs.py`), the reference's values and gradients; a forward without gradients still skips."""
    from kqv.nn import devices
    from kqv.nn.blockwise import attention
    from syncs import SyncCounter

    gpu_like = dataclasses.replace(devices.CPU_KERNELS, free_host_reads=False)
    monkeypatch.setattr(attention, "kernels", lambda device: gpu_like)
    positions = ALiBiPositions(HEADS)
    positions.slopes.fill_(4.0)
    x = inputs()
    expected = values_and_gradients(lambda q, k, v: reference(q, k, v, positions, True), x, positions)
    trace = efficient.Trace()
    with SyncCounter() as counter:
        output = blockwise_attention(
            *x, positions=positions, causal=True, block_size=BLOCKS, q_pos=range(TIME), k_pos=range(TIME), trace=trace
        )
        output.sum().backward()
    assert counter.count == 0 and trace.skipped_blocks == 0
    x = [t.detach().requires_grad_() for t in x]
    actual = values_and_gradients(lambda q, k, v: blockwise(q, k, v, positions, True), x, positions)
    assert_all_close(actual, expected)
    with torch.no_grad():
        blockwise(*x, positions, True, trace=trace)
    assert trace.skipped_blocks > 0


def test_50k_token_alibi_forward_is_fast_and_never_builds_an_n_by_n_matrix():
    """In a fresh process (so its peak memory is its own): 50,000 tokens of causal ALiBi attention. An n x n fp32
    matrix would be 10 GB; the peak must stay under 1 GB and the largest block of scores at its default size.
    One thread: on a busy 2-core machine two OpenMP threads spin at every op's barrier and run 10x slower."""
    script = textwrap.dedent("""
        import json, time, torch
        from kqv.jobs.base import peak_rss_bytes
        from kqv.nn import blockwise as efficient
        from kqv.nn.positions import ALiBiPositions
        torch.set_num_threads(1)
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, 1, 50_000, 16) for _ in range(3))
        before = peak_rss_bytes()
        start = time.perf_counter()
        trace = efficient.Trace()
        out = efficient.blockwise_attention(q, k, v, positions=ALiBiPositions(1), causal=True, trace=trace)
        print(json.dumps({"seconds": time.perf_counter() - start, "finite": bool(torch.isfinite(out).all()),
                          "growth_mb": (peak_rss_bytes() - before) / 2**20,
                          "largest_block": trace.largest_score_block}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["finite"]
    assert report["largest_block"] <= efficient.SCORE_BLOCK_ELEMENTS < 50_000**2 / 100
    assert report["growth_mb"] < 1024
    assert report["seconds"] < 60
