"""What an experiment is: a claim, sizes, a measurement, and checks decided in advance.

Every experiment is one module of `kqv_lab.experiments` holding:

* a docstring that states the claim as the lecture makes it, and how the module tests it;
* `NAME` (the command-line name), `CLAIM` (one line for `kqv experiment list`), `LECTURE` (the claim in the
  lecture's words, for the report) and `FIELDS` (the keys every results dict of the experiment has);
* `Config`, a dataclass of sizes deriving from `ExperimentConfig` (so `kqv.validation` checks it: every field
  against its annotation, every size positive), and two instances: `FULL` and `QUICK`;
* `run(config, seeds, progress) -> dict`: trains and measures, returns every measured number (JSON-able);
* `table(results) -> (columns, rows)`: the results table; `checks(results) -> list[Check]`: the verdict's
  parts, each with the threshold written in the module before anything ran; `plots(results, directory)`:
  PNG files; `method(config) -> str`: how the claim was tested, in words, with the sizes used;
* optionally `notes(results) -> str`: the results beside published figures, for the report and the gallery, and
  `REVISIONS`, lines saying how the design or the checks changed after a trial had been seen.

`Experiment.of(module)` collects these parts into an `Experiment` and fails at once, naming the module and the
missing parts, when one is not there; the registry `kqv_lab.experiments.EXPERIMENTS` holds one per module.

The verdict is never written by hand: `verdict(checks)` derives it from the checks, which derive from the
numbers, so the test suite can recompute it from results.json alone.
"""

from __future__ import annotations

import contextvars
import dataclasses
import statistics
import sys
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from tqdm import tqdm

from kqv import Config, field_types
from kqv.errors import OVERRIDE, OVERRIDE_EXAMPLE, ConfigError, option
from kqv.train import override_value

# Where the experiments' models train (`kqv experiment run --device`, `run_experiment(device=...)`): the CPU unless
# asked, which every figure in docs/experiments was measured on. Whatever the device, a trained model comes back to
# the CPU (`kqv_lab.experiments.lm.train_lm`), so what the experiments measure after training runs there.
TRAINING_DEVICE: contextvars.ContextVar[str] = contextvars.ContextVar("TRAINING_DEVICE", default="cpu")


class ExperimentError(ConfigError):
    """Bad input to an experiment: an unknown name, a size that is not positive, an unknown option."""


# the outcome of one check: decided either way, or not decided by the data (`kqv_lab.experiments.statistics`)
HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
OUTCOMES = (HOLDS, FAILS, INCONCLUSIVE)
# what a check is for: a part of the lecture's claim (decides the verdict); a control (shows the setup can show the
# effect: one that does not hold makes the verdict inconclusive); or a check of the code that holds by construction
# (a count or an identity the code guarantees: reported, never deciding)
CLAIM, CONTROL, CONSTRUCTION = "claim", "control", "by construction"
ROLES = (CLAIM, CONTROL, CONSTRUCTION)


# While `kqv_lab.experiments.statistics.judge` runs an experiment's `checks`, the intervals made, the decisions taken
# and the checks built, in order: how the numbers behind each figure string are found without the experiment
# module passing them (its code, and so its code hash, stays as it is). None outside `judge`.
JUDGING: contextvars.ContextVar[list | None] = contextvars.ContextVar("JUDGING", default=None)


def note(kind: str, item: Any) -> None:
    """Log `item` ('interval', 'decision' or 'check') for `statistics.judge`, when it is listening."""
    log = JUDGING.get()
    if log is not None:
        log.append((kind, item))


@dataclass
class Check:
    """One part of a verdict: what is checked, the threshold fixed in advance, the measured figure, the outcome.

    `Check(what, threshold, figure, holds)` is decided by a yes/no comparison; a check decided by an interval
    passes its outcome (`kqv_lab.experiments.statistics.interval_check`), and `holds` follows from it. `role` says
    what it is for (`CLAIM`, `CONTROL`, `CONSTRUCTION`; `control(...)` and `by_construction(...)` mark one).
    `statistics.judge` fills `intervals` (each interval behind the figure as numbers, with the threshold or band
    it was judged against) and, for an inconclusive check, `to_decide` (how many seeds would decide it)."""

    what: str
    threshold: str
    figure: str
    holds: bool
    outcome: str = ""  # HOLDS, FAILS or INCONCLUSIVE; '' means: from `holds`
    intervals: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    to_decide: dict[str, Any] | None = None
    role: str = CLAIM

    def __post_init__(self) -> None:
        if not self.outcome:
            self.outcome = HOLDS if self.holds else FAILS
        if self.outcome not in OUTCOMES:
            raise ExperimentError(f"a check's outcome is one of {OUTCOMES}, got {self.outcome!r}")
        if self.role not in ROLES:
            raise ExperimentError(f"a check's role is one of {ROLES}, got {self.role!r}")
        self.holds = self.outcome == HOLDS
        note("check", self)


def control(check: Check) -> Check:
    """`check`, marked a control: it shows the setup can show the effect, and decides nothing about the claim."""
    check.role = CONTROL
    return check


