"""Exact attention in O(n) memory, for every kqv position scheme: the lecture's "what if n >= 50,000?".

Plain attention builds the (n, n) score matrix; at n = 65,536 that is 16 GiB in fp32 for one head. torch's fused
`F.scaled_dot_product_attention` avoids it for plain and causal attention, but not once an explicit bias is needed
(Shaw relative positions, ALiBi, a padding mask): the bias itself is n x n.

`blockwise_attention` computes the same numbers one block of queries against one block of keys at a time, with
the online softmax of Milakov & Gimelshein 2018 (a running maximum and running sum per query; what was
accumulated is rescaled whenever the maximum grows; Rabe & Staats 2021). The backward pass is FlashAttention's
(Dao et al. 2022): it keeps only queries, keys, values, the output and each query's log-sum-exp, and recomputes
every block's weights from them. Memory is O(n * head_dim) plus a few (q_block, k_block) buffers, whatever the
position scheme, because every in-attention scheme is a function of (query positions, key positions) and so can
be evaluated one block at a time.

A position scheme adds to a block of scores in one of three shapes, each as cheap as it can be:

* a column per key, added to the block (ALiBi on a block wholly left or right of its queries, where
  -slope * |i - j| = slope * j - slope * i);
* a row per query, folded into the softmax's subtraction of the maximum, so it costs nothing per score (the
  ALiBi row term above; Shaw's embeddings on a block farther than the clipping distance, where every distance
  clips alike);
* a full block, only where nothing cheaper is exact: blocks that straddle the diagonal for ALiBi and Shaw, and
  every block for a scheme this module doesn't know (any `AttentionPositions` subclass works, through autograd).

Plain blocks, whose bias is at most a row per query (no positions; Shaw beyond the clipping distance), go a
contiguous run at a time to torch's own fused CPU kernel (the private op behind `F.scaled_dot_product_attention`,
`aten::_scaled_dot_product_flash_attention_for_cpu`), which also returns its log-sum-exp, so its result merges into
the online softmax like one more block; its backward is given the whole row's output and log-sum-exp. Without
that op (another torch), with a padding mask or another dtype, every block takes the plain-PyTorch path.

ALiBi also lets whole blocks be skipped. Far enough from its queries, a block's largest possible score
(|q| |k| / sqrt(d), by Cauchy-Schwarz) minus slope * distance is more than 50 below each query's running maximum,
so all its weights are below e^-50 times the largest weight, the same threshold as the clamp described below;
it is skipped in forward and backward alike. Key blocks are visited nearest first so the maximum is known early.

Queries and keys are taken as `MultiHeadAttention` has them, already rotated by `positions.rotate`: RoPE changes
the inputs only and needs nothing here.

Three CPU facts shape the code. A fresh block-sized tensor per block costs more than filling a reused one, so
blocks live in a `Workspace`. `exp` of an fp32 number below log(smallest normal) ~ -87.3 (-inf included) takes a
slow path, 50x slower. And arithmetic on subnormal numbers (below 1.2e-38), which the matmuls meet when tiny
weights multiply values, is about as slow again: ALiBi at n = 65,536 gives most weights e^-100 or less and ran 20x
slower for it. So the shifted scores are clamped at -50 before `exp`: a weight below e^-50 = 2e-22 (relative to
the row's largest, 1) becomes 2e-22, which changes no fp32 result (n * 2e-22 is far below fp32's 6e-8 resolution
for any n that fits in memory), and masked weights are then set to exactly 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .positions import ALiBiPositions, AttentionPositions, RelativePositions

SCORE_BLOCK_ELEMENTS = 512 * 512  # default size of one block of scores, all batch rows and heads together
try:  # torch's fused CPU kernel, forward and backward, returning the log-sum-exp that lets its result be merged
    FUSED = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
             torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward)
except (AttributeError, RuntimeError):  # an older torch: every block goes through the plain-PyTorch path
    FUSED = None
USE_FUSED = True  # tests switch it off to check that both paths agree
EXP_FLOOR = {torch.float32: -50.0, torch.bfloat16: -50.0, torch.float64: -500.0}  # see the module docstring


@dataclass
class Trace:
    """What the blocks did, for tests: that no (n, n) matrix is ever made, and that negligible blocks are skipped."""

    largest_score_block: int = 0  # elements of one (batch * heads, q_block, k_block) buffer
    skipped_blocks: int = 0  # (query block, key block) pairs proven negligible and not computed


trace = Trace()


def blockwise_attention(queries: Tensor, keys: Tensor, values: Tensor, *, positions: AttentionPositions | None = None,
                        q_pos: Tensor | None = None, k_pos: Tensor | None = None, causal: bool = False,
                        key_padding: Tensor | None = None,
                        block_size: int | tuple[int, int] | None = None) -> Tensor:
    """softmax(q k^T / sqrt(d_head) + position bias, masked) (v + value-side positions), exactly, in O(n) memory.

    queries (batch, heads, q_time, head_dim); keys, values (batch, heads, k_time, head_dim); queries and keys
    already rotated if the scheme rotates. `q_pos` (q_time,) and `k_pos` (k_time,) are the positions the scheme
    sees (default: the queries are the last q_time of 0..k_time-1, as with a cache). `causal` lets query i see
    key j when j <= i + (k_time - q_time), as `kqv.attention.causal_mask`. `key_padding` (batch, k_time) bool,
    True = real token. `block_size` is (q_block, k_block), or one int for both; the default keeps a block of
    scores near 256K numbers. A query that may see no key outputs zeros, as the reference does. No attention
    dropout. Returns (batch, heads, q_time, head_dim).
    """
    batch, heads, q_time, head_dim = queries.shape
    k_time = keys.shape[2]
    if keys.shape != (batch, heads, k_time, head_dim) or values.shape[:3] != keys.shape[:3]:
        raise ValueError(f"queries {tuple(queries.shape)}, keys {tuple(keys.shape)} and values "
                         f"{tuple(values.shape)} must be (batch, heads, time, head_dim) with matching sizes")
    if key_padding is not None and tuple(key_padding.shape) != (batch, k_time):
        raise ValueError(f"key_padding must have shape (batch, k_time) = {(batch, k_time)}, "
                         f"got {tuple(key_padding.shape)}")
    if q_time == 0 or k_time == 0:
        return queries.new_zeros(batch, heads, q_time, values.shape[-1])
    device = queries.device
    k_pos = torch.arange(k_time, device=device) if k_pos is None else k_pos
    q_pos = torch.arange(k_time - q_time, k_time, device=device) if q_pos is None else q_pos
    bias = block_bias(positions, batch, heads, queries.dtype)
    fused = FUSED is not None and USE_FUSED and key_padding is None and queries.device.type == "cpu" \
        and queries.dtype in (torch.float32, torch.float64) and type(bias).plain is not BlockBias.plain
    q_block, k_block = block_sizes(block_size, batch * heads, q_time, k_time, fused)
    plan = Plan(q_pos, k_pos, q_block, k_block, causal, key_padding, heads, queries.dtype, fused)
    flat = [x.reshape(batch * heads, x.shape[2], x.shape[3]) for x in (queries, keys, values)]
    output = _BlockwiseAttention.apply(*flat, plan, bias, *bias.parameters)  # (batch * heads, q_time, v_dim)
    return output.view(batch, heads, q_time, values.shape[-1])


def block_sizes(block_size: int | tuple[int, int] | None, batch_heads: int, q_time: int, k_time: int,
                fused: bool = False) -> tuple[int, int]:
    """(q_block, k_block): as asked, or by default 512 keys (256 when plain blocks go to the fused kernel) and as
    many queries as fit SCORE_BLOCK_ELEMENTS (at least 64, so many heads still make matmuls of a useful size).

    A 512 x 512 fp32 block (1 MiB) stays in a core's L2 cache. Measured on a 2-core Xeon, one thread, causal,
    forward + backward CPU time: at n = 16,384, 512 x 512 beat 1024 x 1024 by 20% and 2048 x 2048 by more, and
    256 x 512 lost to per-block Python overhead. With the fused kernel doing the plain blocks, what remains is the
    diagonal, and longer query blocks with shorter key blocks did better at n = 32,768: 1024 x 256 beat 512 x 512
    by about 10%."""
    if block_size is None:
        k_block = min(k_time, 256 if fused else 512)
        q_block = max(64, SCORE_BLOCK_ELEMENTS // (batch_heads * k_block))
    elif isinstance(block_size, int):
        q_block = k_block = block_size
    else:
        q_block, k_block = block_size
    if q_block <= 0 or k_block <= 0:
        raise ValueError(f"block sizes must be positive, got {(q_block, k_block)}")
    return min(q_block, q_time), min(k_block, k_time)


# ---------------------------------------------------------------------------------------------------------------
# Blocks, masks and reusable buffers


@dataclass
class Block:
    """A contiguous range [start, end) of queries or keys, with their positions and the extremes of those."""

    index: int
    start: int
    end: int
    pos: Tensor
    low: int
    high: int


def _blocks(pos: Tensor, size: int) -> list[Block]:
    values = pos.tolist()
    return [Block(i, s, min(s + size, len(values)), pos[s:s + size], min(values[s:s + size]),
                  max(values[s:s + size])) for i, s in enumerate(range(0, len(values), size))]


@dataclass
class Plain:
    """A block whose bias is at most a row per query: plain attention, shifted. `row` (batch_heads, q_block, 1) is
    added to every score; `value` (v_dim,) to every value (Shaw's value side); `bucket` is the column of the
    scheme's value state that collects the block's total weight."""

    row: Tensor | None = None
    value: Tensor | None = None
    bucket: int | None = None


@dataclass
class Run:
    """Keys [start, end) for one call of the fused kernel, with the block that stands for them all."""

    start: int
    end: int
    block: Block
    plain: Plain
    output: Tensor | None = None  # the run's own softmax-weighted values, (batch_heads, q_block, v_dim)
    log_sum_exp: Tensor | None = None  # of its scores, row term included, (batch_heads, q_block, 1)


class Plan:
    """Which key blocks each query block visits, and the masks: causal (on the blocks that cross the diagonal)
    and padding (a column of -inf before the softmax, and of 0 after it, so masked weights are exactly 0)."""

    def __init__(self, q_pos: Tensor, k_pos: Tensor, q_block: int, k_block: int, causal: bool,
                 key_padding: Tensor | None, heads: int, dtype: torch.dtype, fused: bool):
        self.causal, self.fused = causal, fused
        self.offset = len(k_pos) - len(q_pos)  # query i is at index i + offset among the keys
        self.q_blocks, self.k_blocks = _blocks(q_pos, q_block), _blocks(k_pos, k_block)
        self.padding = self.keep = None
        if key_padding is not None:  # (batch, k_time) -> (batch * heads, 1, k_time)
            keep = key_padding.bool()[:, None, None, :].expand(-1, heads, -1, -1).reshape(-1, 1, key_padding.shape[1])
            self.keep = keep.to(dtype)
            self.padding = torch.zeros_like(self.keep).masked_fill_(~keep, float("-inf"))
        self._causal_bias: dict[tuple[int, int, int], Tensor] = {}

    def key_blocks(self, qb: Block) -> list[tuple[Block, int | None]]:
        """(key block, diagonal) for every key block some query of `qb` may see, nearest first (so the running
        maximum is large early). `diagonal` is None when the whole block is visible, else the causal mask is
        keys c <= queries r + diagonal within the block."""
        first_query = qb.start + self.offset
        if self.causal:
            blocks = [(kb, first_query - kb.start if kb.end - 1 > first_query else None)
                      for kb in self.k_blocks if kb.start <= qb.end - 1 + self.offset]
        else:
            blocks = [(kb, None) for kb in self.k_blocks]
        middle = first_query + (qb.end - qb.start) / 2
        return sorted(blocks, key=lambda pair: abs((pair[0].start + pair[0].end) / 2 - middle))

    def runs(self, qb: Block, bias: BlockBias, state: object) -> tuple[list[Run], list[tuple[Block, int | None]]]:
        """Split the key blocks `qb` visits into runs for the fused kernel (consecutive, wholly visible blocks on
        which the bias is at most the same row term) and the rest, for the blockwise path, nearest first."""
        if not self.fused:
            return [], self.key_blocks(qb)
        runs: list[Run] = []
        rest = []
        for kb, diagonal in sorted(self.key_blocks(qb), key=lambda pair: pair[0].start):
            plain = bias.plain(state, qb, kb) if diagonal is None else None
            if plain is None:
                rest.append((kb, diagonal))
            elif runs and runs[-1].end == kb.start and runs[-1].plain.bucket == plain.bucket:
                runs[-1].end = kb.end
            else:
                runs.append(Run(kb.start, kb.end, kb, plain))
        middle = qb.start + self.offset + (qb.end - qb.start) / 2
        return runs, sorted(rest, key=lambda pair: abs((pair[0].start + pair[0].end) / 2 - middle))

    def causal_bias(self, rows: int, cols: int, diagonal: int, like: Tensor) -> Tensor:
        """(rows, cols) of 0 where key c <= query r + diagonal, else -inf; one per shape, reused."""
        key = (rows, cols, diagonal)
        if key not in self._causal_bias:
            future = torch.ones(rows, cols, dtype=torch.bool, device=like.device).triu_(diagonal + 1)
            self._causal_bias[key] = torch.zeros(rows, cols, dtype=like.dtype, device=like.device).masked_fill_(
                future, float("-inf"))
        return self._causal_bias[key]


class Workspace:
    """Two score-sized buffers reused by every block: scores (then weights) and their gradient."""

    def __init__(self, like: Tensor, size: int):
        self.buffers = [like.new_empty(size), like.new_empty(size)]
        trace.largest_score_block = max(trace.largest_score_block, size)

    def get(self, which: int, *shape: int) -> Tensor:
        return self.buffers[which][:math.prod(shape)].view(shape)


def _weights(scores: Tensor, shift: Tensor, plan: Plan, kb: Block, diagonal: int | None) -> Tensor:
    """exp(scores - shift) in place, with masked weights exactly 0."""
    weights = scores.sub_(shift)
    if scores.dtype in EXP_FLOOR:
        weights.clamp_(min=EXP_FLOOR[scores.dtype])
    weights.exp_()
    if diagonal is not None:
        weights.tril_(diagonal)
    if plan.keep is not None:
        weights.mul_(plan.keep[:, :, kb.start:kb.end])
    return weights


def _scores(queries: Tensor, keys: Tensor, out: Tensor, bias: BlockBias, state: object, plan: Plan, qb: Block,
            kb: Block, diagonal: int | None) -> Tensor | None:
    """Fill `out` (batch_heads, q_block, k_block) with the scores of one block, masked with -inf; `queries` are
    already scaled by 1 / sqrt(head_dim). Returns the position scheme's row term, which is not added."""
    torch.bmm(queries, keys.transpose(1, 2), out=out)
    row = bias.add_scores(out, state, qb, kb)
    if plan.padding is not None:
        out += plan.padding[:, :, kb.start:kb.end]
    if diagonal is not None:
        out += plan.causal_bias(out.shape[1], out.shape[2], diagonal, out)
    return row


def _finite(x: Tensor) -> Tensor:
    """-inf (a query that has seen no visible key yet) -> 0, so exp(score - max) is exp(-inf) = 0, never nan."""
    return x.masked_fill(x == float("-inf"), 0.0)


class Norms:
    """|q_i| / sqrt(d) per query and max |k_j| per key block: by Cauchy-Schwarz, q_i . k_j / sqrt(d) <= their
    product. With a bias bound this proves a whole block's weights negligible without computing its scores."""

    def __init__(self, queries: Tensor, keys: Tensor, plan: Plan, scale: float):
        self.queries = queries.norm(dim=-1, keepdim=True) * scale  # (batch_heads, q_time, 1)
        self.keys = torch.stack([keys[:, kb.start:kb.end].norm(dim=-1).amax(-1) for kb in plan.k_blocks], -1)

    def negligible(self, bias: BlockBias, qb: Block, kb: Block, reference: Tensor) -> bool:
        """True when every weight of the block is below e^EXP_FLOOR times `reference` (the running maximum in the
        forward pass, the log-sum-exp in backward): skipping it changes the result less than the clamp does."""
        bound = bias.bias_bound(qb, kb)
        if bound is None or reference.dtype not in EXP_FLOOR:
            return False
        largest = self.queries[:, qb.start:qb.end] * self.keys[:, kb.index, None, None] + bound
        skip = bool((largest - reference).amax() < EXP_FLOOR[reference.dtype])
        trace.skipped_blocks += skip
        return skip


# ---------------------------------------------------------------------------------------------------------------
# How a position scheme enters one block


class BlockBias:
    """Any `AttentionPositions`, its `score_bias` and `value_bias` evaluated one block at a time.

    Subclasses do the same faster for schemes they know. The generic route gets the gradients of the queries and
    of the scheme's parameters from autograd, one block at a time. `value_bias` must be linear in the weights (a
    weighted sum, as Shaw's is), so that it can be accumulated and rescaled like the output.
    """

    def __init__(self, positions: AttentionPositions, batch: int, heads: int):
        self.positions, self.batch, self.heads = positions, batch, heads
        self.parameters = tuple(p for p in positions.parameters() if p.requires_grad)
        self.has_value_bias = positions.has_value_bias

    def split(self, x: Tensor) -> Tensor:
        """(batch * heads, ...) -> (batch, heads, ...), the shape `AttentionPositions` works in."""
        return x.view(self.batch, self.heads, *x.shape[1:])

    # forward, and the recomputation in backward

    def query_state(self, queries: Tensor, qb: Block) -> object:
        """What the scheme computes once per query block, from the unscaled queries (batch_heads, q_block, dim)."""
        return queries

    def add_scores(self, scores: Tensor, state: object, qb: Block, kb: Block) -> Tensor | None:
        """Add the bias to one block of scores in place; may instead return a (batch_heads, q_block, 1) row term."""
        bias = self.positions.score_bias(self.split(state), qb.pos, kb.pos)
        if bias is not None:
            self.split(scores).add_(bias)
        return None

    def bias_bound(self, qb: Block, kb: Block) -> Tensor | None:
        """An upper bound of the bias on this block for each query, (batch_heads | 1, q_block, 1), if the scheme
        has one that can make a whole block negligible; None otherwise."""
        return None

    def plain(self, state: object, qb: Block, kb: Block) -> Plain | None:
        """How the block is plain attention (see `Plain`), or None if its bias is more than a row."""
        return None

    def row_grad(self, grad_state: object, grad_row: Tensor, plain: Plain) -> None:
        """Add d loss / d (the plain block's row term), (batch_heads, q_block, 1)."""

    def new_value_state(self, queries: Tensor, v_dim: int) -> Tensor | None:
        return queries.new_zeros(*queries.shape[:2], v_dim) if self.has_value_bias else None

    def accumulate_values(self, value_state: Tensor, weights: Tensor, row_sum: Tensor, qb: Block, kb: Block) -> None:
        """value_state += the value-side term of one block of unnormalised weights (already rescaled)."""
        value_state += self.positions.value_bias(self.split(weights), qb.pos, kb.pos).flatten(0, 1)

    def value_output(self, value_state: Tensor, norm: Tensor) -> tuple[Tensor, Tensor | None]:
        """(the value-side output before dividing by the softmax sum, what backward needs of it)."""
        return value_state, None

    # backward

    def value_grad_state(self, saved: Tensor | None, grad_out: Tensor, qb: Block) -> object:
        return grad_out

    def add_value_grad(self, grad_weights: Tensor, state: object, weights: Tensor, qb: Block, kb: Block,
                       grads: list[Tensor]) -> Tensor | None:
        """Add d loss / d weights through the value side to `grad_weights` (or return it as a row term) and the
        gradients of the scheme's parameters to `grads`; `weights` are normalised."""
        weights = weights.detach().requires_grad_()
        with torch.enable_grad():
            extra = self.positions.value_bias(self.split(weights), qb.pos, kb.pos)
        found = torch.autograd.grad(extra, (weights, *self.parameters), self.split(state), allow_unused=True)
        grad_weights += found[0]
        _add_all(grads, found[1:])
        return None

    def new_score_grad_state(self, queries: Tensor) -> object:
        return None

    def score_grad(self, state: object, grad_state: object, grad_scores: Tensor, qb: Block, kb: Block,
                   grad_queries: Tensor, grads: list[Tensor]) -> None:
        """Given d loss / d scores of one block, add the gradients of the queries and of the parameters."""
        queries = state.detach().requires_grad_()
        with torch.enable_grad():
            bias = self.positions.score_bias(self.split(queries), qb.pos, kb.pos)
        if bias is None or not bias.requires_grad:
            return
        found = torch.autograd.grad(bias, (queries, *self.parameters), self.split(grad_scores).sum_to_size(bias.shape),
                                    allow_unused=True)
        if found[0] is not None:
            grad_queries += found[0]
        _add_all(grads, found[1:])

    def finish_query_block(self, grad_state: object, queries: Tensor, grad_queries: Tensor,
                           grads: list[Tensor]) -> None:
        """Turn what score_grad gathered over a query block's key blocks into query and parameter gradients."""

    def finish(self, saved: Tensor | None, grad_out: Tensor, grads: list[Tensor]) -> None:
        """Parameter gradients that need every query at once."""


class NoBias(BlockBias):
    """Nothing to add: no positions, absolute positions, or RoPE (which only rotates)."""

    def __init__(self) -> None:
        self.parameters, self.has_value_bias = (), False

    def add_scores(self, scores: Tensor, state: object, qb: Block, kb: Block) -> Tensor | None:
        return None

    def plain(self, state: object, qb: Block, kb: Block) -> Plain | None:
        return Plain()

    def score_grad(self, *args: object) -> None:
        pass


class ALiBiBias(NoBias):
    plain = BlockBias.plain  # a column term: not plain

    """-slope_h * |i - j| (Press et al. 2022), no parameters.

    Left of every query (j <= i) it is slope * j - slope * i: a column plus a row; right of every query the same
    with the signs flipped. Only blocks straddling i = j need |i - j| in full. Both terms are measured from the
    key block's start, so they stay small where the weights are large and fp32 keeps them exact.
    """

    def __init__(self, positions: ALiBiPositions, batch: int, heads: int, dtype: torch.dtype):
        super().__init__()
        self.slopes = positions.slopes.to(dtype).reshape(1, heads).expand(batch, heads).reshape(-1, 1, 1)

    def add_scores(self, scores: Tensor, state: object, qb: Block, kb: Block) -> Tensor | None:
        if kb.high <= qb.low or kb.low >= qb.high:
            sign = 1.0 if kb.high <= qb.low else -1.0
            scores += (kb.pos - kb.start).to(scores.dtype)[None, None, :] * (sign * self.slopes)  # column
            return (qb.pos - kb.start).to(scores.dtype)[None, :, None] * (-sign * self.slopes)  # row
        distance = (kb.pos.to(scores.dtype)[None, :] - qb.pos.to(scores.dtype)[:, None]).abs_()  # (q_block, k_block)
        scores.addcmul_(self.slopes, distance, value=-1.0)
        return None

    def bias_bound(self, qb: Block, kb: Block) -> Tensor | None:
        """-slope * (distance to the block's nearest key), for blocks wholly on one side of every query."""
        if kb.high <= qb.low:
            return (qb.pos - kb.high).to(self.slopes.dtype)[None, :, None] * -self.slopes
        if kb.low >= qb.high:
            return (kb.low - qb.pos).to(self.slopes.dtype)[None, :, None] * -self.slopes
        return None


class RelativeBias(BlockBias):
    """Shaw et al. 2018 through the 2k+1 clipped-distance embeddings a^K, a^V, never an (n, n, d) tensor.

    Key side: q . a^K for all 2k+1 distances once per query block, gathered into the blocks that straddle the
    diagonal; a block farther away than k clips every distance alike, so there the bias is one number per query,
    a row term. Value side: the weight each query gives to each clipped distance, (q_block, 2k+1), accumulated and
    rescaled like the output (a far block adds its row sums to the end bucket). Gradients go back the same ways.
    """

    def __init__(self, positions: RelativePositions, batch: int, heads: int):
        super().__init__(positions, batch, heads)
        self.k, self.scale = positions.max_distance, positions.scale
        self.key_table, self.value_table = positions.keys, positions.values
        self.parameters = (self.key_table,) if self.value_table is None else (self.key_table, self.value_table)
        self._index: tuple[tuple[int, int], Tensor] | None = None

    def side(self, qb: Block, kb: Block) -> int | None:
        """0 or 2k when every distance j - i in the block clips to -k or +k; None for a block near the diagonal."""
        if kb.high - qb.low <= -self.k:
            return 0
        if kb.low - qb.high >= self.k:
            return 2 * self.k
        return None

    def index(self, qb: Block, kb: Block, batch_heads: int) -> Tensor:
        """(batch_heads, q_block, k_block) clip(j - i, -k, k) + k, made once per block and pass, in one buffer."""
        if self._index is None or self._index[0] != (qb.start, kb.start):
            size = len(qb.pos) * len(kb.pos)
            buffer = self._index[1] if self._index is not None and self._index[1].numel() >= size else None
            buffer = kb.pos.new_empty(size) if buffer is None else buffer
            index = buffer[:size].view(len(qb.pos), len(kb.pos))
            torch.sub(kb.pos[None, :], qb.pos[:, None], out=index).clamp_(-self.k, self.k).add_(self.k)
            self._index = ((qb.start, kb.start), buffer)
        return self._index[1][:len(qb.pos) * len(kb.pos)].view(1, len(qb.pos), len(kb.pos)).expand(batch_heads, -1, -1)

    def query_state(self, queries: Tensor, qb: Block) -> Tensor:
        self._index = None if self._index is None else ((-1, -1), self._index[1])
        return queries @ self.key_table.T * self.scale  # (batch_heads, q_block, 2k+1)

    def add_scores(self, scores: Tensor, per_distance: Tensor, qb: Block, kb: Block) -> Tensor | None:
        side = self.side(qb, kb)
        if side is not None:
            return per_distance[..., side:side + 1]
        scores += per_distance.gather(-1, self.index(qb, kb, scores.shape[0]))
        return None

    def plain(self, per_distance: Tensor, qb: Block, kb: Block) -> Plain | None:
        side = self.side(qb, kb)
        if side is None:
            return None
        value = None if self.value_table is None else self.value_table[side]
        return Plain(per_distance[..., side:side + 1], value, side)

    def row_grad(self, grad_per_distance: Tensor, grad_row: Tensor, plain: Plain) -> None:
        grad_per_distance[..., plain.bucket] += grad_row[..., 0]

    def new_value_state(self, queries: Tensor, v_dim: int) -> Tensor | None:
        if self.value_table is None:
            return None
        return queries.new_zeros(*queries.shape[:2], 2 * self.k + 1)  # weight given to each clipped distance

    def accumulate_values(self, per_distance: Tensor, weights: Tensor, row_sum: Tensor, qb: Block, kb: Block) -> None:
        side = self.side(qb, kb)
        if side is not None:
            per_distance[..., side:side + 1] += row_sum
        else:
            per_distance.scatter_add_(-1, self.index(qb, kb, weights.shape[0]), weights)

    def value_output(self, per_distance: Tensor, norm: Tensor) -> tuple[Tensor, Tensor]:
        return per_distance @ self.value_table, per_distance / norm  # keep the normalised weights per distance

    def value_grad_state(self, saved: Tensor | None, grad_out: Tensor, qb: Block) -> Tensor:
        return grad_out @ self.value_table.T  # (batch_heads, q_block, 2k+1): dO . a^V for every distance

    def add_value_grad(self, grad_weights: Tensor, per_distance: Tensor, weights: Tensor, qb: Block, kb: Block,
                       grads: list[Tensor]) -> Tensor | None:
        side = self.side(qb, kb)
        if side is not None:
            return per_distance[..., side:side + 1]
        grad_weights += per_distance.gather(-1, self.index(qb, kb, weights.shape[0]))
        return None

    def new_score_grad_state(self, queries: Tensor) -> Tensor:
        return queries.new_zeros(*queries.shape[:2], 2 * self.k + 1)

    def score_grad(self, state: Tensor, grad_per_distance: Tensor, grad_scores: Tensor, qb: Block, kb: Block,
                   grad_queries: Tensor, grads: list[Tensor]) -> None:
        side = self.side(qb, kb)
        if side is not None:
            self.row_grad(grad_per_distance, grad_scores.sum(-1, keepdim=True), Plain(bucket=side))
        else:
            grad_per_distance.scatter_add_(-1, self.index(qb, kb, grad_scores.shape[0]), grad_scores)

    def finish_query_block(self, grad_per_distance: Tensor, queries: Tensor, grad_queries: Tensor,
                           grads: list[Tensor]) -> None:
        grad_per_distance = grad_per_distance * self.scale
        grad_queries += grad_per_distance @ self.key_table
        grads[0] += (grad_per_distance.transpose(1, 2) @ queries).sum(0)  # d a^K (2k+1, head_dim)

    def finish(self, per_distance: Tensor | None, grad_out: Tensor, grads: list[Tensor]) -> None:
        if self.value_table is not None:
            grads[1] += (per_distance.transpose(1, 2) @ grad_out).sum(0)  # d a^V (2k+1, head_dim)


def block_bias(positions: AttentionPositions | None, batch: int, heads: int, dtype: torch.dtype) -> BlockBias:
    """The fastest exact way to evaluate `positions` one block at a time. Subclasses of the known schemes take the
    generic route, since they may change the bias."""
    if positions is None or type(positions) is AttentionPositions:
        return NoBias()
    if type(positions) is ALiBiPositions:
        return ALiBiBias(positions, batch, heads, dtype)
    if type(positions) is RelativePositions:
        return RelativeBias(positions, batch, heads)
    if type(positions).score_bias is AttentionPositions.score_bias and not positions.has_value_bias:
        return NoBias()  # e.g. RoPE
    return BlockBias(positions, batch, heads)


def _add_all(grads: list[Tensor], found: tuple[Tensor | None, ...]) -> None:
    for total, grad in zip(grads, found):
        if grad is not None:
            total += grad


# ---------------------------------------------------------------------------------------------------------------
# The blockwise computation, forward and backward


def _forward(queries: Tensor, keys: Tensor, values: Tensor, plan: Plan,
             bias: BlockBias) -> tuple[Tensor, Tensor, Tensor | None, list[list[Run]]]:
    """(output, log-sum-exp per query, what the value side saves, the fused runs of every query block)."""
    batch_heads, _, head_dim = queries.shape
    v_dim = values.shape[-1]
    scale = 1.0 / math.sqrt(head_dim)
    workspace = Workspace(queries, batch_heads * len(plan.q_blocks[0].pos) * len(plan.k_blocks[0].pos))
    output = queries.new_empty(*queries.shape[:2], v_dim)
    log_sum_exp = queries.new_empty(*queries.shape[:2], 1)
    saved, all_runs = [], []
    norms = Norms(queries, keys, plan, scale)
    for qb in plan.q_blocks:
        q = queries[:, qb.start:qb.end]  # (batch_heads, q_block, head_dim)
        q_scaled = q * scale
        state = bias.query_state(q, qb)
        running_max = q.new_full((batch_heads, q.shape[1], 1), float("-inf"))
        running_sum = q.new_zeros(batch_heads, q.shape[1], 1)
        accumulated = q.new_zeros(batch_heads, q.shape[1], v_dim)
        value_state = bias.new_value_state(q, v_dim)
        runs, blocks = plan.runs(qb, bias, state)
        for run in runs:  # fused kernel, then merged like one more block: max = its log-sum-exp, sum = 1
            output_run, lse = FUSED[0](q[None], keys[None, :, run.start:run.end], values[None, :, run.start:run.end],
                                       0.0, False, scale=scale)
            run.output, run.log_sum_exp = output_run[0], lse[0, :, :, None]
            if run.plain.row is not None:
                run.log_sum_exp = run.log_sum_exp + run.plain.row
            new_max = torch.maximum(running_max, run.log_sum_exp)
            rescale, weight = (running_max - new_max).exp(), (run.log_sum_exp - new_max).exp()
            running_sum = running_sum * rescale + weight
            accumulated = accumulated * rescale + run.output * weight
            if value_state is not None:
                value_state *= rescale
                bias.accumulate_values(value_state, None, weight, qb, run.block)
            running_max = new_max
        all_runs.append(runs)
        for kb, diagonal in blocks:
            if norms.negligible(bias, qb, kb, running_max):
                continue
            scores = workspace.get(0, batch_heads, q.shape[1], kb.end - kb.start)
            row = _scores(q_scaled, keys[:, kb.start:kb.end], scores, bias, state, plan, qb, kb, diagonal)
            block_max = scores.amax(-1, keepdim=True)  # (batch_heads, q_block, 1)
            if row is not None:
                block_max += row
            new_max = torch.maximum(running_max, block_max)
            finite_max = _finite(new_max)
            rescale = (running_max - finite_max).exp()
            weights = _weights(scores, finite_max if row is None else finite_max - row, plan, kb, diagonal)
            row_sum = weights.sum(-1, keepdim=True)
            running_sum = running_sum * rescale + row_sum
            accumulated = torch.baddbmm(accumulated * rescale, weights, values[:, kb.start:kb.end])
            if value_state is not None:
                value_state *= rescale
                bias.accumulate_values(value_state, weights, row_sum, qb, kb)
            running_max = new_max
        norm = running_sum.masked_fill(running_sum == 0, 1.0)  # a query that sees no key outputs 0
        if value_state is not None:
            extra, keep = bias.value_output(value_state, norm)
            accumulated += extra
            saved.append(keep)
        output[:, qb.start:qb.end] = accumulated / norm
        log_sum_exp[:, qb.start:qb.end] = (running_max + running_sum.log()).masked_fill(running_sum == 0, math.inf)
    return output, log_sum_exp, torch.cat(saved, 1) if saved and saved[0] is not None else None, all_runs


def _backward(grad_out: Tensor, queries: Tensor, keys: Tensor, values: Tensor, output: Tensor, log_sum_exp: Tensor,
              saved: Tensor | None, all_runs: list[list[Run]], plan: Plan,
              bias: BlockBias) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    batch_heads, _, head_dim = queries.shape
    scale = 1.0 / math.sqrt(head_dim)
    workspace = Workspace(queries, batch_heads * len(plan.q_blocks[0].pos) * len(plan.k_blocks[0].pos))
    grad_queries, grad_keys, grad_values = torch.zeros_like(queries), torch.zeros_like(keys), torch.zeros_like(values)
    grads = [torch.zeros_like(p) for p in bias.parameters]
    delta = (grad_out * output).sum(-1, keepdim=True)  # D_i = dO_i . O_i = sum_j P_ij dP_ij
    norms = Norms(queries, keys, plan, scale)
    for qb in plan.q_blocks:
        rows = slice(qb.start, qb.end)
        q, d_out, lse, d_i = queries[:, rows], grad_out[:, rows], log_sum_exp[:, rows], delta[:, rows]
        q_scaled = q * scale
        state = bias.query_state(q, qb)
        value_state = bias.value_grad_state(None if saved is None else saved[:, rows], d_out, qb) \
            if bias.has_value_bias else None
        grad_state = bias.new_score_grad_state(q)
        grad_q = torch.zeros_like(q)  # d loss / d q_scaled, through q k^T
        grad_q_bias = torch.zeros_like(q)  # d loss / d q, through the position bias and the fused runs
        runs = all_runs[qb.index]
        for run in runs:  # the fused kernel's backward, told the whole row's log-sum-exp and output
            plain, cols = run.plain, slice(run.start, run.end)
            out = output[:, rows] if plain.value is None else output[:, rows] - plain.value  # dO . out = D - dO . a
            lse_run = lse if plain.row is None else lse - plain.row
            dq, dk, dv = FUSED[1](d_out[None], q[None], keys[None, :, cols], values[None, :, cols], out[None],
                                  lse_run[None, :, :, 0], 0.0, False, scale=scale)
            grad_q_bias += dq[0]
            grad_keys[:, cols] += dk[0]
            grad_values[:, cols] += dv[0]
            if plain.row is not None:  # sum over the run of dS = W (dO . o_run + dO . a - D), W its total weight
                dot = (d_out * run.output).sum(-1, keepdim=True)
                if plain.value is not None:
                    dot += d_out @ plain.value[:, None]
                bias.row_grad(grad_state, (run.log_sum_exp - lse).exp() * (dot - d_i), plain)
        for kb, diagonal in plan.runs(qb, bias, state)[1]:
            if norms.negligible(bias, qb, kb, lse):
                continue
            cols = slice(kb.start, kb.end)
            scores = workspace.get(0, batch_heads, q.shape[1], kb.end - kb.start)
            row = _scores(q_scaled, keys[:, cols], scores, bias, state, plan, qb, kb, diagonal)
            weights = _weights(scores, lse if row is None else lse - row, plan, kb, diagonal)  # normalised
            grad_weights = torch.bmm(d_out, values[:, cols].transpose(1, 2), out=workspace.get(1, *scores.shape))
            row_term = d_i
            if value_state is not None:
                value_row = bias.add_value_grad(grad_weights, value_state, weights, qb, kb, grads)
                row_term = d_i if value_row is None else d_i - value_row
            grad_scores = grad_weights.sub_(row_term).mul_(weights)  # dS = P * (dP - D)
            grad_values[:, cols].baddbmm_(weights.transpose(1, 2), d_out)
            grad_keys[:, cols].baddbmm_(grad_scores.transpose(1, 2), q_scaled)
            grad_q.baddbmm_(grad_scores, keys[:, cols])
            bias.score_grad(state, grad_state, grad_scores, qb, kb, grad_q_bias, grads)
        bias.finish_query_block(grad_state, q, grad_q_bias, grads)
        grad_queries[:, rows] = grad_q * scale + grad_q_bias
    if bias.has_value_bias:
        bias.finish(saved, grad_out, grads)
    return grad_queries, grad_keys, grad_values, grads


class _BlockwiseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, queries: Tensor, keys: Tensor, values: Tensor, plan: Plan, bias: BlockBias,
                *parameters: Tensor) -> Tensor:
        output, log_sum_exp, saved, runs = _forward(queries, keys, values, plan, bias)
        ctx.save_for_backward(queries, keys, values, output, log_sum_exp, saved)
        ctx.plan, ctx.bias, ctx.runs = plan, bias, runs
        return output

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        queries, keys, values, output, log_sum_exp, saved = ctx.saved_tensors
        grad_queries, grad_keys, grad_values, grads = _backward(grad_out.contiguous(), queries, keys, values, output,
                                                                log_sum_exp, saved, ctx.runs, ctx.plan, ctx.bias)
        return grad_queries, grad_keys, grad_values, None, None, *grads
