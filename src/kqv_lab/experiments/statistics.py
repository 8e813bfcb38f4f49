"""Verdicts with uncertainty: 95% intervals over seeds (or timing repeats) and a three-way outcome.

The whole API, for an experiment's `checks(results)`:

    from .statistics import interval_check, mean_interval, paired_difference, paired_ratio, ratio_interval

    gap = paired_difference(unscaled_losses, scaled_losses)      # arms that share seeds: per-seed differences
    gap.text()                                                   # '+0.022 [-0.011, +0.055] (n=3)'
    interval_check("the LM trains worse without the factor",    # a Check whose outcome the interval decides
                   "unscaled - scaled validation loss > 0.02 nats (95% interval)",
                   gap, 0.02, above=True,
                   failed_arm=None)                              # or 'scaled arm at the unigram loss': inconclusive

* `mean_interval(values)`: the mean with a Student-t 95% interval (n - 1 degrees of freedom; one value gives an
  infinite interval, so one seed never decides anything).
* `paired_difference(a, b)`: the interval of mean(a_i - b_i) for arms measured on the same seeds (paired t).
* `paired_ratio(a, b)`: the geometric mean of a_i / b_i with its interval, for timings on the same seeds.
* `ratio_interval(a, b)`: the ratio of the geometric means of two unpaired sets of repeats (timings) with its
  interval: Welch's t on the logarithms, back-transformed, so "A is 2x slower than B" is decided by repeats, not
  by one number.
* `decide(interval, threshold, above=True)` -> HOLDS when the whole interval lies beyond the threshold in the
  claimed direction, FAILS when it lies wholly on the other side, INCONCLUSIVE when it straddles the threshold.
* `decide_within(interval, low, high)` -> HOLDS when the whole interval lies inside [low, high], FAILS when it
  lies wholly outside, INCONCLUSIVE when it overlaps an edge (a band such as "an exponent between 1.7 and 2.3").
* `all_of(outcomes)`: the outcome of several decisions that must all hold (FAILS if one fails, else
  INCONCLUSIVE if one is undecided, else HOLDS).
* `interval_check(...)`: a `base.Check` with that outcome; `failed_arm` (a sanity check: an arm that did not
  learn, e.g. BLEU at 0 or loss at the unigram entropy) makes it INCONCLUSIVE whatever the interval says.

`base.verdict(checks)` turns outcomes into the experiment's verdict: an inconclusive part never reads "holds".

The numbers behind the figures (for the harness, not for an experiment's `checks`): `judge(checks, results)`
runs an experiment's `checks` while logging every interval made, every decision taken and every check built
(`base.JUDGING`), then gives each check its `intervals`: each interval its figure shows (found by its text), as
numbers (estimate, low, high, n, the spread of one value and the t quantile's degrees of freedom), with each
threshold or band it was judged against and the outcome; a decided interval the figure does not show is kept too
(`shown` null). An inconclusive check also gets `to_decide`: how many seeds (or repeats) would decide it if the
mean and spread stayed as measured (`units_to_clear`, the same t interval), or why no number would.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats

from .base import FAILS, HOLDS, INCONCLUSIVE, JUDGING, Check, ExperimentError, note

LEVEL = 0.95  # every interval of the experiments is a 95% interval


@dataclass(frozen=True)
class Interval:
    """A mean (or ratio) with its 95% interval [low, high] over n values."""

    mean: float
    low: float
    high: float
    n: int
    ratio: bool = False  # a ratio prints as 1.62x [1.41x, 1.86x]
    signed: bool = False  # a difference prints its sign: +0.022 [-0.011, +0.055]
    # the spread of one value on the interval's scale (the logarithm's, for a ratio) and the t quantile's degrees of
    # freedom, so that half the width is t(df) sd / sqrt(n); None where the interval was not made from n values here
    sd: float | None = None
    df: float | None = None

    def __post_init__(self) -> None:
        note("interval", self)

    def scale(self, x: float) -> float:
        """`x` on the scale where the interval is symmetric: the logarithm for a ratio (-inf for x <= 0)."""
        if not self.ratio:
            return x
        return math.log(x) if x > 0 else -math.inf

    def text(self, digits: int = 3) -> str:
        """'+0.022 [-0.011, +0.055] (n=3)' for a difference, '0.444 [0.411, 0.477] (n=3)' for a mean, or
        '1.62x [1.41x, 1.86x] (n=5)' for a ratio."""
        if self.ratio:
            form = lambda x: f"{x:.{digits - 1}f}x"
        else:
            form = lambda x: f"{x:{'+' if self.signed else ''}.{digits}f}"
        return f"{form(self.mean)} [{form(self.low)}, {form(self.high)}] (n={self.n})"


def t_quantile(df: int) -> float:
    """The two-sided 95% quantile of Student's t with `df` degrees of freedom (infinite for df < 1)."""
    return float(stats.t.ppf(0.5 + LEVEL / 2, df)) if df >= 1 else math.inf


