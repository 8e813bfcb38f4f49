"""The bookkeeping of blockwise attention: blocks of queries and keys, which key blocks each query block visits
(the plan, with its causal and padding masks), runs of plain blocks for torch's fused kernel, reused buffers, the
Cauchy-Schwarz bound that skips negligible blocks, and a `Trace` of what was done (for tests)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from ..positions import position_tensor

EXP_FLOOR = {torch.float32: -50.0, torch.bfloat16: -50.0, torch.float64: -500.0}  # see the package docstring


@dataclass
class Trace:
    """What the blocks did, for tests: that no (n, n) matrix is ever made, and that negligible blocks are skipped.
    Pass one to `blockwise_attention(trace=...)` to fill it."""

    largest_score_block: int = 0  # elements of one (batch * heads, q_block, k_block) buffer
    skipped_blocks: int = 0  # (query block, key block) pairs proven negligible and not computed


@dataclass
class Block:
    """A contiguous range [start, end) of queries or keys, with their positions and the extremes of those."""

    index: int
    start: int
    end: int
    pos: Tensor
    low: int
    high: int


def blocks_of(pos: Tensor | range, size: int, device: torch.device) -> list[Block]:
    """Blocks of `size` consecutive queries or keys. Their extremes steer the plan in Python: a `range` (consecutive
    positions, as layers pass them) gives them without reading the device, so a training step never waits here;
    a tensor of positions is read once."""
    values = pos if isinstance(pos, range) else pos.tolist()
    pos = position_tensor(pos, device)
    return [
        Block(i, s, min(s + size, len(values)), pos[s : s + size], min(values[s : s + size]), max(values[s : s + size]))
        for i, s in enumerate(range(0, len(values), size))
    ]


@dataclass
class Plain:
    """A block whose bias is at most a row per query: plain attention, shifted. `row` (batch_heads, q_block, 1) is
    added to every score; `value` (v_dim,) to every value (Shaw's value side); `bucket` is the column of the
    scheme's value state that collects the block's total weight."""

    row: Tensor | None = None
    value: Tensor | None = None
    bucket: int | None = None


class Bias(Protocol):
    """What the plan asks of a position scheme's bias on one block (`kqv.nn.blockwise.bias.BlockBias` and its
    kinds implement it): declared here, below them, so that the bookkeeping needs no import of the biases."""

    def add_scores(self, scores: Tensor, state: object, qb: Block, kb: Block) -> Tensor | None: ...

    def bias_bound(self, qb: Block, kb: Block) -> Tensor | None: ...

    def plain(self, state: object, qb: Block, kb: Block) -> Plain | None: ...


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

    def __init__(
        self,
        q_pos: Tensor | range,
        k_pos: Tensor | range,
        q_block: int,
        k_block: int,
        causal: bool,
        key_padding: Tensor | None,
        heads: int,
        dtype: torch.dtype,
        device: torch.device,
        fused: bool,
        trace: Trace,
        skips: bool = True,
    ):
        self.causal, self.fused, self.trace = causal, fused, trace
        self.skips = skips  # whether negligible blocks may be skipped: a proof read on the host (`Norms`)
        self.offset = len(k_pos) - len(q_pos)  # query i is at index i + offset among the keys
        self.q_blocks, self.k_blocks = blocks_of(q_pos, q_block, device), blocks_of(k_pos, k_block, device)
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
            blocks = [
                (kb, first_query - kb.start if kb.end - 1 > first_query else None)
                for kb in self.k_blocks
                if kb.start <= qb.end - 1 + self.offset
            ]
        else:
            blocks = [(kb, None) for kb in self.k_blocks]
        middle = first_query + (qb.end - qb.start) / 2
        return sorted(blocks, key=lambda pair: abs((pair[0].start + pair[0].end) / 2 - middle))

    def runs(self, qb: Block, bias: Bias, state: object) -> tuple[list[Run], list[tuple[Block, int | None]]]:
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
                future, float("-inf")
            )
        return self._causal_bias[key]


class Workspace:
    """Two score-sized buffers reused by every block: scores (then weights) and their gradient."""

    def __init__(self, like: Tensor, size: int, trace: Trace):
        self.buffers = [like.new_empty(size), like.new_empty(size)]
        trace.largest_score_block = max(trace.largest_score_block, size)

    def get(self, which: int, *shape: int) -> Tensor:
        return self.buffers[which][: math.prod(shape)].view(shape)


def block_weights(scores: Tensor, shift: Tensor, plan: Plan, kb: Block, diagonal: int | None) -> Tensor:
    """exp(scores - shift) in place, with masked weights exactly 0."""
    weights = scores.sub_(shift)
    if scores.dtype in EXP_FLOOR:
        weights.clamp_(min=EXP_FLOOR[scores.dtype])
    weights.exp_()
    if diagonal is not None:
        weights.tril_(diagonal)
    if plan.keep is not None:
        weights.mul_(plan.keep[:, :, kb.start : kb.end])
    return weights


def block_scores(
    queries: Tensor,
    keys: Tensor,
    out: Tensor,
    bias: Bias,
    state: object,
    plan: Plan,
    qb: Block,
    kb: Block,
    diagonal: int | None,
) -> Tensor | None:
    """Fill `out` (batch_heads, q_block, k_block) with the scores of one block, masked with -inf; `queries` are
    already scaled by 1 / sqrt(head_dim). Returns the position scheme's row term, which is not added."""
    torch.bmm(queries, keys.transpose(1, 2), out=out)
    row = bias.add_scores(out, state, qb, kb)
    if plan.padding is not None:
        out += plan.padding[:, :, kb.start : kb.end]
    if diagonal is not None:
        out += plan.causal_bias(out.shape[1], out.shape[2], diagonal, out)
    return row


def finite(x: Tensor) -> Tensor:
    """-inf (a query that has seen no visible key yet) -> 0, so exp(score - max) is exp(-inf) = 0, never nan."""
    return x.masked_fill(x == float("-inf"), 0.0)


class Norms:
    """|q_i| / sqrt(d) per query and max |k_j| per key block: by Cauchy-Schwarz, q_i . k_j / sqrt(d) <= their
    product. With a bias bound this proves a whole block's weights negligible without computing its scores."""

    def __init__(self, queries: Tensor, keys: Tensor, plan: Plan, scale: float):
        self.trace, self.skips = plan.trace, plan.skips
        if not self.skips:
            return
        self.queries = queries.norm(dim=-1, keepdim=True) * scale  # (batch_heads, q_time, 1)
        self.keys = torch.stack([keys[:, kb.start : kb.end].norm(dim=-1).amax(-1) for kb in plan.k_blocks], -1)

    def negligible(self, bias: Bias, qb: Block, kb: Block, reference: Tensor) -> bool:
        """True when every weight of the block is below e^EXP_FLOOR times `reference` (the running maximum in the
        forward pass, the log-sum-exp in backward): skipping it changes the result less than the clamp does.
        The proof is read on the host, once per block: free on the CPU, whose ops have all finished by then, but a
        wait for a GPU; so a training step on a device whose host reads are not free (`Kernels.free_host_reads`)
        never asks, and computes every block instead (`Plan.skips`)."""
        if not self.skips:
            return False
        bound = bias.bias_bound(qb, kb)
        if bound is None or reference.dtype not in EXP_FLOOR:
            return False
        largest = self.queries[:, qb.start : qb.end] * self.keys[:, kb.index, None, None] + bound
        skip = bool((largest - reference).amax() < EXP_FLOOR[reference.dtype])
        self.trace.skipped_blocks += skip
        return skip
