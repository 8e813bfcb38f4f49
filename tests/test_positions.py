import math
import typing

import pytest
import torch

from conftest import POSITIONS, tiny_config
from kqv.nn.config import Position
from kqv.nn.positions import (
    POSITION_SCHEMES,
    ALiBiPositions,
    AttentionPositions,
    LearnedPositions,
    RelativePositions,
    RotaryPositions,
    SinusoidalPositions,
    alibi_slopes,
    attention_positions,
    input_positions,
)


def test_sinusoidal_matches_the_paper_formula_with_sines_then_cosines():
    d = 8
    table = SinusoidalPositions(d)(torch.arange(50))
    for pos in (0, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[pos, d // 2 + i].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_sinusoidal_works_far_past_any_max_len():
    table = SinusoidalPositions(16)(torch.arange(100_000, 100_003))
    assert table.shape == (3, 16) and torch.isfinite(table).all()


def test_learned_positions_past_max_len_raise_value_error_naming_the_limit():
    positions = LearnedPositions(max_len=10, d_model=4)
    assert positions(torch.arange(10)).shape == (10, 4)
    with pytest.raises(ValueError, match=r"position 10 but learned positions only cover max_len=10"):
        positions(torch.arange(11))


def test_rope_scores_depend_only_on_relative_distance():
    rope = RotaryPositions(head_dim=8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i: int, j: int) -> float:
        return float(rope.rotate(q, torch.tensor([i])) @ rope.rotate(k, torch.tensor([j])).transpose(-1, -2))

    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-4)
    assert score(3, 1) == pytest.approx(score(1002, 1000), abs=1e-3)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)


def test_rope_preserves_vector_norms():
    x = torch.randn(2, 3, 5, 8)
    rotated = RotaryPositions(8).rotate(x, torch.arange(5))
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))


def test_alibi_slopes_are_the_papers_geometric_sequence():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(h + 1) for h in range(8)]))
    # non-power-of-two: the 4 slopes of 4 heads, then every other slope of 8 heads
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]))


def test_alibi_bias_is_minus_slope_times_distance():
    bias = ALiBiPositions(2).score_bias(torch.zeros(1, 2, 3, 4), torch.arange(3), torch.arange(3))
    torch.testing.assert_close(bias[1], -(2.0**-8) * torch.tensor([[0.0, 1, 2], [1, 0, 1], [2, 1, 0]]))


def _explicit_shaw_tables(rel: RelativePositions, n: int):
    """The (n, n, d) tables a^K_ij and a^V_ij of the paper, built the slow obvious way."""
    k = rel.max_distance
    index = [[max(-k, min(k, j - i)) + k for j in range(n)] for i in range(n)]
    index = torch.tensor(index)
    return rel.keys[index], rel.values[index]


def test_shaw_key_bias_equals_query_dot_clipped_relative_embedding():
    rel = RelativePositions(head_dim=4, max_distance=2)
    q = torch.randn(2, 3, 6, 4)
    a_keys, _ = _explicit_shaw_tables(rel, 6)  # (6, 6, 4)
    expected = torch.einsum("bhid,ijd->bhij", q, a_keys) / 2.0
    torch.testing.assert_close(rel.score_bias(q, torch.arange(6), torch.arange(6)), expected)


def test_shaw_value_bias_equals_weighted_sum_of_relative_embeddings():
    rel = RelativePositions(head_dim=4, max_distance=2)
    weights = torch.softmax(torch.randn(2, 3, 6, 6), -1)
    _, a_values = _explicit_shaw_tables(rel, 6)
    expected = torch.einsum("bhij,ijd->bhid", weights, a_values)
    torch.testing.assert_close(rel.value_bias(weights, torch.arange(6), torch.arange(6)), expected)


def test_shaw_distances_beyond_k_share_one_embedding():
    rel = RelativePositions(head_dim=4, max_distance=2)
    index = rel.distance_index(torch.arange(6), torch.arange(6))
    assert index[0, 5] == index[0, 3] == 4 and index[5, 0] == index[3, 0] == 0 and index[2, 2] == 2


@pytest.mark.parametrize(
    "scheme", [AttentionPositions(), RelativePositions(8, 4), RotaryPositions(8), ALiBiPositions(2)]
)
def test_a_scheme_declares_rotates_exactly_when_it_rotates(scheme):
    """The lean decoding step skips `rotate` unless the scheme declares `rotates`: the flag must match what the
    method does (queries it leaves unchanged at positions 3 and 5 mean it does not rotate)."""
    x = torch.randn(1, 1, 2, 8)
    assert scheme.rotates == (not torch.equal(scheme.rotate(x, torch.tensor([3, 5])), x))


def test_the_position_registry_names_exactly_the_schemes_the_config_accepts():
    """`POSITION_SCHEMES` and the `Position` Literal list the same names (and the property families all of them)."""
    assert list(POSITION_SCHEMES) == list(typing.get_args(Position))
    assert set(POSITIONS) == set(POSITION_SCHEMES)


@pytest.mark.parametrize(
    "position,absolute,in_attention",
    [
        ("sinusoidal", SinusoidalPositions, AttentionPositions),
        ("learned", LearnedPositions, AttentionPositions),
        ("relative", None, RelativePositions),
        ("rope", None, RotaryPositions),
        ("alibi", None, ALiBiPositions),
        ("none", None, AttentionPositions),
    ],
)
def test_the_two_constructors_build_each_scheme_where_it_acts(position, absolute, in_attention):
    """An absolute scheme is added to the embeddings and leaves attention a no-op; an in-attention one is the
    reverse; "none" is neither. Each is built with the config's sizes."""
    config = tiny_config(position=position)
    added = input_positions(config)
    assert (added is None) if absolute is None else type(added) is absolute
    assert type(attention_positions(config)) is in_attention
    if position == "learned":
        assert added.embedding.weight.shape == (config.max_len, config.d_model)
    if position == "alibi":
        assert torch.equal(attention_positions(config).slopes.flatten(), alibi_slopes(config.n_heads))
    if position == "relative":
        assert attention_positions(config).keys.shape == (2 * config.relative.max_distance + 1, config.head_dim)
