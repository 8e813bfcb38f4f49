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
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

from .base import FAILS, HOLDS, INCONCLUSIVE, Check, ExperimentError

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
    half = t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half, len(values))


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
    half = t_quantile(max(1, math.floor(df))) * spread
    return Interval(ratio, math.exp(centre - half), math.exp(centre + half), min(len(la), len(lb)), ratio=True)


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> Interval:
    """The geometric mean of a_i / b_i with its 95% interval (paired t on the log ratios): for timings of two
    arms measured on the same seeds, "A takes 1.6x as long as B"."""
    if len(a) != len(b):
        raise ExperimentError(f"paired arms share seeds: {len(a)} values against {len(b)}")
    logs = mean_interval([math.log(x / y) for x, y in zip(a, b)])
    return Interval(math.exp(logs.mean), math.exp(logs.low), math.exp(logs.high), logs.n, ratio=True)


def decide(interval: Interval, threshold: float, above: bool = True) -> str:
    """HOLDS when the interval clears `threshold` in the claimed direction (above it, or below it when
    `above` is False), FAILS when it clears it the other way, INCONCLUSIVE when it straddles it."""
    low, high = (interval.low, interval.high) if above else (-interval.high, -interval.low)
    bar = threshold if above else -threshold
    if low > bar:
        return HOLDS
    return FAILS if high < bar else INCONCLUSIVE


def decide_within(interval: Interval, low: float, high: float) -> str:
    """HOLDS when the whole interval lies inside the band [low, high], FAILS when it lies wholly outside it,
    INCONCLUSIVE when it overlaps an edge of the band."""
    if interval.low > low and interval.high < high:
        return HOLDS
    return FAILS if interval.high < low or interval.low > high else INCONCLUSIVE


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
    if failed_arm:
        return Check(what, threshold, f"{figure}; {failed_arm}", False, INCONCLUSIVE)
    return Check(what, threshold, figure, False, decide(interval, bar, above))
