"""`scaling-head-dim`: the 1/sqrt(d_k) argument in kqv's own attention layer, at initialisation, across head sizes.

The lecture: if the queries and keys have components of mean 0 and variance 1, q . k has variance d_k, so the
scores grow with the head dimension, the softmax saturates (one weight near 1) and its gradients become small;
dividing by sqrt(d_k) keeps the scores at unit variance whatever d_k is.

How it is tested: kqv's `MultiHeadAttention` at a fixed d_model with head dimensions 16, 64 and 256 (d_model / d_k
heads), its query, key and value maps drawn N(0, 1/d_model) so that on N(0, I) inputs q and k have unit-variance
components at initialisation (measured). On the same inputs and weights, the softmax of q . k / sqrt(d_k) (kqv's,
checked against the layer's own output) and of q . k: the variance of q . k, the mean largest weight and entropy of
each query's softmax over n keys, and, for a random upstream gradient g on the layer's output (loss = sum(g *
output)), the gradient norm reaching the scores (the softmax's input, per query) and reaching W_Q. Per seed (fresh
weights, inputs and g), so each figure has one value per seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from kqv.nn import ModelConfig, MultiHeadAttention

from .base import Check, ExperimentConfig, ExperimentError, Progress, by_construction, control, mean_std, pm
from .plotting import figure, log_log, save
from .statistics import all_of, decide, decide_within, interval_check, mean_interval, paired_ratio

NAME = "scaling-head-dim"
CLAIM = "at initialisation var(q.k) = d_k; unscaled, the softmax saturates and passes less gradient as d_k grows"
LECTURE = (
    "When dimensionality d becomes large, dot products between vectors tend to become large. Because of this, "
    "inputs to the softmax function can be large, making the gradients small. Scaled dot-product attention "
    "divides the attention scores by sqrt(d/h), to stop the scores from becoming large just as a function of d/h."
)
FIELDS = ("head_dims", "d_model", "length", "q_variance", "k_variance", "score_variance", "arms", "kqv_difference")
ARMS = ("scaled", "unscaled")
STATISTICS = ("max_weight", "entropy", "score_grad", "query_weight_grad")
INPUT_SEED = 1_000_003  # inputs and g are drawn from seed + this, the weights from seed


@dataclass
class Config(ExperimentConfig):
    """The sizes of the `scaling-head-dim` experiment (`FULL` and `QUICK` below), validated when made."""

    d_model: int = 256
    head_dims: tuple[int, ...] = (16, 64, 256)
    length: int = 128  # keys per query
    batch: int = 8
    seeds: int = 5

    def check(self) -> None:
        super().check()
        if any(self.d_model % d for d in self.head_dims):
            raise ExperimentError(f"every head dimension must divide d_model {self.d_model}: {list(self.head_dims)}")


FULL = Config()
QUICK = Config(d_model=64, head_dims=(16, 64), length=32, batch=2, seeds=2)


def method(config: Config) -> str:
    return (
        f"kqv's MultiHeadAttention at d_model {config.d_model} with head dimensions "
        f"{', '.join(map(str, config.head_dims))}, query/key/value maps N(0, 1/d_model), on {config.batch} "
        f"sequences of {config.length} N(0, I) vectors (bidirectional, no positions, fp64); softmax of q . k with "
        f"and without 1/sqrt(d_k) on the same weights and inputs; gradients of sum(g * output) for random g."
    )


def initialised_layer(d_model: int, head_dim: int) -> MultiHeadAttention:
    """A layer whose q and k have unit-variance components on N(0, I) inputs: weights N(0, 1/d_model)."""
    config = ModelConfig(
        vocab_size=1, d_model=d_model, n_heads=d_model // head_dim, max_len=1 << 16, dropout=0.0, position="none"
    )
    layer = MultiHeadAttention(config).double()
    for linear in (layer.to_queries, layer.to_keys_values, layer.to_output):
        nn.init.normal_(linear.weight, 0.0, 1 / math.sqrt(d_model))
        if linear.bias is not None:
            nn.init.zeros_(linear.bias)
    return layer


def attend(layer: MultiHeadAttention, x: Tensor, g: Tensor, scaled: bool) -> dict[str, float | Tensor]:
    """softmax(q k^T [/ sqrt(d_k)]) v through the layer's own maps, x (batch, n, d_model); its statistics and
    gradients for loss = sum(g * output)."""
    layer.zero_grad(set_to_none=True)
    queries = layer.split_heads(layer.to_queries(x))  # (batch, heads, n, head_dim)
    keys, values = layer.project_keys_values(x)
    dots = queries @ keys.transpose(-2, -1)  # (batch, heads, n, n)
    scores = dots / math.sqrt(queries.shape[-1]) if scaled else dots * 1.0
    scores.retain_grad()
    weights = scores.softmax(-1)
    output = layer.to_output(layer.merge_heads(weights @ values))  # (batch, n, d_model)
    (g * output).sum().backward()
    entropy = -(weights * weights.clamp_min(1e-300).log()).sum(-1)
    return {
        "max_weight": float(weights.detach().max(-1).values.mean()),
        "entropy": float(entropy.detach().mean()),
        "score_grad": float(scores.grad.norm(dim=-1).mean()),  # per query: |d loss / d scores|
        "query_weight_grad": float(layer.to_queries.weight.grad.norm()),
        "output": output.detach(),
        "q": queries.detach(),
        "k": keys.detach(),
        "dots": dots.detach(),
    }


def measure(config: Config, head_dim: int, seed: int) -> dict:
    """One seed at one head dimension: variances, each arm's statistics, and how far the scaled arm is from
    kqv's own forward pass."""
    generator = torch.Generator().manual_seed(INPUT_SEED + seed)  # not the weights' stream: x would align with W
    torch.manual_seed(seed)
    layer = initialised_layer(config.d_model, head_dim)
    x = torch.randn(config.batch, config.length, config.d_model, generator=generator, dtype=torch.float64)
    g = torch.randn(config.batch, config.length, config.d_model, generator=generator, dtype=torch.float64)
    arms = {arm: attend(layer, x, g, arm == "scaled") for arm in ARMS}
    with torch.no_grad():
        reference = layer(x)[0]  # kqv's attention, scaled by 1/sqrt(d_k)
    scaled = arms["scaled"]
    return {
        "q_variance": float(scaled["q"].var()),
        "k_variance": float(scaled["k"].var()),
        "score_variance": float(scaled["dots"].var()),
        "kqv_difference": float((scaled["output"] - reference).abs().max()),
        "arms": {arm: {name: arms[arm][name] for name in STATISTICS} for arm in ARMS},
    }


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(len(seeds) * len(config.head_dims))
    keys = ("q_variance", "k_variance", "score_variance", "kqv_difference")
    found: dict = {key: {str(d): [] for d in config.head_dims} for key in keys}
    arms = {arm: {name: {str(d): [] for d in config.head_dims} for name in STATISTICS} for arm in ARMS}
    for seed in seeds:
        for d in config.head_dims:
            one = measure(config, d, seed)
            for key in keys:
                found[key][str(d)].append(one[key])
            for arm in ARMS:
                for name in STATISTICS:
                    arms[arm][name][str(d)].append(one["arms"][arm][name])
            progress.step(f"d_k={d}: var(q.k) {one['score_variance']:.1f}")
    return {
        "head_dims": list(config.head_dims),
        "d_model": config.d_model,
        "length": config.length,
        **found,
        "arms": arms,
    }


