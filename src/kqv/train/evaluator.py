"""Evaluation during training: the validation loss and the job's own metrics, on every rank's slice, without
touching the training's randomness (the generators are saved before and restored after)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..errors import ConfigTypeError
from . import distributed
from .config import TrainConfig
from .distributed import Batch
from .nonfinite import check_loss
from .precision import MixedPrecision
from .rng import rng_state, set_rng_state
from .sharding import plain_on_rank0, reshard


class Evaluator:
    """`evaluator(model, callers_model)`: `val_loss`, the mean of `loss_fn` over `config.eval_batches` of
    `val_batches` (every rank its slice), and what `eval_fn` returns, run on rank 0 on the plain model
    `callers_model` (under FSDP rank 0's plain model is filled from the shards of `model` first, and released
    after). In eval mode, without gradients, in the training precision."""

    def __init__(
        self,
        config: TrainConfig,
        precision: MixedPrecision,
        loss_fn: Callable[[nn.Module, Batch], Tensor],
        val_batches: Callable[[int], Batch] | None,
        eval_fn: Callable[[nn.Module], dict[str, float]] | None,
        sharded: bool,
        rank: int,
        world_size: int,
        loss_terms: Callable[[Batch], float] | None = None,
    ):
        self.config, self.precision, self.loss_fn, self.loss_terms = config, precision, loss_fn, loss_terms
        self.val_batches, self.eval_fn = val_batches, eval_fn
        self.sharded, self.rank, self.world_size = sharded, rank, world_size

    @property
    def evaluates(self) -> bool:
        """Whether there is anything to evaluate."""
        return self.val_batches is not None or self.eval_fn is not None

    def __call__(self, model: nn.Module, callers_model: nn.Module) -> dict[str, float]:
        rng = rng_state()
        model.eval()
        metrics: dict[str, float] = {}
        try:
            with torch.no_grad(), self.precision.autocast():
                if self.val_batches is not None:
                    metrics["val_loss"] = self.val_loss(model)
                # under FSDP rank 0's plain model is filled from the shards for eval_fn, and released after
                device = self.precision.device.device
                with plain_on_rank0(callers_model, model, device, self.sharded and bool(self.eval_fn)):
                    for name, value in self.eval_fn(callers_model).items() if self.eval_fn and self.rank == 0 else ():
                        try:
                            metrics[name] = float(value)
                        except (TypeError, ValueError):
                            raise ConfigTypeError(f"eval_fn must return numbers, got {name}={value!r}") from None
        finally:
            set_rng_state(rng)
        return metrics

    def val_loss(self, model: nn.Module) -> float:
        """The mean validation loss over `eval_batches` batches and every process."""
        total = torch.zeros((), device=self.precision.device.device)
        for i in range(self.config.eval_batches):
            local, weight = distributed.share(self.val_batches(i), self.rank, self.world_size, self.loss_terms)
            loss = check_loss(self.loss_fn(model, self.precision.device.batch(local))).float()
            total += loss if weight == 1 else loss * weight
        reshard(model)  # FSDP keeps the root's weights gathered after a forward without a backward
        return distributed.process_mean(total, self.world_size).item() / self.config.eval_batches
