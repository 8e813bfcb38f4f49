"""`blockwise_attention` and its two passes: the forward pass's online softmax over key blocks, and the backward
pass that recomputes each block's weights from the saved log-sum-exp (see the package docstring)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ...errors import ConfigError, DataError
from ..devices import kernels
from ..positions import AttentionPositions
from .bias import BlockBias, block_bias
from .blocks import Block, Norms, Plan, Run, Trace, Workspace, block_scores, block_weights, finite

SCORE_BLOCK_ELEMENTS = 512 * 512  # default size of one block of scores, all batch rows and heads together
try:  # torch's fused CPU kernel, forward and backward, returning the log-sum-exp that lets its result be merged
    FUSED = (
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward,
    )
except (AttributeError, RuntimeError):  # an older torch: every block goes through the plain-PyTorch path
    FUSED = None


def blockwise_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    positions: AttentionPositions | None = None,
    q_pos: Tensor | range | None = None,
    k_pos: Tensor | range | None = None,
    causal: bool = False,
    key_padding: Tensor | None = None,
    block_size: int | tuple[int, int] | None = None,
    fused: bool = True,
    trace: Trace | None = None,
) -> Tensor:
    """softmax(q k^T / sqrt(d_head) + position bias, masked) (v + value-side positions), exactly, in O(n) memory.

    queries (batch, heads, q_time, head_dim); keys, values (batch, heads, k_time, head_dim); queries and keys
    already rotated if the scheme rotates. `q_pos` (q_time,) and `k_pos` (k_time,) are the positions the scheme
    sees (default: the queries are the last q_time of 0..k_time-1, as with a cache): LongTensors, read once to
    plan the blocks, or Python `range`s, which need no read of the device. `causal` lets query i see
    key j when j <= i + (k_time - q_time), as `kqv.attention.causal_mask`. `key_padding` (batch, k_time) bool,
    True = real token. `block_size` is (q_block, k_block), or one int for both; the default keeps a block of
    scores near 256K numbers. A query that may see no key outputs zeros, as the reference does. No attention
    dropout. `fused=False` keeps plain blocks off torch's fused kernel (tests check both routes agree); a given
    `trace` records the largest block of scores and the blocks skipped. Returns (batch, heads, q_time, head_dim).
    """
    batch, heads, q_time, head_dim = queries.shape
    k_time = keys.shape[2]
    if keys.shape != (batch, heads, k_time, head_dim) or values.shape[:3] != keys.shape[:3]:
        raise DataError(
            f"queries {tuple(queries.shape)}, keys {tuple(keys.shape)} and values "
            f"{tuple(values.shape)} must be (batch, heads, time, head_dim) with matching sizes"
        )
    if key_padding is not None and tuple(key_padding.shape) != (batch, k_time):
        raise DataError(
            f"key_padding must have shape (batch, k_time) = {(batch, k_time)}, got {tuple(key_padding.shape)}"
        )
    if q_time == 0 or k_time == 0:
        return queries.new_zeros(batch, heads, q_time, values.shape[-1])
    k_pos = range(k_time) if k_pos is None else k_pos
    q_pos = range(k_time - q_time, k_time) if q_pos is None else q_pos
    bias = block_bias(positions, batch, heads, queries.dtype)
    fused = (
        fused
        and FUSED is not None
        and key_padding is None
        and kernels(queries.device).fused_cpu_blocks
        and queries.dtype in (torch.float32, torch.float64)
        and type(bias).plain is not BlockBias.plain
    )
    q_block, k_block = block_sizes(block_size, batch * heads, q_time, k_time, fused)
    plan = Plan(
        q_pos,
        k_pos,
        q_block,
        k_block,
        causal,
        key_padding,
        heads,
        queries.dtype,
        queries.device,
        fused,
        Trace() if trace is None else trace,
        skips=kernels(queries.device).free_host_reads or not training(queries, keys, values, *bias.parameters),
    )
    flat = [x.reshape(batch * heads, x.shape[2], x.shape[3]) for x in (queries, keys, values)]
    output = _BlockwiseAttention.apply(*flat, plan, bias, *bias.parameters)  # (batch * heads, q_time, v_dim)
    return output.view(batch, heads, q_time, values.shape[-1])


def training(*tensors: Tensor) -> bool:
    """Whether this call is part of a training step: gradients are on and some input needs one."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def block_sizes(
    block_size: int | tuple[int, int] | None, batch_heads: int, q_time: int, k_time: int, fused: bool = False
) -> tuple[int, int]:
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
        raise ConfigError(f"block sizes must be positive, got {(q_block, k_block)}")
    return min(q_block, q_time), min(k_block, k_time)


