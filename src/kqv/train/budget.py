"""Training planned to a time budget: measure this machine's speed, then fix how many updates fit.

With `train.budget_minutes > 0` a run does not know its number of updates in advance. Each session skips its first
`SKIPPED_UPDATES` updates (the first calls build kernels: compilation, oneDNN primitives) and times the next ones,
up to `TIMED_UPDATES`. After the last timed update it times one evaluation (what `eval_every` costs, and the
`afterwards` reserve the job asks for: its final test or samples, in evaluations) and one checkpoint write, and
fixes the plan: the most updates, never more than `train.steps`, whose updates, evaluations, checkpoints and
reserve fit in the budget less a `MARGIN`. The plan is recorded in metrics.jsonl (a record with "plan") and in every
checkpoint (state.json "plan"); from then on the run is an ordinary run of that many updates, so its schedule
(warmup, cosine or inverse-sqrt) runs to its end.

Why the updates before the plan agree with any plan: warmup is fixed in updates (`warmup_steps`), and for the
cosine schedule, the one whose rates depend on `steps`, the plan is fixed at the latest at the end of the warmup,
whose rates do not (`learning_rate`). So a budgeted run equals, bit for bit, the run of a fixed `steps` equal to its
plan, and a resume replays the recorded plan instead of measuring again (`resumed_plan`; a run stopped before its
plan measures in its next session, its time so far counted against the budget). A run whose `steps` end
before the plan would be fixed never plans: it is the fixed-steps run. `steps` is the upper bound; for runs that
must be the same on every machine, set `budget_minutes = 0`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..errors import ConfigError
from .events import Message
from .metrics import FIRST_UPDATES, append_metrics, format_duration

if TYPE_CHECKING:
    from .config import TrainConfig
    from .trainer import Trainer

logger = logging.getLogger(__name__)

SKIPPED_UPDATES = FIRST_UPDATES  # not timed: the first calls of a session build kernels and caches
TIMED_UPDATES = 20  # timed to measure the seconds an update takes
MARGIN = 0.03  # of the budget, kept free for what the measurement missed (load, logging)


def check_budget(config: TrainConfig) -> None:
    """The checks `TrainConfig.check` makes on `budget_minutes`."""
    if config.budget_minutes < 0:
        raise ConfigError(
            f"budget_minutes must be >= 0 (0 = train exactly `steps` updates), got {config.budget_minutes}"
        )


def too_short_a_warmup(config: TrainConfig) -> bool:
    """Whether a cosine schedule's warmup leaves no update to time before the plan must be fixed."""
    return config.schedule == "cosine" and config.warmup_steps <= SKIPPED_UPDATES


def budgeted(config: TrainConfig) -> bool:
    """Whether `config` plans its updates to a budget. `max_minutes` (a cap at equal training time) wins, and so
    does a cosine warmup too short to plan in: both train the fixed `steps` (`Planner.for_session` says so)."""
    return config.budget_minutes > 0 and config.max_minutes <= 0 and not too_short_a_warmup(config)


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
    reserved_s: float  # the job's work after training: `afterwards` evaluations
    predicted_s: float  # the whole run as planned, from its start: at most the budget less the margin
    limited_by: str  # "budget", "steps" (the upper bound) or "minimum" (the budget fits less than the warmup)


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
    limited it. A cosine plan ends after its warmup (else its schedule could not finish): that and one update more
    than `done` are the minimum, kept (with a warning) when even they do not fit."""
    lowest = min(max(done + 1, config.warmup_steps + 1 if config.schedule == "cosine" else 0), config.steps)
    if predicted_seconds(config, done, config.steps, update_s, eval_s, ckpt_s) <= available_s:
        return config.steps, "steps"
    if predicted_seconds(config, done, lowest, update_s, eval_s, ckpt_s) > available_s:
        return lowest, "minimum"
    low, high = lowest, config.steps  # fits(low) and not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        if predicted_seconds(config, done, middle, update_s, eval_s, ckpt_s) <= available_s:
            low = middle
        else:
            high = middle
    return low, "budget"


class Planner:
    """One session's measurement: which updates it times, and fixing the plan after the last of them."""

    def __init__(self, config: TrainConfig, start: int, afterwards: float):
        limit = config.warmup_steps if config.schedule == "cosine" else math.inf
        self.config, self.afterwards = config, afterwards
        self.plan_step = int(min(start + SKIPPED_UPDATES + TIMED_UPDATES, limit))
        self.first_timed = min(start + SKIPPED_UPDATES, self.plan_step - 1) + 1  # the first update timed
        self.seconds: list[float] = []

    @classmethod
    def for_session(cls, config: TrainConfig, start: int, plan: dict | None, afterwards: float) -> Planner | None:
        """A planner for a session that starts at update `start`, or None when nothing is to be planned."""
        if config.budget_minutes > 0 and not budgeted(config) and plan is None:
            why = (
                "train.max_minutes, a cap at equal training time, is set"
                if config.max_minutes > 0
                else f"a cosine plan is fixed inside the warmup, and {config.warmup_steps} updates leave none to time"
            )
            logger.warning("train.budget_minutes is not used (%s); training up to train.steps = %d", why, config.steps)
        if not budgeted(config) or plan is not None:
            return None
        planner = cls(config, start, afterwards)
        return planner if start < planner.plan_step < config.steps else None

    def timed(self, step: int, seconds: float) -> bool:
        """Note that update `step` took `seconds`; whether the plan is due now."""
        if step >= self.first_timed:
            self.seconds.append(seconds)
        return step == self.plan_step

    def fix(self, trainer: Trainer, origin: float) -> TrainConfig:
        """Time one evaluation and one checkpoint, fix the plan and set it on `trainer`: its config's steps, its
        `plan` (rank 0's; the others receive only the steps), recorded in a second checkpoint and in metrics.jsonl,
        and said to its reporter. Returns the planned config. `origin`: the clock's reading at the run's start."""
        started = trainer.clock()
        metrics = trainer.evaluate() if trainer.val_batches is not None or trainer.eval_fn is not None else {}
        if trainer.rank == 0 and trainer.run.metrics_file.exists():
            trainer._plot()
        evaluated = trainer.clock()
        trainer.save_checkpoint()
        now = trainer.clock()
        plan = (
            self.plan(trainer.step, now - origin, evaluated - started, now - evaluated) if trainer.rank == 0 else None
        )
        steps = torch.tensor(plan.steps if plan else 0)
        if trainer.world_size > 1:
            dist.broadcast(steps, src=0)
        trainer.config = replace(trainer.config, steps=int(steps))
        trainer.plan = asdict(plan) if plan else {"steps": int(steps)}
        trainer.save_checkpoint()  # the plan, recorded at once
        if plan is not None:
            record = {"step": trainer.step, **metrics, "plan": trainer.plan, "train_seconds": trainer.train_seconds}
            append_metrics(trainer.run.metrics_file, {**record, "elapsed_s": trainer.clock() - origin})
            trainer.report(announcement(plan))
        return trainer.config

    def plan(self, done: int, elapsed_s: float, eval_s: float, ckpt_s: float) -> Plan:
        """The plan after update `done`, `elapsed_s` into the run, given the measured costs."""
        config = self.config
        update_s = sum(self.seconds) / len(self.seconds)
        reserved_s = self.afterwards * eval_s
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
        )