def _mean(results: dict, arm: str, name: str, d: int) -> float:
    return mean_std(results["arms"][arm][name][str(d)])[0]


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = ["d_k", "heads", "var(q)", "var(k)", "var(q.k)", "var(q.k) / d_k"]
    columns += [f"{name} {arm}" for name in STATISTICS for arm in ARMS]
    rows = []
    for d in results["head_dims"]:
        per_seed = [v / d for v in results["score_variance"][str(d)]]
        row = [d, results["d_model"] // d, pm(results["q_variance"][str(d)]), pm(results["k_variance"][str(d)])]
        row += [pm(results["score_variance"][str(d)], 1), pm(per_seed)]
        row += [pm(results["arms"][arm][name][str(d)], 4) for name in STATISTICS for arm in ARMS]
        rows.append(row)
    return columns, rows


# thresholds, fixed before the experiment ran
UNIT = (0.9, 1.1)  # var(q), var(k) at initialisation
PROPORTIONAL = (0.85, 1.15)  # var(q . k) / d_k
SATURATED, SPREAD = 0.5, 0.2  # mean largest weight at the largest d_k: unscaled at least, scaled at most
STEADY = (0.8, 1.25)  # scaled: largest weight at the largest d_k / at the smallest
VANISH = 0.5  # unscaled gradient / scaled gradient at the largest d_k, at most
SAME = 1e-9  # the scaled arm against kqv's own forward pass (fp64), max |difference|


def checks(results: dict) -> list[Check]:
    dims = results["head_dims"]
    small, large = dims[0], dims[-1]
    per_d = lambda key: {d: mean_interval(results[key][str(d)]) for d in dims}
    variance = {key: per_d(key) for key in ("q_variance", "k_variance")}
    ratio = {d: mean_interval([v / d for v in results["score_variance"][str(d)]]) for d in dims}
    seeds = lambda arm, name, d: results["arms"][arm][name][str(d)]
    top = {arm: mean_interval(seeds(arm, "max_weight", large)) for arm in ARMS}
    steady = paired_ratio(seeds("scaled", "max_weight", large), seeds("scaled", "max_weight", small))
    difference = max(max(v) for v in results["kqv_difference"].values())
    listed = lambda values: "; ".join(f"{d}: {v.text()}" for d, v in values.items())
    return [
        by_construction(
            Check(
                "the scaled arm is kqv's own attention",
                f"max |output - MultiHeadAttention output| <= {SAME:g} (an identity, fp64: an exact check, no "
                "interval)",
                f"{difference:.1e}",
                difference <= SAME,
            )
        ),
        control(
            Check(
                "q and k have unit-variance components at initialisation",
                f"var(q) and var(k) within {list(UNIT)} at every d_k (95% intervals over seeds)",
                f"var(q) {listed(variance['q_variance'])}; var(k) {listed(variance['k_variance'])}",
                False,
                all_of([decide_within(v, *UNIT) for values in variance.values() for v in values.values()]),
            )
        ),
        Check(
            "var(q . k) grows in proportion to d_k",
            f"var(q . k) / d_k within {list(PROPORTIONAL)} at every d_k (95% interval over seeds)",
            listed(ratio),
            False,
            all_of([decide_within(r, *PROPORTIONAL) for r in ratio.values()]),
        ),
        Check(
            f"unscaled, the softmax saturates at d_k = {large}; scaled, it does not change with d_k",
            f"largest weight unscaled > {SATURATED}, scaled < {SPREAD}; scaled at {large} / at {small} within "
            f"{list(STEADY)} (95% intervals over seeds, the ratio per seed)",
            f"unscaled {top['unscaled'].text()}; scaled {top['scaled'].text()}; ratio {steady.text()}",
            False,
            all_of(
                [
                    decide(top["unscaled"], SATURATED),
                    decide(top["scaled"], SPREAD, above=False),
                    decide_within(steady, *STEADY),
                ]
            ),
        ),
        _vanishes(
            results,
            "score_grad",
            f"unscaled, less gradient reaches the scores at d_k = {large}",
            "at the softmax input",
        ),
        _vanishes(results, "query_weight_grad", f"unscaled, less gradient reaches W_Q at d_k = {large}", "of W_Q"),
    ]


def _vanishes(results: dict, name: str, what: str, where: str) -> Check:
    """Unscaled / scaled gradient norm at the largest d_k, per seed (same weights and inputs), below VANISH."""
    d = str(results["head_dims"][-1])
    unscaled, scaled = (results["arms"][arm][name][d] for arm in ("unscaled", "scaled"))
    return interval_check(
        what,
        f"unscaled / scaled gradient norm {where} < {VANISH} (per seed, 95% interval)",
        paired_ratio(unscaled, scaled),
        VANISH,
        above=False,
        detail=f"unscaled {pm(unscaled, 4)}, scaled {pm(scaled, 4)}",
    )


def plots(results: dict, directory: Path) -> list[Path]:
    dims = results["head_dims"]
    fig, (variance, saturation, gradient) = figure(3, width=4.8)
    variance.plot(dims, [mean_std(results["score_variance"][str(d)])[0] for d in dims], "o-", label="var(q . k)")
    variance.plot(dims, dims, "k--", label="d_k")
    log_log(variance, "head dimension d_k", "variance", "scores at initialisation")
    for arm, style in (("scaled", "o-"), ("unscaled", "s--")):
        saturation.plot(dims, [_mean(results, arm, "max_weight", d) for d in dims], style, label=f"{arm}")
        gradient.plot(dims, [_mean(results, arm, "score_grad", d) for d in dims], style, label=f"scores, {arm}")
        gradient.plot(
            dims, [_mean(results, arm, "query_weight_grad", d) for d in dims], style, alpha=0.5, label=f"W_Q, {arm}"
        )
    saturation.set(
        xscale="log",
        ylim=(0, 1.05),
        xlabel="head dimension d_k",
        ylabel="mean largest weight",
        title=f"softmax over {results['length']} keys",
    )
    log_log(gradient, "head dimension d_k", "gradient norm", "gradient of sum(g * output)")
    for ax in (variance, saturation, gradient):
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.set_xticks([], minor=True)
        ax.legend(fontsize=7)
    return [save(fig, directory / "scaling-head-dim.png")]