@dataclass
class OnlineSoftmax:
    """One query block's running state: the largest score seen per query, the sum of exp(score - max), the values
    weighted by exp(score - max), and the value side's state (Shaw). Every merge rescales it to the new maximum."""

    max: Tensor  # (batch_heads, q_block, 1)
    sum: Tensor  # (batch_heads, q_block, 1)
    accumulated: Tensor  # (batch_heads, q_block, v_dim)
    value_state: Tensor | None

    @classmethod
    def start(cls, q: Tensor, v_dim: int, value_state: Tensor | None) -> OnlineSoftmax:
        batch_heads, q_block = q.shape[:2]
        return cls(
            q.new_full((batch_heads, q_block, 1), float("-inf")),
            q.new_zeros(batch_heads, q_block, 1),
            q.new_zeros(batch_heads, q_block, v_dim),
            value_state,
        )

    def merge_run(
        self, run: Run, q: Tensor, keys: Tensor, values: Tensor, scale: float, bias: BlockBias, qb: Block
    ) -> None:
        """A run of plain blocks through the fused kernel, merged like one more block: max = its log-sum-exp,
        sum = 1. Keeps its output and log-sum-exp on `run` for the backward pass."""
        output_run, lse = FUSED[0](
            q[None], keys[None, :, run.start : run.end], values[None, :, run.start : run.end], 0.0, False, scale=scale
        )
        run.output, run.log_sum_exp = output_run[0], lse[0, :, :, None]
        if run.plain.row is not None:
            run.log_sum_exp = run.log_sum_exp + run.plain.row
        new_max = torch.maximum(self.max, run.log_sum_exp)
        rescale, weight = (self.max - new_max).exp(), (run.log_sum_exp - new_max).exp()
        self.sum = self.sum * rescale + weight
        self.accumulated = self.accumulated * rescale + run.output * weight
        if self.value_state is not None:
            self.value_state *= rescale
            bias.accumulate_values(self.value_state, None, weight, qb, run.block)
        self.max = new_max

    def merge_block(
        self,
        scores: Tensor,
        row: Tensor | None,
        values: Tensor,
        bias: BlockBias,
        plan: Plan,
        qb: Block,
        kb: Block,
        diagonal: int | None,
    ) -> None:
        """One block of scores (batch_heads, q_block, k_block), masked, with the scheme's row term aside."""
        block_max = scores.amax(-1, keepdim=True)  # (batch_heads, q_block, 1)
        if row is not None:
            block_max += row
        new_max = torch.maximum(self.max, block_max)
        finite_max = finite(new_max)
        rescale = (self.max - finite_max).exp()
        weights = block_weights(scores, finite_max if row is None else finite_max - row, plan, kb, diagonal)
        row_sum = weights.sum(-1, keepdim=True)
        self.sum = self.sum * rescale + row_sum
        self.accumulated = torch.baddbmm(self.accumulated * rescale, weights, values)
        if self.value_state is not None:
            self.value_state *= rescale
            bias.accumulate_values(self.value_state, weights, row_sum, qb, kb)
        self.max = new_max


