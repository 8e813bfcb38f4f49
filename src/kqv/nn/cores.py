"""Attention cores: what `MultiHeadAttention` does between its projections, softmax(q k^T / sqrt(d)) v and its
cheaper relatives, behind one small interface.

The layer projects x to queries, keys and values, splits heads and applies RoPE; the core turns
(queries, keys, values) into one output per query; the layer merges heads and projects the output. Which core a
layer uses is decided once, when the layer is built, from `ModelConfig.attention` (see `CORES` in
`kqv.nn.attention`), so the layer's forward reads the same whatever the core.

The interface (`AttentionCore.attend(queries, keys, values, call)`):
    queries (batch, heads, q_time, head_dim), keys and values (batch, heads, k_time, head_dim), already rotated
    (with fewer heads, kv_heads, for a core whose `takes_groups` is True: grouped-query attention);
    and the call's options, one `AttentionCall`: `positions`, the layer's `AttentionPositions` (for schemes that
    add a score or value bias);
    `q_pos` (q_time,) the queries' positions, a LongTensor, a Python `range`, or None: the queries are the last
    q_time of the keys, which are at 0..k_time-1 (consecutive positions, planned from the shapes alone);
    `mask` bool broadcastable to (batch, heads, q_time, k_time), True = may attend, or None;
    `causal`, `dropout` (attention dropout, 0 in eval), `need_weights`.
    Returns (output (batch, heads, q_time, head_dim), weights (batch, heads, q_time, k_time) or None).

To add a core: write a subclass of `AttentionCore` (or of `PaddingOnlyCore` if it takes padding
masks only and never forms every (query, key) score, like Linformer and BigBird) with a `from_config(config)`
class method, add one entry to `CORES` in `kqv.nn.attention`, and its name to `AttentionKind` in
`kqv.nn.config` (tests/test_long_attention_models.py checks the two agree). A core's parameters are saved as
`...attention.core.*`; a parameter-free core changes no state dict.

This module also holds the two ways full attention is computed densely: `scaled_dot_product_attention`, the
readable reference, and `fused_attention`, the same through torch's fused kernel.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError, DataError
from . import flex
from .blockwise import blockwise_attention
from .config import Blockwise, ModelConfig
from .devices import kernels
from .dropout import dropout as apply_dropout
from .positions import AttentionPositions, position_tensor

PLAIN_BF16_PAIRS = 256 * 256  # up to this many scores, bf16 attention on the CPU is faster as plain matmuls
BLOCKWISE_MIN_PAIRS = 1 << 21  # below ~1,450 x 1,450 scores the dense matrix is cheap: blockwise only saves memory


# ---------------------------------------------------------------------------------------------------------------
# Masks


def causal_mask(q_time: int, k_time: int, device: torch.device | None = None) -> Tensor:
    """(q_time, k_time) bool, True where query i may see key j. Queries are the last q_time of the k_time
    positions, so with a cache of earlier keys the newest query sees everything before it."""
    q_pos = torch.arange(k_time - q_time, k_time, device=device)
    return torch.arange(k_time, device=device)[None, :] <= q_pos[:, None]


def query_positions(q_pos: Tensor | range | None, q_time: int, k_time: int, device: torch.device) -> Tensor:
    """The queries' positions (q_time,) as a tensor; `q_pos=None`: the last q_time of the k_time keys."""
    return torch.arange(k_time - q_time, k_time, device=device) if q_pos is None else position_tensor(q_pos, device)


def flag(condition: object) -> bool:
    """`condition` as a plain bool for a kernel's flag. Under torch.compile with dynamic lengths, a comparison of
    lengths is a symbolic bool, which `bool()` keeps symbolic and SDPA's `is_causal` refuses; a branch on it makes
    Dynamo decide it (a guard on the lengths) and gives a plain one."""
    return True if condition else False


def padding_mask(attention_mask: Tensor) -> Tensor:
    """(batch, k_time) with 1 for real tokens -> (batch, 1, 1, k_time) bool, broadcastable over heads and queries."""
    return attention_mask.bool()[:, None, None, :]


