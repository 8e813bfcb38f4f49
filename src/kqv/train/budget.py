"""Training planned to a time budget: measure this machine's speed, then fix how many updates fit.

With `train.budget_minutes > 0` a run does not know its number of updates in advance. Each session skips its first
`SKIPPED_UPDATES` updates (the first calls build kernels: compilation, oneDNN primitives) and times the next ones
until `TIMED_UPDATES` of them are timed. An update during which torch.compile compiled something (a graph traced
for new shapes, a backward compiled lazily, a CUDA graph recorded: `kqv.train.compiling.compilations`) is not
timed: its seconds are what compiling cost once, not what training costs, and counted in them a compiled run on a
GPU would plan for updates 30 times slower than they are. So the plan waits for updates that compile nothing, up
to `LATEST_UPDATES` after the skipped ones (and a cosine plan at the latest at the end of its warmup, see below).
After the last timed update it times one evaluation (what `eval_every` costs, and the `work_after_training` reserve
the job asks for: its final test or samples, in evaluations; timed again when it compiled) and one checkpoint write,
and fixes the plan: the most updates, never more than `train.steps`, whose updates, evaluations, checkpoints and
reserve fit in the budget less a `MARGIN`. The planner is pure: it is told the times and returns a `Plan`, which the
Trainer applies (its state's plan, the one place its steps are read from: `planned_steps`). The plan is recorded in
metrics.jsonl (a record with "plan") and in every checkpoint (state.json "plan"); from then on the run is an ordinary
run of that many updates, so its schedule (warmup, cosine or inverse-sqrt) runs to its end.

A budget is a promise, and a machine's pace may change after the plan (another job starts beside it, or finishes;
a recompilation the plan could not wait out ends). So the Trainer keeps timing the updates that compile nothing
(`Watch`) and, at log intervals with at least `TIMED_UPDATES` updates timed since the last look, asks whether the
rest of the plan, at the pace just measured (its evaluations slowed alike, never counted faster), still ends
within the budget; if not, it re-plans from there (`Watch.check`: fewer updates, the schedule then ending at the
new plan's end) and says so. A pace so much faster that the plan would leave more than `SLACK` of the budget unused
re-plans upward alike, to at most `steps`. Under torchrun rank 0 decides and the others receive its steps, at the
same log interval on every rank.

Why the updates before the plan agree with any plan: warmup is fixed in updates (`warmup_steps`), and for the
cosine schedule, the one whose rates depend on `steps`, the plan is fixed at the latest at the end of the warmup,
whose rates do not (`learning_rate`). So a budgeted run that does not re-plan equals, bit for bit, the run of a
fixed `steps` equal to its plan, and a resume replays the recorded plan instead of measuring again
(`resumed_plan`; a run stopped before its plan measures in its next session, its time so far counted against the
budget). A run whose `steps` end before the plan would be fixed never plans: it is the fixed-steps run. `steps` is
the upper bound; for runs that must be the same on every machine, set `budget_minutes = 0`.

On a machine so slow (or loaded) that waiting for the timed updates would spend most of the budget (`PLAN_BY`), the
plan comes at once from what was timed; and where the budget cannot hold even a cosine schedule's warmup, the plan
cuts the run inside it ("cut", said as a warning) rather than overrun: the budget is kept either way.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ConfigError
from .config import TrainConfig
from .events import Message
from .metrics import FIRST_UPDATES, format_duration

logger = logging.getLogger(__name__)

SKIPPED_UPDATES = FIRST_UPDATES  # not timed: the first calls of a session build kernels and caches
TIMED_UPDATES = 20  # timed to measure the seconds an update takes
LATEST_UPDATES = 3 * TIMED_UPDATES  # after the skipped ones, the plan waits no longer for updates that compile nothing
MARGIN = 0.03  # of the budget, kept free for what the measurement missed (load, logging)
PLAN_BY = 0.75  # of the budget: a plan that would come later (a machine too slow to time its updates) comes at once
SLACK = 0.05  # of the budget: a plan that would leave this much more than the margin unused re-plans upward


def budgeted(config: TrainConfig) -> bool:
    """Whether `config` plans its updates to a budget. `max_minutes` (a cap at equal training time) wins: it trains
    the fixed `steps` (`Planner.for_session` says so). A cosine warmup too short to plan in is refused when the
    config is read (`TrainConfig.check`)."""
    return config.budget_minutes > 0 and config.max_minutes <= 0


@dataclass
class Plan:
    """The recorded plan: `steps` updates of at most `upper_bound`, measured after update `planned_at`."""

    steps: int
    upper_bound: int
    budget_minutes: float
    planned_at: int
    update_s: float  # seconds per update, over the timed updates
    evaluation_s: float  # one evaluation (with its loss plot)
    checkpoint_s: float  # one checkpoint write
    reserved_s: float  # the job's work after training: `work_after_training` evaluations
    predicted_s: float  # the whole run as planned, from its start: at most the budget less the margin
    limited_by: str  # "budget", "steps" (the upper bound) or "cut" (the budget fits less than the warmup)
    replans: int = 0  # how many times the pace measured after the plan changed it (`Watch`)
    compiling_updates: int = 0  # updates before the plan not timed: torch.compile compiled during them


def events(done: int, steps: int, every: int) -> int:
    """How many evaluations (or checkpoints) updates done+1..steps make: every `every` updates and after the last."""
    return steps // every - done // every + (steps % every != 0)


def predicted_seconds(config: TrainConfig, done: int, steps: int, update_s: float, eval_s: float, ckpt_s: float):
    """The seconds from update `done` to the end of a plan of `steps` updates: updates, evaluations, checkpoints."""
    evaluations = events(done, steps, config.eval_every) if eval_s > 0 else 0
    return (steps - done) * update_s + evaluations * eval_s + events(done, steps, config.checkpoint_every) * ckpt_s


def fit_steps(
    config: TrainConfig, done: int, available_s: float, update_s: float, eval_s: float, ckpt_s: float
) -> tuple[int, str]:
    """The most updates (at most `config.steps`) whose rest after `done` fits in `available_s` seconds, and what
    limited it. A cosine plan ends after its warmup, so that its schedule finishes; when even that does not fit,
    the budget wins: the most updates that fit, `done` (stop now) at the least, "cut" inside the warmup."""
    lowest = min(max(done + 1, config.warmup_steps + 1 if config.schedule == "cosine" else 0), config.steps)
    if predicted_seconds(config, done, config.steps, update_s, eval_s, ckpt_s) <= available_s:
        return config.steps, "steps"
    cut = predicted_seconds(config, done, lowest, update_s, eval_s, ckpt_s) > available_s
    low, high = (done, lowest) if cut else (lowest, config.steps)  # fits(low) (or stops now) and not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        if predicted_seconds(config, done, middle, update_s, eval_s, ckpt_s) <= available_s:
            low = middle
        else:
            high = middle
    return low, "cut" if cut else "budget"


class Planner:
    """One session's measurement: which updates it times, and fixing the plan after the last of them."""

    def __init__(self, config: TrainConfig, start: int, work_after_training: float):
        limit = config.warmup_steps if config.schedule == "cosine" else math.inf
        self.config, self.work_after_training = config, work_after_training
        self.plan_step = int(min(start + SKIPPED_UPDATES + TIMED_UPDATES, limit))  # the earliest
        self.last_step = int(min(start + SKIPPED_UPDATES + LATEST_UPDATES, limit))  # the latest
        self.first_timed = min(start + SKIPPED_UPDATES, self.plan_step - 1) + 1  # the first update timed
        self.seconds: list[float] = []  # the timed updates'
        self.skipped: list[float] = []  # the seconds of the updates before the timed ones (a late plan's last resort)
        self.compiling: list[float] = []  # the seconds of the updates not timed because something compiled

    @classmethod
    def for_session(
        cls, config: TrainConfig, start: int, plan: dict | None, work_after_training: float
    ) -> Planner | None:
        """A planner for a session that starts at update `start`, or None when nothing is to be planned."""
        if config.budget_minutes > 0 and not budgeted(config) and plan is None:
            logger.warning(
                "train.budget_minutes is not used (train.max_minutes, a cap at equal training time, is set); "
                "training up to train.steps = %d",
                config.steps,
            )
        if not budgeted(config) or plan is not None:
            return None
        planner = cls(config, start, work_after_training)
        return planner if start < planner.plan_step < config.steps else None

    def timed(self, step: int, seconds: float, compiled: bool = False) -> None:
        """Note that update `step` took `seconds`, `compiled` something or not (the updates before `first_timed`
        are not counted, and those that compiled are kept apart)."""
        (self.skipped if step < self.first_timed else self.compiling if compiled else self.seconds).append(seconds)

    def due(self, step: int, compiled: bool = False, elapsed_s: float = 0.0) -> bool:
        """Whether the plan is fixed after update `step` (which `compiled` something or not; the trainer then times
        one evaluation and one checkpoint and asks for `plan`): once `TIMED_UPDATES` updates are timed, from
        `plan_step` on, or at `last_step` with fewer; and at once, from whatever was timed, when the run, `elapsed_s`
        into its budget, would reach `plan_step` past `PLAN_BY` of it at the pace of its last update (a machine too
        slow to wait for its timed updates). A plan that would come at `steps` never comes."""
        timed = len(self.seconds) + (step >= self.first_timed and not compiled)
        pace_s = self.seconds[-1] if self.seconds else 0.0  # the last timed update that compiled nothing
        waited_s = elapsed_s + max(self.plan_step - step, 0) * pace_s
        late = waited_s >= self.config.budget_minutes * 60 * PLAN_BY
        due = late or (step >= self.plan_step and (timed >= TIMED_UPDATES or step >= self.last_step))
        return due and step < self.config.steps

    def plan(self, done: int, elapsed_s: float, eval_s: float, ckpt_s: float) -> Plan:
        """The plan after update `done`, `elapsed_s` into the run, given the measured costs (the updates that
        compiled count only when no other was timed)."""
        config = self.config
        seconds = self.seconds or self.compiling or self.skipped
        update_s = sum(seconds) / len(seconds)
        reserved_s = self.work_after_training * eval_s
        budget_s = config.budget_minutes * 60
        available_s = budget_s * (1 - MARGIN) - elapsed_s - ckpt_s - reserved_s  # ckpt_s: the plan's own checkpoint
        steps, limited_by = fit_steps(config, done, available_s, update_s, eval_s, ckpt_s)
        rest = predicted_seconds(config, done, steps, update_s, eval_s, ckpt_s)
        predicted_s = elapsed_s + ckpt_s + rest + reserved_s
        return Plan(
            steps,
            config.steps,
            config.budget_minutes,
            done,
            update_s,
            eval_s,
            ckpt_s,
            reserved_s,
            predicted_s,
            limited_by,
            compiling_updates=len(self.compiling),
        )