def mean_interval(values: Sequence[float]) -> Interval:
    """The mean of `values` with its Student-t 95% interval (n - 1 df). NaN values (failed runs) are an error:
    score them first (e.g. at the unigram loss)."""
    values = [float(v) for v in values]
    if not values or any(math.isnan(v) for v in values):
        raise ExperimentError(f"an interval needs finite values, got {values}")
    mean = statistics.fmean(values)
    if len(values) == 1:
        return Interval(mean, -math.inf, math.inf, 1)
    sd, df = statistics.stdev(values), len(values) - 1
    half = t_quantile(df) * sd / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half, len(values), sd=sd, df=df)


def paired_difference(a: Sequence[float], b: Sequence[float]) -> Interval:
    """mean(a_i - b_i) with its 95% interval, for two arms run on the same seeds (a_i and b_i share seed i)."""
    if len(a) != len(b):
        raise ExperimentError(f"paired arms share seeds: {len(a)} values against {len(b)}")
    return dataclasses.replace(mean_interval([x - y for x, y in zip(a, b)]), signed=True)


def ratio_interval(a: Sequence[float], b: Sequence[float]) -> Interval:
    """The ratio of the geometric means of a and b with a 95% interval from Welch's t on the log values (repeats
    of two timings, unpaired: a slow first pass weighs less than in a ratio of arithmetic means)."""
    la, lb = [math.log(x) for x in a], [math.log(x) for x in b]
    ratio = math.exp(statistics.fmean(la) - statistics.fmean(lb))  # of geometric means, the interval's centre
    if len(la) < 2 or len(lb) < 2:
        return Interval(ratio, 0.0, math.inf, min(len(la), len(lb)), ratio=True)
    va, vb = statistics.variance(la) / len(la), statistics.variance(lb) / len(lb)
    spread = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(la) - 1) + vb**2 / (len(lb) - 1)) if spread > 0 else len(la) + len(lb) - 2
    centre = statistics.fmean(la) - statistics.fmean(lb)
    df, n = max(1, math.floor(df)), min(len(la), len(lb))
    half = t_quantile(df) * spread
    return Interval(
        ratio, math.exp(centre - half), math.exp(centre + half), n, ratio=True, sd=spread * math.sqrt(n), df=df
    )


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> Interval:
    """The geometric mean of a_i / b_i with its 95% interval (paired t on the log ratios): for timings of two
    arms measured on the same seeds, "A takes 1.6x as long as B"."""
    if len(a) != len(b):
        raise ExperimentError(f"paired arms share seeds: {len(a)} values against {len(b)}")
    logs = mean_interval([math.log(x / y) for x, y in zip(a, b)])
    low, high = math.exp(logs.low), math.exp(logs.high)
    return Interval(math.exp(logs.mean), low, high, logs.n, ratio=True, sd=logs.sd, df=logs.df)


def decide(interval: Interval, threshold: float, above: bool = True) -> str:
    """HOLDS when the interval clears `threshold` in the claimed direction (above it, or below it when
    `above` is False), FAILS when it clears it the other way, INCONCLUSIVE when it straddles it."""
    outcome = _side(interval, threshold, above)
    note("decision", Decision(interval, outcome, threshold=threshold, above=above))
    return outcome


def _side(interval: Interval, threshold: float, above: bool) -> str:
    low, high = (interval.low, interval.high) if above else (-interval.high, -interval.low)
    bar = threshold if above else -threshold
    return HOLDS if low > bar else FAILS if high < bar else INCONCLUSIVE


