"""What an experiment is: a claim, sizes, a measurement, and checks decided in advance.

Every experiment is one module of `kqv.experiments` holding:

* a docstring that states the claim as the lecture makes it, and how the module tests it;
* `NAME` (the command-line name), `CLAIM` (one line for `kqv experiment list`), `LECTURE` (the claim in the
  lecture's words, for the report) and `FIELDS` (the keys every results dict of the experiment has);
* `Config`, a dataclass of sizes validated by `check_config`, and two instances: `FULL` and `QUICK`;
* `run(config, seeds, progress) -> dict`: trains and measures, returns every measured number (JSON-able);
* `table(results) -> (columns, rows)`: the results table; `checks(results) -> list[Check]`: the verdict's
  parts, each with the threshold written in the module before anything ran; `plots(results, directory)`:
  PNG files; `method(config) -> str`: how the claim was tested, in words, with the sizes used.

The verdict is never written by hand: `verdict(checks)` derives it from the checks, which derive from the
numbers, so the test suite can recompute it from results.json alone.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import time
import tomllib
import typing
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Sequence

from tqdm import tqdm

from ..errors import ConfigError


class ExperimentError(ConfigError):
    """Bad input to an experiment: an unknown name, a size that is not positive, an unknown option."""


@dataclass
class Check:
    """One part of a verdict: what is checked, the threshold fixed in advance, the measured figure, the outcome."""

    what: str
    threshold: str
    figure: str
    holds: bool

    def __post_init__(self) -> None:
        self.holds = bool(self.holds)


def verdict(checks: Sequence[Check]) -> str:
    """'holds' when every check holds, 'does not hold here' when none does, 'holds in part' otherwise."""
    if not checks:
        raise ValueError("a verdict needs at least one check")
    passed = sum(check.holds for check in checks)
    if passed == len(checks):
        return "holds"
    return "does not hold here" if passed == 0 else "holds in part"


@dataclass(frozen=True)
class Experiment:
    """An experiment module seen through its contract (see the module docstring of `kqv.experiments.base`)."""

    module: ModuleType

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)

    @property
    def description(self) -> str:
        return (self.module.__doc__ or "").strip()

    def config(self, quick: bool = False, overrides: Sequence[str] = ()) -> Any:
        """The FULL or QUICK config with `field=value` overrides applied and validated."""
        return apply_overrides(self.QUICK if quick else self.FULL, overrides)


# ---------------------------------------------------------------------------------------------------------------
# Configs: sizes are positive, overrides are typed


def check_config(config: Any) -> None:
    """Every int (or int in a tuple) must be >= 1 and every float finite and > 0: sizes, steps, rates, seeds.

    Call it from a config's `__post_init__`. A field whose name is in the config's `ZERO_ALLOWED` may be 0.
    """
    zero_allowed = getattr(config, "ZERO_ALLOWED", ())
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        values = value if isinstance(value, tuple) else (value,)
        if not values:
            raise ExperimentError(f"{field.name} must list at least one value")
        for item in values:
            if isinstance(item, bool) or isinstance(item, str):
                continue
            if not isinstance(item, (int, float)) or not math.isfinite(item):
                raise ExperimentError(f"{field.name} must be a finite number, got {item!r}")
            zero_ok = field.name in zero_allowed
            if item < 0 or (item == 0 and not zero_ok):
                raise ExperimentError(f"{field.name} must be {'>= 0' if zero_ok else 'positive'}, got {item!r} "
                                      f"(in {type(config).__name__})")


def apply_overrides(config: Any, overrides: Sequence[str]) -> Any:
    """A copy of `config` with `field=value` overrides (TOML values: `200`, `0.5`, `[64, 128]`, `"rope"`)."""
    changes: dict[str, Any] = {}
    hints = typing.get_type_hints(type(config))
    for override in overrides:
        name, sep, raw = override.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ExperimentError(f"--set {override!r} must look like field=value, e.g. --set steps=200")
        if name not in hints:
            experiment = type(config).__module__.rpartition(".")[2]
            raise ExperimentError(f"unknown option {name!r} for {experiment}; its options are "
                                  f"{sorted(f.name for f in dataclasses.fields(config))}")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        changes[name] = _coerce(name, value, hints[name])
    return dataclasses.replace(config, **changes)


def _coerce(name: str, value: Any, expected: Any) -> Any:
    origin = typing.get_origin(expected)
    if origin is tuple:
        item_type = typing.get_args(expected)[0]
        items = value if isinstance(value, list) else [value]
        return tuple(_coerce(name, item, item_type) for item in items)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if origin is typing.Literal:
        if value not in typing.get_args(expected):
            raise ExperimentError(f"{name} must be one of {list(typing.get_args(expected))}, got {value!r}")
        return value
    wrong_type = isinstance(expected, type) and not isinstance(value, expected)
    if wrong_type or (expected is int and isinstance(value, bool)):
        raise ExperimentError(f"{name} must be {expected.__name__}, got {value!r}")
    return value


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
    """Progress of one experiment: a tqdm bar on a terminal, else one line per finished unit on stderr."""

    def __init__(self, name: str, enabled: bool = True):
        self.name, self.enabled, self.done, self.total = name, enabled, 0, 0
        self.started = time.perf_counter()
        self.bar = tqdm(desc=name, unit="run", dynamic_ncols=True, file=sys.stderr,
                        disable=not enabled or not sys.stderr.isatty())

    def plan(self, total: int) -> None:
        """Announce how many units (training runs, timings) the experiment will do."""
        self.total = total
        self.bar.total = total
        self.bar.refresh()

    def step(self, label: str) -> None:
        """One unit is finished."""
        self.done += 1
        self.bar.update(1)
        self.bar.set_postfix_str(label)
        if self.enabled and self.bar.disable:
            elapsed = time.perf_counter() - self.started
            print(f"kqv: {self.name} {self.done}/{self.total or '?'} {label} ({elapsed:.0f} s)", file=sys.stderr,
                  flush=True)

    def close(self) -> None:
        self.bar.close()

