"""Evaluation during training: the validation loss and the job's own metrics, on every rank's slice, without
touching the training's randomness (the generators are saved before and restored after)."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigTypeError
from . import distributed
from .options import TrainerOptions, check_loss
from .placement import Placement
from .rng import rng_state, set_rng_state
from .sharding import plain_on_rank0, reshard


class Evaluator:
    """`evaluator(model, callers_model)`: `val_loss`, the mean of `options.loss_fn` over `eval_batches` of
    `options.val_batches` (every rank its slice), and what `options.eval_fn` returns, run on rank 0 on the plain
    model `callers_model` (under FSDP rank 0's plain model is filled from the shards of `model` first, and released
    after). In eval mode, without gradients, in the training precision of `placement`."""

    def __init__(self, placement: Placement, options: TrainerOptions, eval_batches: int):
        self.placement, self.options, self.eval_batches = placement, options, eval_batches

    @property
    def evaluates(self) -> bool:
        """Whether there is anything to evaluate."""
        return self.options.val_batches is not None or self.options.eval_fn is not None

    def __call__(self, model: nn.Module, callers_model: nn.Module) -> dict[str, float]:
        place, eval_fn = self.placement, self.options.eval_fn
        rng = rng_state()
        model.eval()
        metrics: dict[str, float] = {}
        try:
            with torch.no_grad(), place.precision.autocast():
                if self.options.val_batches is not None:
                    metrics["val_loss"] = self.val_loss(model)
                # under FSDP rank 0's plain model is filled from the shards for eval_fn, and released after
                plain = place.sharded and bool(eval_fn)
                with plain_on_rank0(callers_model, model, place.topology, place.device.device, plain):
                    for name, value in eval_fn(callers_model).items() if eval_fn and place.rank == 0 else ():
                        try:
                            metrics[name] = float(value)
                        except (TypeError, ValueError):
                            raise ConfigTypeError(f"eval_fn must return numbers, got {name}={value!r}") from None
        finally:
            set_rng_state(rng)
        return metrics

    def val_loss(self, model: nn.Module) -> float:
        """The mean validation loss over `eval_batches` batches and every process."""
        place, options = self.placement, self.options
        total = torch.zeros((), device=place.device.device)
        for i in range(self.eval_batches):
            local, weight = distributed.share(options.val_batches(i), place.rank, place.world_size, options.loss_terms)
            loss = check_loss(options.loss_fn(model, place.device.batch(local))).float()
            total += loss if weight == 1 else loss * weight
        reshard(model)  # FSDP keeps the root's weights gathered after a forward without a backward
        return distributed.process_mean(total, place.world_size).item() / self.eval_batches
