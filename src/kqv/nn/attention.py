"""Attention as a soft lookup: each query takes a softmax-weighted average of the values, weighted by how well
it matches each key.

This module holds the lecture's score functions (dot-product, multiplicative, reduced-rank, additive) in a
single-head `Attention` for experiments and the RNN baseline, and the Transformer's `MultiHeadAttention`, which
computes all heads as one batched operation. `scaled_dot_product_attention` is written out plainly as the
reference and dispatched to torch's fused kernel when nothing it can't express is needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .blockwise import blockwise_attention
from .positions import AttentionPositions, attention_positions
from .sparse import sparse_core

Score = Literal["dot", "multiplicative", "reduced_rank", "additive"]
PLAIN_BF16_PAIRS = 256 * 256  # up to this many scores, bf16 attention on the CPU is faster as plain matmuls
BLOCKWISE_MIN_PAIRS = 1 << 21  # below ~1,450 x 1,450 scores the dense matrix is cheap: blockwise only saves memory


# ---------------------------------------------------------------------------------------------------------------
# Masks


def causal_mask(q_time: int, k_time: int, device: torch.device | None = None) -> Tensor:
    """(q_time, k_time) bool, True where query i may see key j. Queries are the last q_time of the k_time
    positions, so with a cache of earlier keys the newest query sees everything before it."""
    q_pos = torch.arange(k_time - q_time, k_time, device=device)
    return torch.arange(k_time, device=device)[None, :] <= q_pos[:, None]


def padding_mask(attention_mask: Tensor) -> Tensor:
    """(batch, k_time) with 1 for real tokens -> (batch, 1, 1, k_time) bool, broadcastable over heads and queries."""
    return attention_mask.bool()[:, None, None, :]


def padding_of(mask: Tensor | None, batch: int) -> Tensor | None:
    """The (batch, k_time) keys-to-keep of a padding mask (batch | 1, 1, 1, k_time); None for any other mask."""
    if mask is None or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != 1:
        return None
    return mask[:, 0, 0, :].expand(batch, -1)


# ---------------------------------------------------------------------------------------------------------------
# Score functions and single-head attention (the lecture's variants)


class DotScore(nn.Module):
    """e_i = q . k_i (needs query and key of the same size)."""

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        return query @ keys.transpose(-2, -1)


class MultiplicativeScore(nn.Module):
    """e_i = q^T W k_i: a learned bilinear form (Luong et al. 2015)."""

    def __init__(self, query_dim: int, key_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(query_dim, key_dim) / math.sqrt(query_dim))

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        return (query @ self.weight) @ keys.transpose(-2, -1)


class ReducedRankScore(nn.Module):
    """e_i = q^T (U^T V) k_i = (U q) . (V k_i), with U, V of rank r << d: what Transformer heads compute."""

    def __init__(self, query_dim: int, key_dim: int, rank: int):
        super().__init__()
        self.query_map = nn.Linear(query_dim, rank, bias=False)  # U
        self.key_map = nn.Linear(key_dim, rank, bias=False)  # V

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        return self.query_map(query) @ self.key_map(keys).transpose(-2, -1)


class AdditiveScore(nn.Module):
    """e_i = v^T tanh(W1 q + W2 k_i) (Bahdanau et al. 2015)."""

    def __init__(self, query_dim: int, key_dim: int, hidden: int):
        super().__init__()
        self.query_map = nn.Linear(query_dim, hidden, bias=False)  # W1
        self.key_map = nn.Linear(key_dim, hidden, bias=False)  # W2
        self.v = nn.Linear(hidden, 1, bias=False)

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        hidden = self.query_map(query)[..., :, None, :] + self.key_map(keys)[..., None, :, :]  # (..., q, k, hidden)
        return self.v(torch.tanh(hidden)).squeeze(-1)  # (..., q, k)


class Attention(nn.Module):
    """Single-head attention with a choice of score function: weights = softmax(scores), output = weights @ values.

    query (batch, q_time, query_dim), keys (batch, k_time, key_dim), values (batch, k_time, value_dim);
    mask broadcastable to (batch, q_time, k_time), True where a key may be attended.
    """

    def __init__(self, query_dim: int, key_dim: int | None = None, score: Score = "dot", *,
                 rank: int | None = None, hidden: int | None = None):
        super().__init__()
        key_dim = key_dim or query_dim
        if score == "dot":
            if query_dim != key_dim:
                raise ValueError(f"dot-product scores need query_dim == key_dim, got {query_dim} and {key_dim}; "
                                 f"use score='multiplicative' for different sizes")
            self.score = DotScore()
        elif score == "multiplicative":
            self.score = MultiplicativeScore(query_dim, key_dim)
        elif score == "reduced_rank":
            self.score = ReducedRankScore(query_dim, key_dim, rank or max(1, min(query_dim, key_dim) // 4))
        elif score == "additive":
            self.score = AdditiveScore(query_dim, key_dim, hidden or query_dim)
        else:
            raise ValueError(f"unknown score {score!r}; choose one of 'dot', 'multiplicative', 'reduced_rank', "
                             f"'additive'")

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        scores = self.score(query, keys)  # (batch, q_time, k_time)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)
        return weights @ values, weights


# ---------------------------------------------------------------------------------------------------------------
# Scaled dot-product attention, plainly and fused


def scaled_dot_product_attention(queries: Tensor, keys: Tensor, values: Tensor, *, mask: Tensor | None = None,
                                 bias: Tensor | None = None, causal: bool = False,
                                 dropout: float = 0.0) -> tuple[Tensor, Tensor]:
    """The readable reference: softmax(q k^T / sqrt(d_head) + bias, future and padding = -inf) v.

    queries (batch, heads, q_time, head_dim); keys, values (batch, heads, k_time, head_dim);
    mask bool broadcastable to (batch, heads, q_time, k_time), True = may attend; `causal` masks the future as
    `causal_mask` does. Returns (output, weights).
    """
    q_time, k_time = queries.shape[2], keys.shape[2]
    scores = queries @ keys.transpose(-2, -1) / math.sqrt(queries.shape[-1])  # (batch, heads, q_time, k_time)
    if bias is not None:
        scores = scores + bias
    if causal:
        future = torch.full((q_time, k_time), float("-inf"), dtype=scores.dtype, device=scores.device)
        scores = scores + future.triu_(k_time - q_time + 1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    if mask is not None or bias is not None:
        weights = weights.nan_to_num(0.0)  # a query with every key masked attends to nothing
    if dropout > 0:
        weights = F.dropout(weights, dropout)
    return weights @ values, weights


def fused_attention(queries: Tensor, keys: Tensor, values: Tensor, *, mask: Tensor | None = None,
                    bias: Tensor | None = None, causal: bool = False, dropout: float = 0.0) -> Tensor:
    """The same computation through `F.scaled_dot_product_attention` (O(n) memory when mask and bias are None).

    Short bf16 inputs on the CPU take the plain path instead: there torch's flash kernel is 1.9-3.8x slower
    forward + backward (`python benchmarks/attention_kernels.py`), and the plain path's numerics are eager
    attention's under autocast (bf16 scores, softmax accumulated in fp32).
    """
    if queries.dtype == torch.bfloat16 and queries.device.type == "cpu" \
            and queries.shape[2] * keys.shape[2] <= PLAIN_BF16_PAIRS:
        return scaled_dot_product_attention(queries, keys, values, mask=mask, bias=bias, causal=causal,
                                            dropout=dropout)[0]
    if bias is not None:
        attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    else:
        attn_mask = mask
    return F.scaled_dot_product_attention(queries, keys, values, attn_mask=attn_mask, dropout_p=dropout,
                                          is_causal=causal)


# ---------------------------------------------------------------------------------------------------------------
# Multi-head attention


@dataclass
class KVCache:
    """Keys and values one attention layer has already computed, (batch, heads, time, head_dim) each.

    For self-attention they grow by the new tokens at each step; for cross-attention they are the projected
    encoder memory, computed once.
    """

    keys: Tensor | None = None
    values: Tensor | None = None
    extra: dict = field(default_factory=dict)

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]


class MultiHeadAttention(nn.Module):
    """h heads of scaled dot-product attention computed as one batched matmul, then an output projection.

    Self-attention when `memory` is None; cross-attention (queries from x, keys and values from `memory`)
    otherwise. Heads are a batch axis: (batch, time, d_model) -> (batch, heads, time, head_dim).
    """

    def __init__(self, config: ModelConfig, cross_attention: bool = False):
        super().__init__()
        self.n_heads, self.head_dim = config.n_heads, config.head_dim
        self.dropout = config.dropout
        self.cross_attention = cross_attention
        self.to_queries = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.to_keys_values = nn.Linear(config.d_model, 2 * config.d_model, bias=config.bias)
        self.to_output = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        # positions act on self-attention only: in cross-attention the two sequences share no positions
        self.positions = AttentionPositions() if cross_attention else attention_positions(config)
        self.use_fused = True  # dispatch to F.scaled_dot_product_attention where it is exact
        self.blockwise = config.blockwise
        self.core = None if cross_attention else sparse_core(config)  # Linformer or BigBird instead of full

    def split_heads(self, x: Tensor) -> Tensor:
        batch, time, _ = x.shape
        return x.view(batch, time, self.n_heads, self.head_dim).transpose(1, 2)  # (batch, heads, time, head_dim)

    def merge_heads(self, x: Tensor) -> Tensor:
        batch, _, time, _ = x.shape
        return x.transpose(1, 2).reshape(batch, time, self.n_heads * self.head_dim)  # (batch, time, d_model)

    def project_keys_values(self, source: Tensor) -> tuple[Tensor, Tensor]:
        keys, values = self.to_keys_values(source).chunk(2, dim=-1)
        return self.split_heads(keys), self.split_heads(values)

    def forward(self, x: Tensor, memory: Tensor | None = None, *, mask: Tensor | None = None, causal: bool = False,
                positions: Tensor | None = None, cache: KVCache | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x (batch, q_time, d_model); memory (batch, k_time, d_model) for cross-attention.

        `positions` (q_time,) are the absolute positions of x's tokens (default 0..q_time-1, or after the cache).
        `mask` is bool, broadcastable to (batch, heads, q_time, k_time), True = may attend; `causal` adds the
        causal mask. Returns (output (batch, q_time, d_model), weights or None).
        """
        if positions is None:
            start = cache.length if cache is not None and not self.cross_attention else 0
            positions = torch.arange(start, start + x.shape[1], device=x.device)
        queries = self.positions.rotate(self.split_heads(self.to_queries(x)), positions)
        keys, values = self.keys_values(x, memory, positions, cache)
        k_pos = torch.arange(keys.shape[2], device=x.device)

        dropout = self.dropout if self.training else 0.0
        key_padding = padding_of(mask, x.shape[0])  # (batch, k_time), or None when mask is not a padding mask
        if self.core is not None:
            if need_weights:
                raise ValueError("attention weights exist only for attention='full': Linformer and BigBird never "
                                 "score every (query, key) pair")
            if mask is not None and key_padding is None:
                raise ValueError(f"Linformer and BigBird take padding masks, (batch, 1, 1, k_time), only; got a "
                                 f"mask of shape {tuple(mask.shape)}")
            output = self.core(queries, keys, values, causal=causal, key_padding=key_padding)
            return self.to_output(self.merge_heads(output)), None
        if self.use_blockwise(queries.shape[2], keys.shape[2], mask, key_padding, causal, dropout, need_weights):
            output = blockwise_attention(queries, keys, values, positions=self.positions, q_pos=positions,
                                         k_pos=k_pos, causal=causal, key_padding=key_padding)
            return self.to_output(self.merge_heads(output)), None

        bias = self.positions.score_bias(queries, positions, k_pos)  # (heads | 1, q_time, k_time) or None
        fused = self.use_fused and not need_weights and not self.positions.has_value_bias
        # given nothing but causality, SDPA masks the future itself and never builds a (time, time) mask
        sdpa_causal = fused and causal and mask is None and bias is None and queries.shape[2] == keys.shape[2]
        if causal and not sdpa_causal:
            future = causal_mask(queries.shape[2], keys.shape[2], x.device)
            mask = future if mask is None else mask & future

        if fused:
            output = fused_attention(queries, keys, values, mask=mask, bias=bias, causal=sdpa_causal, dropout=dropout)
            weights = None
        else:
            output, weights = scaled_dot_product_attention(queries, keys, values, mask=mask, bias=bias,
                                                           dropout=dropout)
            extra = self.positions.value_bias(weights, positions, k_pos)
            if extra is not None:
                output = output + extra
        return self.to_output(self.merge_heads(output)), weights

    def use_blockwise(self, q_time: int, k_time: int, mask: Tensor | None, key_padding: Tensor | None,
                      causal: bool, dropout: float, need_weights: bool) -> bool:
        """Whether full attention takes kqv.efficient's exact O(n)-memory path (it has no attention dropout,
        returns no weights and takes padding masks only). "auto" takes it only where SDPA would otherwise build a
        large n x n matrix."""
        if self.blockwise == "never" or need_weights or dropout > 0 or (mask is not None and key_padding is None):
            return False
        if self.blockwise == "always":
            return True
        sdpa_streams = (mask is None and not self.positions.has_value_bias and (not causal or q_time == k_time)
                        and type(self.positions).score_bias is AttentionPositions.score_bias)
        return not sdpa_streams and q_time * k_time >= BLOCKWISE_MIN_PAIRS

    def keys_values(self, x: Tensor, memory: Tensor | None, positions: Tensor,
                    cache: KVCache | None) -> tuple[Tensor, Tensor]:
        """Keys and values for this step: from memory (cross) or x (self), reusing and extending the cache."""
        if self.cross_attention:
            if cache is not None and cache.keys is not None:
                return cache.keys, cache.values
            if memory is None:
                raise ValueError("cross-attention needs the encoder memory")
            keys, values = self.project_keys_values(memory)
        else:
            keys, values = self.project_keys_values(x)
            keys = self.positions.rotate(keys, positions)
            if cache is not None and cache.keys is not None:
                keys, values = torch.cat((cache.keys, keys), dim=2), torch.cat((cache.values, values), dim=2)
        if cache is not None:
            cache.keys, cache.values = keys, values
        return keys, values
