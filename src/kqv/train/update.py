"""One optimizer update with no host sync: the micro-batches' forward and backward, the gradient's clipping, and a
step that the non-finite guard may skip, all decided on the device.

The loss and the gradient norm stay tensors on the device, and so does the guard's verdict
(`kqv.train.nonfinite.NonFiniteGuard.decide`); the fused optimizer skips a judged-bad update there
(`MixedPrecision.step`). Nothing is read back to the host until the trainer reads its window at the log
interval, so a GPU never waits for Python between updates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from . import distributed
from .ahead import BatchesAhead
from .config import TrainConfig
from .distributed import Batch, batch_tokens
from .nonfinite import NonFiniteGuard
from .options import TrainerOptions, check_loss
from .placement import Placement


@dataclass
class Outcome:
    """One update as the device knows it: the mean loss over its micro-batches, the gradient norm before clipping,
    and the guard's verdict (`good`: counted as such; `skipped`: the weights did not change), plus its tokens."""

    loss: Tensor
    grad_norm: Tensor
    good: Tensor
    skipped: Tensor
    tokens: int | None


class Updater:
    """Makes the updates of a training: `updater(module, step, lr)` is update number `step + 1`, of the model
    `placement` trains, by `optimizer`, on `options.train_batches` and `options.loss_fn`, judged by `guard`; `config`
    says the accumulation and clipping."""

    def __init__(
        self,
        config: TrainConfig,
        placement: Placement,
        optimizer: torch.optim.Optimizer,
        guard: NonFiniteGuard,
        options: TrainerOptions,
    ):
        self.config, self.placement, self.optimizer, self.guard, self.options = (
            config,
            placement,
            optimizer,
            guard,
            options,
        )
        self.ahead = BatchesAhead(options.train_batches, options.tokens_per_batch)  # made on a worker thread

    def __call__(self, module: nn.Module, step: int, lr: float) -> Outcome:
        """The gradient of update `step + 1` at learning rate `lr` over `grad_accum` micro-batches, forward and
        backward through `module` (the model, or its DDP or compiled wrapper), clipped and judged; `apply` then
        makes the update."""
        cfg, place, precision, options = self.config, self.placement, self.placement.precision, self.options
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=place.device.device)
        tokens: int | None = 0
        for j in range(cfg.grad_accum):
            i = step * cfg.grad_accum + j
            batch, count = self.ahead.get(i)
            count = self.tokens(batch, count)
            tokens = None if tokens is None or count is None else tokens + count
            local, weight = distributed.share(batch, place.rank, place.world_size, options.loss_terms)
            local = place.device.batch(local)
            with distributed.gradient_sync(module, j == cfg.grad_accum - 1):
                with precision.autocast():
                    loss = check_loss(options.loss_fn(module, local))
                    loss = loss if weight == 1 else loss * weight  # this rank's share (`distributed.share`)
                precision.backward(loss / cfg.grad_accum)
            total += loss.detach().float()
        mean_loss = distributed.process_mean(total / cfg.grad_accum, place.world_size)  # the same on every rank
        grad_norm = precision.clip(self.optimizer, place.model, cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
        good, skipped = self.guard.decide(mean_loss, grad_norm, precision.overflowed(grad_norm))
        return Outcome(mean_loss, grad_norm, good, skipped, tokens)

    def apply(self, outcome: Outcome) -> None:
        """Make the update, unless the guard skips it: nothing non-finite reaches the weights."""
        self.placement.precision.step(self.optimizer, outcome.skipped)

    def tokens(self, batch: Batch, counted: int | None) -> int | None:
        """The token count of a micro-batch, for tokens/s: as the job counted it (`counted`, when its
        `tokens_per_batch` is a function), its fixed count, or the batch's own."""
        given = self.options.tokens_per_batch
        return counted if callable(given) else given or batch_tokens(batch)

    def close(self) -> None:
        """Stop making batches ahead (the end of training)."""
        self.ahead.close()