def _forward(
    queries: Tensor, keys: Tensor, values: Tensor, plan: Plan, bias: BlockBias
) -> tuple[Tensor, Tensor, Tensor | None, list[list[Run]]]:
    """(output, log-sum-exp per query, what the value side saves, the fused runs of every query block)."""
    batch_heads, _, head_dim = queries.shape
    v_dim = values.shape[-1]
    scale = 1.0 / math.sqrt(head_dim)
    workspace = Workspace(queries, batch_heads * len(plan.q_blocks[0].pos) * len(plan.k_blocks[0].pos), plan.trace)
    output = queries.new_empty(*queries.shape[:2], v_dim)
    log_sum_exp = queries.new_empty(*queries.shape[:2], 1)
    saved, all_runs = [], []
    norms = Norms(queries, keys, plan, scale)
    for qb in plan.q_blocks:
        q = queries[:, qb.start : qb.end]  # (batch_heads, q_block, head_dim)
        q_scaled = q * scale
        state = bias.query_state(q, qb)
        softmax = OnlineSoftmax.start(q, v_dim, bias.new_value_state(q, v_dim))
        runs, blocks = plan.runs(qb, bias, state)
        for run in runs:
            softmax.merge_run(run, q, keys, values, scale, bias, qb)
        all_runs.append(runs)
        for kb, diagonal in blocks:
            if norms.negligible(bias, qb, kb, softmax.max):
                continue
            scores = workspace.get(0, batch_heads, q.shape[1], kb.end - kb.start)
            row = block_scores(q_scaled, keys[:, kb.start : kb.end], scores, bias, state, plan, qb, kb, diagonal)
            softmax.merge_block(scores, row, values[:, kb.start : kb.end], bias, plan, qb, kb, diagonal)
        running_sum, accumulated = softmax.sum, softmax.accumulated
        norm = running_sum.masked_fill(running_sum == 0, 1.0)  # a query that sees no key outputs 0
        if softmax.value_state is not None:
            extra, keep = bias.value_output(softmax.value_state, norm)
            accumulated += extra
            saved.append(keep)
        output[:, qb.start : qb.end] = accumulated / norm
        log_sum_exp[:, qb.start : qb.end] = (softmax.max + running_sum.log()).masked_fill(running_sum == 0, math.inf)
    return output, log_sum_exp, torch.cat(saved, 1) if saved and saved[0] is not None else None, all_runs


@dataclass
class Gradients:
    """What the backward pass accumulates: for queries, keys, values and the position scheme's parameters."""

    queries: Tensor
    keys: Tensor
    values: Tensor
    parameters: list[Tensor]


def _backward_runs(
    runs: list[Run],
    grads: Gradients,
    rows: slice,
    q: Tensor,
    d_out: Tensor,
    output: Tensor,
    lse: Tensor,
    d_i: Tensor,
    keys: Tensor,
    values: Tensor,
    scale: float,
    bias: BlockBias,
    grad_state: object,
    grad_q_bias: Tensor,
) -> None:
    """The fused kernel's backward for each run of a query block, told the whole row's log-sum-exp and output."""
    for run in runs:
        plain, cols = run.plain, slice(run.start, run.end)
        out = output[:, rows] if plain.value is None else output[:, rows] - plain.value  # dO . out = D - dO . a
        lse_run = lse if plain.row is None else lse - plain.row
        dq, dk, dv = FUSED[1](
            d_out[None],
            q[None],
            keys[None, :, cols],
            values[None, :, cols],
            out[None],
            lse_run[None, :, :, 0],
            0.0,
            False,
            scale=scale,
        )
        grad_q_bias += dq[0]
        grads.keys[:, cols] += dk[0]
        grads.values[:, cols] += dv[0]
        if plain.row is not None:  # sum over the run of dS = W (dO . o_run + dO . a - D), W its total weight
            dot = (d_out * run.output).sum(-1, keepdim=True)
            if plain.value is not None:
                dot += d_out @ plain.value[:, None]
            bias.row_grad(grad_state, (run.log_sum_exp - lse).exp() * (dot - d_i), plain)


