"""Cheaper-than-quadratic attention: each query looks at fewer keys, or at compressed ones.

Both modules are attention cores (`kqv.nn.cores.PaddingOnlyCore`): queries, keys and values of shape
(batch, heads, time, head_dim) in, (batch, heads, q_time, head_dim) out, with `causal` and `key_padding`
(batch, k_time) bool (True = real token) given per call. Queries and keys are taken already rotated (RoPE);
score biases (ALiBi, Shaw) are not supported: Linformer has no key positions left to bias, and BigBird would
need them per gathered block.

* `LinformerAttention` (Wang et al. 2020): keys and values are projected along the sequence axis, n -> k, with
  learned (max_len, k) matrices E and F, so every query scores k compressed keys: O(n k) time and memory.
* `BigBirdAttention` (Zaheer et al. 2020): blocks of queries attend to a sliding window of key blocks, a few
  global blocks and a few random blocks, gathered block by block: O(n (window + global + random) block).
"""

from __future__ import annotations

import math
import random
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError, DataError
from . import flex
from .config import ModelConfig
from .cores import PaddingOnlyCore

# ---------------------------------------------------------------------------------------------------------------
# Linformer


class LinformerProjection(nn.Module):
    """The sequence-axis projections of Linformer: E for keys and F for values, (max_len, k) each.

    `shared_heads=True` uses one E (and F) for every head, as the paper's "headwise" sharing; otherwise each head
    has its own, (heads, max_len, k). `share_kv=True` uses E for values too (the paper's "key-value" sharing).
    Passing one instance to the attention of every layer is the paper's "layerwise" sharing. A shorter input
    uses the first n rows. Initialised N(0, 1/max_len), so a full-length summary has the size of one key.
    """

    def __init__(self, max_len: int, k: int, heads: int = 1, shared_heads: bool = True, share_kv: bool = False):
        super().__init__()
        self.max_len, self.k = max_len, k
        shape = (1 if shared_heads else heads, max_len, k)
        self.keys = nn.Parameter(torch.randn(shape) / math.sqrt(max_len))  # E
        self.values = None if share_kv else nn.Parameter(torch.randn(shape) / math.sqrt(max_len))  # F

    def forward(self, time: int) -> tuple[Tensor, Tensor]:
        """(E, F) for an input of `time` positions, each (heads | 1, time, k)."""
        if time > self.max_len:
            raise DataError(
                f"Linformer projects at most max_len={self.max_len} positions, got {time}; "
                f"build it with a larger max_len or use BigBird or blockwise attention"
            )
        keys = self.keys[:, :time]
        return keys, keys if self.values is None else self.values[:, :time]


