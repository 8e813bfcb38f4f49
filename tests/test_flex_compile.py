"""flex_attention's block masks inside torch.compile, with CUDA's kernel choices on the CPU: a padded batch through
an ALiBi model compiles to one graph, `fullgraph=True` holding, not a graph per layer's cache lookup (the padding
mask's cache is a weak reference and a version counter, Python state a graph cannot keep), and gives eager's
outputs. Forward only: flex_attention has no backward on the CPU. Then every score_mod and mask_mod through
inductor's own lowering at symbolic lengths, and Shaw's relative keys kept out of flex inside a traced model."""

import sys
import warnings

import pytest
import torch

from kqv.nn.config import ModelConfig
from kqv.nn.devices import CUDA_KERNELS
from kqv.nn.models import DecoderLM, Encoder


@pytest.fixture
def cuda_kernels(monkeypatch):
    """Every kqv.nn module that asks which kernels a device takes gets CUDA's: flex_attention for score biases,
    SDPA's streaming padding, the whole-loss kernel."""
    for name, module in list(sys.modules.items()):
        if name.startswith("kqv.nn") and hasattr(module, "kernels"):
            monkeypatch.setattr(module, "kernels", lambda device: CUDA_KERNELS)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention.*")
        yield
    torch._dynamo.reset()


def padded(rows: int, time: int, real: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 50, (rows, time), generator=torch.Generator().manual_seed(seed))
    return ids, torch.arange(time) < torch.tensor(real)[:, None]  # (rows, time) True = token


