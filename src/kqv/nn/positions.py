"""Position representations: self-attention alone is order-blind, these tell it where each token is.

Two families, used at two places in the model:

* absolute positions are added to the token embeddings once, at the bottom of the model:
  `SinusoidalPositions` (Vaswani et al. 2017) and `LearnedPositions`;
* relative positions act inside every attention layer, on the scores or on queries and keys:
  `RelativePositions` (Shaw et al. 2018), `RotaryPositions` (RoPE, Su et al. 2021) and
  `ALiBiPositions` (Press et al. 2022).

Every in-attention scheme is a function of (query positions, key positions) only, so attention can be computed a
block of keys at a time without ever building an n x n table of anything.

`POSITION_SCHEMES` names every scheme (`ModelConfig.position`); each class builds itself with `from_config`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NoReturn

import torch
from torch import Tensor, nn

from ..errors import DataError
from . import flex
from .config import ModelConfig


class SinusoidalPositions(nn.Module):
    """Sines and cosines of p / 10000^(2i/d) for i < d/2. Computed on the fly: any length works.

    The paper writes each (sin, cos) pair side by side; like the reference implementation (tensor2tensor),
    fairseq and Marian, we put all sines first and all cosines after. That is a fixed permutation of the
    dimensions, the same for training, and lets Marian's weights load exactly.
    """

    def __init__(self, d_model: int):
        super().__init__()
        inv_freq = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @classmethod
    def from_config(cls, config: ModelConfig) -> SinusoidalPositions:
        return cls(config.d_model)

    def forward(self, positions: Tensor) -> Tensor:
        """positions (time,) or (batch, time) -> (time, d_model) or (batch, time, d_model)."""
        angles = positions.float()[..., None] * self.inv_freq  # (..., time, d_model / 2)
        return torch.cat((angles.sin(), angles.cos()), dim=-1)  # (..., time, d_model)


class LearnedPositions(nn.Module):
    """One learned vector per absolute position, up to `max_len`: the lecture's pitfall is that it can't go beyond."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)

    @classmethod
    def from_config(cls, config: ModelConfig) -> LearnedPositions:
        return cls(config.max_len, config.d_model)

    def forward(self, positions: Tensor) -> Tensor:
        """positions (time,) or (batch, time) -> (time, d_model) or (batch, time, d_model).

        Checked by shape, reading no value (no host sync in a training step): more positions than `max_len` is a
        DataError; a position past the table otherwise (a continuation beyond max_len) is torch's IndexError on
        the CPU, turned into the same DataError (`kqv.nn.generation` checks prompt + new tokens up front)."""
        if positions.shape[-1] > self.max_len:
            self._refuse(positions)
        try:
            return self.embedding(positions)
        except IndexError:
            self._refuse(positions)

    def _refuse(self, positions: Tensor) -> NoReturn:
        last = int(positions.max())  # only on the way to an error
        raise DataError(
            f"input reaches position {last} but learned positions only cover max_len={self.max_len}; "
            f"shorten the input to {self.max_len} tokens, or use position='sinusoidal', 'rope', 'alibi' or "
            f"'relative', which work at any length"
        )


def position_tensor(positions: Tensor | range, device: torch.device | str | None = None) -> Tensor:
    """Positions as the 1-D LongTensor the schemes take. Layers hand consecutive positions over as a Python `range`,
    whose values are known without reading the device (blockwise attention plans its blocks from them); this
    makes the tensor of the same values on `device`. A tensor is returned as it is."""
    if isinstance(positions, range):
        return torch.arange(positions.start, positions.stop, positions.step, device=device)
    return positions


