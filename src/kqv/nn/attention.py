"""Attention as a soft lookup: each query takes a softmax-weighted average of the values, weighted by how well
it matches each key.

This module holds the lecture's score functions (dot-product, multiplicative, reduced-rank, additive) in a
single-head `Attention` for experiments and the RNN baseline, and the Transformer's `MultiHeadAttention`, which
computes all heads as one batched operation. How its queries meet its keys is an attention core
(`kqv.nn.cores`), chosen when the layer is built from `CORES`: full softmax attention (plain, fused or
blockwise), Linformer or BigBird. `scaled_dot_product_attention` and the masks live in `kqv.nn.cores` and are
re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn

from ..errors import ConfigError, DataError
from .config import ModelConfig
from .cores import (
    AttentionCall,
    AttentionCore,
    FullAttention,
    causal_mask,
    fused_attention,
    padding_mask,
    padding_of,
    repeat_kv,
    scaled_dot_product_attention,
)
from .dmca import LocalAttention, MemoryCompressedAttention
from .positions import AttentionPositions, attention_positions, position_tensor
from .sparse import BigBirdAttention, LinformerAttention

Score = Literal["dot", "multiplicative", "reduced_rank", "additive"]
__all__ = [
    "Attention",
    "CORES",
    "KVCache",
    "MultiHeadAttention",
    "causal_mask",
    "fused_attention",
    "padding_mask",
    "padding_of",
    "repeat_kv",
    "scaled_dot_product_attention",
]


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

    def __init__(
        self,
        query_dim: int,
        key_dim: int | None = None,
        score: Score = "dot",
        *,
        rank: int | None = None,
        hidden: int | None = None,
    ):
        super().__init__()
        key_dim = key_dim or query_dim
        if score == "dot":
            if query_dim != key_dim:
                raise ConfigError(
                    f"dot-product scores need query_dim == key_dim, got {query_dim} and {key_dim}; "
                    f"use score='multiplicative' for different sizes"
                )
            self.score = DotScore()
        elif score == "multiplicative":
            self.score = MultiplicativeScore(query_dim, key_dim)
        elif score == "reduced_rank":
            self.score = ReducedRankScore(query_dim, key_dim, rank or max(1, min(query_dim, key_dim) // 4))
        elif score == "additive":
            self.score = AdditiveScore(query_dim, key_dim, hidden or query_dim)
        else:
            raise ConfigError(
                f"unknown score {score!r}; choose one of 'dot', 'multiplicative', 'reduced_rank', 'additive'"
            )

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        scores = self.score(query, keys)  # (batch, q_time, k_time)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)
        return weights @ values, weights


# ---------------------------------------------------------------------------------------------------------------
# Multi-head attention


class KVCache:
    """Keys and values one attention layer has already computed, (batch, heads, time, head_dim) each, with the
    layer's n_kv_heads heads (fewer than its query heads under grouped-query attention).

    Self-attention appends each step's keys and values in place, into buffers reserved for `capacity` positions
    (doubled when a step goes past them), so a step copies its own keys and values only, never the whole past;
    `keys` and `values` are views of the filled part. Cross-attention stores the projected encoder memory once.
    """

    def __init__(self, capacity: int = 0):
        self.capacity = capacity
        self.length = 0
        self._keys: Tensor | None = None  # (batch, heads, reserved time, head_dim)
        self._values: Tensor | None = None

    @property
    def keys(self) -> Tensor | None:
        """The cached keys (batch, heads, length, head_dim): a view of the reserved buffer, or None if empty."""
        return None if self._keys is None else self._keys.narrow(2, 0, self.length)

    @property
    def values(self) -> Tensor | None:
        """The cached values (batch, heads, length, head_dim): a view of the reserved buffer, or None if empty."""
        return None if self._values is None else self._values.narrow(2, 0, self.length)

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys and values (batch, heads, new, head_dim) of the newest tokens; return all of them."""
        new = keys.shape[2]
        end = self.length + new
        if self._keys is None or end > self._keys.shape[2]:
            self._reserve(keys, values, max(end, self.capacity, 2 * self.length))
        # narrow, not [:, :, a:b]: one view op instead of Python indexing, a few microseconds per token and layer
        self._keys.narrow(2, self.length, new).copy_(keys)
        self._values.narrow(2, self.length, new).copy_(values)
        self.length = end
        return self.keys, self.values

    def _reserve(self, keys: Tensor, values: Tensor, time: int) -> None:
        batch, heads = keys.shape[:2]
        reserved = [new.new_empty(batch, heads, time, new.shape[-1]) for new in (keys, values)]
        if self.length:
            reserved[0][:, :, : self.length], reserved[1][:, :, : self.length] = self.keys, self.values
        self._keys, self._values = reserved

    def store(self, keys: Tensor, values: Tensor) -> None:
        """Keep keys and values computed once (cross-attention's, of the encoder memory)."""
        self._keys, self._values, self.length = keys, values, keys.shape[2]

    def select(self, rows: Tensor) -> None:
        """Keep the batch rows `rows`, in that order (beam search)."""
        if self._keys is not None:
            self._keys, self._values = self._keys.index_select(0, rows), self._values.index_select(0, rows)


CORES: dict[str, Callable[[ModelConfig], AttentionCore]] = {
    "full": FullAttention.from_config,
    "linformer": LinformerAttention.from_config,  # Wang et al. 2020
    "bigbird": BigBirdAttention.from_config,  # Zaheer et al. 2020
    "local": LocalAttention.from_config,  # Liu et al. 2018
    "memory_compressed": MemoryCompressedAttention.from_config,  # Liu et al. 2018
}