def decide_within(interval: Interval, low: float, high: float) -> str:
    """HOLDS when the whole interval lies inside the band [low, high], FAILS when it lies wholly outside it,
    INCONCLUSIVE when it overlaps an edge of the band."""
    if interval.low > low and interval.high < high:
        outcome = HOLDS
    else:
        outcome = FAILS if interval.high < low or interval.low > high else INCONCLUSIVE
    note("decision", Decision(interval, outcome, band=(low, high)))
    return outcome


def all_of(outcomes: Sequence[str]) -> str:
    """The outcome of several decisions that must all hold: FAILS if any fails, else INCONCLUSIVE if any is
    undecided, else HOLDS."""
    return FAILS if FAILS in outcomes else INCONCLUSIVE if INCONCLUSIVE in outcomes else HOLDS


def interval_check(
    what: str,
    threshold: str,
    interval: Interval,
    bar: float,
    *,
    above: bool = True,
    failed_arm: str | None = None,
    detail: str = "",
) -> Check:
    """A Check decided by `decide(interval, bar, above)`; INCONCLUSIVE when `failed_arm` names an arm that did
    not learn. The figure shows the interval (and `detail`, e.g. the arms' own means)."""
    figure = (f"{detail}; " if detail else "") + interval.text()
    if failed_arm:  # the interval's own outcome is kept for `judge`, with the arm that makes it count for nothing
        note("decision", Decision(interval, _side(interval, bar, above), bar, above, failed_arm=failed_arm))
        return Check(what, threshold, f"{figure}; {failed_arm}", False, INCONCLUSIVE)
    return Check(what, threshold, figure, False, decide(interval, bar, above))


# ---------------------------------------------------------------------------------------------------------------
# The numbers behind the figures, and how many seeds would decide an undecided check

MOST_UNITS = 1_000_000  # beyond this many seeds (or repeats) an effect is called too small to decide


@dataclass(frozen=True)
class Decision:
    """One `decide` (a threshold and the claimed side) or `decide_within` (a band) taken on an interval."""

    interval: Interval
    outcome: str
    threshold: float | None = None
    above: bool | None = None
    band: tuple[float, float] | None = None
    failed_arm: str = ""  # an arm that did not learn: the check is inconclusive whatever this outcome

    def gaps(self) -> tuple[float, float]:
        """(towards holding, towards failing): how far the estimate lies inside the claimed side (or band) and
        beyond it, on the interval's scale; the first is <= 0 when the estimate is on the wrong side or at the edge."""
        scale = self.interval.scale
        centre = scale(self.interval.mean)
        if self.band is not None:
            low, high = map(scale, self.band)
            return min(centre - low, high - centre), max(low - centre, centre - high)
        toward = centre - scale(self.threshold) if self.above else scale(self.threshold) - centre
        return toward, -toward

    def numbers(self) -> dict[str, Any]:
        """The threshold (and the claimed side) or the band, and the outcome, as results.json stores them."""
        if self.band is not None:
            judged = {"band": list(self.band), "claimed": "within", "outcome": self.outcome}
        else:
            judged = {
                "threshold": self.threshold,
                "claimed": "above" if self.above else "below",
                "outcome": self.outcome,
            }
        if self.failed_arm:
            judged["failed_arm"] = self.failed_arm
        elif self.outcome == INCONCLUSIVE:
            judged["to_decide"] = self.to_decide()
        return judged

    def to_decide(self) -> dict[str, Any]:
        """{'n', 'as', 'reason'}: the fewest values (seeds or repeats) whose interval would decide this undecided
        decision if its estimate and spread stayed as measured, which way ('holds' or 'does not hold'), and why
        none would ('n' None) when that is so."""
        toward, against = self.gaps()
        side, gap = (HOLDS, toward) if toward > 0 else (FAILS, against)
        if gap <= 0:
            return {"n": None, "as": None, "reason": "the estimate lies exactly on the threshold"}
        n = units_to_clear(gap, self.interval.sd)
        if n is None:
            if self.interval.sd is None and self.interval.n < 2:
                reason = "one value gives no spread to project from: run at least 2"
            elif self.interval.sd is None:
                reason = (
                    f"its interval (n={self.interval.n}) is not over per-seed values, so no spread per seed is known"
                )
            else:
                reason = f"more than {MOST_UNITS:,} would be needed"
            return {"n": None, "as": side, "reason": reason}
        return {"n": n, "as": side, "reason": ""}