def packed_mask(sequences: Tensor) -> Tensor:
    """(batch, time) sequence numbers of a packed row's tokens -> (batch, 1, time, time) bool, True where query i
    and key j belong to the same sequence: block-diagonal, so that no sequence attends to another (the causal
    mask is added by attention)."""
    return (sequences[:, :, None] == sequences[:, None, :])[:, None]


def padding_of(mask: Tensor | None, batch: int) -> Tensor | None:
    """The (batch, k_time) keys-to-keep of a padding mask (batch | 1, 1, 1, k_time); None for any other mask."""
    if mask is None or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != 1:
        return None
    return mask[:, 0, 0, :].expand(batch, -1)


def repeat_kv(x: Tensor, heads: int) -> Tensor:
    """Keys or values (batch, kv_heads, time, head_dim) -> (batch, heads, time, head_dim), each key/value head
    repeated for its group of heads / kv_heads consecutive query heads, as `x.repeat_interleave(heads // kv_heads,
    dim=1)` would: grouped-query attention as plain multi-head attention. `x` itself when kv_heads == heads; a
    view, no copy, for one key/value head (multi-query attention); a copy otherwise."""
    batch, kv_heads, time, head_dim = x.shape
    if kv_heads == heads:
        return x
    grouped = x[:, :, None].expand(batch, kv_heads, heads // kv_heads, time, head_dim)
    return grouped.reshape(batch, heads, time, head_dim)  # (batch, heads, time, head_dim)


def sdpa_takes_groups(queries: Tensor, attn_mask: Tensor | None) -> bool:
    """Whether torch's fused SDPA takes keys and values of fewer heads than the queries (`enable_gqa`) on a fused
    kernel, not on its math fallback, which forms every score: the CPU's flash kernel always; on CUDA the flash
    kernel only (fp16 or bf16, no mask), the memory-efficient kernel that takes masks and fp32 has no GQA."""
    takes = kernels(queries.device).sdpa_groups
    half = queries.dtype in (torch.float16, torch.bfloat16)
    return takes == "always" or (takes == "flash" and attn_mask is None and half)


# ---------------------------------------------------------------------------------------------------------------
# Scaled dot-product attention, plainly and fused


def attention_scores(queries: Tensor, keys: Tensor, bias: Tensor | None, causal: bool) -> Tensor:
    """q k^T / sqrt(d_head) + bias, the future -inf when `causal` (as `causal_mask` hides it): (batch, heads,
    q_time, k_time), before any mask and the softmax."""
    q_time, k_time = queries.shape[2], keys.shape[2]
    scores = queries @ keys.transpose(-2, -1) / math.sqrt(queries.shape[-1])
    if bias is not None:
        scores = scores + bias
    if causal:
        future = torch.full((q_time, k_time), float("-inf"), dtype=scores.dtype, device=scores.device)
        scores = scores + future.triu_(k_time - q_time + 1)
    return scores


def scaled_dot_product_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    dropout: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """The readable reference: softmax(q k^T / sqrt(d_head) + bias, future and padding = -inf) v.

    queries (batch, heads, q_time, head_dim); keys, values (batch, heads, k_time, head_dim);
    mask bool broadcastable to (batch, heads, q_time, k_time), True = may attend; `causal` masks the future as
    `causal_mask` does. Returns (output, weights).
    """
    scores = attention_scores(queries, keys, bias, causal)  # (batch, heads, q_time, k_time)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    if mask is not None or bias is not None:
        weights = weights.nan_to_num(0.0)  # a query with every key masked attends to nothing
    if dropout > 0:
        weights = apply_dropout(weights, dropout)
    return weights @ values, weights


def masked_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    dropout: float = 0.0,
) -> Tensor:
    """`scaled_dot_product_attention`'s output with the mask added to the scores as 0 / -inf: one pass forward
    and none backward, where filling the scores and then zeroing the NaN weights of a query that sees no key costs
    five (a packed row's block-diagonal mask, at every layer). Such a query is let see every key, and its output is
    then multiplied by 0: the reference's zeros, on (batch, heads, q_time, head_dim) rather than on the weights."""
    if causal and mask is not None:  # folded into the mask, so that `seen` knows what the future hides
        mask, causal = mask & causal_mask(queries.shape[2], keys.shape[2], queries.device), False
    seen = None if mask is None else mask.any(dim=-1, keepdim=True)  # (..., q_time, 1): a query with a key to see
    scores = attention_scores(queries, keys, bias, causal)  # (batch, heads, q_time, k_time)
    if mask is not None:
        hidden = torch.full((), float("-inf"), dtype=scores.dtype, device=scores.device)
        scores = scores + torch.where(mask | ~seen, 0.0, hidden)  # (..., q_time, k_time): 0 or -inf, added
    weights = scores.softmax(dim=-1)
    if dropout > 0:
        weights = apply_dropout(weights, dropout)
    output = weights @ values
    return output if seen is None else output * seen