def _backward(
    grad_out: Tensor,
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    output: Tensor,
    log_sum_exp: Tensor,
    saved: Tensor | None,
    all_runs: list[list[Run]],
    plan: Plan,
    bias: BlockBias,
) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    batch_heads, _, head_dim = queries.shape
    scale = 1.0 / math.sqrt(head_dim)
    workspace = Workspace(queries, batch_heads * len(plan.q_blocks[0].pos) * len(plan.k_blocks[0].pos), plan.trace)
    grads = Gradients(
        torch.zeros_like(queries),
        torch.zeros_like(keys),
        torch.zeros_like(values),
        [torch.zeros_like(p) for p in bias.parameters],
    )
    delta = (grad_out * output).sum(-1, keepdim=True)  # D_i = dO_i . O_i = sum_j P_ij dP_ij
    norms = Norms(queries, keys, plan, scale)
    for qb in plan.q_blocks:
        rows = slice(qb.start, qb.end)
        q, d_out, lse, d_i = queries[:, rows], grad_out[:, rows], log_sum_exp[:, rows], delta[:, rows]
        q_scaled = q * scale
        state = bias.query_state(q, qb)
        value_state = (
            bias.value_grad_state(None if saved is None else saved[:, rows], d_out, qb) if bias.has_value_bias else None
        )
        grad_state = bias.new_score_grad_state(q)
        grad_q = torch.zeros_like(q)  # d loss / d q_scaled, through q k^T
        grad_q_bias = torch.zeros_like(q)  # d loss / d q, through the position bias and the fused runs
        _backward_runs(
            all_runs[qb.index],
            grads,
            rows,
            q,
            d_out,
            output,
            lse,
            d_i,
            keys,
            values,
            scale,
            bias,
            grad_state,
            grad_q_bias,
        )
        for kb, diagonal in plan.runs(qb, bias, state)[1]:
            if norms.negligible(bias, qb, kb, lse):
                continue
            cols = slice(kb.start, kb.end)
            scores = workspace.get(0, batch_heads, q.shape[1], kb.end - kb.start)
            row = block_scores(q_scaled, keys[:, cols], scores, bias, state, plan, qb, kb, diagonal)
            weights = block_weights(scores, lse if row is None else lse - row, plan, kb, diagonal)  # normalised
            grad_weights = torch.bmm(d_out, values[:, cols].transpose(1, 2), out=workspace.get(1, *scores.shape))
            row_term = d_i
            if value_state is not None:
                value_row = bias.add_value_grad(grad_weights, value_state, weights, qb, kb, grads.parameters)
                row_term = d_i if value_row is None else d_i - value_row
            grad_scores = grad_weights.sub_(row_term).mul_(weights)  # dS = P * (dP - D)
            grads.values[:, cols].baddbmm_(weights.transpose(1, 2), d_out)
            grads.keys[:, cols].baddbmm_(grad_scores.transpose(1, 2), q_scaled)
            grad_q.baddbmm_(grad_scores, keys[:, cols])
            bias.score_grad(state, grad_state, grad_scores, qb, kb, grad_q_bias, grads.parameters)
        bias.finish_query_block(grad_state, q, grad_q_bias, grads.parameters)
        grads.queries[:, rows] = grad_q * scale + grad_q_bias
    if bias.has_value_bias:
        bias.finish(saved, grad_out, grads.parameters)
    return grads.queries, grads.keys, grads.values, grads.parameters


class _BlockwiseAttention(torch.autograd.Function):
    """Blockwise attention as one autograd node: saves only its inputs, output and log-sum-exp."""

    @staticmethod
    def forward(
        ctx, queries: Tensor, keys: Tensor, values: Tensor, plan: Plan, bias: BlockBias, *parameters: Tensor
    ) -> Tensor:
        output, log_sum_exp, saved, runs = _forward(queries, keys, values, plan, bias)
        ctx.save_for_backward(queries, keys, values, output, log_sum_exp, saved)
        ctx.plan, ctx.bias, ctx.runs = plan, bias, runs
        return output

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        queries, keys, values, output, log_sum_exp, saved = ctx.saved_tensors
        grad_queries, grad_keys, grad_values, grads = _backward(
            grad_out.contiguous(), queries, keys, values, output, log_sum_exp, saved, ctx.runs, ctx.plan, ctx.bias
        )
        return grad_queries, grad_keys, grad_values, None, None, *grads