def units_to_clear(gap: float, sd: float | None, most: int = MOST_UNITS) -> int | None:
    """The smallest n >= 2 for which a 95% Student-t interval (n - 1 degrees of freedom) around an estimate `gap`
    away from a threshold, over n values of standard deviation `sd`, excludes the threshold: t(n - 1) sd / sqrt(n)
    < gap. The standard sample-size calculation with the interval `mean_interval` uses (for Welch's interval,
    n - 1 is its fewest degrees of freedom, so n is an upper bound). None when gap <= 0, the spread is unknown, or
    more than `most` would be needed."""
    if sd is None or not gap > 0 or not math.isfinite(sd):
        return None
    half = lambda n: t_quantile(n - 1) * sd / math.sqrt(n)
    if half(most) >= gap:
        return None
    low, high = 1, most  # half(high) < gap; half(low) is infinite
    while high - low > 1:  # t(n - 1) / sqrt(n) falls as n grows
        middle = (low + high) // 2
        low, high = (low, middle) if half(middle) < gap else (middle, high)
    return high


def judge(checks: Callable[[dict], list[Check]], results: dict) -> list[Check]:
    """`checks(results)`, each check given its `intervals` and, when inconclusive, its `to_decide` (see the module
    docstring). The experiment's `checks` is run as it is: the numbers are found from what it logged."""
    token = JUDGING.set([])
    try:
        found = checks(results)
        log = JUDGING.get()
    finally:
        JUDGING.reset(token)
    owners = _owners(found, log) if found else []
    intervals = [item for kind, item in log if kind == "interval"]
    for check in found:
        owned = [d for d, owner in owners if owner is check]
        check.intervals = _entries(check.figure, owned, intervals)
        check.to_decide = _to_decide(owned, check.outcome)
    return found


def _to_decide(decisions: list[Decision], outcome: str) -> dict[str, Any] | None:
    """How many seeds would decide an inconclusive check: it needs each undecided interval to clear its threshold
    on the claimed side (the checks combine their parts with `all_of` or its like), and fails as soon as one
    clears it on the other side; None for a decided check."""
    if outcome != INCONCLUSIVE:
        return None
    undecided = [d for d in decisions if d.outcome == INCONCLUSIVE]
    now = max((d.interval.n for d in decisions), default=None)
    failed = [d.failed_arm for d in decisions if d.failed_arm]
    if failed:
        return {
            "n": None,
            "now": now,
            "as": None,
            "reason": f"an arm did not learn ({failed[0]}), which more seeds of the same sizes do not change",
        }
    if not undecided:
        return {
            "n": None,
            "now": now,
            "as": None,
            "reason": "none of its intervals is undecided: it is inconclusive for a reason its figure gives (an arm "
            "that did not learn, a part not measured), which more seeds do not change",
        }
    parts = [(d, d.to_decide()) for d in undecided]
    wrong = [(d, part) for d, part in parts if part["as"] != HOLDS]
    if wrong:
        d, part = min(wrong, key=lambda dp: dp[1]["n"] if dp[1]["n"] is not None else math.inf)
        reason = (
            f"cannot clear: the estimate {_value(d.interval)} is on the wrong side of {_bar(d)}, so more seeds "
            "would not make it hold" + ("" if part["n"] else f" ({part['reason']})")
        )
        return {"n": part["n"], "now": now, "as": part["as"], "reason": reason}
    unknown = [part["reason"] for _, part in parts if part["n"] is None]
    if unknown:
        return {"n": None, "now": now, "as": HOLDS, "reason": f"cannot be projected: {unknown[0]}"}
    return {"n": max(part["n"] for _, part in parts), "now": now, "as": HOLDS, "reason": ""}


def _value(interval: Interval) -> str:
    return interval.text().partition(" [")[0]


def _bar(decision: Decision) -> str:
    if decision.band is not None:
        return f"the band [{decision.band[0]:g}, {decision.band[1]:g}]"
    return f"{decision.threshold:g} (claimed {'above' if decision.above else 'below'})"


