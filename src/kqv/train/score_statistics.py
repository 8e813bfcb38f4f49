"""The statistics of exact-match scores: the interval of a proportion (Wilson), a paired difference over questions
(`difference_over_questions`: Student's t, the exact sign test, McNemar's on 1/0 scores) and a score against its
guess (`difference_from_guess`: the exact Poisson-binomial test), each question the unit, seeds averaged per
question (`mean_over_seeds`), never pooled."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist, fmean, stdev

import torch

from ..errors import DataError


def wilson_interval(correct: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a proportion `correct` / `n` (Wilson 1927): the p whose normal test does not
    reject correct/n at `level`. Unlike p +- z sqrt(p(1-p)/n) it stays inside [0, 1] and is not empty at 0 or n right,
    which small exact-match counts hit often."""
    if not 0 <= correct <= n or n < 1:
        raise DataError(f"a proportion needs 0 <= correct <= n and n >= 1, got {correct}/{n}")
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p, z2 = correct / n, z * z / n
    centre = (p + z2 / 2) / (1 + z2)
    half = z / (1 + z2) * math.sqrt(p * (1 - p) / n + z2 / (4 * n))
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class QuestionDifference:
    """mean(a_i - b_i) over `n` questions (the unit: each question once, however many seeds scored it), its 95%
    interval [low, high], and an exact two-sided test (`test` names it): by default the sign test over the questions
    where a and b differ, `better` questions where a scored higher, `worse` where it scored lower, `p_value` its
    p-value. On 1/0 scores on both sides (one run against a constant, or two runs) the sign test is McNemar's exact
    test, and `test` says "McNemar"; where a side's scores are means over seeds, it is the sign test over the
    questions (which side each question leans to), and `test` says "sign". Against a guess (`difference_from_guess`)
    `test` says "guess" and `seed_p_values` holds each seed's own p-value when several seeds answered."""

    difference: float
    low: float
    high: float
    n: int
    better: int
    worse: int
    p_value: float
    test: str = "McNemar"  # the exact test of p_value: "McNemar", "sign" (seed means) or "guess" (`guess_test`)
    seed_p_values: tuple[float, ...] = ()  # against a guess, each seed's p-value (`difference_from_guess`)

    def to_dict(self, name: str | None = None) -> dict:
        """Its figures as JSON; given a `name`, as flat keys that begin with it (name, name_95, name_questions, ...),
        to sit beside other figures."""
        keys = (
            ("difference", "difference_95", "questions", "better", "worse", "p_value")
            if name is None
            else (name, f"{name}_95", f"{name}_questions", f"{name}_better", f"{name}_worse", f"{name}_p")
        )
        figures = dict(
            zip(keys, (self.difference, [self.low, self.high], self.n, self.better, self.worse, self.p_value))
        )
        if name is None:
            figures["test"] = self.test
        if self.seed_p_values:
            figures["seed_p_values" if name is None else f"{name}_seed_p"] = list(self.seed_p_values)
        return figures