class LinformerAttention(PaddingOnlyCore):
    """softmax(q (E^T K)^T / sqrt(d)) (F^T V): every query scores k learned mixtures of the keys.

    The published Linformer is non-causal: E^T K mixes every position, the future included, into each of the k
    summaries. The causal variant here projects cumulatively: query i sees the summaries of keys 0..i only,
    E[:i+1]^T K[:i+1] and F[:i+1]^T V[:i+1], which are prefix sums, computed chunk by chunk with a running (k, d)
    state, still O(n k). So no future token can reach a past output. Its caveat: an early query's summaries mix few
    tokens and grow as i grows, so the scores change scale along the sequence, and a query can only single out a
    far-back token if E happens to route it to a slot of its own; expect it to trail full attention on retrieval.
    Padding keys and values are zeroed before they are projected.
    """

    name = "Linformer"

    def __init__(
        self,
        max_len: int,
        k: int,
        heads: int = 1,
        shared_heads: bool = True,
        share_kv: bool = False,
        projection: LinformerProjection | None = None,
        chunk: int = 256,
    ):
        super().__init__()
        self.projection = projection or LinformerProjection(max_len, k, heads, shared_heads, share_kv)
        self.chunk = chunk

    @classmethod
    def from_config(cls, config: ModelConfig) -> LinformerAttention:
        return cls(
            config.max_len,
            config.linformer.k,
            config.n_heads,
            shared_heads=config.linformer.sharing != "none",
            share_kv=config.linformer.sharing in ("key_value", "layerwise"),
        )

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, *, causal: bool = False, key_padding: Tensor | None = None
    ) -> Tensor:
        if key_padding is not None:
            keep = key_padding[:, None, :, None].to(keys.dtype)  # (batch, 1, k_time, 1)
            keys, values = keys * keep, values * keep
        e, f = self.projection(keys.shape[2])  # (heads | 1, k_time, k)
        if causal:
            return self.causal_attention(queries, keys, values, e, f)
        compressed_keys = e.transpose(1, 2) @ keys  # (batch, heads, k, head_dim)
        compressed_values = f.transpose(1, 2) @ values
        scores = queries @ compressed_keys.transpose(-2, -1) / math.sqrt(queries.shape[-1])  # (batch, heads, q, k)
        return scores.softmax(-1) @ compressed_values

    def causal_attention(self, queries: Tensor, keys: Tensor, values: Tensor, e: Tensor, f: Tensor) -> Tensor:
        """Query i scores the k summaries sum_{j<=i} E[j] k_j and reads sum_{j<=i} F[j] v_j, one chunk of keys at a
        time: summaries of earlier chunks come from the running state, those within the chunk through a causal
        mask. Queries are the last q_time positions (all of them, or the new ones when decoding with a cache)."""
        batch, heads, q_time, head_dim = queries.shape
        k_time, scale = keys.shape[2], 1.0 / math.sqrt(head_dim)
        key_state = queries.new_zeros(batch, heads, e.shape[-1], head_dim)  # sum_{j < chunk start} E[j]^T k_j
        value_state = queries.new_zeros(batch, heads, f.shape[-1], values.shape[-1])
        # split, not slicing in the loop: the backward of a slice writes a full-size gradient, one per chunk
        starts = range(0, k_time, self.chunk)
        sizes = [min(self.chunk, k_time - start) for start in starts]
        q_sizes = [max(0, min(size, start + size - (k_time - q_time))) for start, size in zip(starts, sizes)]
        outputs = []
        for q, k, v, e_c, f_c in zip(
            queries.split(q_sizes, dim=2),
            keys.split(sizes, dim=2),
            values.split(sizes, dim=2),
            e.split(sizes, dim=1),
            f.split(sizes, dim=1),
        ):
            if q.shape[2]:  # the chunk's last q.shape[2] positions are queries
                past = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
                past = past.tril_(k.shape[2] - q.shape[2])
                within = (q @ k.transpose(-2, -1)).masked_fill(~past, 0.0)  # (batch, heads, q_chunk, chunk)
                scores = (q @ key_state.transpose(-2, -1) + within @ e_c) * scale  # (batch, heads, q_chunk, k)
                weights = scores.softmax(-1)
                mixing = (weights @ f_c.transpose(-2, -1)).masked_fill(~past, 0.0)  # (batch, heads, q_chunk, chunk)
                outputs.append(weights @ value_state + mixing @ v)
            key_state = key_state + e_c.transpose(-2, -1) @ k
            value_state = value_state + f_c.transpose(-2, -1) @ v
        return torch.cat(outputs, dim=2)


def share_linformer_projection(model: nn.Module) -> None:
    """The paper's layerwise sharing: every `LinformerAttention` in `model` uses the first one's projection."""
    layers = [m for m in model.modules() if isinstance(m, LinformerAttention)]
    for layer in layers[1:]:
        layer.projection = layers[0].projection


# ---------------------------------------------------------------------------------------------------------------
# BigBird