@pytest.mark.parametrize("model_class", [DecoderLM, Encoder])
def test_a_padded_alibi_model_compiles_to_one_graph_over_batches(cuda_kernels, model_class):
    config = ModelConfig(
        vocab_size=50, d_model=64, n_heads=4, n_layers=4, d_ff=128, max_len=16, dropout=0.0, position="alibi"
    )  # head_dim 16: what flex's kernel takes
    torch.manual_seed(0)
    model = model_class(config).eval()
    graphs = []

    def counting(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    compiled = torch.compile(model, backend=counting, fullgraph=True)
    forward = lambda m, ids, mask: m(ids, attention_mask=mask)
    with torch.no_grad():
        for seed, real in enumerate(([13, 9], [11, 13], [13, 13])):
            ids, mask = padded(2, 13, real, seed)
            got, expected = forward(compiled, ids, mask), forward(model, ids, mask)
            torch.testing.assert_close(got, expected)
    assert len(graphs) == 1, f"{len(graphs)} graphs for 3 batches through {config.n_layers} layers"


# ---------------------------------------------------------------------------------------------------------------
# Every score_mod and mask_mod kqv gives flex_attention, lowered by inductor at lengths it takes as symbolic: a
# score_mod that read a captured tensor through another one's values (Shaw's relative keys gathered at
# q_pos[q_idx]) failed to lower on an H200 (`ShapeAsConstantBuffer` has no `dtype`) and here, on the CPU's
# template, at the second length (a C++ compile error); nothing short of inductor's lowering sees it.

LENGTHS = (24, 40, 57)  # none equal to another size of the call (a size equal to the head dim would share its symbol)
HEADS, HEAD_DIM = 2, 16


def _qkv(time: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(time)
    return [torch.randn(2, HEADS, time, HEAD_DIM, generator=generator) for _ in range(3)]


def _row_zero_padded(time: int) -> torch.Tensor:
    """(2, time) bool, True = token: row 0 ends in 5 padding tokens."""
    return torch.arange(time) < torch.tensor([time - 5, time])[:, None]


def _dense(q, k, v, bias: torch.Tensor) -> torch.Tensor:
    """torch's SDPA given the bias (and -inf where masked) as a dense float mask: the reference."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)


class InductorFlex:
    """flex_attention compiled by inductor, `dynamic=True`, and whether its CPU template computes attention right
    here (`exact`): torch 2.13's does not with AVX2 code (ATEN_CPU_CAPABILITY=avx2) or several threads, whatever
    it is given (plain causal attention differs from SDPA by more than 1 there). Where it does not, a test checks
    the lowering alone; where it does, also the outputs."""

    def __init__(self):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        self.compiled = torch.compile(flex_attention, fullgraph=True, dynamic=True)
        q, k, v = _qkv(24)
        causal = create_block_mask(lambda b, h, i, j: j <= i, None, None, 24, 24, device="cpu", BLOCK_SIZE=8)
        with torch.no_grad():
            plain = self.compiled(q, k, v, block_mask=causal)
            self.exact = torch.allclose(plain, _dense(q, k, v, _causal_bias(24)), atol=1e-5, rtol=1e-5)
        torch._dynamo.reset()  # the tests' graphs compile afresh

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        return self.compiled(*args, **kwargs)

    def check(self, got: torch.Tensor, expected: torch.Tensor) -> None:
        if self.exact:
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _causal_bias(time: int) -> torch.Tensor:
    return torch.zeros(time, time).masked_fill(torch.ones(time, time, dtype=torch.bool).triu(1), float("-inf"))


@pytest.fixture
def inductor_flex():
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention.*")
        yield InductorFlex()
    torch._dynamo.reset()


def _inputs(time: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v; row 0's padding as a (2, time) mask and as the additive (2, 1, 1, time) -inf; positions i, j."""
    padding, i, j = _row_zero_padded(time), torch.arange(time)[:, None], torch.arange(time)[None, :]
    hidden = torch.zeros(2, 1, 1, time).masked_fill(~padding[:, None, None, :], float("-inf"))
    return _qkv(time), padding, hidden, i, j


def test_shaws_relative_keys_with_bigbirds_blocks_and_padding_lower_at_symbolic_lengths(inductor_flex):
    """Against dense attention with Shaw et al.'s key term, q_i . a_clip(j - i) / sqrt(d), and BigBird's mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    from kqv.nn import flex
    from kqv.nn.positions import RelativePositions
    from kqv.nn.sparse import BigBirdAttention, bigbird_mask

    cpu, k = torch.device("cpu"), 4
    relative = RelativePositions(HEAD_DIM, k, values=False)
    bigbird = BigBirdAttention(block=8, window=1, global_blocks=1, random_blocks=1, seed=2)
    with torch.no_grad():
        for time in LENGTHS:
            (q, key, v), padding, hidden, i, j = _inputs(time)
            mask = flex.combined(bigbird.flex_mask(time, False, cpu), False, padding)
            block_mask = create_block_mask(mask, 2, None, time, time, device=cpu, BLOCK_SIZE=8)
            got = inductor_flex(q, key, v, score_mod=relative.score_mod(q), block_mask=block_mask)
            shaw = torch.einsum("bhid,ijd->bhij", q, relative.keys[(j - i).clamp(-k, k) + k]) * HEAD_DIM**-0.5
            layout = torch.zeros(time, time).masked_fill(~bigbird_mask(time, 8, 1, 1, 1, seed=2), float("-inf"))
            inductor_flex.check(got, _dense(q, key, v, shaw + layout + hidden))


def test_alibi_with_local_blocks_the_causal_mask_and_padding_lower_at_symbolic_lengths(inductor_flex):
    """Against dense attention with ALiBi's -slope_h |i - j| (slopes 2^(-8(h+1)/H)) and Liu et al.'s causal blocks."""
    from torch.nn.attention.flex_attention import create_block_mask

    from kqv.nn import flex
    from kqv.nn.dmca import LocalAttention
    from kqv.nn.positions import ALiBiPositions

    cpu, alibi, local = torch.device("cpu"), ALiBiPositions(HEADS), LocalAttention(8)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / HEADS) for h in range(HEADS)])[:, None, None]
    with torch.no_grad():
        for time in LENGTHS:
            (q, key, v), padding, hidden, i, j = _inputs(time)
            mask = flex.combined(local.flex_mask(time, True, cpu), True, padding)
            block_mask = create_block_mask(mask, 2, None, time, time, device=cpu, BLOCK_SIZE=8)
            got = inductor_flex(q, key, v, score_mod=alibi.score_mod(q), block_mask=block_mask)
            blocks = torch.zeros(time, time).masked_fill(~((i // 8 == j // 8) & (j <= i)), float("-inf"))
            inductor_flex.check(got, _dense(q, key, v, -slopes * (j - i).abs() + blocks + hidden))


def test_relative_keys_take_flex_eagerly_and_todays_cores_inside_a_traced_model(cuda_kernels, monkeypatch):
    """Shaw's per-distance products are sized by the length, which a traced model makes symbolic: there its
    attention is today's cores (`AttentionPositions.score_mod_in_graphs`), with eager's outputs."""
    from kqv.nn import flex

    config = ModelConfig(
        vocab_size=50,
        d_model=64,
        n_heads=4,
        n_layers=2,
        d_ff=128,
        max_len=32,
        dropout=0.0,
        position="relative",
        relative={"max_distance": 4, "values": False},
    )
    torch.manual_seed(0)
    model = DecoderLM(config).eval()
    calls, attend = [], flex.attend
    monkeypatch.setattr(flex, "attend", lambda *a, **k: calls.append(1) or attend(*a, **k))
    graphs = []

    def keeping(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    ids = torch.randint(0, 50, (2, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        eager = model(ids)
        assert len(calls) == config.n_layers  # eagerly, every layer takes flex
        traced = torch.compile(model, backend=keeping, fullgraph=True)(ids)
    torch.testing.assert_close(traced, eager, atol=1e-5, rtol=1e-5)
    assert len(calls) == config.n_layers and len(graphs) == 1
    assert "flex_attention" not in graphs[0].code