class MultiHeadAttention(nn.Module):
    """h heads of scaled dot-product attention computed as one batched matmul, then an output projection.

    Self-attention when `memory` is None; cross-attention (queries from x, keys and values from `memory`)
    otherwise. Heads are a batch axis: (batch, time, d_model) -> (batch, heads, time, head_dim). Self-attention
    uses the core `config.attention` (or `config.layer_pattern`'s slot for block `layer`) names and the config's
    position scheme; cross-attention is always full attention without positions, since the two sequences share none.
    Keys and values have `config.kv_heads` heads (grouped-query attention when fewer than n_heads; the cache keeps
    that many): query head h reads key/value head h // (n_heads / n_kv_heads). A core whose `takes_groups` is
    False gets them repeated to n_heads (`repeat_kv`); full attention takes them as they are.
    """

    def __init__(self, config: ModelConfig, cross_attention: bool = False, layer: int = 0):
        super().__init__()
        self.n_heads, self.head_dim = config.n_heads, config.head_dim
        self.n_kv_heads = config.kv_heads  # each shared by n_heads / n_kv_heads query heads (GQA; MQA at 1)
        self.dropout = config.dropout
        self.cross_attention = cross_attention
        self.to_queries = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        # keys then values along the output, n_kv_heads * head_dim each
        self.to_keys_values = nn.Linear(config.d_model, 2 * self.n_kv_heads * self.head_dim, bias=config.bias)
        self.to_output = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.positions = AttentionPositions() if cross_attention else attention_positions(config)
        # the core of block `layer`: config.attention, or its slot of config.layer_pattern
        self.core = FullAttention.from_config(config) if cross_attention else CORES[config.attention_of(layer)](config)

    def split_heads(self, x: Tensor, heads: int | None = None) -> Tensor:
        """(batch, time, heads * head_dim) -> (batch, heads, time, head_dim): heads become a batch axis, a view.
        `heads` is n_heads (queries) unless given (n_kv_heads, for keys and values)."""
        batch, time, _ = x.shape
        heads = heads or self.n_heads
        return x.view(batch, time, heads, self.head_dim).transpose(1, 2)  # (batch, heads, time, head_dim)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(batch, heads, time, head_dim) -> (batch, time, d_model): the heads' outputs side by side."""
        batch, _, time, _ = x.shape
        return x.transpose(1, 2).reshape(batch, time, self.n_heads * self.head_dim)  # (batch, time, d_model)

    def project_keys_values(self, source: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of source (batch, time, d_model), one projection for both, split into n_kv_heads heads
        each: (batch, n_kv_heads, time, head_dim)."""
        keys, values = self.to_keys_values(source).chunk(2, dim=-1)
        return self.split_heads(keys, self.n_kv_heads), self.split_heads(values, self.n_kv_heads)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        positions: Tensor | range | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x (batch, q_time, d_model); memory (batch, k_time, d_model) for cross-attention.

        `positions` (q_time,) are the absolute positions of x's tokens, a LongTensor or a `range`; by default
        0..q_time-1, or after the cache: a tensor for the scheme, and for the core the queries are the last q_time
        of the keys (`q_pos=None`), which it plans by from the shapes alone (no Python range of the length, which
        torch.compile would fix, and no read of the device).
        `mask` is bool, broadcastable to (batch, heads, q_time, k_time), True = may attend; `causal` adds the
        causal mask. Returns (output (batch, q_time, d_model), weights or None).
        """
        if positions is None:  # consecutive: the core takes the queries to be the last of the keys (cross-attention
            # has no position scheme, so there only their number counts)
            start = cache.length if cache is not None and not self.cross_attention else 0
            q_pos, positions = None, torch.arange(start, start + x.shape[1], device=x.device)
        else:
            q_pos, positions = positions, position_tensor(positions, x.device)  # as given, for the core; a tensor
        queries = self.positions.rotate(self.split_heads(self.to_queries(x)), positions)  # (batch, heads, q, hd)
        keys, values = self.keys_values(x, memory, positions, cache)  # (batch, kv_heads, k_time, head_dim)
        if not self.core.takes_groups:  # each key/value head repeated for its query heads: (batch, heads, ...)
            keys, values = repeat_kv(keys, self.n_heads), repeat_kv(values, self.n_heads)
        dropout = self.dropout if self.training else 0.0
        call = AttentionCall(self.positions, q_pos, mask, causal, dropout, need_weights)
        output, weights = self.core.attend(queries, keys, values, call)
        return self.to_output(self.merge_heads(output)), weights

    def keys_values(
        self, x: Tensor, memory: Tensor | None, positions: Tensor, cache: KVCache | None
    ) -> tuple[Tensor, Tensor]:
        """Keys and values for this step: from memory (cross) or x (self), reusing and extending the cache."""
        if self.cross_attention:
            if cache is not None and cache.keys is not None:
                return cache.keys, cache.values
            if memory is None:
                raise DataError("cross-attention needs the encoder memory")
            keys, values = self.project_keys_values(memory)
            if cache is not None:
                cache.store(keys, values)
            return keys, values
        keys, values = self.project_keys_values(x)
        keys = self.positions.rotate(keys, positions)
        return (keys, values) if cache is None else cache.append(keys, values)