def fused_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    dropout: float = 0.0,
) -> Tensor:
    """The same computation through `F.scaled_dot_product_attention` (O(n) memory when mask and bias are None).

    Keys and values may have fewer heads than the queries (grouped-query attention): SDPA takes them so
    (`enable_gqa`) where a fused kernel does (`sdpa_takes_groups`), else they are repeated (`repeat_kv`).
    Short bf16 inputs on the CPU take the plain path instead: there torch's flash kernel is 1.9-3.8x slower
    forward + backward (`python benchmarks/attention_kernels.py`), and the plain path's numerics are eager
    attention's under autocast (bf16 scores, softmax accumulated in fp32).
    """
    heads = queries.shape[1]
    if (
        queries.dtype == torch.bfloat16
        and kernels(queries.device).plain_bf16_attention
        and queries.shape[2] * keys.shape[2] <= PLAIN_BF16_PAIRS
    ):
        keys, values = repeat_kv(keys, heads), repeat_kv(values, heads)
        return masked_attention(queries, keys, values, mask=mask, bias=bias, causal=causal, dropout=dropout)
    if bias is not None:
        attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    else:
        attn_mask = mask
    grouped = keys.shape[1] != heads  # grouped-query attention: fewer key/value heads than query heads
    if grouped and not sdpa_takes_groups(queries, attn_mask):
        keys, values, grouped = repeat_kv(keys, heads), repeat_kv(values, heads), False
    return F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=attn_mask, dropout_p=dropout, is_causal=causal, enable_gqa=grouped
    )


# ---------------------------------------------------------------------------------------------------------------
# The interface, and full attention


class AttentionCall(NamedTuple):
    """What one call of `AttentionCore.attend` asks besides queries, keys and values (the module docstring says
    what each is): one object, so that the cores and the cores that wrap them pass it on whole."""

    positions: AttentionPositions
    q_pos: Tensor | range | None
    mask: Tensor | None
    causal: bool
    dropout: float
    need_weights: bool


class AttentionCore(nn.Module):
    """How queries meet keys: the part of multi-head attention that differs between attention kinds.

    See the module docstring for the shapes; subclasses implement `attend` and `from_config`. `takes_groups`:
    whether `attend` takes keys and values with fewer heads than the queries (grouped-query attention, query head
    h reading key/value head h // (heads / kv_heads)); where False, the layer repeats them first (`repeat_kv`).
    """

    takes_groups = False

    @classmethod
    def from_config(cls, config: ModelConfig) -> AttentionCore:
        raise NotImplementedError

    def attend(
        self, queries: Tensor, keys: Tensor, values: Tensor, call: AttentionCall
    ) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError


class FullAttention(AttentionCore):
    """Exact softmax attention over every key, by the cheapest exact kernel for the call (keys and values of fewer
    heads than the queries, grouped-query attention, are taken as they are by flex_attention and SDPA, and
    repeated for the others):

    * `blockwise_attention` (O(n) memory) where a position bias or padding would make SDPA build a large n x n
      matrix, as `blockwise` says ("auto": from BLOCKWISE_MIN_PAIRS scores on; "always"; "never");
    * on a CUDA GPU, flex_attention (`kqv.nn.flex`) for a score bias (ALiBi, Shaw's relative keys) over a whole
      sequence without dropout: fused and O(n) memory where SDPA would take the bias as a dense n x n matrix;
    * torch's fused SDPA (`fused_attention`) where nothing it cannot express is asked;
    * the plain reference (`scaled_dot_product_attention`) when the weights are wanted or a scheme adds a value
      bias (Shaw et al. 2018), which needs them. `fused=False` takes it always (tests compare the kernels).
    """

    takes_groups = True

    def __init__(self, blockwise: Blockwise = "auto", fused: bool = True):
        super().__init__()
        self.blockwise, self.fused = blockwise, fused

    @classmethod
    def from_config(cls, config: ModelConfig) -> FullAttention:
        return cls(config.blockwise)

    def attend(
        self, queries: Tensor, keys: Tensor, values: Tensor, call: AttentionCall
    ) -> tuple[Tensor, Tensor | None]:
        positions, q_pos, mask, causal, dropout, need_weights = call
        q_time, k_time = queries.shape[2], keys.shape[2]
        # one query (decoding a token) is the newest position: it sees every key
        causal = flag(causal and q_time > 1)
        key_padding = padding_of(mask, queries.shape[0])  # (batch, k_time), or None when mask is not padding
        if self.use_flex(queries, keys, positions, q_pos, mask, key_padding, dropout, need_weights):
            score_mod = positions.score_mod(queries)
            return flex.attend(
                queries,
                keys,
                values,
                score_mod=score_mod,
                mask_mod=flex.combined(None, causal, key_padding),
                padding=None if key_padding is None else mask,
                mask_key=("causal", bool(causal)),
            ), None
        if self.use_blockwise(
            positions, q_time, k_time, mask, key_padding, causal, dropout, need_weights, queries.device
        ):
            return blockwise_attention(  # given ranges, it plans its blocks without reading the device
                queries,
                repeat_kv(keys, queries.shape[1]),
                repeat_kv(values, queries.shape[1]),
                positions=positions,
                q_pos=q_pos,
                k_pos=range(k_time),
                causal=causal,
                key_padding=key_padding,
            ), None

        q_pos, k_pos = (
            (query_positions(q_pos, q_time, k_time, queries.device), torch.arange(k_time, device=queries.device))
            if positions.has_score_bias or positions.has_value_bias
            else (None, None)
        )
        # (heads | 1, q_time, k_time) or (batch, heads, q_time, k_time)
        bias = positions.score_bias(queries, q_pos, k_pos) if positions.has_score_bias else None
        fused = self.fused and not need_weights and not positions.has_value_bias
        # given nothing but causality, SDPA masks the future itself and never builds a (time, time) mask
        sdpa_causal = flag(fused and causal and mask is None and bias is None and q_time == k_time)
        if causal and not sdpa_causal:
            future = causal_mask(q_time, k_time, queries.device)
            mask = future if mask is None else mask & future
        if fused:
            return fused_attention(
                queries, keys, values, mask=mask, bias=bias, causal=sdpa_causal, dropout=dropout
            ), None
        keys, values = repeat_kv(keys, queries.shape[1]), repeat_kv(values, queries.shape[1])
        output, weights = scaled_dot_product_attention(queries, keys, values, mask=mask, bias=bias, dropout=dropout)
        if positions.has_value_bias:
            output = output + positions.value_bias(weights, q_pos, k_pos)
        return output, weights

    def use_flex(
        self,
        queries: Tensor,
        keys: Tensor,
        positions: AttentionPositions,
        q_pos: Tensor | range | None,
        mask: Tensor | None,
        key_padding: Tensor | None,
        dropout: float,
        need_weights: bool,
    ) -> bool:
        """Whether a score bias goes through flex_attention (`kqv.nn.flex`: on CUDA, exact); SDPA takes the rest.
        Its score_mods take the queries to be at 0..time-1, as the keys are (`AttentionPositions.score_mod`):
        queries at positions given otherwise go to today's cores."""
        exact = positions.has_score_bias and not positions.has_value_bias and (mask is None or key_padding is not None)
        if not (self.fused and exact and flex.applies(queries, keys, dropout, need_weights)):
            return False
        lowers = positions.score_mod_in_graphs or not torch.compiler.is_compiling()  # `kqv.nn.flex.fixed`
        # where q_pos None puts them; the range of the shapes made only for a range given (made in a traced model
        # for every call, it would fix the length in the graph)
        consecutive = q_pos is None or (
            isinstance(q_pos, range) and q_pos == range(keys.shape[2] - queries.shape[2], keys.shape[2])
        )
        return lowers and consecutive

    def use_blockwise(
        self,
        positions: AttentionPositions,
        q_time: int,
        k_time: int,
        mask: Tensor | None,
        key_padding: Tensor | None,
        causal: bool,
        dropout: float,
        need_weights: bool,
        device: torch.device,
    ) -> bool:
        """Whether to take the exact O(n)-memory path (it has no attention dropout, returns no weights and takes
        padding masks only). "auto" takes it only where SDPA would otherwise build a large n x n matrix: SDPA
        streams the causal mask of a whole sequence anywhere, and a padding mask (broadcast over queries, never
        n x n) where the device's fused kernels take one (the memory-efficient kernel on CUDA)."""
        if self.blockwise == "never" or need_weights or dropout > 0 or (mask is not None and key_padding is None):
            return False
        if self.blockwise == "always":
            return True
        streams_mask = mask is None and (not causal or q_time == k_time)
        streams_padding = key_padding is not None and not causal and kernels(device).sdpa_streams_padding
        sdpa_streams = (streams_mask or streams_padding) and not (positions.has_value_bias or positions.has_score_bias)
        return not sdpa_streams and q_time * k_time >= BLOCKWISE_MIN_PAIRS