def by_construction(check: Check) -> Check:
    """`check`, marked as holding by construction (a count or an identity the code guarantees): reported only."""
    check.role = CONSTRUCTION
    return check


def verdict(checks: Sequence[Check]) -> str:
    """The verdict, decided by the checks of the claim alone: 'holds' when every one holds; 'does not hold here'
    when none holds and some fails; 'holds in part' when some hold and some fail; 'inconclusive' when none fails
    but some could not be decided (an interval that straddles its threshold, or an arm that did not learn), and
    whatever the claim's checks say when a control does not hold (the setup could not have shown the effect).
    Checks that hold by construction never decide: an undecided part never reads as 'holds'."""
    claims = [check.outcome for check in checks if check.role == CLAIM]
    if not claims:
        raise ExperimentError("a verdict needs at least one check of the claim")
    if any(check.role == CONTROL and check.outcome != HOLDS for check in checks):
        return "inconclusive"
    if FAILS not in claims:
        return "inconclusive" if INCONCLUSIVE in claims else "holds"
    return "holds in part" if HOLDS in claims else "does not hold here"


@dataclass(frozen=True)
class Experiment:
    """An experiment: the parts its module declares (see the module docstring of `kqv_lab.experiments.base`).

    Made by `Experiment.of(module)`, which checks that the module declares every part of the contract, so a
    module that lacks one fails when the registry (`kqv_lab.experiments.EXPERIMENTS`) is imported, not when used."""

    name: str
    claim: str
    lecture: str
    fields: tuple[str, ...]
    config_class: type[ExperimentConfig]
    full: ExperimentConfig
    quick: ExperimentConfig
    run: Callable[[Any, list[int], Progress], dict]
    table: Callable[[dict], tuple[list[str], list[list]]]
    checks: Callable[[dict], list[Check]]
    plots: Callable[[dict, Path], list]
    method: Callable[[Any], str]
    module: str  # the module's dotted name (the report points readers to its source)
    notes: Callable[[dict], str] | None = None  # optional: the results beside published figures
    revisions: tuple[str, ...] = ()  # optional (`REVISIONS`): how the design changed after a trial had been seen

    @classmethod
    def of(cls, module: ModuleType) -> Experiment:
        """The experiment `module` declares; an ExperimentError naming the module and every missing part if not."""
        missing = [part for part in CONTRACT if not hasattr(module, part)]
        if missing:
            raise ExperimentError(
                f"experiment module {module.__name__} lacks {', '.join(missing)}: every experiment "
                f"module declares {', '.join(CONTRACT)} (see kqv_lab.experiments.base)"
            )
        parts = {field: getattr(module, part) for part, field in CONTRACT.items()}
        if not isinstance(parts["fields"], (tuple, list)) or not all(isinstance(k, str) for k in parts["fields"]):
            raise ExperimentError(f"experiment module {module.__name__}: FIELDS must be a tuple of result keys")
        parts["fields"] = tuple(parts["fields"])
        optional = {"notes": getattr(module, "notes", None), "revisions": tuple(getattr(module, "REVISIONS", ()))}
        experiment = cls(**parts, module=module.__name__, **optional)
        experiment._check_parts()
        return experiment

    def _check_parts(self) -> None:
        where = f"experiment module {self.module}"
        if not (isinstance(self.config_class, type) and issubclass(self.config_class, ExperimentConfig)):
            raise ExperimentError(f"{where}: Config must be a dataclass deriving from ExperimentConfig")
        for size in ("full", "quick"):
            if not isinstance(getattr(self, size), self.config_class):
                raise ExperimentError(f"{where}: {size.upper()} must be a {self.module}.Config")
        not_callable = [
            part for part in ("run", "table", "checks", "plots", "method") if not callable(getattr(self, part))
        ]
        if not_callable:
            raise ExperimentError(f"{where}: {', '.join(not_callable)} must be functions")

    def config(self, quick: bool = False, overrides: Sequence[str] = ()) -> Any:
        """The FULL or QUICK config with `field=value` overrides applied and validated."""
        return with_overrides(self.quick if quick else self.full, overrides, self.name)

    def options(self) -> list[str]:
        """The names of the config's fields: what `--set FIELD=VALUE` can change."""
        return [f.name for f in dataclasses.fields(self.config_class)]


# module attribute -> Experiment field: the parts every experiment module declares (`notes` is optional)
CONTRACT = {
    "NAME": "name",
    "CLAIM": "claim",
    "LECTURE": "lecture",
    "FIELDS": "fields",
    "Config": "config_class",
    "FULL": "full",
    "QUICK": "quick",
    "run": "run",
    "table": "table",
    "checks": "checks",
    "plots": "plots",
    "method": "method",
}


# ---------------------------------------------------------------------------------------------------------------
# Configs: sizes are positive, overrides are typed