def announcement(plan: Plan) -> Message:
    """What was planned (a warning when the budget cannot hold the shortest complete schedule)."""
    text = (
        f"planned {plan.steps} updates (at most {plan.upper_bound}) for the {plan.budget_minutes:g}-minute budget: "
        f"{plan.update_s:.3g} s per update, {plan.evaluation_s:.3g} s per evaluation, "
        f"{format_duration(plan.reserved_s)} after training; about {format_duration(plan.predicted_s)} in all"
    )
    if plan.limited_by == "cut":
        return Message(f"{text}. {CUT_SHORT.format(steps=plan.steps)}", warning=True)
    return Message(text)


CUT_SHORT = (
    "The budget is too short for this machine to finish the schedule's warmup: the run stops after {steps} "
    "updates, inside it, to keep the budget; raise train.budget_minutes or lower train.warmup_steps"
)


def replanned_announcement(plan: Plan, was: dict[str, Any]) -> Message:
    """What a re-plan changed, and why (a warning when even the shortest complete schedule overruns)."""
    would = "overrun" if plan.steps < was["steps"] else "leave much of"
    text = (
        f"re-planned at update {plan.planned_at}: updates now take {plan.update_s:.3g} s (planned "
        f"{was['update_s']:.3g} s), so {was['steps']} updates would {would} the {plan.budget_minutes:g}-minute "
        f"budget; now {plan.steps} updates, about {format_duration(plan.predicted_s)} in all"
    )
    if plan.limited_by == "cut":
        return Message(f"{text}. {CUT_SHORT.format(steps=plan.steps)}", warning=True)
    return Message(text)


