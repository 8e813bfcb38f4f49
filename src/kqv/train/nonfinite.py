"""The non-finite guard: an update whose loss or gradient is not finite never reaches the weights, and too many in a
row stop the run with a message that says where to resume and why.

`NonFiniteGuard.decide` judges each update on the device (no host sync: the loss and the gradient norm stay
there), and the optimizer skips a judged-bad update there too (`MixedPrecision.step`: the weights and the optimizer
state stay exactly as they were). After `TrainConfig.max_bad_steps` bad updates in a row the guard halts: every
later update is skipped as well, so the weights stay those of the last good update. The host learns the verdicts
when the trainer reads its window (at the log interval, and before a checkpoint, an evaluation or the end):
`NonFiniteGuard.verdict` replays them, counts the skipped updates (`bad_steps` in metrics.jsonl) and says when the
run diverged, naming the exact steps, so `TrainingDiverged` comes at that read, with `diverged_message`. A
checkpoint is written only from a state that passed the guard: never while updates are being skipped (the weights
then are the ones whose loss or gradient was not finite, e.g. after an update at a far too high learning rate; the
last good checkpoint stays), and never with a non-finite weight (`check_finite_weights`: finite gradients can
still overflow them). A finite loss however large is not treated as bad: no threshold fits every loss, and
skipping on one would change the numbers of runs that recover by themselves.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import IF_EXISTS_RESUME, KqvError, option
from ..nn.devices import Accelerator
from .config import TrainConfig
from .precision import resolve_precision

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


def diverged_message(
    config: TrainConfig, what: str, steps: tuple[int, ...], checkpoint: tuple[Path, int] | None
) -> str:
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
        f"{saved}. {compiled_cause(config, steps, precision)}Usual causes: a learning rate too high "
        f"(lr = {config.lr:g}, warmup_steps = {config.warmup_steps}: lower lr or lengthen warmup), the range of "
        f"{_PRECISION_CAUSES[precision]}, or bad input data. Resume from the checkpoint "
        f"({option(IF_EXISTS_RESUME)}) after changing the config, or raise "
        f"train.max_bad_steps (now {config.max_bad_steps}) to skip more."
    )


def compiled_cause(config: TrainConfig, steps: tuple[int, ...], precision: str) -> str:
    """The likelier cause when a compiled step (`train.compile`) was never finite, from its first update on: at
    warmup's first rate the data and the rate rarely are, the compiled kernels may be (on an Intel AMX Xeon a
    compiled bf16 step gave a NaN gradient from its first update, where the same step uncompiled trained)."""
    device = Accelerator.resolve(config.device)
    compiled = config.compile is True or (config.compile == "auto" and device.kernels.compiled_training)
    if not compiled or steps[0] != 1:
        return ""
    return (
        f"Not finite from the first update of a compiled step ({precision} on {device.type}): the compiled kernels "
        f"are the likelier cause; train once with train.compile = false to tell (it trains the same model). "
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


def warn_skipped(step: int, loss: float, grad_norm: float, streak: int) -> str:
    """Log a skipped update; returns what was not finite, in words."""
    what = f"the loss was {loss}" if not math.isfinite(loss) else f"the gradient norm was {grad_norm}"
    logger.warning("step %d: %s; the update was skipped (%d in a row)", step, what, streak)
    return what


@dataclass
class Verdict:
    """What the guard found in the updates read: how many it skipped, and, when the run diverged, at which step,
    what was not finite and the steps of the streak (then training must stop: `diverged_message`)."""

    skipped: int = 0
    diverged_at: int | None = None
    what: str = ""
    streak: tuple[int, ...] = ()


class NonFiniteGuard:
    """Judges every update on the device, and the host's account of it when the trainer reads the verdicts.

    On the device it keeps the length of the current streak of bad updates and whether it has halted (a streak of
    `max_bad_steps`); on the host, the steps of the current streak as last read (`skipping`)."""

    def __init__(self, max_bad_steps: int, device: torch.device):
        self.max_bad_steps = max_bad_steps
        self.run = torch.zeros((), dtype=torch.int32, device=device)  # bad updates in a row, on the device
        self.halted = torch.zeros((), dtype=torch.bool, device=device)
        self.streak: list[int] = []  # the steps of the current streak, as last read

    def decide(self, loss: Tensor, grad_norm: Tensor, overflowed: Tensor) -> tuple[Tensor, Tensor]:
        """(good, skip) of one update, as device bools, without a sync: `good` when its loss is finite and its
        gradient too (or the gradient scaler overflowed: its skip is no sign of divergence); `skip` when its loss or
        gradient is not finite, or the guard has halted."""
        finite = torch.isfinite(loss) & torch.isfinite(grad_norm)
        good = torch.isfinite(loss) & (torch.isfinite(grad_norm) | overflowed)
        skip = ~finite | self.halted
        self.run = torch.where(good, 0, self.run + 1)
        self.halted = self.halted | (self.run >= self.max_bad_steps)
        return good, skip

    @property
    def skipping(self) -> bool:
        """Whether the last update read was skipped as bad (no checkpoint may be written now)."""
        return bool(self.streak)

    def verdict(self, steps: list[int], good: list[bool], losses: list[float], norms: list[float]) -> Verdict:
        """Replay the verdicts of the updates `steps` (read from the device), warning about each skipped one."""
        verdict = Verdict()
        for step, ok, loss, norm in zip(steps, good, losses, norms):
            if ok:
                self.streak = []
                continue
            verdict.skipped += 1
            self.streak.append(step)
            what = warn_skipped(step, loss, norm, len(self.streak))
            if len(self.streak) >= self.max_bad_steps:
                verdict.diverged_at, verdict.what, verdict.streak = step, what, tuple(self.streak)
                return verdict
        return verdict


def warn_withheld(step: int, streak: int, last_saved: int | None) -> None:
    """Log a checkpoint that was due but not written because updates are being skipped."""
    kept = "no checkpoint" if last_saved is None else f"the one of step {last_saved}"
    logger.warning(
        "step %d: no checkpoint written while updates are being skipped (%d in a row); kept %s", step, streak, kept
    )