def announcement(plan: Plan) -> Message:
    """What was planned (a warning when the budget cannot hold the shortest complete schedule)."""
    text = (
        f"planned {plan.steps} updates (at most {plan.upper_bound}) for the {plan.budget_minutes:g}-minute budget: "
        f"{plan.update_s:.3g} s per update, {plan.evaluation_s:.3g} s per evaluation, "
        f"{format_duration(plan.reserved_s)} after training; about {format_duration(plan.predicted_s)} in all"
    )
    if plan.limited_by == "minimum":
        return Message(
            f"{text}. The budget is too short for this machine: even the shortest complete schedule overruns it; "
            f"raise train.budget_minutes or lower train.warmup_steps",
            warning=True,
        )
    return Message(text)


def resumed_plan(config: TrainConfig, plan: dict[str, Any] | None, step: int) -> tuple[TrainConfig, dict | None]:
    """The config and plan a run resumed at `step` continues with: the recorded plan replayed when the budget and
    the upper bound are the ones it was made for (or the config is the checkpoint's own, whose `steps` is the plan);
    else the `steps` asked for (a plan may be extended or cut like any run: `kqv.train.config.replan`). A changed
    budget is refused: the plan was fixed once, from the first updates."""
    if plan is None:
        if budgeted(config) and config.schedule == "cosine" and config.warmup_steps <= step < config.steps:
            raise ConfigError(
                f"this run is at update {step}, past its warmup of {config.warmup_steps}, and has no recorded plan: "
                f"a budget is planned during the warmup; resume with train.budget_minutes=0 and the train.steps "
                f"you want"
            )
        return config, None
    same_budget = config.budget_minutes == plan.get("budget_minutes")
    if same_budget and config.steps in (plan["steps"], plan.get("upper_bound")):
        return replace(config, steps=plan["steps"]), plan
    if budgeted(config) and not same_budget:
        raise ConfigError(
            f"this run was planned for a {plan.get('budget_minutes'):g}-minute budget ({plan['steps']} updates); a "
            f"plan is fixed once: resume with the same train.budget_minutes, or with train.budget_minutes=0 and "
            f"the train.steps you want"
        )
    return config, {**plan, "steps": config.steps, "upper_bound": config.steps, "resumed_to": step}


def time_left(config: TrainConfig, planned: bool, step: int, elapsed_s: float, train_s: float, step_s: float | None):
    """Seconds of training left: the remaining updates at `step_s` seconds each (this session's pace, evaluations
    included), and no more than an unplanned budget or the `max_minutes` cap leaves; None before any estimate."""
    left = None if step_s is None else step_s * (config.steps - step)
    limits = []
    if budgeted(config) and not planned:
        limits.append(config.budget_minutes * 60 - elapsed_s)
    if config.max_minutes > 0:
        limits.append((config.max_minutes * 60 - train_s) * (elapsed_s / train_s if train_s > 0 else 1.0))
    if limits:
        left = min(limits) if left is None else min(left, *limits)
    return None if left is None else max(left, 0.0)