class Watch:
    """After the plan: the pace of the updates since the last look, and a new plan when at that pace the run
    would end past its budget, or at the pace since the plan far within it (see the module docstring). Every rank
    keeps one; only rank 0's `check` decides."""

    def __init__(self, config: TrainConfig, plan: dict[str, Any]):
        self.config, self.measured = config, plan  # `measured`: the plan whose evaluation was timed
        self.evaluation_seconds, self.evaluations = 0.0, 0  # the periodic evaluations of this session
        self.follow(plan)

    @classmethod
    def for_session(cls, config: TrainConfig, plan: dict[str, Any] | None) -> Watch | None:
        """A watch over a budgeted run's plan (None without one, or when a resume fixed other steps)."""
        if not budgeted(config) or plan is None or "resumed_to" in plan:
            return None
        return cls(config, plan)

    def follow(self, plan: dict[str, Any]) -> None:
        """Watch `plan` from here (a new one, on every rank): its pace is measured from its start."""
        self.plan = plan
        self.seconds, self.updates = 0.0, 0  # since the last look
        self.plan_seconds, self.plan_updates = 0.0, 0  # since the plan

    def timed(self, seconds: float, compiled: bool = False) -> None:
        """Note the seconds of one update (evaluations and checkpoints are not in them; an update that `compiled`
        something is not counted: its seconds are compiling's)."""
        if not compiled:
            self.seconds += seconds
            self.updates += 1
            self.plan_seconds += seconds
            self.plan_updates += 1

    def evaluated(self, seconds: float) -> None:
        """Note the seconds of one periodic evaluation."""
        self.evaluation_seconds += seconds
        self.evaluations += 1

    def restart(self) -> None:
        """Measure the pace afresh from here: after every look, on every rank (which then look again together)."""
        self.seconds, self.updates = 0.0, 0

    def due(self, step: int, steps: int) -> bool:
        """Whether to look after update `step`: at a log interval, with enough updates timed, before the end (the
        same answer on every rank, which all take part in the look)."""
        return self.updates >= TIMED_UPDATES and step % self.config.log_every == 0 and step < steps

    def check(self, done: int, elapsed_s: float) -> Plan | None:
        """Rank 0: a new plan when the rest of this one, at the pace measured since the last look, would end past
        the budget (fewer updates), or at the pace since the plan, over at least twice `TIMED_UPDATES` (steadier:
        one window's noise re-plans nothing upward), leave more than `SLACK` of it unused (more, at most the upper
        bound); None to keep it. Every rank then measures the pace afresh (`restart`)."""
        plan = self.plan
        if "update_s" not in plan:  # a plan received from rank 0 has only its steps
            return None
        budget_s = plan["budget_minutes"] * 60
        update_s, most = self.seconds / self.updates, plan["steps"]  # fewer updates
        if self.ends_s(done, elapsed_s, update_s) <= budget_s:
            update_s, most = self.plan_seconds / self.plan_updates, plan["upper_bound"]  # more updates
            steady = self.plan_updates >= 2 * TIMED_UPDATES  # two looks' worth since the plan
            if (
                not steady
                or plan["steps"] >= most
                or self.ends_s(done, elapsed_s, update_s) >= budget_s * (1 - MARGIN - SLACK)
            ):
                return None
        eval_s, ckpt_s, reserved_s = self.costs(update_s)
        config = replace(self.config, steps=most)
        available_s = budget_s * (1 - MARGIN) - elapsed_s - reserved_s
        steps, limited_by = fit_steps(config, done, available_s, update_s, eval_s, ckpt_s)
        if steps == plan["steps"]:
            return None
        predicted_s = elapsed_s + predicted_seconds(config, done, steps, update_s, eval_s, ckpt_s) + reserved_s
        replans = plan.get("replans", 0) + 1
        return Plan(
            steps, plan["upper_bound"], plan["budget_minutes"], done, update_s, eval_s, ckpt_s, reserved_s,
            predicted_s, limited_by, replans, plan.get("compiling_updates", 0),
        )  # fmt: skip

    def costs(self, update_s: float) -> tuple[float, float, float]:
        """An evaluation's, a checkpoint's and the reserve's seconds at a pace of `update_s`: the mean of this
        session's periodic evaluations where there were some, else the measured plan's, slowed as the updates are
        (never counted faster); the checkpoint's as measured; the reserve (evaluations too) slowed alike, or
        scaled by how the periodic evaluations compare with the one timed for the plan."""
        measured = self.measured
        slower = max(update_s / measured["update_s"], 1.0)
        eval_s, reserved_s = measured["evaluation_s"] * slower, measured["reserved_s"] * slower
        if self.evaluations:
            timed_s = self.evaluation_seconds / self.evaluations
            reserved_s *= timed_s / eval_s if eval_s > 0 else 1.0
            eval_s = timed_s
        return eval_s, measured["checkpoint_s"], reserved_s

    def ends_s(self, done: int, elapsed_s: float, update_s: float) -> float:
        """When the run, `elapsed_s` in after update `done`, ends this plan at a pace of `update_s`."""
        eval_s, ckpt_s, reserved_s = self.costs(update_s)
        rest = predicted_seconds(self.config, done, self.plan["steps"], update_s, eval_s, ckpt_s)
        return elapsed_s + rest + reserved_s


