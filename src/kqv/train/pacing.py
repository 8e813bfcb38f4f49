"""A budgeted run's session as the Trainer lives it (`kqv.train.budget` plans; this applies): the updates timed
(not those during which torch.compile compiled), the plan fixed after the timed ones, and, once fixed, the pace
watched at log intervals and the plan cut when the run would overrun its budget, or extended when it would leave
much of it unused. Rank 0 decides; every rank receives the steps at the same update.

`Pacing` is given what it reads of the Trainer's session (`PacedSession`: its config, place among the processes,
clock, metrics file, and the evaluation and checkpoint it times) and, at each update, the Trainer's `TrainState`,
which it reads and never writes: a new plan is returned (`NewPlan`), and the Trainer, the owner of its state,
adopts it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from . import distributed
from .budget import Plan, Planner, Watch, announcement, planned_steps, replanned_announcement
from .compiling import compilations
from .config import TrainConfig
from .events import Event
from .state import TrainState
from .topology import Topology


def agreed_steps(plan: Plan | None, world_size: int) -> int:
    """Rank 0's plan's steps on every rank (every rank must call it); 0 where rank 0 has no new plan."""
    steps = torch.tensor(plan.steps if plan else 0)
    if world_size > 1:
        dist.broadcast(steps, src=0)
    return int(steps)


@dataclass(frozen=True)
class PacedSession:
    """What pacing reads of the Trainer's session: its `config` (the budget; `steps` the upper bound), this
    process among the run's (`topology`), its `clock`, the `metrics_file` plans are recorded in (by `log`, the run
    directory's, which hands them to the run's loggers too), the evaluations of
    work the job does after training (`work_after_training`, reserved in the plan), and what it times before the
    plan: `evaluate` (one evaluation's metrics, empty when the run has none), `redraw_plot` (its loss plot) and
    `save_checkpoint` (of the state as it is)."""

    config: TrainConfig
    topology: Topology
    clock: Callable[[], float]
    metrics_file: Path
    log: Callable[[dict[str, Any]], None]
    work_after_training: float
    evaluate: Callable[[], dict[str, float]]
    redraw_plot: Callable[[], None]
    save_checkpoint: Callable[[], None]


@dataclass(frozen=True)
class NewPlan:
    """A plan pacing hands the Trainer: `plan`, its state's plan from now on (whence its steps); `fixed`, whether it
    is the session's first, which the Trainer records in a checkpoint at once; `said`, rank 0's event about it."""

    plan: dict[str, Any]
    fixed: bool = False
    said: Event | None = None


class Pacing:
    """One session's planner (before the plan) and watch (after it), for a Trainer's `session` that starts at
    `state` (its `TrainState`, read only)."""

    def __init__(self, session: PacedSession, state: TrainState):
        self.session = session
        self.planner = Planner.for_session(session.config, state.step, state.plan, session.work_after_training)
        self.watch = Watch.for_session(session.config, state.plan)

    def due(self, step: int, compiled: bool, elapsed_s: float = 0.0) -> bool:
        """Whether the plan is fixed after update `step`, which `compiled` something or not, `elapsed_s` into the run
        (the window is then read). From the earliest update the plan may come at, and before it at every update
        (under torchrun at log intervals) in case the budget runs out first, rank 0 says for every rank: a rank's
        compilations and clock are its own."""
        if self.planner is None:
            return False
        session = self.session
        early = step < self.planner.plan_step  # only a late plan: the budget mostly spent before the timed updates
        if early and session.topology.world_size > 1 and step % session.config.log_every:
            return False
        return distributed.rank0_says(self.planner.due(step, compiled, elapsed_s), session.topology.world_size)

    def after_update(
        self, state: TrainState, seconds: float, compiled: bool, planning: bool, read: bool, run_start: float
    ) -> NewPlan | None:
        """Note the update's `seconds` (not timed when it `compiled` something), the update `state` is after; fix
        the plan when `planning`, or look at the pace when the window was `read` at a log interval. Returns the
        new plan, if any, for the Trainer to adopt."""
        if self.planner is not None:
            self.planner.timed(state.step, seconds, compiled)
        if self.watch is not None:
            self.watch.timed(seconds, compiled)
        if planning:
            new = self.fix(state, run_start)
            self.planner, self.watch = None, Watch.for_session(self.session.config, new.plan)
            return new
        steps = planned_steps(self.session.config, state.plan)
        if self.watch is not None and read and self.watch.due(state.step, steps):
            return self.replan(state, run_start)
        return None

    def evaluated(self, seconds: float) -> None:
        """Note that a periodic evaluation took `seconds` (the watch then predicts the plan's with their mean)."""
        if self.watch is not None:
            self.watch.evaluated(seconds)

    def fix(self, state: TrainState, run_start: float) -> NewPlan:
        """Time one evaluation and one checkpoint, and ask the planner for the plan (rank 0; the others receive its
        steps), recorded in metrics.jsonl: the plan the Trainer then adopts, records in a checkpoint, and says."""
        session = self.session
        metrics, eval_s = self.timed_evaluation()
        evaluated = session.clock()
        session.save_checkpoint()
        now = session.clock()
        made = self.planner.plan(state.step, now - run_start, eval_s, now - evaluated)
        plan = made if session.topology.rank == 0 else None
        adopted = self.adopted(state, agreed_steps(plan, session.topology.world_size), plan, "plan", run_start, metrics)
        return NewPlan(adopted, fixed=True, said=None if plan is None else announcement(plan))

    def timed_evaluation(self) -> tuple[dict, float]:
        """One evaluation's metrics and seconds (with its loss plot); evaluated again, the same metrics, when the
        first compiled something (FSDP's blocks compiled in place), so that its seconds are an evaluation's."""
        session = self.session
        for _ in range(2):
            started, compiling = session.clock(), compilations()
            metrics = session.evaluate()
            if session.topology.rank == 0 and session.metrics_file.exists():
                session.redraw_plot()
            if not distributed.rank0_says(compilations() != compiling, session.topology.world_size):
                break
        return metrics, session.clock() - started

    def replan(self, state: TrainState, run_start: float) -> NewPlan | None:
        """At a log interval after the plan: rank 0 asks the watch whether the pace since its last look still ends
        within the budget, and every rank gets the steps of a new plan, said and recorded in metrics.jsonl."""
        session = self.session
        plan = self.watch.check(state.step, session.clock() - run_start) if session.topology.rank == 0 else None
        self.watch.restart()  # on every rank, so that all look again at the same update
        steps = agreed_steps(plan, session.topology.world_size)
        if not steps:
            return None
        adopted = self.adopted(state, steps, plan, "replan", run_start)
        self.watch.follow(adopted)
        return NewPlan(adopted, said=None if plan is None else replanned_announcement(plan, state.plan))

    def adopted(
        self, state: TrainState, steps: int, plan: Plan | None, key: str, run_start: float, metrics: dict | None = None
    ) -> dict[str, Any]:
        """The plan the Trainer's state takes (whence its steps): rank 0's `plan`, recorded under `key` in
        metrics.jsonl; on the other ranks, the state's plan with `steps`."""
        adopted = asdict(plan) if plan else {**(state.plan or {}), "steps": steps}
        if plan is not None:
            record = {"step": state.step, **(metrics or {}), key: adopted}
            record.update(train_seconds=state.train_seconds, elapsed_s=self.session.clock() - run_start)
            self.session.log(record)
        return adopted