@lru_cache(maxsize=64)
@lru_cache(maxsize=64)  # the same few lengths every step: drawn once each
def bigbird_layout(
    n_blocks: int, window: int, global_blocks: int, random_blocks: int, causal: bool, seed: int
) -> tuple[tuple[int, ...], ...]:
    """For each query block, the sorted key blocks it attends to.

    Global blocks (the first `global_blocks`) attend to every block and every block attends to them; every other
    block attends to `window` blocks on each side of its own and to `random_blocks` others drawn with a generator
    seeded by (seed, block). Causal: only blocks at or before the query's own, and the random draw depends on the
    block alone, not on the sequence length, so appending tokens never changes an earlier block's choice.
    """
    layout = []
    for i in range(n_blocks):
        visible = range(i + 1) if causal else range(n_blocks)
        if i < global_blocks:
            layout.append(tuple(visible))
            continue
        chosen = {b for b in range(global_blocks) if b in visible}
        chosen |= {b for b in range(i - window, i + window + 1) if b in visible}
        eligible = [b for b in visible if b not in chosen]
        chosen |= set(random.Random(seed * 1_000_003 + i).sample(eligible, min(random_blocks, len(eligible))))
        layout.append(tuple(sorted(chosen)))
    return tuple(layout)


def bigbird_mask(
    time: int, block: int, window: int, global_blocks: int, random_blocks: int, causal: bool = False, seed: int = 0
) -> Tensor:
    """(time, time) bool, True where query i may attend to key j: the dense equivalent of `BigBirdAttention`
    (including the causal mask when `causal`). For tests and for small inputs: it is n x n."""
    n_blocks = -(-time // block)
    layout = bigbird_layout(n_blocks, window, global_blocks, random_blocks, causal, seed)
    mask = layout_table(layout).repeat_interleave(block, 0).repeat_interleave(block, 1)[:time, :time]
    if causal:
        mask &= torch.ones(time, time, dtype=torch.bool).tril_()
    return mask


@lru_cache(maxsize=64)
def layout_table(layout: tuple[tuple[int, ...], ...], device: torch.device | None = None) -> Tensor:
    """(n_blocks, n_blocks) bool, True where query block i attends to key block j in `layout`: built and copied
    to `device` once per layout and device, not every forward (callers never write into it)."""
    rows = [[j in set(row) for j in range(len(layout))] for row in layout]
    return torch.tensor(rows, dtype=torch.bool, device=device)  # one copy to the device, made there


class BigBirdAttention(PaddingOnlyCore):
    """Block-sparse attention (Zaheer et al. 2020), computed without an n x n matrix.

    The sequence is cut into blocks of `block` tokens (the last padded). Each non-global query block gathers its
    key blocks (window + global + random, `bigbird_layout`) into one (slots * block) run of keys and attends to
    them; the global query blocks attend densely. Memory and time O(n * slots * block). Causal attention also
    takes fewer queries than keys, the last ones (decoding with a cache): only their blocks are computed.
    """

    name = "BigBird"

    def __init__(self, block: int = 64, window: int = 1, global_blocks: int = 1, random_blocks: int = 2, seed: int = 0):
        super().__init__()
        if block <= 0 or window < 0 or global_blocks < 0 or random_blocks < 0:
            raise ConfigError(
                f"BigBird needs block > 0 and window, global_blocks, random_blocks >= 0, got "
                f"{(block, window, global_blocks, random_blocks)}"
            )
        self.block, self.window, self.global_blocks, self.random_blocks, self.seed = (
            block,
            window,
            global_blocks,
            random_blocks,
            seed,
        )

    @classmethod
    def from_config(cls, config: ModelConfig) -> BigBirdAttention:
        bigbird = config.bigbird
        return cls(bigbird.block, bigbird.window, bigbird.global_blocks, bigbird.random_blocks, bigbird.seed)

    def layout(self, n_blocks: int, causal: bool) -> tuple[tuple[int, ...], ...]:
        return bigbird_layout(n_blocks, self.window, self.global_blocks, self.random_blocks, causal, self.seed)

    def flex_mask(self, time: int, causal: bool, device: torch.device) -> flex.MaskMod:
        """The block layout as a mask; on the device of the queries."""
        layout = self.layout(-(-time // self.block), causal)
        return flex.block_layout_mask(layout_table(layout, device), self.block)

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, *, causal: bool = False, key_padding: Tensor | None = None
    ) -> Tensor:
        batch, _, q_time, head_dim = queries.shape
        time = keys.shape[2]
        if q_time > time or (q_time < time and not causal):
            raise DataError(
                f"BigBird is self-attention over one sequence: got {q_time} queries and {time} keys "
                f"(fewer queries than keys only when causal, for decoding with a cache)"
            )
        b = self.block
        n_blocks = -(-time // b)
        padded = n_blocks * b
        first = (time - q_time) // b  # the first block holding a query
        before = time - q_time - first * b  # positions of that block before the first query
        keep = (
            torch.ones(batch, time, dtype=torch.bool, device=queries.device)
            if key_padding is None
            else key_padding.bool()
        )
        keep = F.pad(keep, (0, padded - time + b))  # (batch, padded + b): a last all-masked block for empty slots
        k, v = (F.pad(x, (0, 0, 0, padded - time + b)) for x in (keys, values))
        q = F.pad(queries, (0, 0, before, padded - time))  # blocks first .. n_blocks - 1
        layout = self.layout(n_blocks, causal)
        n_global = min(self.global_blocks, n_blocks)
        outputs = []
        if first < n_global:  # global query blocks: dense rows
            rows = (n_global - first) * b
            scores = q[:, :, :rows] @ k[:, :, :padded].transpose(-2, -1)  # (batch, heads, rows, padded)
            allowed = keep[:, None, None, :padded].expand(-1, -1, rows, -1)
            if causal:
                q_pos = torch.arange(first * b, n_global * b, device=q.device)
                allowed = allowed & (torch.arange(padded, device=q.device)[None, :] <= q_pos[:, None])
            outputs.append(_masked_attention(scores / math.sqrt(head_dim), allowed, v[:, :, :padded]))
        start = max(first, n_global)
        if n_blocks > start:
            outputs.append(self.sparse_rows(q[:, :, (start - first) * b :], k, v, keep, layout[start:], start, causal))
        return torch.cat(outputs, dim=2)[:, :, before : before + q_time]

    def sparse_rows(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        keep: Tensor,
        layout: tuple[tuple[int, ...], ...],
        first: int,
        causal: bool,
    ) -> Tensor:
        """Query blocks first, first+1, ... (q starts at block `first`) each against its gathered key blocks."""
        head_dim = q.shape[-1]
        b, n_rows = self.block, len(layout)
        empty = k.shape[2] // b - 1  # index of the all-masked block that pads short rows
        index = gather_index(layout, empty, q.device)  # (rows, slots)
        key_pos = (index[:, :, None] * b + torch.arange(b, device=q.device)).flatten(1)  # (rows, slots * b)
        queries = q[:, :, : n_rows * b].unflatten(2, (n_rows, b))  # (batch, heads, rows, b, head_dim)
        gathered_keys = k[:, :, key_pos]  # (batch, heads, rows, slots * b, head_dim)
        gathered_values = v[:, :, key_pos]
        scores = queries @ gathered_keys.transpose(-2, -1) / math.sqrt(head_dim)  # (batch, heads, rows, b, slots*b)
        allowed = keep[:, key_pos][:, None, :, None, :]  # (batch, 1, rows, 1, slots * b)
        if causal:
            q_pos = torch.arange(first * b, (first + n_rows) * b, device=q.device).view(n_rows, b)
            allowed = allowed & (key_pos[:, None, :] <= q_pos[:, :, None])  # (rows, b, slots * b)
        output = _masked_attention(scores, allowed, gathered_values)  # (batch, heads, rows, b, head_dim)
        return output.flatten(2, 3)


@lru_cache(maxsize=64)
def gather_index(layout: tuple[tuple[int, ...], ...], empty: int, device: torch.device) -> Tensor:
    """(rows, slots) the key blocks of each query block of `layout`, short rows padded with the all-masked block
    `empty`: built and copied to `device` once per layout, not every forward (callers never write into it)."""
    slots = max(len(row) for row in layout)
    return torch.tensor([row + (empty,) * (slots - len(row)) for row in layout], device=device)


def _masked_attention(scores: Tensor, allowed: Tensor, values: Tensor) -> Tensor:
    """softmax over allowed keys, then the weighted values; a query that may see nothing gets zeros."""
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    return weights @ values
