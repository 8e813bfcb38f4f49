"""One training loop for every kqv model: language models, machine translation, classification.

The trainer knows nothing about models or data. It is given any `nn.Module` and two functions:

* `train_batches(i)` returns the i-th micro-batch of training data (a tensor, a tuple/list/dict of tensors, or
  anything `loss_fn` understands);
* `loss_fn(model, batch)` returns the scalar loss of a batch,

and does the rest: AdamW with weight-decay groups, linear warmup then cosine decay (or inverse-sqrt, or constant),
gradient clipping and accumulation, bf16 autocast, periodic validation, metrics and a loss plot, atomic
checkpoints that resume bit-exactly (also to more steps than first planned: see `kqv.train.config.replan`), a
checkpoint on Ctrl-C or SIGTERM (`kqv.signals`), updates with a non-finite loss or gradient skipped and counted
(`kqv.train.nonfinite`), the run directory locked against a second writer (`kqv.train.rundir`), and multi-process
training under torchrun (below).

No host sync between log records. An update (`kqv.train.update`) leaves its loss, gradient norm and the
non-finite guard's verdict on the device; the trainer reads them all at once (`Window.read`) only when a log
record, an evaluation, a checkpoint, a budget's plan or the end is due, so on a GPU Python never waits for the
device in between. A run that diverges (`max_bad_steps` bad updates in a row) has its weights frozen on the device
at once and stops with `TrainingDiverged` at that next read. Its progress (step, times, bad steps, plan) is one
`kqv.train.state.TrainState`, saved in every checkpoint and restored by a resume.

Determinism contract. `train_batches(i)` must return the same batch for the same `i`. Update `s` (0-based) uses
the micro-batches `s * grad_accum + j` for `j` in `range(grad_accum)`, so a resumed run needs no data-loader
state: it asks for the batches of the next step. The random generators (torch, `random`, numpy) are seeded at
the start of a fresh run and saved in every checkpoint, so dropout continues exactly too. Evaluation runs on a
saved-and-restored generator state, so how often you evaluate never changes the training run.

Multi-process training. Launch the same script with `torchrun --nproc_per_node N script.py`. When WORLD_SIZE > 1
the trainer joins a process group (gloo; NCCL for CUDA tensors) and wraps the model in DistributedDataParallel,
or with `parallel="fsdp"` trains a sharded copy of it, each rank holding only its shard (`kqv.train.sharding`: ranks
other than 0 may pass a model on the meta device, or a function that builds it; each rank writes its own shards of a
checkpoint: `kqv.train.shards`). Every rank calls
`train_batches(i)` and gets the same global batch (of `batch_size` rows, or fewer: a token budget's); of its n rows
rank r keeps rows `[r * n // N, (r + 1) * n // N)` of every tensor in it (non-tensor items are shared), its loss
weighted by its share of the batch's `loss_terms` (`kqv.train.distributed.share`; a batch function may make only
those rows itself and return them as `distributed.OwnRows`), so the batch function is the
same for one or N processes and the result equals one process up to float rounding. `loss_fn`
receives the wrapped model and must call it (its `forward`) for gradients to be synchronised. Only rank 0
writes files and shows progress.

Files in `run_dir`: `metrics.jsonl` (one JSON object per log or evaluation step; with mixture-of-experts layers a
log record also holds `aux_loss`, `dropped_fraction` and each layer's `expert_load` of the last training batch),
`loss.png`, `checkpoint/` (`kqv.train.checkpoints`), and where `train.loggers` asks, the same records as TensorBoard
events, a CSV table or a W&B run (`kqv.train.loggers`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import ConfigError, ConfigTypeError
from ..nn.devices import Accelerator
from ..nn.training import step_figures
from ..signals import deferred
from . import distributed
from .budget import planned_steps, resumed_plan, time_left
from .checkpoints import Checkpoint, read_checkpoint
from .compiling import compilations, training_module
from .config import TrainConfig, learning_rate, replan
from .evaluator import Evaluator
from .events import Evaluation, Message, Progress
from .flops import model_flops_per_token, utilisation
from .metrics import Pace, Window, format_duration, plot_losses
from .nonfinite import NonFiniteGuard, TrainingDiverged, diverged_message, warn_withheld
from .optimizer import make_optimizer
from .options import TrainerOptions
from .pacing import NewPlan, PacedSession, Pacing
from .placement import place_model
from .precision import MixedPrecision
from .reporter import Reporter
from .rng import rng_state, start_generators
from .rundir import RunDirectory
from .saving import Checkpointer
from .sharding import gather_to_rank0
from .state import TrainState
from .topology import Topology
from .update import Updater


class Trainer:
    """Trains `model` (an `nn.Module`, or a function without arguments that builds it) as `config` says, into
    `run_dir`, on the batches and loss of its `options` (`TrainerOptions`: `train_batches` and `loss_fn`, and as
    needed validation, `eval_fn`, `extra_state`, ...; from Python given as keywords, `Trainer(model, config, run_dir,
    train_batches=..., loss_fn=...)`); see the module docstring for the contracts.

    `run_dir` is a `RunDirectory` its caller opened (a job does, to write its data under the same lock), with the
    `topology` of this process, or a path: then the trainer opens it itself (`RunDirectory.open`, holding the
    writer's lock until train() returns) for this process as torchrun's environment says (`Topology.of_process`,
    the one default, at this public entry), doing what `options.if_exists` says when it already holds a run
    ("resume" continues its checkpoint with the `config` given here).

    The Trainer decides where it trains once (its `placement`: device, precision, processes, the model on them) and
    hands it whole to the parts that read it: its checkpoints (`Checkpointer`), evaluation (`Evaluator`) and updates
    (`Updater`). It trains to `steps`, read from its one plan: its state's (a budget's, once fixed, or a resume's),
    or else `config.steps`.
    """

    resumed_from: int | None = None  # the update a resumed run's checkpoint was taken after (`_resume`)

    def __init__(
        self,
        model: nn.Module | Callable[[], nn.Module],
        config: TrainConfig,
        run_dir: RunDirectory | str | Path,
        options: TrainerOptions | None = None,
        **given: Any,  # the fields of `TrainerOptions` one by one, instead of or over `options`
    ):
        if not isinstance(config, TrainConfig):
            raise ConfigTypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        config.check_installed()  # a logger's missing package: said before anything is placed or written
        self.options = options = TrainerOptions.of(options, given)
        # where it trains (`kqv.train.placement`); under FSDP `callers_model` is released by the shard
        topology = run_dir.topology if isinstance(run_dir, RunDirectory) else Topology.of_process()  # see above
        self.placement = place_model(model, config, topology, options.saved_weights)
        self.config = config  # as given: its steps are the upper bound of a budget's plan (`steps`)
        self.flops_per_token = model_flops_per_token(self.model)  # for MFU, against the device's peak (if known)
        self.extra_state = {} if options.extra_state is None else options.extra_state  # this very dict
        self.clock = options.clock or time.perf_counter
        self.report = options.reporter or Reporter(options.quiet or self.rank != 0)  # rank 0 speaks for every process
        self.optimizer = make_optimizer(self.model, config)
        self.state = TrainState()  # progress and plan: saved in every checkpoint and restored by a resume
        self.guard = NonFiniteGuard(config.max_bad_steps, self.device.device)
        self.replanned: dict[str, Any] | None = None  # the metrics record of a resume that changed the plan
        # The loop's state: generators and where an interrupt may save.
        self._saved_rng: list[dict | None] | None = None  # generator states of a resumed run, per rank
        self._boundary_rng: dict[str, Any] | None = None  # generator state after the last completed update
        self._mark: Any = None  # the device's queue after the last completed update (`distributed.update_mark`)
        self._left: float | None = None  # the estimated seconds of training left, after the last update
        self._owned = ExitStack()  # a run directory this trainer opens itself (given a path), closed after train()
        self.run = self._open(run_dir, topology)
        self.run_dir = self.run.path
        self.checkpoints = Checkpointer(self.run, self.placement, self.optimizer, options.saved_weights)
        try:
            distributed.agree_on_checkpoint(self.run.checkpoint, self.run.path, self.world_size)
            if self.run.checkpoint is not None:
                self._resume(self.run.checkpoint)
        except BaseException:  # e.g. the checkpoint does not fit the model: release what this trainer opened
            self._owned.close()
            raise
        # forward and backward: in DDP under several processes, compiled with train.compile (kqv.train.compiling)
        said = lambda text: self.report(Message(text))  # each graph compiled, a line of the run's output
        self.ddp_model = training_module(self.model, self.world_size, self.placement.sharded, config.compile, said)
        self.evaluator = Evaluator(self.placement, options, config.eval_batches)
        self.updater = Updater(config, self.placement, self.optimizer, self.guard, options)

    def _open(self, run_dir: RunDirectory | str | Path, topology: Topology) -> RunDirectory:
        """The run directory: the job's, or one this trainer opens itself for `topology` and closes after train()."""
        if isinstance(run_dir, RunDirectory):
            return run_dir
        return self._owned.enter_context(RunDirectory.open(run_dir, self.options.if_exists, topology=topology))

    @classmethod
    def resume(
        cls,
        run_dir: str | Path,
        model: nn.Module | Callable[[], nn.Module],
        options: TrainerOptions | None = None,
        *,
        config: TrainConfig | None = None,
        **given: Any,
    ) -> Trainer:
        """Continue the run saved in `run_dir`. `config=None` uses the saved config; pass one to change it (e.g.
        more steps: the schedule is replanned, `kqv.train.config.replan`). `extra_state` is restored from the
        checkpoint unless given. A missing or damaged checkpoint is a RunError that says which file and what to do.
        `options` and `given` are the Trainer's (`train_batches` and `loss_fn` among them)."""
        saved = read_checkpoint(run_dir)
        saved.close()
        return cls(model, config or saved.config, run_dir, options, **given, if_exists="resume")

    # -- where it trains (`placement`), as its owner shows it ----------------------------------------------------

    @property
    def model(self) -> nn.Module:
        """The model trained: the caller's on the device, or under FSDP this process's shard of it."""
        return self.placement.model

    @property
    def callers_model(self) -> nn.Module:
        """The caller's model (under FSDP released by the shard, and given the trained weights on rank 0 at the end)."""
        return self.placement.callers_model

    @property
    def device(self) -> Accelerator:
        return self.placement.device

    @property
    def precision(self) -> MixedPrecision:
        return self.placement.precision

    @property
    def rank(self) -> int:
        return self.placement.rank

    @property
    def world_size(self) -> int:
        return self.placement.world_size

    # -- the state, as its owner shows it ------------------------------------------------------------------------

    @property
    def step(self) -> int:
        """Updates done."""
        return self.state.step

    @property
    def bad_steps(self) -> int:
        """Updates skipped by the non-finite guard over the whole run (as last read from the device)."""
        return self.state.bad_steps

    @property
    def plan(self) -> dict[str, Any] | None:
        """A budgeted run's plan, once fixed (`kqv.train.budget`), or a resume's that changed its steps."""
        return self.state.plan

    @property
    def steps(self) -> int:
        """The updates this run trains to: its plan's, or else `config.steps` (`kqv.train.budget.planned_steps`)."""
        return planned_steps(self.config, self.state.plan)

    def planned_config(self) -> TrainConfig:
        """`config` with the plan's `steps`: what a checkpoint records, so that a resume with it replays the plan."""
        return replace(self.config, steps=self.steps)

    @property
    def elapsed_s(self) -> float:
        return self.state.elapsed_s

    @property
    def train_seconds(self) -> float:
        return self.state.train_seconds

    # -- the loop ------------------------------------------------------------------------------------------------

    def train(self) -> dict[str, float]:
        """Train until `steps` updates are done; returns the metrics of the last step.

        On Ctrl-C or SIGTERM it saves a checkpoint of the last completed update and re-raises (KeyboardInterrupt,
        or `kqv.signals.Terminated`), so a resume continues from there. An update whose loss or gradient is not
        finite is skipped (counted as `bad_steps` in metrics.jsonl); `config.max_bad_steps` of them in a row raise
        TrainingDiverged, whose message says where the last good checkpoint is. A run directory the trainer opened
        itself (it was given a path) stays locked against other writers until train() returns."""
        with self._owned:  # a run directory the trainer opened itself is released at the end
            self._prepare_run_dir()
            self._start_rng()
            try:
                with distributed.stops_when_a_process_is_lost(self.rank, self.world_size):
                    return self._loop()
            finally:
                self._leave_process_group()

    def _prepare_run_dir(self) -> None:
        """Rank 0, before its first write: the earlier run's files go (overwrite), and so do the metrics records
        after the checkpoint; a resume that changed the plan says so in metrics.jsonl."""
        if self.rank != 0:
            return
        self.run.prepare(self.step, self.config.loggers)  # its loggers opened: they continue from this step
        if self.replanned is not None:
            self.run.log(self.replanned)

    def _leave_process_group(self) -> None:
        """DDP's reducer lets go of the group first, so that it goes now, after `distributed.settle`."""
        if self.placement.owns_process_group:
            self.ddp_model = self.model
            self.placement.leave_process_group()

    def _loop(self) -> dict[str, float]:
        """Updates from `self.step` to the end of the plan (or of the time budget), logging, evaluating and
        checkpointing on the way. The window is read (one host sync) only when one of them is due."""
        self.ddp_model.train()
        self._pace = Pace(self.clock, self.step)
        pacing = Pacing(self._paced_session(), self.state)  # a budget's plan, fixed and then kept (kqv.train.pacing)
        window = Window()
        run_start = self.clock() - self.state.elapsed_s
        result: dict[str, float] = {"step": self.step}
        try:
            while self.step < self.steps:
                started, compiling = self.clock(), compilations()
                lr = learning_rate(self.config, self.step + 1, self.steps)
                outcome = self.updater(self.ddp_model, self.step, lr)
                with deferred():  # a signal waits for the update and the counter: an interrupt saves a completed step
                    self.updater.apply(outcome)
                    self.state.step += 1
                    self._boundary_rng = rng_state()
                    self._mark = distributed.update_mark(self.device.device, self.world_size)  # its kernels queued
                window.add(self.step, outcome.loss, outcome.grad_norm, outcome.good, outcome.tokens)
                compiled = compilations() != compiling  # then its seconds are not training's (kqv.train.budget)
                planning = pacing.due(self.step, compiled, self.state.elapsed_s)  # the last update's
                read = self._due() or planning
                if read:
                    self._read(window)  # the one sync: inside the update's time, which it waited for
                now = self.clock()
                window.time(now - started)
                self.state.elapsed_s, self.state.train_seconds = (
                    now - run_start,
                    self.state.train_seconds + now - started,
                )
                self._adopt(pacing.after_update(self.state, now - started, compiled, planning, read, run_start))
                last = self.step == self.steps or self._out_of_time(read)
                if last and not read:
                    self._read(window)
                result = self._log(lr, window, run_start, last, pacing) or result
                if self.step % self.config.checkpoint_every == 0 or last:
                    self._checkpoint_if_good(final=last)
                self.report(self._progress(result, run_start))
                if last:
                    break
        except KeyboardInterrupt:
            with deferred():  # a second Ctrl-C waits until the save is done and said
                self._save_after_interrupt(window, run_start)
            raise
        finally:
            self.updater.close()
            self.report.close()
        if self.placement.sharded:  # the caller's model holds the trained weights, on rank 0 (kqv.train.sharding)
            gather_to_rank0(self.callers_model, self.model, self.placement.topology, self.device.device)
        distributed.settle(self.world_size)
        return result

    def _paced_session(self) -> PacedSession:
        """What a budget's pacing reads of this session: it times an evaluation (with its plot) and a checkpoint."""
        evaluate = self.evaluate if self.evaluator.evaluates else dict  # one evaluation's metrics, or none
        place = (self.config, self.placement.topology, self.clock, self.run.metrics_file, self.run.log)
        return PacedSession(*place, self.options.work_after_training, evaluate, self.redraw_plot, self.save_checkpoint)

    def _adopt(self, new: NewPlan | None) -> None:
        """Take pacing's new plan into the state (whence `steps`): the session's first recorded in a checkpoint at
        once, and each said."""
        if new is None:
            return
        self.state.plan = new.plan
        if new.fixed:
            self.save_checkpoint()  # the plan, recorded at once
        if new.said is not None:
            self.report(new.said)

    def _due(self) -> bool:
        """Whether a log record, an evaluation, a checkpoint or the end is due after this update: then the window
        is read."""
        cfg, step = self.config, self.step
        evaluates = self.evaluator.evaluates and step % cfg.eval_every == 0
        return step == self.steps or step % cfg.log_every == 0 or step % cfg.checkpoint_every == 0 or evaluates

    def _read(self, window: Window) -> None:
        """Read the updates since the last read from the device (one sync) and account for the guard's verdicts:
        skipped updates counted, and TrainingDiverged after `max_bad_steps` in a row."""
        verdict = self.guard.verdict(*window.read())
        self.state.bad_steps += verdict.skipped
        if verdict.diverged_at is None:
            return
        if self.rank == 0:
            stopped = {"step": verdict.diverged_at, "bad_steps": self.state.bad_steps}
            self.run.log({**stopped, "stopped": "non-finite loss or gradient"})
        checkpoint = (
            None if self.checkpoints.last_saved is None else (self.run.checkpoint_dir, self.checkpoints.last_saved)
        )
        raise TrainingDiverged(diverged_message(self.config, verdict.what, verdict.streak, checkpoint))

    def _out_of_time(self, read: bool) -> bool:
        """Whether `max_minutes` of training time have passed. With several processes rank 0's clock decides for
        all, asked only after an update whose window was `read` (a log interval, an evaluation or a checkpoint),
        where the processes wait for each other anyway: a broadcast every update would hold them in lockstep."""
        limit = self.config.max_minutes
        if limit <= 0 or (self.world_size > 1 and not read):
            return False
        return distributed.rank0_says(self.state.train_seconds >= limit * 60, self.world_size)

    def _progress(self, record: dict[str, Any], run_start: float) -> Progress:
        """The event after an update, with the time left at this session's pace (`record`: the last log record;
        `run_start`: the clock's reading at the run's start)."""
        elapsed = self.state.elapsed_s = self.clock() - run_start  # the run's minutes, as its last line says them
        step_s = self._pace.step_seconds(self.step)
        self._left = time_left(self.config, self.plan, self.step, elapsed, self.train_seconds, step_s)
        figures = {key: record.get(key) for key in ("train_loss", "lr", "tokens_per_s", "mfu", "peak_memory_mb")}
        return Progress(self.step, self.steps, elapsed, self._left, **figures)

    def _log(self, lr: float, window: Window, run_start: float, last: bool, pacing: Pacing) -> dict | None:
        """Log (every `log_every` updates) and evaluate (every `eval_every`, timed for the budget's `pacing`); one
        metrics.jsonl record for both."""
        cfg = self.config
        record: dict[str, Any] = {}
        if (self.step % cfg.log_every == 0 or last) and window.steps:
            record.update(
                train_loss=window.mean_loss(),
                lr=lr,
                tokens_per_s=window.tokens_per_s(),
                grad_norm=window.grad_norm,
                bad_steps=self.bad_steps,
            )
            record.update(self._device_figures(record["tokens_per_s"]))
            record.update(step_figures(self.model))  # the model's own: experts' aux loss, dropped fraction, load
            record.update(self.updater.ahead.take_times())  # host ms per batch made, and waited for
            window.reset()
        can_evaluate = self.evaluator.evaluates
        evaluated = can_evaluate and (self.step % cfg.eval_every == 0 or last)
        if evaluated:
            started = self.clock()
            record.update(self.evaluate())
            pacing.evaluated(self.clock() - started)
        if not record:
            return None
        record = {
            "step": self.step,
            **record,
            "train_seconds": self.train_seconds,
            "elapsed_s": self.clock() - run_start,
        }
        if self.rank == 0:
            self.run.log(record)  # metrics.jsonl, and the same figures to `train.loggers`
            if evaluated or last:
                self.redraw_plot()
            if evaluated:
                self.report(Evaluation(self.step, self.steps, record, self._left))
        return record

    def _peak_flops(self) -> float | None:
        return self.device.peak_flops(self.device.precision(self.config.precision), self.config.tf32)

    def _device_figures(self, tokens_per_s: float | None) -> dict[str, float | None]:
        """A log record's model FLOPs utilisation (None where the device's peak is unknown: the CPU) and the peak
        memory of the device so far (`Accelerator.peak_memory`), both from counters on the host: no sync."""
        peak = self.device.peak_memory()
        return {
            "mfu": utilisation(self.flops_per_token, tokens_per_s, self._peak_flops(), self.world_size),
            "peak_memory_mb": None if peak is None else round(peak / 1e6, 1),
        }

    def evaluate(self) -> dict[str, float]:
        """Validation metrics now: `val_loss` and whatever `eval_fn` returns. Training randomness is untouched."""
        try:
            return self.evaluator(self.model, self.callers_model)
        finally:
            self.ddp_model.train()

    # -- checkpoints ---------------------------------------------------------------------------------------------

    def save_checkpoint(self, final: bool = False) -> None:
        """Save the state after the last completed update (every rank must call this under torchrun); the `final`
        one of a sharded run holds the whole weights too."""
        self.checkpoints.save(self.state, self.planned_config(), self.extra_state, final)

    def _checkpoint_if_good(self, final: bool) -> None:
        """Save a checkpoint that is due, unless the guard is skipping updates: the weights then are the ones
        whose loss or gradient stopped being finite, and the last good checkpoint must stay until a newer one is."""
        if not self.guard.skipping:
            self.save_checkpoint(final)
        else:
            warn_withheld(self.step, len(self.guard.streak), self.checkpoints.last_saved)

    def _save_after_interrupt(self, window: Window, run_start: float) -> None:
        """Rank 0, on Ctrl-C or SIGTERM: save the last completed update, unless the guard was skipping updates.
        Under several processes on GPUs it reads only what that update queued (`distributed.reads_up_to`), never
        what a pending collective of the next one holds, and saves nothing if that update itself is still waiting."""
        if self.rank != 0:
            return
        with distributed.reads_up_to(self._mark) as readable:
            if not readable:
                return
            with suppress(TrainingDiverged):
                self._read(window)  # the updates since the last read: was the last one skipped?
            self.state.elapsed_s = self.clock() - run_start
            saved = self.checkpoints.after_interrupt(
                self.state, self.planned_config(), self.extra_state, self._boundary_rng, self.guard.skipping
            )
        if saved and self.run.metrics_file.exists():
            self.redraw_plot()

    def redraw_plot(self) -> None:
        """Redraw loss.png. A signal waits: one inside the lazy import of matplotlib would leave it half-loaded,
        and the plot after the interrupt would then fail."""
        with deferred():
            plot_losses(self.run.metrics_file, self.run.plot_file)

    def _resume(self, checkpoint: Checkpoint) -> None:
        """Continue `checkpoint`: its weights, optimizer, generators and progress, checked against the new plan."""
        self.state, self._saved_rng = self.checkpoints.load(checkpoint)
        given = dict(self.extra_state)
        self.extra_state.update(checkpoint.extra_state)
        self.extra_state.update(given)  # what was given wins
        self.state.plan = resumed_plan(self.config, self.state.plan, checkpoint.step)
        if self.steps < checkpoint.step:
            raise ConfigError(
                f"the run in {self.run_dir} is already at step {checkpoint.step}, past the {self.steps} "
                f"steps asked for; to continue it, ask for more than {checkpoint.step} steps"
            )
        self.replanned = replan(checkpoint.config, self.planned_config(), checkpoint.step)
        self.resumed_from = checkpoint.step
        elapsed = format_duration(self.state.elapsed_s)
        self.report(
            Message(f"resumed {checkpoint.path} at update {checkpoint.step} of {self.steps}, {elapsed} into the run")
        )

    def _start_rng(self) -> None:
        """Seed a fresh run; restore the saved generators of a resumed one (reseed ranks that have none). This is
        the first update boundary: what a Ctrl-C before the first update saves."""
        start_generators(self.config.seed, self.rank, self._saved_rng, self.step)
        self._boundary_rng = rng_state()
        self.checkpoints.last_saved = self.step if self._saved_rng is not None else None