def _owners(found: list[Check], log: list[tuple[str, Any]]) -> list[tuple[Decision, Check]]:
    """Which check each decision belongs to: the first check built after it whose figure shows its interval; a
    decision no figure shows goes with the nearest shown one taken against the same threshold (one of several
    compared with one bar, of which the figure shows the worst), else with the next check built."""
    built = {}
    for i, (kind, item) in enumerate(log):
        if kind == "check" and any(item is check for check in found):
            built.setdefault(id(item), i)
    order = sorted(found, key=lambda check: built.get(id(check), math.inf))
    decisions = [(i, item) for i, (kind, item) in enumerate(log) if kind == "decision"]
    owner: dict[int, Check] = {}
    for i, decision in decisions:
        showing = [c for c in order if built.get(id(c), math.inf) > i and _spans(c.figure, [decision.interval])]
        if showing:
            owner[i] = showing[0]
    for i, decision in decisions:
        if i in owner:
            continue
        alike = [(abs(j - i), j) for j, other in decisions if j in owner and _same_bar(other, decision)]
        later = [c for c in order if built.get(id(c), math.inf) > i]
        owner[i] = owner[min(alike)[1]] if alike else later[0] if later else order[-1]
    return [(decision, owner[i]) for i, decision in decisions]


def _same_bar(a: Decision, b: Decision) -> bool:
    return (a.threshold, a.above, a.band) == (b.threshold, b.above, b.band)


# an interval's text as `Interval.text` writes it, at 1-4 digits, not preceded by a digit, a sign, a point or '['
_BEFORE = re.compile(r"[\w.+\-\[]")


def _spans(figure: str, intervals: Sequence[Interval]) -> list[tuple[int, str, Interval, int]]:
    """(position, text, interval, digits) for each place `figure` shows one of `intervals`, in figure order; one
    interval per place (the last logged with that text)."""
    found: dict[int, tuple[int, str, Interval, int]] = {}
    for interval in intervals:
        for digits in range(1, 5):
            text = interval.text(digits)
            start = figure.find(text)
            while start >= 0:
                if start == 0 or not _BEFORE.match(figure[start - 1]):
                    found[start] = (start, text, interval, digits)
                start = figure.find(text, start + 1)
    return sorted(found.values(), key=lambda span: span[0])


def _entries(figure: str, owned: list[Decision], intervals: list[Interval]) -> list[dict[str, Any]]:
    """The intervals behind a check, as numbers: one entry for each interval its figure shows (in figure order)
    with the decisions taken on it, then one for each interval it decided but does not show (`shown` None)."""
    groups: dict[int, list[Decision]] = {}  # decisions taken on the same interval (e.g. a band's two edges)
    for decision in owned:
        groups.setdefault(id(decision.interval), []).append(decision)
    used: set[int | None] = set()
    entries = []
    for _, text, interval, digits in _spans(figure, intervals + [d.interval for d in owned]):
        matching = [key for key, ds in groups.items() if ds[0].interval.text(digits) == text]
        key = next((k for k in matching if k not in used), matching[0] if matching else None)
        decisions = groups.get(key, [])
        used.add(key)
        entries.append(_entry(decisions[0].interval if decisions else interval, decisions, text, digits))
    for key, decisions in groups.items():
        if key not in used:
            entries.append(_entry(decisions[0].interval, decisions, None, None))
    return entries


def _entry(interval: Interval, decisions: list[Decision], shown: str | None, digits: int | None) -> dict[str, Any]:
    return {
        "shown": shown,
        "digits": digits,
        "estimate": interval.mean,
        "low": interval.low,
        "high": interval.high,
        "n": interval.n,
        "ratio": interval.ratio,
        "signed": interval.signed,
        "sd": interval.sd,
        "df": interval.df,
        "judged": [d.numbers() for d in decisions],
    }


def interval_from(entry: dict[str, Any]) -> Interval:
    """The `Interval` of a results.json interval entry (to check it against its text, or decide it again)."""
    keys = ("estimate", "low", "high", "n", "ratio", "signed", "sd", "df")
    return Interval(*(entry[k] for k in keys))
