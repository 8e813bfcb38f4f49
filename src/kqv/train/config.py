"""How to train: the validated `TrainConfig` and the learning-rate schedule it describes."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from ..errors import ConfigError
from ..nn.devices import check_device_name
from ..validation import Config, check_at_least, check_positive, check_seed
from .loggers import check_installed, check_names
from .metrics import FIRST_UPDATES
from .precision import Precision

logger = logging.getLogger(__name__)

Schedule = Literal["cosine", "inverse_sqrt", "constant"]
Parallel = Literal["ddp", "fsdp"]  # how processes under torchrun share the model: replicated, or sharded


@dataclass
class TrainConfig(Config):
    """How to train: schedule, optimizer, precision and how often to log, evaluate and checkpoint.

    `batch_size` is the number of rows of one micro-batch returned by `train_batches` (the global batch, before
    it is split across processes); one update sees `batch_size * grad_accum` rows. `schedule`: "cosine" warms up
    linearly for `warmup_steps` then decays to `min_lr_ratio * lr`; "inverse_sqrt" is Vaswani et al. 2017's
    d^-0.5 * min(t^-0.5, t * warmup^-1.5) scaled so its peak is `lr` (it ignores `min_lr_ratio`); "constant"
    warms up and stays at `lr`. `grad_clip=0` disables clipping. Evaluation and checkpoints happen every
    `eval_every` / `checkpoint_every` updates and always after the last one. `max_minutes > 0` makes the update
    during which that much training time (evaluation and checkpoints excluded) has passed the last one, for
    comparisons at equal wall-clock budget (under torchrun, the first logged update after it: the processes agree
    at log intervals); the schedule still follows `steps`. `budget_minutes > 0` plans the run
    to that much wall-clock, evaluations, checkpoints and the job's work after training included: the run times its
    first updates (inside the warmup; not those during which torch.compile compiles) and fixes how many updates
    fit, at most `steps`, then runs its whole schedule to that plan, re-planned where the pace after it would
    overrun the budget or leave much of it unused (`kqv.train.budget`; a cosine warmup too short to time updates
    in is refused); with `max_minutes`
    also set, `max_minutes` wins and nothing is planned. An
    update whose loss or gradient is not finite is skipped; `max_bad_steps` of them in a row stop training
    (`TrainingDiverged`). Under torchrun, `parallel` says how the processes share the work: "ddp" (each holds the
    whole model) or "fsdp" (each holds a shard of the weights, gradients and optimizer state); one process ignores
    it, and `collective_timeout_minutes` is how long a collective waits for another process before it fails (the
    process group's timeout, NCCL's watchdog included: torch's default is 30 minutes; rank 0's `eval_fn` runs while
    the others wait, so it must take less). `device` is where the model trains (`kqv.nn.devices.Accelerator`: a
    device this machine lacks is a ConfigError when training starts); `tf32` lets a CUDA GPU run the products
    autocast leaves in fp32 on TF32 tensor cores, as nanoGPT and Lightning do (10-bit significands, within fp32's
    range). `compile` runs forward and backward through `torch.compile` (`kqv.train.compiling`: the whole model, or
    each block under FSDP): the first steps pay for compiling, later ones run fused kernels, which pays on GPUs
    (docs/devices.md says what each costs); "auto" compiles where the device's kernels say it pays (CUDA GPUs:
    `kqv.nn.devices.Kernels.compiled_training`), not on the CPU. `tokens_per_update > 0` fixes the tokens of one
    update whatever the number of processes: `batch_size` is then the rows each process holds (its device's
    share), and `grad_accum` is derived from both (`per_update`), so a config runs unchanged on 1 or 8 GPUs.
    Compiled or not, checkpoints are the same files; with dropout, inductor draws its own random numbers, so a
    compiled run follows the same distribution as an uncompiled one, not the same masks. `loggers` hands the
    metrics.jsonl records to TensorBoard ("tensorboard": `RUN/tensorboard/`), a table ("csv": `RUN/metrics.csv`) or
    Weights & Biases ("wandb"), at the same steps, from rank 0 (`kqv.train.loggers`).
    """

    steps: int
    batch_size: int
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    schedule: Schedule = "cosine"
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    grad_accum: int = 1
    precision: Precision = "bf16"  # or "fp32", "fp16" (GPUs), or "auto": see kqv.nn.devices.Accelerator.precision
    device: str = "auto"  # "cpu", "cuda", "cuda:N", "mps", or "auto": a CUDA GPU, then Apple silicon, then the CPU
    tf32: bool = True  # fp32 matrix products on TF32 tensor cores (CUDA GPUs from Ampere on; nothing elsewhere)
    eval_every: int = 100
    eval_batches: int = 20
    checkpoint_every: int = 500
    seed: int = 0
    log_every: int = 10
    max_minutes: float = 0.0
    budget_minutes: float = 0.0  # plan the number of updates (at most `steps`) to this wall-clock (kqv.train.budget)
    max_bad_steps: int = 5  # updates in a row skipped for a non-finite loss or gradient before training stops
    compile: bool | Literal["auto"] = "auto"  # forward and backward through torch.compile; "auto": on CUDA GPUs
    tokens_per_update: int = 0  # > 0: batch_size is each process's rows, grad_accum follows (`per_update`)
    parallel: Parallel = "ddp"  # under torchrun: "ddp" replicates the model, "fsdp" shards it (kqv.train.sharding)
    collective_timeout_minutes: float = 10.0  # under torchrun: a collective waiting longer for a process fails
    loggers: tuple[str, ...] = ()  # where the metrics go besides metrics.jsonl: "tensorboard", "csv", "wandb"

    def check(self) -> None:
        for name, minimum in (
            ("steps", 1),
            ("batch_size", 1),
            ("warmup_steps", 0),
            ("grad_accum", 1),
            ("eval_every", 1),
            ("eval_batches", 1),
            ("checkpoint_every", 1),
            ("log_every", 1),
            ("max_bad_steps", 1),
            ("tokens_per_update", 0),
        ):
            check_at_least(name, getattr(self, name), minimum)
        check_seed("seed", self.seed)
        check_device_name(self.device)
        check_names(self.loggers)
        if self.precision == "fp16" and self.device == "cpu":
            raise ConfigError("precision 'fp16' is for GPUs; on the CPU use 'bf16', 'fp32' or 'auto'")
        if self.max_minutes < 0:
            raise ConfigError(f"max_minutes must be >= 0 (0 = no time limit), got {self.max_minutes}")
        self.check_budget()
        check_positive("lr", self.lr)
        check_positive("collective_timeout_minutes", self.collective_timeout_minutes)
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min_lr_ratio must be in [0, 1] (the final lr over the peak), got {self.min_lr_ratio}")
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be non-negative, got {self.weight_decay}")
        if self.grad_clip < 0:
            raise ConfigError(f"grad_clip must be non-negative (0 disables clipping), got {self.grad_clip}")
        if not all(0 <= beta < 1 for beta in self.betas):
            raise ConfigError(f"betas must lie in [0, 1), got {self.betas}")

    def check_installed(self) -> None:
        """ConfigError, before any training, when a package that training needs here is missing (a logger's:
        `kqv.train.loggers`). Not part of `check`: a run trained with TensorBoard still loads where it is missing."""
        check_installed(self.loggers)

    def per_update(self, context: int, processes: int) -> TrainConfig:
        """This config with `tokens_per_update` spent: the global micro-batch `batch_size * processes` rows and
        `grad_accum` the whole number of them closest to `tokens_per_update` tokens of `context` (at least one);
        itself when `tokens_per_update` is 0. What it resolves to is what run.toml records."""
        if not self.tokens_per_update:
            return self
        rows = self.batch_size * processes
        accumulation = max(1, round(self.tokens_per_update / (rows * context)))
        return replace(self, batch_size=rows, grad_accum=accumulation, tokens_per_update=0)

    def check_budget(self) -> None:
        """A budget is planned inside a cosine warmup, after its first `FIRST_UPDATES` updates (which build kernels)
        and before its end, so a warmup of no more updates than those leaves none to time: refused, never ignored."""
        if self.budget_minutes < 0:
            raise ConfigError(
                f"budget_minutes must be >= 0 (0 = train exactly `steps` updates), got {self.budget_minutes}"
            )
        if self.budget_minutes > 0 and self.max_minutes <= 0 and self.schedule == "cosine":
            if self.warmup_steps <= FIRST_UPDATES:
                raise ConfigError(
                    f"train.budget_minutes plans a cosine schedule inside its warmup, after timing updates there; "
                    f"warmup_steps = {self.warmup_steps} leaves none to time (the first {FIRST_UPDATES} build "
                    f"kernels): raise train.warmup_steps above {FIRST_UPDATES}, or set train.budget_minutes = 0 to "
                    f"train exactly train.steps"
                )


def learning_rate(config: TrainConfig, step: int, steps: int | None = None) -> float:
    """The learning rate of update number `step` (1-based: the first update is step 1) of a run of `steps` updates
    (default `config.steps`; a budget's plan gives its own).

    Warmup rises linearly and reaches `lr` at `step == warmup_steps`; cosine then falls to `min_lr_ratio * lr`
    exactly at `step == steps`.
    """
    peak, warmup = config.lr, config.warmup_steps
    if config.schedule == "inverse_sqrt":
        warmup = max(warmup, 1)
        return peak * min(step / warmup, math.sqrt(warmup / step))
    if step <= warmup:
        return peak * step / warmup
    if config.schedule == "constant":
        return peak
    progress = min((step - warmup) / ((config.steps if steps is None else steps) - warmup), 1.0)  # (0, 1]
    floor = config.min_lr_ratio * peak
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def replan(saved: TrainConfig, config: TrainConfig, step: int) -> dict[str, Any] | None:
    """What resuming a run saved at `step` with `saved`'s plan under `config` means: None when it equals having
    planned `config` from the start, else the metrics record that says where the plans part (also logged).

    Resuming to `steps` equals having planned `steps` from the start exactly when every update already done had the
    learning rate the new plan gives it. That holds for "constant" and "inverse_sqrt" (their rate never depends on
    `steps`), for any schedule while the run is still in its warmup, and whenever `steps` is unchanged. A cosine
    schedule extended after its warmup is recomputed to the new end: the updates still to come follow the cosine of
    the new plan, so the rate jumps back up at the resume point, and the result differs from a run planned that long
    from the start.
    """
    changed = next((t for t in range(1, step + 1) if learning_rate(saved, t) != learning_rate(config, t)), None)
    if changed is None:
        return None
    before, after = learning_rate(saved, step), learning_rate(config, step + 1)
    logger.warning(
        "resuming at step %d with a new plan (%d -> %d steps, %s schedule): updates %d-%d already used the "
        "old plan's learning rates, so this run will differ from one planned for %d steps from the start; "
        "the schedule is recomputed to the new end (lr %.3g at step %d, %.3g at step %d). The constant and "
        "inverse_sqrt schedules extend exactly.",
        step, saved.steps, config.steps, config.schedule, changed, step, config.steps, before, step, after, step + 1,
    )  # fmt: skip
    replanned = {"from_steps": saved.steps, "to_steps": config.steps, "first_differing_step": changed}
    return {"step": step, "schedule_replanned": {**replanned, "lr_before": before, "lr_after": after}}
