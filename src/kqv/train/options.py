"""`TrainerOptions`: what a training hands the Trainer besides its model, config and run directory, as one typed
object. A job's `trainer_options` hook returns one; from Python, `Trainer(model, config, run_dir, train_batches=...,
loss_fn=...)` takes its fields as keywords and builds it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..errors import ConfigError, ConfigTypeError
from .distributed import Batch
from .layout import STATE_FILE
from .reporter import Reporter
from .rundir import IfExists


@dataclass(frozen=True)
class TrainerOptions:
    """The Trainer's batches, loss and evaluation (`kqv.train.trainer` says their contracts), and how its session
    runs.

    `train_batches(i)` gives the i-th micro-batch and `loss_fn(model, batch)` its scalar loss. `val_batches(i)`
    (optional) gives validation batches: every evaluation reports `val_loss`, the mean of `loss_fn` over
    `config.eval_batches` of them. `eval_fn(model)` (optional) returns further metrics (accuracy, BLEU, ...); it runs
    on rank 0 only. Both run under `torch.no_grad()`, `model.eval()` and the training precision. `extra_state` is
    any JSON-serialisable dict saved with every checkpoint (e.g. the model config) and restored by a resume; the
    Trainer keeps this very dict (a resumed run's saved entries are added to it), so whoever made it can update it
    while training, e.g. an `eval_fn`. `tokens_per_batch` sets the token count of a micro-batch for tokens/s, as a
    number or as a function of the micro-batch index (e.g. the real, non-padding tokens of batch i); by default it
    is the numel of the batch tensor or of the first tensor of a tuple/list/dict. `work_after_training`: the job's
    work after training (final test, samples) in evaluations, reserved by a budget's plan (`kqv.train.budget`).
    `saved_weights(state_dict)` (optional) picks the part of the model's state dict its checkpoints hold (default:
    all of it): a LoRA fine-tune saves its adapters alone, its frozen rest being its source's; a resume then loads
    exactly those tensors into the model, whose other weights its caller has set (`partial_loader`).
    `loss_terms(batch)` (optional): how many terms `loss_fn` averages over in a batch (its targets that count, say;
    by default its rows), by which each process's loss is weighted under torchrun (`kqv.train.distributed.share`).

    The session: `if_exists` says what to do when a `run_dir` given as a path already holds a run: "error" (refuse,
    the default), "resume" (continue its checkpoint; start fresh if it is empty) or "overwrite" (delete the run's
    files when training starts). The Trainer prints nothing: its progress and evaluations are events for
    `reporter` (`kqv.train.reporter`; by default one that shows them unless `quiet`). `clock` (default
    `time.perf_counter`) times budgets, progress and metrics.
    """

    train_batches: Callable[[int], Batch]
    loss_fn: Callable[[nn.Module, Batch], Tensor]
    val_batches: Callable[[int], Batch] | None = None
    eval_fn: Callable[[nn.Module], dict[str, float]] | None = None
    extra_state: dict[str, Any] | None = None
    tokens_per_batch: int | Callable[[int], int] | None = None
    work_after_training: float = 0.0
    saved_weights: Callable[[dict[str, Tensor]], dict[str, Tensor]] | None = None
    loss_terms: Callable[[Batch], float] | None = None
    if_exists: IfExists = "error"
    quiet: bool = False
    reporter: Reporter | None = None
    clock: Callable[[], float] | None = None

    def __post_init__(self) -> None:
        if self.if_exists not in IfExists.__args__:
            raise ConfigError(f"if_exists must be one of {list(IfExists.__args__)}, got {self.if_exists!r}")
        check_extra_state(self.extra_state)

    @classmethod
    def of(cls, options: TrainerOptions | None, given: dict[str, Any]) -> TrainerOptions:
        """`options` with the `given` fields changed, or, without `options`, the options of the `given` fields
        alone (`train_batches` and `loss_fn` among them); a ConfigTypeError names an unknown or missing one."""
        if options is not None and not isinstance(options, cls):
            raise ConfigTypeError(f"options must be a TrainerOptions, got {type(options).__name__}")
        fields = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(set(given) - set(fields))
        if unknown:
            raise ConfigTypeError(
                f"the Trainer has no option {', '.join(unknown)}; its options are {', '.join(fields)}"
            )
        if options is not None:
            return dataclasses.replace(options, **given) if given else options
        missing = [name for name in ("train_batches", "loss_fn") if name not in given]
        if missing:
            raise ConfigTypeError(f"the Trainer needs {' and '.join(missing)}: the batches it trains on and their loss")
        return cls(**given)


def check_extra_state(extra_state: dict[str, Any] | None) -> None:
    """ConfigTypeError unless `extra_state` can go into a checkpoint's state.json."""
    try:
        json.dumps(extra_state)
    except (TypeError, ValueError) as error:
        raise ConfigTypeError(f"extra_state must be JSON-serialisable (it goes into {STATE_FILE}): {error}") from None


def check_loss(loss: object) -> Tensor:
    """The scalar a `loss_fn` returned, shaped (): its contract (`TrainerOptions.loss_fn`), checked at every call
    by the update and the evaluation; a ConfigTypeError for anything else."""
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
        raise ConfigTypeError(f"loss_fn must return a scalar tensor (the mean loss of the batch), got {shape}")
    return loss.reshape(())