class AttentionPositions(nn.Module):
    """Interface of in-attention position schemes; the default does nothing.

    Positions are 1-D LongTensors: `q_pos` (q_time,) for the queries, `k_pos` (k_time,) for the keys.
    A scheme declares what it does, so attention chooses its kernel without calling it to find out: a subclass
    that overrides `score_bias` sets `has_score_bias = True`, one that overrides `value_bias` sets
    `has_value_bias = True`, one that overrides `rotate` sets `rotates = True` (attention ignores the method
    otherwise).
    """

    has_score_bias = False  # True when score_bias adds a term to the scores (torch's SDPA then needs it dense)
    has_value_bias = False  # True when value_bias needs the attention weights, which fused kernels don't expose
    rotates = False  # True when rotate transforms queries and keys (RoPE)
    score_mod_in_graphs = True  # False when score_mod reads a tensor sized by the length (`kqv.nn.flex.fixed`)

    @classmethod
    def from_config(cls, config: ModelConfig) -> AttentionPositions:
        return cls()

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Transform queries or keys (batch, heads, time, head_dim) by their positions (RoPE)."""
        return x

    def score_bias(self, queries: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """A term added to the scaled scores, broadcastable to (batch, heads, q_time, k_time), or None."""
        return None

    def value_bias(self, weights: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """A term added to the attention output given the weights (batch, heads, q_time, k_time), or None."""
        return None

    def score_mod(self, queries: Tensor) -> Callable | None:
        """`score_bias` as flex_attention's score_mod(score, b, h, q_idx, kv_idx), or None. Queries and keys are at
        positions 0..time-1, so q_idx and kv_idx are the positions themselves: a score_mod captures no position
        tensor, only tensors it indexes by them directly (a captured tensor read through another one's values
        does not lower in inductor when its size is symbolic: tests/test_flex_compile.py)."""
        return None


class RelativePositions(AttentionPositions):
    """Shaw et al. 2018: learned embeddings of the clipped distance j - i in [-k, k], shared across heads.

    e_ij = q_i . (k_j + a^K_ij) / sqrt(d_head) and z_i = sum_j w_ij (v_j + a^V_ij). Only the 2k+1 distinct
    embeddings are stored; q . a^K is computed once per distance and gathered, never an (n, n, d) tensor.
    """

    has_score_bias = True
    score_mod_in_graphs = False  # its score_mod reads q . a per query: inside a traced model, today's cores

    def __init__(self, head_dim: int, max_distance: int, values: bool = True):
        super().__init__()
        self.max_distance = max_distance
        self.scale = head_dim**-0.5
        self.keys = nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * head_dim**-0.5)
        self.values = nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * head_dim**-0.5) if values else None
        self.has_value_bias = values

    @classmethod
    def from_config(cls, config: ModelConfig) -> RelativePositions:
        return cls(config.head_dim, config.relative.max_distance, config.relative.values)

    def distance_index(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(q_time, k_time) index into the 2k+1 embeddings: clip(j - i, -k, k) + k."""
        k = self.max_distance
        return (k_pos[None, :] - q_pos[:, None]).clamp(-k, k) + k

    def score_bias(self, queries: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Shaw et al.'s key term: q_i . a_(j - i) for every query and key, added to the scores before softmax."""
        per_distance = queries @ self.keys.T * self.scale  # (batch, heads, q_time, 2k+1)
        index = self.distance_index(q_pos, k_pos).expand(*queries.shape[:2], -1, -1)
        return per_distance.gather(-1, index)  # (batch, heads, q_time, k_time)

    def score_mod(self, queries: Tensor) -> Callable:
        """The key term as flex_attention's score_mod: q_i . a_(j - i) for each distance, then gathered per score."""
        per_distance = flex.fixed(queries @ self.keys.T * self.scale)  # (batch, heads, time, 2k+1)
        k = flex.constant(self.max_distance, queries.device)

        def relative(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + per_distance[b, h, q_idx, (kv_idx - q_idx).clamp(-k, k) + k]

        return relative

    def value_bias(self, weights: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """Shaw et al.'s value term: sum_j weight_ij * b_(j - i), added to the attention output (None without it)."""
        if self.values is None:
            return None
        index = self.distance_index(q_pos, k_pos).expand_as(weights)
        per_distance = weights.new_zeros(*weights.shape[:-1], self.values.shape[0])
        per_distance.scatter_add_(-1, index, weights)  # total weight given to each distance
        return per_distance @ self.values  # (batch, heads, q_time, head_dim)


class RotaryPositions(AttentionPositions):
    """RoPE (Su et al. 2021): rotate each pair of query/key dimensions by an angle proportional to position,
    so q_i . k_j depends on i - j only. Uses the half-split pairing of GPT-NeoX and LLaMA."""

    rotates = True

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @classmethod
    def from_config(cls, config: ModelConfig) -> RotaryPositions:
        return cls(config.head_dim, config.rope_base)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Queries or keys x (..., time, head_dim) rotated by the angles of their positions (time,)."""
        angles = positions.float()[:, None] * self.inv_freq  # (time, head_dim / 2)
        cos, sin = angles.cos().repeat(1, 2).to(x.dtype), angles.sin().repeat(1, 2).to(x.dtype)
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-second, first), dim=-1) * sin


class ALiBiPositions(AttentionPositions):
    """ALiBi (Press et al. 2022): no embeddings; each head penalises scores by slope_h * |i - j|."""

    has_score_bias = True

    def __init__(self, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads)[:, None, None], persistent=False)  # (heads, 1, 1)

    @classmethod
    def from_config(cls, config: ModelConfig) -> ALiBiPositions:
        return cls(config.n_heads)

    def score_bias(self, queries: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """-slope_h * |i - j| for every head, query and key, added to the scores before softmax."""
        distance = (k_pos[None, :] - q_pos[:, None]).abs().to(queries.dtype)  # (q_time, k_time)
        return -self.slopes.to(queries.dtype) * distance  # (heads, q_time, k_time)

    def score_mod(self, queries: Tensor) -> Callable:
        """The penalty as flex_attention's score_mod: score - slope_h * |i - j|."""
        slopes = self.slopes.flatten().to(queries.dtype)  # (heads,)
        dtype = queries.dtype

        def alibi(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score - slopes[h] * (kv_idx - q_idx).abs().to(dtype)

        return alibi


def alibi_slopes(n_heads: int) -> Tensor:
    """The geometric slopes 2^(-8/n), 2^(-16/n), ...; for n not a power of two, interleave as the paper does."""

    def power_of_two(n: int) -> list[float]:
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes)


# Every scheme by its `ModelConfig.position` name (tests/test_positions.py checks the names are `Position`'s): an
# absolute scheme is an nn.Module added to the token embeddings, an in-attention one an `AttentionPositions`;
# "none" is the in-attention scheme that does nothing. Each builds itself with `from_config(config)`.
POSITION_SCHEMES: dict[str, type[nn.Module]] = {
    "sinusoidal": SinusoidalPositions,  # Vaswani et al. 2017
    "learned": LearnedPositions,
    "relative": RelativePositions,  # Shaw et al. 2018
    "rope": RotaryPositions,  # Su et al. 2021
    "alibi": ALiBiPositions,  # Press et al. 2022
    "none": AttentionPositions,
}


def is_absolute(scheme: type[nn.Module]) -> bool:
    """Whether a scheme of `POSITION_SCHEMES` is added to the token embeddings (rather than acting in attention)."""
    return not issubclass(scheme, AttentionPositions)


def input_positions(config: ModelConfig) -> nn.Module | None:
    """The absolute position module added to token embeddings, or None for in-attention schemes."""
    scheme = POSITION_SCHEMES[config.position]
    return scheme.from_config(config) if is_absolute(scheme) else None


def attention_positions(config: ModelConfig) -> AttentionPositions:
    """The in-attention position scheme of one attention layer (a no-op for absolute or no positions)."""
    scheme = POSITION_SCHEMES[config.position]
    return AttentionPositions() if is_absolute(scheme) else scheme.from_config(config)
