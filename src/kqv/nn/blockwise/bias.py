"""How a position scheme enters one block of blockwise attention: `BlockBias` evaluates any `AttentionPositions`
one block at a time through autograd; `ALiBiBias` and `RelativeBias` do the same for ALiBi and Shaw's relative
positions in closed form, as a column, a row or a full block of bias (see the package docstring). A closed form
declares the scheme and the methods of it that it computes (`scheme`, `relies_on`); `block_bias` takes it for any
instance of the scheme that keeps those methods (`kqv.nn.capability.keeps`), and the generic route otherwise."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from ..capability import keeps
from ..positions import ALiBiPositions, AttentionPositions, RelativePositions
from .blocks import Block, Plain


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

    def add_value_grad(
        self, grad_weights: Tensor, state: object, weights: Tensor, qb: Block, kb: Block, grads: list[Tensor]
    ) -> Tensor | None:
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

    def score_grad(
        self,
        state: object,
        grad_state: object,
        grad_scores: Tensor,
        qb: Block,
        kb: Block,
        grad_queries: Tensor,
        grads: list[Tensor],
    ) -> None:
        """Given d loss / d scores of one block, add the gradients of the queries and of the parameters."""
        queries = state.detach().requires_grad_()
        with torch.enable_grad():
            bias = self.positions.score_bias(self.split(queries), qb.pos, kb.pos)
        if bias is None or not bias.requires_grad:
            return
        found = torch.autograd.grad(
            bias, (queries, *self.parameters), self.split(grad_scores).sum_to_size(bias.shape), allow_unused=True
        )
        if found[0] is not None:
            grad_queries += found[0]
        _add_all(grads, found[1:])

    def finish_query_block(
        self, grad_state: object, queries: Tensor, grad_queries: Tensor, grads: list[Tensor]
    ) -> None:
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
    """-slope_h * |i - j| (Press et al. 2022), no parameters.

    Left of every query (j <= i) it is slope * j - slope * i: a column plus a row; right of every query the same
    with the signs flipped. Only blocks straddling i = j need |i - j| in full. Both terms are measured from the
    key block's start, so they stay small where the weights are large and fp32 keeps them exact.
    """

    plain = BlockBias.plain  # a column term: not plain
    scheme: ClassVar[type] = ALiBiPositions  # computes its score_bias (and no value_bias), reading its slopes
    relies_on: ClassVar[tuple[str, ...]] = ("score_bias", "value_bias")

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

    scheme: ClassVar[type] = RelativePositions  # computes its two biases from its tables keys, values
    relies_on: ClassVar[tuple[str, ...]] = ("score_bias", "value_bias", "distance_index")

    def __init__(self, positions: RelativePositions, batch: int, heads: int, dtype: torch.dtype | None = None):
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
        return self._index[1][: len(qb.pos) * len(kb.pos)].view(1, len(qb.pos), len(kb.pos)).expand(batch_heads, -1, -1)

    def query_state(self, queries: Tensor, qb: Block) -> Tensor:
        self._index = None if self._index is None else ((-1, -1), self._index[1])
        return queries @ self.key_table.T * self.scale  # (batch_heads, q_block, 2k+1)

    def add_scores(self, scores: Tensor, per_distance: Tensor, qb: Block, kb: Block) -> Tensor | None:
        side = self.side(qb, kb)
        if side is not None:
            return per_distance[..., side : side + 1]
        scores += per_distance.gather(-1, self.index(qb, kb, scores.shape[0]))
        return None

    def plain(self, per_distance: Tensor, qb: Block, kb: Block) -> Plain | None:
        side = self.side(qb, kb)
        if side is None:
            return None
        value = None if self.value_table is None else self.value_table[side]
        return Plain(per_distance[..., side : side + 1], value, side)

    def row_grad(self, grad_per_distance: Tensor, grad_row: Tensor, plain: Plain) -> None:
        grad_per_distance[..., plain.bucket] += grad_row[..., 0]

    def new_value_state(self, queries: Tensor, v_dim: int) -> Tensor | None:
        if self.value_table is None:
            return None
        return queries.new_zeros(*queries.shape[:2], 2 * self.k + 1)  # weight given to each clipped distance

    def accumulate_values(self, per_distance: Tensor, weights: Tensor, row_sum: Tensor, qb: Block, kb: Block) -> None:
        side = self.side(qb, kb)
        if side is not None:
            per_distance[..., side : side + 1] += row_sum
        else:
            per_distance.scatter_add_(-1, self.index(qb, kb, weights.shape[0]), weights)

    def value_output(self, per_distance: Tensor, norm: Tensor) -> tuple[Tensor, Tensor]:
        return per_distance @ self.value_table, per_distance / norm  # keep the normalised weights per distance

    def value_grad_state(self, saved: Tensor | None, grad_out: Tensor, qb: Block) -> Tensor:
        return grad_out @ self.value_table.T  # (batch_heads, q_block, 2k+1): dO . a^V for every distance

    def add_value_grad(
        self, grad_weights: Tensor, per_distance: Tensor, weights: Tensor, qb: Block, kb: Block, grads: list[Tensor]
    ) -> Tensor | None:
        side = self.side(qb, kb)
        if side is not None:
            return per_distance[..., side : side + 1]
        grad_weights += per_distance.gather(-1, self.index(qb, kb, weights.shape[0]))
        return None

    def new_score_grad_state(self, queries: Tensor) -> Tensor:
        return queries.new_zeros(*queries.shape[:2], 2 * self.k + 1)

    def score_grad(
        self,
        state: Tensor,
        grad_per_distance: Tensor,
        grad_scores: Tensor,
        qb: Block,
        kb: Block,
        grad_queries: Tensor,
        grads: list[Tensor],
    ) -> None:
        side = self.side(qb, kb)
        if side is not None:
            self.row_grad(grad_per_distance, grad_scores.sum(-1, keepdim=True), Plain(bucket=side))
        else:
            grad_per_distance.scatter_add_(-1, self.index(qb, kb, grad_scores.shape[0]), grad_scores)

    def finish_query_block(
        self, grad_per_distance: Tensor, queries: Tensor, grad_queries: Tensor, grads: list[Tensor]
    ) -> None:
        grad_per_distance = grad_per_distance * self.scale
        grad_queries += grad_per_distance @ self.key_table
        grads[0] += (grad_per_distance.transpose(1, 2) @ queries).sum(0)  # d a^K (2k+1, head_dim)

    def finish(self, per_distance: Tensor | None, grad_out: Tensor, grads: list[Tensor]) -> None:
        if self.value_table is not None:
            grads[1] += (per_distance.transpose(1, 2) @ grad_out).sum(0)  # d a^V (2k+1, head_dim)


CLOSED_FORMS: tuple[type[BlockBias], ...] = (ALiBiBias, RelativeBias)


def block_bias(positions: AttentionPositions | None, batch: int, heads: int, dtype: torch.dtype) -> BlockBias:
    """The fastest exact way to evaluate `positions` one block at a time: nothing for a scheme without biases, a
    closed form for a scheme that keeps the methods it computes, the generic route (which calls the methods) for
    anything else, a subclass that changes the bias included."""
    if positions is None or not (positions.has_score_bias or positions.has_value_bias):
        return NoBias()  # no positions, absolute positions, RoPE
    for closed_form in CLOSED_FORMS:
        if keeps(positions, closed_form.scheme, *closed_form.relies_on):
            return closed_form(positions, batch, heads, dtype)
    return BlockBias(positions, batch, heads)


def _add_all(grads: list[Tensor], found: tuple[Tensor | None, ...]) -> None:
    for total, grad in zip(grads, found):
        if grad is not None:
            total += grad
