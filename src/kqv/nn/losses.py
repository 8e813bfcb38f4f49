"""The output layer and its cross-entropy in one pass over blocks of rows.

Projecting every position to the vocabulary makes a (tokens, vocab) logits matrix: 1,800 target tokens and a
vocabulary of 8,000 are 58 MB in fp32, and `F.cross_entropy` then reads and writes it about ten times (softmax,
its gradient, the label-smoothing terms, the casts), which is slow on a CPU with little memory bandwidth
(`python benchmarks/step_kernels.py` times both ways). `linear_cross_entropy` gives the
same loss and gradients a block of rows at a time: each block's logits stay in the cache, and the gradients of
the hidden states and the weights are formed while the block is there (when they will be needed), so the
backward pass only scales them.

That is a CPU's kernel, chosen once per device (`Kernels.blocked_loss` in `kqv.nn.devices`). On a GPU a block of
a cache's size is a few rows (20 at GPT-2's vocabulary of 50,257), each block reading the whole head weight: a
forward and backward of thousands of small products. There, and wherever the step is compiled (where the loop
would be unrolled into the graph, and the length of a sequence fixed by it), the loss is the head and
`F.cross_entropy` in one piece, which torch.compile fuses.

A padded vocabulary (`kqv.nn.vocabulary`) is scored over its real classes only: the padded columns are left out,
not set to -inf. A -inf logit is a log-probability of -inf, which makes label smoothing's uniform term infinite
(and counts the padding as classes). And leaving them out is as cheap on a GPU: the product still runs over the
padded rows (the tile-friendly shape padding is for), and its real columns are a view, which a compiled step's
fused softmax reads in place and bf16 autocast's fp32 cast copies as it would have copied the whole (only an eager
fp32 step copies the view once more, where masking would write the padded columns of every row). The CPU's blocked
kernel multiplies by the real rows of the weight only (a contiguous view): a CPU gains nothing from the padded shape.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError, DataError
from .devices import kernels
from .vocabulary import classes

BLOCK_LOGITS = 1 << 20  # logits per block: 4 MB in fp32, well inside a CPU's last-level cache


def linear_cross_entropy(
    hidden: Tensor, head: nn.Linear, targets: Tensor, *, label_smoothing: float = 0.0, ignore_index: int = -100
) -> Tensor:
    """Mean cross-entropy of `head(hidden)` against `targets`, as
    `F.cross_entropy(head(hidden).flatten(0, -2).float(), targets.flatten(), ...)` computes it (under bf16
    autocast too: bf16 products, fp32 softmax), without the whole logits matrix.

    hidden (..., d_model); targets (...) class ids, `ignore_index` where there is no target. A `PaddedHead`'s
    padded columns are no classes: the loss is over its first `vocab_size` (see the module's docstring).
    """
    if targets.shape != hidden.shape[:-1]:
        raise DataError(
            f"targets must have shape {tuple(hidden.shape[:-1])}, one per position, got {tuple(targets.shape)}"
        )
    if not 0.0 <= label_smoothing <= 1.0:
        raise ConfigError(f"label_smoothing must be between 0 and 1, got {label_smoothing}")
    if torch.compiler.is_compiling() or not kernels(hidden.device).blocked_loss:
        return whole_cross_entropy(hidden, head, targets, label_smoothing=label_smoothing, ignore_index=ignore_index)
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    real = classes(head)  # the real rows of the weight: a view, whose gradient lands in the whole weight's
    return _LinearCrossEntropy.apply(
        hidden.flatten(0, -2),
        head.weight[:real],
        None if head.bias is None else head.bias[:real],
        targets.flatten(),
        label_smoothing,
        ignore_index,
        dtype,
        torch.is_grad_enabled(),
    )


def whole_cross_entropy(
    hidden: Tensor, head: nn.Linear, targets: Tensor, *, label_smoothing: float = 0.0, ignore_index: int = -100
) -> Tensor:
    """`linear_cross_entropy` in one piece: the whole logits matrix, `F.cross_entropy` in fp32 over it (the
    products in the autocast precision). One product forward and two backward, whatever the number of rows; over
    a padded vocabulary the product is the padded one and the loss is over its real columns."""
    logits = F.linear(hidden.flatten(0, -2), head.weight, head.bias)[:, : classes(head)]  # (tokens, vocab)
    return F.cross_entropy(
        logits.float(), targets.flatten(), ignore_index=ignore_index, label_smoothing=label_smoothing
    )


class _LinearCrossEntropy(torch.autograd.Function):
    """The loss in forward, with its gradients when any input needs them; backward scales those gradients."""

    @staticmethod
    def forward(
        ctx,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        smoothing: float,
        ignore_index: int,
        dtype: torch.dtype,
        grad_enabled: bool,
    ) -> Tensor:
        wants_grad = grad_enabled and any(ctx.needs_input_grad[:3])  # not under no_grad, e.g. validation
        with torch.autocast(hidden.device.type, enabled=False):
            loss, grads = _blocks(hidden, weight, bias, targets, smoothing, ignore_index, dtype, wants_grad)
        ctx.save_for_backward(*grads)
        ctx.has_bias = bias is not None
        return loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        grad_hidden, grad_weight, *grad_bias = ctx.saved_tensors
        scaled = [g * grad_loss for g in (grad_hidden, grad_weight, *grad_bias)]
        return scaled[0], scaled[1], scaled[2] if ctx.has_bias else None, None, None, None, None, None


def _blocks(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    smoothing: float,
    ignore_index: int,
    dtype: torch.dtype,
    wants_grad: bool,
) -> tuple[Tensor, list[Tensor]]:
    """The mean loss and, when `wants_grad`, its gradients for hidden (tokens, d_model), weight (vocab, d_model)
    and bias (vocab), computed block by block."""
    tokens, vocab = hidden.shape[0], weight.shape[0]
    counted = targets != ignore_index  # (tokens,)
    count = counted.sum()  # with nothing counted the loss is nan, as F.cross_entropy's mean is
    index = targets.clamp(min=0).unsqueeze(1)  # (tokens, 1): where each row's target is (any class if ignored)
    row_weights = (counted / count.clamp(min=1)).unsqueeze(1)  # (tokens, 1): 1 / count, 0 for ignored rows
    w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    grads = [torch.empty_like(hidden), torch.zeros_like(weight)] + ([] if bias is None else [torch.zeros_like(bias)])
    rows = max(1, BLOCK_LOGITS // vocab)
    for start in range(0, tokens, rows):
        block = slice(start, start + rows)
        h, at, keep = hidden[block].to(dtype), index[block], counted[block]
        logits = (h @ w.t() if b is None else torch.addmm(b, h, w.t())).float()  # (rows, vocab)
        picked = logits.gather(1, at).squeeze(1)  # (rows,)
        mean = logits.mean(dim=-1)
        top = logits.amax(dim=-1, keepdim=True)
        exps = logits.sub_(top).exp_()  # in place: the logits are not needed again
        sums = exps.sum(dim=-1)
        log_norm = top.squeeze(1) + sums.log()  # log of the softmax's denominator
        losses = (1 - smoothing) * (log_norm - picked) + smoothing * (log_norm - mean)
        total += losses.masked_fill(~keep, 0.0).sum()
        if wants_grad:  # d loss / d logits = softmax - (1 - smoothing) * one_hot - smoothing / vocab
            grad = exps.div_(sums.unsqueeze(1)).sub_(smoothing / vocab)
            grad.scatter_add_(1, at, torch.full_like(picked, smoothing - 1).unsqueeze(1))
            grad.mul_(row_weights[block])
            grad_logits = grad.to(dtype)
            grads[0][block] = grad_logits @ w
            grads[1] += grad_logits.t() @ h
            if b is not None:
                grads[2] += grad.sum(dim=0)
    return total / count, grads if wants_grad else []


def weighted_cross_entropy(logits: Tensor, targets: Tensor, weights: Tensor, ignore_index: int = -100) -> Tensor:
    """sum(weight * cross-entropy) / sum(weight) over the positions of logits (..., vocab) with targets (...) and
    weights (...): a weighted mean, where weight 1 everywhere is the plain mean and a position of weight 0 (or
    target `ignore_index`) counts for nothing. The cross-entropy is computed in fp32."""
    if targets.shape != logits.shape[:-1] or weights.shape != targets.shape:
        raise DataError(
            f"targets and weights must have shape {tuple(logits.shape[:-1])}, one per position, got "
            f"{tuple(targets.shape)} and {tuple(weights.shape)}"
        )
    losses = F.cross_entropy(
        logits.flatten(0, -2).float(), targets.flatten(), ignore_index=ignore_index, reduction="none"
    )  # (positions,), 0 where ignored
    weights = weights.flatten().float().masked_fill(targets.flatten() == ignore_index, 0.0)
    return (losses * weights).sum() / weights.sum()