def planned_steps(config: TrainConfig, plan: dict[str, Any] | None) -> int:
    """The updates a run trains to: its `plan`'s (a budget's, once fixed, or a resume's) or else `config.steps`."""
    return config.steps if plan is None else plan["steps"]


def resumed_plan(config: TrainConfig, plan: dict[str, Any] | None, step: int) -> dict[str, Any] | None:
    """The plan a run resumed at `step` continues with under `config`: the recorded plan replayed when the budget
    and the upper bound are the ones it was made for (or the config is the checkpoint's own, whose `steps` is the
    plan); else the `steps` asked for (a plan may be extended or cut like any run: `kqv.train.config.replan`). A
    changed budget is refused: the plan was fixed once, from the first updates."""
    if plan is None:
        if budgeted(config) and config.schedule == "cosine" and config.warmup_steps <= step < config.steps:
            raise ConfigError(
                f"this run is at update {step}, past its warmup of {config.warmup_steps}, and has no recorded plan: "
                f"a budget is planned during the warmup; resume with train.budget_minutes=0 and the train.steps "
                f"you want"
            )
        return None
    same_budget = config.budget_minutes == plan.get("budget_minutes")
    if same_budget and config.steps in (plan["steps"], plan.get("upper_bound")):
        return plan
    if budgeted(config) and not same_budget:
        raise ConfigError(
            f"this run was planned for a {plan.get('budget_minutes'):g}-minute budget ({plan['steps']} updates); a "
            f"plan is fixed once: resume with the same train.budget_minutes, or with train.budget_minutes=0 and "
            f"the train.steps you want"
        )
    return {**plan, "steps": config.steps, "upper_bound": config.steps, "resumed_to": step}


def time_left(
    config: TrainConfig, plan: dict | None, step: int, elapsed_s: float, train_s: float, step_s: float | None
):
    """Seconds of training left: the remaining updates of the `plan` (or of `config`) at `step_s` seconds each (this
    session's pace, evaluations included), and no more than an unplanned budget or the `max_minutes` cap leaves;
    None before any estimate."""
    left = None if step_s is None else step_s * (planned_steps(config, plan) - step)
    limits = []
    if budgeted(config) and plan is None:
        limits.append(config.budget_minutes * 60 - elapsed_s)
    if config.max_minutes > 0:
        limits.append((config.max_minutes * 60 - train_s) * (elapsed_s / train_s if train_s > 0 else 1.0))
    if limits:
        left = min(limits) if left is None else min(left, *limits)
    return None if left is None else max(left, 0.0)
