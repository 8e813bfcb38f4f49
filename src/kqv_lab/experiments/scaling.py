"""`scaling`: dot products grow with the dimension, so attention divides them by sqrt(d_k).

The lecture: "when dimensionality d becomes large, dot products between vectors tend to become large. Because of
this, inputs to the softmax function can be large, making the gradients small." Scaled dot-product attention
divides the scores by sqrt(d_k) (Vaswani et al. 2017, §3.2.1: if q and k have independent components of mean 0
and variance 1, q . k has mean 0 and variance d_k).

How it is tested, in three parts:
1. the variance of q . k for random vectors with unit-variance components, for d = 16 ... 1,024;
2. for one random query against random keys, the softmax with and without the factor: its entropy, its largest
   weight, and the norm of its Jacobian (how much gradient it passes back to the scores);
3. the same small Shakespeare LM trained with and without the factor (`ablations.without_scaling`: every kernel
   computes softmax(q k^T) v), its loss curves, final validation loss and the entropy of its trained attention.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from kqv.nn import DecoderLM

from .ablations import without_scaling
from .base import FAILS, HOLDS, INCONCLUSIVE, Check, Progress, mean_std, pm
from .lm import QUICK_LM, Arm, LMConfig, Trained, attention_maps, head_statistics, shakespeare, train_arms
from .plotting import curves, figure, log_log, save
from .statistics import interval_check, mean_interval, paired_difference, paired_ratio

NAME = "scaling"
CLAIM = "without 1/sqrt(d_k), q.k grows with d, softmax saturates and its gradients vanish"
LECTURE = (
    "When dimensionality d becomes large, dot products between vectors tend to become large. Because of this, "
    "inputs to the softmax function can be large, making the gradients small. Scaled dot-product attention "
    "divides the attention scores by sqrt(d/h) to stop the scores from becoming large just as a function of "
    "d/h."
)
FIELDS = ("dims", "variance", "softmax", "lm")
ARMS = {"scaled": Arm(), "unscaled": Arm(lambda config: without_scaling(DecoderLM(config)))}


@dataclass
class Config(LMConfig):
    """The sizes of the `scaling` experiment (`FULL` and `QUICK` below), validated when made."""

    dims: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)
    samples: int = 20_000  # random (q, k) pairs per dimension for the variance
    keys: int = 64  # keys per query for the softmax statistics
    queries: int = 500  # random queries per dimension for the softmax statistics


FULL = Config(d_model=128, n_heads=2, d_ff=512, steps=300)
QUICK = Config(**{**QUICK_LM, "n_heads": 1}, dims=(16, 64, 256), samples=2000, queries=100)


def method(config: Config) -> str:
    return (
        f"(1) var(q . k) over {config.samples:,} pairs of N(0, I) vectors for d = "
        f"{', '.join(map(str, config.dims))}; (2) for {config.queries} random queries against {config.keys} random "
        f"keys per d, the softmax of q . k and of q . k / sqrt(d): entropy, largest weight, and the gradient "
        f"norm (Frobenius norm of the softmax's Jacobian d weights / d scores); (3) a character-level "
        f"Shakespeare LM ({config.sizes()}; head dimension {config.d_model // config.n_heads}) trained with and "
        f"without the factor, on the same batches."
    )


def score_variance(d: int, samples: int, generator: torch.Generator) -> float:
    queries, keys = (torch.randn(samples, d, generator=generator, dtype=torch.float64) for _ in range(2))
    return float((queries * keys).sum(-1).var())


def softmax_statistics(d: int, config: Config, scaled: bool, generator: torch.Generator) -> dict[str, float]:
    """Mean entropy (nats), largest weight and gradient norm of softmax(q K^T [/ sqrt d]) for random q and K.

    The gradient norm is the Frobenius norm of the softmax's Jacobian, diag(p) - p p^T: how much of any upstream
    gradient can flow back to the scores. It is 0 for a one-hot softmax and about 1/sqrt(n) for a uniform one."""
    queries = torch.randn(config.queries, 1, d, generator=generator, dtype=torch.float64)
    keys = torch.randn(config.queries, config.keys, d, generator=generator, dtype=torch.float64)
    scores = (queries @ keys.transpose(-2, -1)).squeeze(1) / (math.sqrt(d) if scaled else 1.0)  # (queries, keys)
    weights = scores.softmax(-1)
    squares = (weights**2).sum(-1)
    jacobian_norm = (squares - 2 * (weights**3).sum(-1) + squares**2).clamp_min(0).sqrt()
    entropy = -(weights * weights.clamp_min(1e-300).log()).sum(-1)
    return {
        "entropy": float(entropy.mean()),
        "max_weight": float(weights.max(-1).values.mean()),
        "grad_norm": float(jacobian_norm.mean()),
    }


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(2 * len(seeds) * len(config.dims) + len(ARMS) * len(seeds))
    variance = {str(d): [] for d in config.dims}
    softmax = {arm: {str(d): [] for d in config.dims} for arm in ("scaled", "unscaled")}
    for seed in seeds:
        generator = torch.Generator().manual_seed(seed)
        for d in config.dims:
            variance[str(d)].append(score_variance(d, config.samples, generator))
            progress.step(f"var(q.k) d={d}")
            for arm in softmax:
                softmax[arm][str(d)].append(softmax_statistics(d, config, arm == "scaled", generator))
            progress.step(f"softmax d={d}")
    corpus = shakespeare()

    def attention_entropy(trained: Trained) -> dict[str, float]:
        maps = attention_maps(trained.model, corpus, config)
        return {"attention_entropy": statistics.fmean(statistics.fmean(head_statistics(w)["entropy"]) for w in maps)}

    lm = train_arms(config, seeds, ARMS, progress, corpus=corpus, measure=attention_entropy)
    return {"dims": list(config.dims), "keys": config.keys, "variance": variance, "softmax": softmax, "lm": lm}


def _stat(results: dict, arm: str, d: int, name: str) -> list[float]:
    return [s[name] for s in results["softmax"][arm][str(d)]]


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = [
        "d",
        "var(q.k)",
        "var / d",
        "entropy scaled",
        "entropy unscaled",
        "max weight scaled",
        "max weight unscaled",
        "grad norm scaled",
        "grad norm unscaled",
    ]
    rows = []
    for d in results["dims"]:
        var = results["variance"][str(d)]
        rows.append(
            [d, pm(var, 1), round(mean_std(var)[0] / d, 3)]
            + [
                pm(_stat(results, arm, d, name), 3)
                for name in ("entropy", "max_weight", "grad_norm")
                for arm in ("scaled", "unscaled")
            ]
        )
    for arm in ("scaled", "unscaled"):
        lm = results["lm"][arm]
        rows.append(
            [
                f"LM {arm}",
                "",
                "",
                f"trained attention entropy {pm(lm['attention_entropy'], 3)}",
                "",
                "",
                "",
                f"val loss {pm(lm['val_loss'])}",
                "",
            ]
        )
    return columns, rows


def checks(results: dict) -> list[Check]:
    dims, largest = results["dims"], results["dims"][-1]
    ratios = [mean_std(results["variance"][str(d)])[0] / d for d in dims]
    top = {arm: _stat(results, arm, largest, "max_weight") for arm in ("scaled", "unscaled")}
    grad = {arm: _stat(results, arm, largest, "grad_norm") for arm in ("scaled", "unscaled")}
    scaled, unscaled = (results["lm"][arm]["val_loss"] for arm in ("scaled", "unscaled"))
    diverged = [arm for arm in ("scaled", "unscaled") if any(results["lm"][arm]["diverged"])]
    return [
        Check(
            "var(q . k) grows in proportion to d",
            "var / d within [0.9, 1.1] at every d",
            ", ".join(f"{d}: {r:.3f}" for d, r in zip(dims, ratios)),
            all(0.9 <= r <= 1.1 for r in ratios),
        ),
        _both(
            f"without the factor the softmax saturates at d = {largest}",
            "mean largest weight > 0.9 unscaled and < 0.5 scaled (95% intervals over seeds)",
            interval_check("", "", mean_interval(top["unscaled"]), 0.9),
            interval_check("", "", mean_interval(top["scaled"]), 0.5, above=False),
        ),
        interval_check(
            f"without the factor the gradient through the softmax vanishes at d = {largest}",
            "unscaled gradient norm / scaled one < 1/10 (per seed, 95% interval)",
            paired_ratio(grad["unscaled"], grad["scaled"]),
            0.1,
            above=False,
            detail=f"unscaled {pm(grad['unscaled'], 4)}, scaled {pm(grad['scaled'], 4)}",
        ),
        interval_check(
            "the LM trains worse without the factor",
            "unscaled - scaled validation loss > 0.02 nats (paired by seed, 95% interval)",
            paired_difference(unscaled, scaled),
            0.02,
            failed_arm=f"diverged: {', '.join(diverged)}" if diverged else None,
            detail=f"scaled {pm(scaled)}, unscaled {pm(unscaled)}",
        ),
    ]


def _both(what: str, threshold: str, first: Check, second: Check) -> Check:
    """One check made of two interval checks that must both hold (it fails when either fails)."""
    outcomes = {first.outcome, second.outcome}
    outcome = FAILS if FAILS in outcomes else INCONCLUSIVE if INCONCLUSIVE in outcomes else HOLDS
    return Check(what, threshold, f"unscaled {first.figure}, scaled {second.figure}", False, outcome)


def plots(results: dict, directory: Path) -> list[Path]:
    dims = results["dims"]
    fig, (variance, saturation, gradient) = figure(3, width=4.8)
    means = [mean_std(results["variance"][str(d)])[0] for d in dims]
    variance.plot(dims, means, "o-", label="measured var(q . k)")
    variance.plot(dims, dims, "k--", label="d")
    log_log(variance, "d", "variance", "q . k for N(0, I) vectors")
    for arm, style in (("scaled", "o-"), ("unscaled", "s--")):
        saturation.plot(
            dims,
            [mean_std(_stat(results, arm, d, "max_weight"))[0] for d in dims],
            style,
            label=f"largest weight, {arm}",
        )
        gradient.plot(dims, [mean_std(_stat(results, arm, d, "grad_norm"))[0] for d in dims], style, label=arm)
    saturation.set(
        xscale="log", ylim=(0, 1.05), xlabel="d", ylabel="weight", title=f"softmax over {results['keys']} keys"
    )
    log_log(gradient, "d", "|d softmax / d scores| (Frobenius)", "gradient through softmax")
    for ax in (variance, saturation, gradient):
        ax.legend()
    lm_fig, (train, val) = figure(2)
    curves(train, {arm: results["lm"][arm]["train_curves"] for arm in ("scaled", "unscaled")})
    curves(val, {arm: results["lm"][arm]["val_curves"] for arm in ("scaled", "unscaled")}, marker="o")
    train.set(title="training loss"), val.set(title="validation loss")
    return [save(fig, directory / "scaling-softmax.png"), save(lm_fig, directory / "scaling-lm.png")]