class PaddingOnlyCore(AttentionCore):
    """Base of cores that never score every (query, key) pair (Linformer, BigBird): they take padding masks only,
    return no weights and have no attention dropout. Subclasses implement
    `forward(queries, keys, values, *, causal, key_padding)`, key_padding (batch, k_time) bool, True = token."""

    name = "this attention kind"

    def attend(
        self, queries: Tensor, keys: Tensor, values: Tensor, call: AttentionCall
    ) -> tuple[Tensor, Tensor | None]:
        mask, causal, dropout, need_weights = call.mask, call.causal, call.dropout, call.need_weights
        if need_weights:
            raise ConfigError(
                f"attention weights exist only for attention='full': {self.name} never scores every (query, key) pair"
            )
        key_padding = padding_of(mask, queries.shape[0])
        if mask is not None and key_padding is None:
            raise DataError(
                f"{self.name} takes padding masks, (batch, 1, 1, k_time), only; got a mask of shape {tuple(mask.shape)}"
            )
        mask_mod = (
            self.flex_mask(keys.shape[2], causal, queries.device)
            if flex.applies(queries, keys, dropout, need_weights)
            else None
        )
        if mask_mod is not None:  # on CUDA: the same mask through flex_attention, wholly masked blocks skipped
            mask_mod = flex.combined(mask_mod, causal, key_padding)
            key = (self.flex_key(), causal)  # the mask depends on the core's options and the shape alone
            return flex.attend(
                queries, keys, values, mask_mod=mask_mod, padding=None if key_padding is None else mask, mask_key=key
            ), None
        return self(queries, keys, values, causal=causal, key_padding=key_padding), None

    def flex_mask(self, time: int, causal: bool, device: torch.device) -> flex.MaskMod | None:
        """The core as a mask over full attention of `time` positions (before the causal mask and padding) on
        `device`, for `kqv.nn.flex`; None where it is not one (it compresses or projects the keys)."""
        return None

    def flex_key(self) -> tuple:
        """What `flex_mask` depends on besides the shape: the core's kind and its options (`vars`)."""
        return (type(self).__name__, *sorted((k, v) for k, v in vars(self).items() if isinstance(v, (int, float))))
