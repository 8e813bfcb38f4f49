"""A budgeted run's session as the Trainer lives it (`kqv.train.budget` plans; this applies): the updates timed
(not those during which torch.compile compiled), the plan fixed after the timed ones, and, once fixed, the pace
watched at log intervals and the plan cut when the run would overrun its budget, or extended when it would leave
much of it unused. Rank 0 decides; every rank receives the steps at the same update."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist

from . import distributed
from .budget import Plan, Planner, Watch, announcement, replanned_announcement
from .compiling import compilations
from .metrics import append_metrics


def agreed_steps(plan: Plan | None, world_size: int) -> int:
    """Rank 0's plan's steps on every rank (every rank must call it); 0 where rank 0 has no new plan."""
    steps = torch.tensor(plan.steps if plan else 0)
    if world_size > 1:
        dist.broadcast(steps, src=0)
    return int(steps)


class Pacing:
    """One session's planner (before the plan) and watch (after it), for `trainer` (a `kqv.train.Trainer`)."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        config, plan = trainer.config, trainer.plan
        self.planner = Planner.for_session(config, trainer.step, plan, trainer.options.work_after_training)
        self.watch = Watch.for_session(config, plan)

    def due(self, step: int, compiled: bool) -> bool:
        """Whether the plan is fixed after update `step`, which `compiled` something or not (the window is then
        read). From the earliest update the plan may come at, rank 0 says for every rank: a rank's compilations
        are its own."""
        if self.planner is None or step < self.planner.plan_step:
            return False
        return distributed.rank0_says(self.planner.due(step, compiled), self.trainer.world_size)

    def after_update(self, seconds: float, compiled: bool, planning: bool, read: bool, run_start: float) -> None:
        """Note the update's `seconds` (not timed when it `compiled` something); fix the plan when `planning`, or
        look at the pace when the window was `read` at a log interval."""
        trainer = self.trainer
        if self.planner is not None:
            self.planner.timed(trainer.step, seconds, compiled)
        if self.watch is not None:
            self.watch.timed(seconds, compiled)
        if planning:
            self.fix(run_start)
            self.planner, self.watch = None, Watch.for_session(trainer.config, trainer.plan)
        elif self.watch is not None and read and self.watch.due(trainer.step, trainer.steps):
            self.replan(run_start)

    def evaluated(self, seconds: float) -> None:
        """Note that a periodic evaluation took `seconds` (the watch then predicts the plan's with their mean)."""
        if self.watch is not None:
            self.watch.evaluated(seconds)

    def fix(self, run_start: float) -> None:
        """Time one evaluation and one checkpoint, ask the planner for the plan (rank 0; the others receive its
        steps) and apply it: the state's plan, recorded in a checkpoint and in metrics.jsonl, and said to the
        reporter."""
        trainer = self.trainer
        metrics, eval_s = self.timed_evaluation()
        evaluated = trainer.clock()
        trainer.save_checkpoint()
        now = trainer.clock()
        made = self.planner.plan(trainer.step, now - run_start, eval_s, now - evaluated)
        plan = made if trainer.rank == 0 else None
        self.apply(agreed_steps(plan, trainer.world_size), plan, "plan", run_start, metrics)
        trainer.save_checkpoint()  # the plan, recorded at once
        if plan is not None:
            trainer.report(announcement(plan))

    def timed_evaluation(self) -> tuple[dict, float]:
        """One evaluation's metrics and seconds (with its loss plot); evaluated again, the same metrics, when the
        first compiled something (FSDP's blocks compiled in place), so that its seconds are an evaluation's."""
        trainer = self.trainer
        for _ in range(2):
            started, compiling = trainer.clock(), compilations()
            metrics = trainer.evaluate() if trainer.evaluator.evaluates else {}
            if trainer.rank == 0 and trainer.run.metrics_file.exists():
                trainer.redraw_plot()
            if not distributed.rank0_says(compilations() != compiling, trainer.world_size):
                break
        return metrics, trainer.clock() - started

    def replan(self, run_start: float) -> None:
        """At a log interval after the plan: rank 0 asks the watch whether the pace since its last look still ends
        within the budget, and every rank applies the steps of a new plan, said and recorded in metrics.jsonl."""
        trainer = self.trainer
        plan = self.watch.check(trainer.step, trainer.clock() - run_start) if trainer.rank == 0 else None
        self.watch.restart()  # on every rank, so that all look again at the same update
        steps, was = agreed_steps(plan, trainer.world_size), trainer.plan
        if steps:
            self.apply(steps, plan, "replan", run_start)
            self.watch.follow(trainer.plan)
            if plan is not None:
                trainer.report(replanned_announcement(plan, was))

    def apply(self, steps: int, plan: Plan | None, key: str, run_start: float, metrics: dict | None = None) -> None:
        """The trainer's plan (`TrainState.plan`, whence its steps) takes `steps`: rank 0's `plan`, recorded under
        `key` in metrics.jsonl; on the other ranks, the steps alone."""
        trainer = self.trainer
        trainer.state.plan = asdict(plan) if plan else {**(trainer.plan or {}), "steps": steps}
        if plan is not None:
            record = {"step": trainer.step, **(metrics or {}), key: trainer.plan}
            record.update(train_seconds=trainer.state.train_seconds, elapsed_s=trainer.clock() - run_start)
            append_metrics(trainer.run.metrics_file, record)