@dataclass
class ExperimentConfig(Config):
    """Base of every experiment's `Config`: fields checked against their annotations by `kqv.validation`, and
    every size positive: each int (or int in a tuple) >= 1 and each float > 0 (sizes, steps, rates, seeds), a
    tuple lists at least one value. A field named in the class's `ZERO_ALLOWED` may be 0; the two tuple fields of
    each pair in `PAIRED` are read side by side, so they must be as long as each other."""

    ZERO_ALLOWED: ClassVar[tuple[str, ...]] = ()
    PAIRED: ClassVar[tuple[tuple[str, str], ...]] = ()

    def check(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            values = value if isinstance(value, tuple) else (value,)
            if not values:
                raise ExperimentError(f"{field.name} must list at least one value")
            zero_ok = field.name in self.ZERO_ALLOWED
            for item in values:
                number = isinstance(item, (int, float)) and not isinstance(item, bool)
                if number and (item < 0 or item == 0 and not zero_ok):
                    raise ExperimentError(
                        f"{field.name} must be {'>= 0' if zero_ok else 'positive'}, got {item!r} "
                        f"(in {type(self).__module__.rpartition('.')[2]}.{type(self).__name__})"
                    )
        for first, second in self.PAIRED:
            a, b = getattr(self, first), getattr(self, second)
            if len(a) != len(b):
                raise ExperimentError(f"{first} and {second} pair up: got {len(a)} {first} and {len(b)} {second}")


def with_overrides(config: ExperimentConfig, overrides: Sequence[str], experiment: str = "") -> Any:
    """A copy of `config` with `field=value` overrides, validated as any config is (`kqv.validation`).

    Values are read as the run configs' overrides are (`kqv.train.runs.override_value`: TOML, else a bare string);
    a single value given to a list field is a list of one."""
    changes: dict[str, Any] = {}
    hints = {
        name: hint
        for name, hint in field_types(type(config)).items()
        if name in {f.name for f in dataclasses.fields(config)}
    }
    for override in overrides:
        name, sep, raw = override.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ExperimentError(
                f"{option(OVERRIDE)}{override!r} must look like field=value, e.g. {option(OVERRIDE_EXAMPLE)}"
            )
        if name not in hints:
            raise ExperimentError(
                f"unknown option {name!r} for {experiment or type(config).__module__}; its options "
                f"are {sorted(f.name for f in dataclasses.fields(config))}"
            )
        value = override_value(raw, name)
        listed = typing.get_origin(hints[name]) is tuple and not isinstance(value, list)
        changes[name] = [value] if listed else value
    return dataclasses.replace(config, **changes)


# ---------------------------------------------------------------------------------------------------------------
# Numbers


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    values = [float(v) for v in values]
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def pm(values: Sequence[float], digits: int = 3) -> str:
    """'mean ± std' of the values ('value' alone for one)."""
    mean, std = mean_std(values)
    return f"{mean:.{digits}f}" if len(values) == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"


# ---------------------------------------------------------------------------------------------------------------
# Progress


class Progress:
    """Progress of one experiment: a tqdm bar on a terminal, else one line per unit on stderr.

    An experiment calls `plan(total)` once, then for each unit (a training run, a timing) `start(label)` (optional:
    names the unit now running) and `step(label)` when it is done. Within `kqv experiment run all`, `position`
    is (k, n), this experiment's place in the run, and `share` is (work done before it, its own work), as
    fractions of the whole run's expected work, so the line reads '[3/18 22%] scaling 4/9 ...'."""

    def __init__(
        self,
        name: str,
        enabled: bool = True,
        position: tuple[int, int] | None = None,
        share: tuple[float, float] = (0.0, 1.0),
    ):
        self.name, self.enabled, self.done, self.total = name, enabled, 0, 0
        self.position, self.share = position, share
        self.started = time.perf_counter()
        self.bar = tqdm(
            desc=self.prefix() + name,
            unit="run",
            dynamic_ncols=True,
            file=sys.stderr,
            disable=not enabled or not sys.stderr.isatty(),
        )

    def prefix(self) -> str:
        """'[k/n p%] ' within a run of several experiments (p: the whole run's work done), else ''."""
        if self.position is None:
            return ""
        fraction = self.done / self.total if self.total else 0.0
        overall = self.share[0] + self.share[1] * min(fraction, 1.0)
        return f"[{self.position[0]}/{self.position[1]} {overall:.0%}] "

    def plan(self, total: int) -> None:
        """Announce how many units (training runs, timings) the experiment will do."""
        self.total = total
        self.bar.total = total
        self.bar.refresh()

    def start(self, label: str) -> None:
        """Unit `label` starts now (shown beside the bar, or as one line)."""
        self._show(f"running {label}")

    def step(self, label: str) -> None:
        """One unit is finished."""
        self.done += 1
        self.bar.update(1)
        self._show(label)

    def _show(self, label: str) -> None:
        self.bar.set_description_str(self.prefix() + self.name, refresh=False)
        self.bar.set_postfix_str(label)
        if self.enabled and self.bar.disable:
            elapsed = time.perf_counter() - self.started
            print(
                f"kqv: {self.prefix()}{self.name} {self.done}/{self.total or '?'} {label} ({elapsed:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        self.bar.close()
