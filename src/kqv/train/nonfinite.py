"""The non-finite guard's verdicts: when a run stops because its numbers stopped being finite, and what it says.

The Trainer skips an update whose loss or gradient norm is NaN or infinite (the weights and the optimizer state
stay as they were), counts it as `bad_steps` in metrics.jsonl, and after `TrainConfig.max_bad_steps` such updates
in a row raises `TrainingDiverged` with `diverged_message`. A checkpoint is written only from a state that passed
the guard: never while updates are being skipped (the weights then are the ones whose loss or gradient was not
finite, e.g. after an update at a far too high learning rate; the last good checkpoint stays), and never with a
non-finite weight (`check_finite_weights`: finite gradients can still overflow them). A finite loss however large
is not treated as bad: no threshold fits every loss, and skipping on one would change the numbers of runs that
recover by themselves.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..errors import ConfigTypeError, KqvError, spoken
from ..nn.devices import Accelerator
from .config import TrainConfig
from .metrics import append_metrics
from .precision import resolve_precision

if TYPE_CHECKING:
    from .trainer import Trainer

_PRECISION_CAUSES = {
    "bf16": "bf16 autocast (fp32's exponent range but an 8-bit significand: large logits or attention scores lose "
    'precision; try precision = "fp32" to rule it out)',
    "fp16": "fp16 autocast (its largest value is 65504: activations or scores beyond it overflow even with the "
    'gradient scaler; try precision = "bf16" where the GPU has it, or "fp32")',
    "fp32": "fp32 itself (a value beyond 3.4e38, e.g. from activations growing without bound)",
}


logger = logging.getLogger("kqv.train.trainer")  # the trainer's voice


class TrainingDiverged(KqvError, RuntimeError):
    """Training stopped because the loss, the gradients or the weights stopped being finite."""


def diverged_message(config: TrainConfig, what: str, steps: list[int], checkpoint: tuple[Path, int] | None) -> str:
    """Why training stopped after the consecutive skipped updates `steps`, where to resume, and the usual causes."""
    saved = "no checkpoint was written in this session"
    precision = resolve_precision(config.precision, Accelerator.resolve(config.device))
    if checkpoint is not None:
        saved = (
            f"the last good checkpoint is {checkpoint[0]} (step {checkpoint[1]}, the last one before the skipped "
            f"updates began; none is written while updates are skipped)"
        )
        if checkpoint[1] == steps[0] - 1:  # its weights gave the first non-finite loss: maybe they are the cause
            saved += " -- it holds the weights of the update just before them, which may be what broke"
    return (
        f"training stopped at step {steps[-1]}: {what}, and the loss or gradient has not been finite for "
        f"{len(steps)} updates in a row (steps {steps[0]}-{steps[-1]}; none of them changed the weights); "
        f"{saved}. Usual causes: a learning rate too high (lr = {config.lr:g}, warmup_steps = "
        f"{config.warmup_steps}: lower lr or lengthen warmup), the range of "
        f"{_PRECISION_CAUSES[precision]}, or bad input data. Resume from the checkpoint "
        f"({spoken('`--resume`', 'if_exists=' + repr('resume'))}) after changing the config, or raise "
        f"train.max_bad_steps (now {config.max_bad_steps}) to skip more."
    )


def check_finite_weights(
    model: nn.Module | dict[str, Tensor], config: TrainConfig, step: int, last_saved: int | None
) -> None:
    """Raise TrainingDiverged instead of letting a checkpoint save NaN or infinite weights (of a model, or of a
    state dict gathered from shards)."""
    named = model.items() if isinstance(model, dict) else model.named_parameters()
    bad = [name for name, param in named if param.is_floating_point() and not torch.isfinite(param).all()]
    if bad:
        raise TrainingDiverged(
            f"training stopped at step {step}: the weights {bad[:5]} are no longer finite, so no "
            f"checkpoint was written (the last good one is step {last_saved}); lower the "
            f'learning rate (lr = {config.lr:g}) or use precision = "fp32"'
        )


def warn_skipped(step: int, loss: float, grad_norm: float, streak: int, total: int) -> str:
    """Log a skipped update; returns what was not finite, in words."""
    what = f"the loss was {loss}" if not math.isfinite(loss) else f"the gradient norm was {grad_norm}"
    logger.warning("step %d: %s; the update was skipped (%d in a row, %d in the run)", step, what, streak, total)
    return what


def count_skipped(trainer: Trainer, loss: float, grad_norm: float) -> None:
    """Count an update the trainer skipped for a non-finite loss or gradient; stop after max_bad_steps in a row."""
    trainer.bad_steps += 1
    trainer._bad_streak.append(trainer.step)
    what = warn_skipped(trainer.step, loss, grad_norm, len(trainer._bad_streak), trainer.bad_steps)
    if len(trainer._bad_streak) < trainer.config.max_bad_steps:
        return
    if trainer.rank == 0:
        append_metrics(
            trainer.run.metrics_file,
            {"step": trainer.step, "bad_steps": trainer.bad_steps, "stopped": "non-finite loss or gradient"},
        )
    checkpoint = None if trainer._last_saved is None else (trainer.run.checkpoint_dir, trainer._last_saved)
    raise TrainingDiverged(diverged_message(trainer.config, what, trainer._bad_streak, checkpoint))


def warn_withheld(step: int, streak: int, last_saved: int | None) -> None:
    """Log a checkpoint that was due but not written because updates are being skipped."""
    kept = "no checkpoint" if last_saved is None else f"the one of step {last_saved}"
    logger.warning(
        "step %d: no checkpoint written while updates are being skipped (%d in a row); kept %s", step, streak, kept
    )


def check_loss(loss: object) -> Tensor:
    """The scalar a `loss_fn` returned, shaped (); a ConfigTypeError for anything else."""
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
        raise ConfigTypeError(f"loss_fn must return a scalar tensor (the mean loss of the batch), got {shape}")
    return loss.reshape(())