def difference_over_questions(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> QuestionDifference:
    """How much a scores above b on the same questions: a_i and b_i are question i's scores in [0, 1] (1/0 for one
    run; with several seeds, each question's mean over the seeds, never the seeds' answers pooled as more
    questions). The interval is Student's t over the n per-question differences d_i = a_i - b_i:
    mean(d) +- t(n - 1) sd(d) / sqrt(n), kept within [-1, 1] (with 1/0 scores, the Wald interval of a paired
    difference of proportions, t for z); one question gives [-1, 1], and when every question has the same
    difference the interval has no width, so read it with the sign test's p-value (`sign_test`)."""
    if len(a) != len(b) or not a:
        raise DataError(f"a paired difference needs the same questions on both sides, got {len(a)} and {len(b)}")
    if not all(0 <= x <= 1 for x in (*a, *b)):
        raise DataError("scores over questions are in [0, 1] (1/0 per question, or a mean over seeds)")
    differences = [float(x) - float(y) for x, y in zip(a, b)]
    mean, n = fmean(differences), len(differences)
    half = math.inf if n == 1 else t_quantile(n - 1, level) * stdev(differences) / math.sqrt(n)
    better, worse = sum(d > 0 for d in differences), sum(d < 0 for d in differences)
    low, high = max(-1.0, mean - half), min(1.0, mean + half)
    test = "McNemar" if all(x in (0, 1) for x in (*a, *b)) else "sign"
    return QuestionDifference(mean, low, high, n, better, worse, sign_test(better, worse), test)


def difference_from_guess(
    scores: Sequence[float], guesses: Sequence[float], per_seed: Sequence[Sequence[float]] | None = None
) -> QuestionDifference:
    """How much `scores` (question i's exact match) score above a random guess that is right on question i with
    probability `guesses[i]`: the paired t interval of `difference_over_questions`, and an exact test made for a
    guess (`guess_test`) in place of McNemar's, which needs 1/0 scores on both sides.

    One run's 1/0 `scores` are independent trials against the guess's: `p_value` is `guess_test` of its hits. Where
    several seeds answered the same questions, `scores` is each question's mean over them and `per_seed[s]` seed s's
    1/0 scores: the seeds' answers to one question are not independent trials (a question one seed gets right,
    another likely does too), so they are never pooled as more trials. Each seed is tested on its own
    (`seed_p_values`), and `p_value` is the largest of them (1 when the seeds fall on opposite sides of the guess):
    below a level only when every seed is, on the same side, which is a valid test at that level (an
    intersection-union test). `better` is the hits of one run (the seeds' mean, rounded), `worse` the hits a guess
    expects."""
    t = difference_over_questions(scores, guesses)
    expected = sum(guesses)
    if per_seed is None:
        if not all(s in (0, 1) for s in scores):
            raise DataError("scores averaged over seeds need each seed's own scores (per_seed) for the guess test")
        hits = round(sum(scores))
        return QuestionDifference(t.difference, t.low, t.high, t.n, hits, round(expected), guess_test(hits, guesses),
                                  "guess")  # fmt: skip
    if not per_seed or any(len(seed) != len(scores) or not all(s in (0, 1) for s in seed) for seed in per_seed):
        raise DataError("each seed's scores are 1/0 on the same questions as the scores")
    if any(abs(m - x) > 1e-9 for m, x in zip(mean_over_seeds(per_seed), scores)):
        raise DataError("the scores must be each question's mean over the seeds of per_seed")
    hits = [round(sum(seed)) for seed in per_seed]
    p_values = tuple(guess_test(h, guesses) for h in hits)
    sides = {h > expected for h in hits if h != expected}
    p_value = max(p_values) if len(sides) <= 1 else 1.0
    return QuestionDifference(t.difference, t.low, t.high, t.n, round(fmean(hits)), round(expected), p_value, "guess",
                              p_values)  # fmt: skip


def guess_test(hits: int, guesses: Sequence[float]) -> float:
    """The exact two-sided p-value of `hits` right answers of one run against a guess that is right on question i
    with probability `guesses[i]`: its count of right answers G follows the Poisson-binomial distribution of those
    probabilities, and p = 2 min(P(G <= hits), P(G >= hits)), at most 1."""
    probabilities = torch.tensor([float(g) for g in guesses], dtype=torch.float64)
    if not bool(((probabilities >= 0) & (probabilities <= 1)).all()):  # host-side data, not a training step
        raise DataError("a guess's chance of being right is in [0, 1] on every question")
    counts = torch.zeros(len(probabilities) + 1, dtype=torch.float64)
    counts[0] = 1.0  # P(G = k) after no questions
    for k, p in enumerate(probabilities.tolist()):
        counts[1 : k + 2] = counts[1 : k + 2] * (1 - p) + counts[: k + 1] * p
        counts[0] *= 1 - p
    hits = min(max(hits, 0), len(probabilities))
    return min(1.0, 2 * min(float(counts[: hits + 1].sum()), float(counts[hits:].sum())))


def mean_over_seeds(per_seed: Sequence[Sequence[float]]) -> list[float]:
    """Each question's mean score over the seeds that answered it (`per_seed[s][i]`: seed s on question i): the
    per-question scores a paired analysis over questions takes when several seeds answered the same questions, so
    that n stays the number of questions (pooling the seeds' answers as more questions would narrow the interval
    with answers that are not independent)."""
    if not per_seed or len({len(scores) for scores in per_seed}) != 1:
        raise DataError(f"every seed must answer the same questions, got {[len(s) for s in per_seed]} answers")
    return [fmean(scores) for scores in zip(*per_seed)]


def sign_test(better: int, worse: int) -> float:
    """The exact two-sided p-value of `better` against `worse` under a fair coin (questions with no difference left
    out): 2 P(X <= min) for X ~ Binomial(better + worse, 1/2), at most 1; McNemar's exact test on 1/0 scores, and on
    scores averaged over seeds the sign test of which side each question leans to."""
    n = better + worse
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(better, worse) + 1))
    return min(1.0, 2 * tail / 2**n)


def t_quantile(df: int, level: float = 0.95) -> float:
    """The two-sided `level` quantile of Student's t with `df` degrees of freedom: the t with P(|T| <= t) = level,
    by bisection on the closed form of that probability (Abramowitz & Stegun 26.7.3-4) up to 200 degrees of freedom,
    and the Cornish-Fisher expansion in 1/df beyond (error below 1e-9 there)."""
    if df < 1 or not 0 < level < 1:
        raise DataError(f"a t quantile needs df >= 1 and a level in (0, 1), got {df} and {level}")
    if df > 200:
        z = NormalDist().inv_cdf(0.5 + level / 2)
        terms = [
            z,
            (z**3 + z) / 4,
            (5 * z**5 + 16 * z**3 + 3 * z) / 96,
            (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
            (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
        ]
        return sum(term / df**power for power, term in enumerate(terms))
    low, high = 0.0, 1e6
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if t_central(middle, df) < level else (low, middle)
    return (low + high) / 2


def t_central(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with `df` (a positive integer) degrees of freedom, in closed form
    (Abramowitz & Stegun 26.7.3 for odd df, 26.7.4 for even)."""
    theta = math.atan(t / math.sqrt(df))
    cos2, term = math.cos(theta) ** 2, 1.0
    if df % 2 == 0:
        total = 1.0
        for k in range(1, df // 2):
            term *= (2 * k - 1) / (2 * k) * cos2
            total += term
        return math.sin(theta) * total
    total = 0.0 if df == 1 else 1.0
    for k in range(1, (df - 1) // 2):
        term *= 2 * k / (2 * k + 1) * cos2
        total += term
    return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
