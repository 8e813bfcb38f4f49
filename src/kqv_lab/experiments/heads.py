"""`heads`: one attention head can only look one way; several heads can look several ways at once.

The lecture: for word i, self-attention "looks" where x_i^T Q^T K x_j is high, but maybe we want to focus on
different j for different reasons. Multi-head attention runs h attention operations with their own Q, K, V of
d/h dimensions each, in parallel, at the same cost as one head of d dimensions.

How it is tested: the small Shakespeare LM trained with 1, 2, 4 and 8 heads at the same d_model (so the same
parameter count, reported) on the same batches. Measured: validation loss, and per head of the trained models the
entropy of its attention (nats) and its mean attended distance sum_j w_ij (i - j) in tokens, on validation
blocks; how differently the heads attend is the spread of those per-head figures within a layer. The range of h
values grows with h by construction, so the spread of the trained heads is compared with the spread of the same
model's heads at initialisation (same seed, untrained), per seed: training must widen it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kqv.nn import DecoderLM

from .base import INCONCLUSIVE, Check, Progress, mean_std, pm
from .lm import QUICK_LM, Arm, LMConfig, attention_maps, head_statistics, shakespeare, train_arms
from .plotting import curves, figure, save
from .statistics import decide, interval_check, paired_difference

RERUN = "inconclusive: needs rerun (`kqv experiment run heads --out docs/experiments`) to measure untrained heads"

NAME = "heads"
CLAIM = "several heads at the same width attend in different ways (entropy, distance) and model text at least as well"
LECTURE = (
    "For word i, self-attention looks where x_i^T Q^T K x_j is high, but maybe we want to focus on different j "
    "for different reasons. Multi-head attention defines multiple attention heads through multiple Q, K, V "
    "matrices; each head looks at different things, at the same computational cost as one head."
)
FIELDS = ("heads", "arms")


@dataclass
class Config(LMConfig):
    """The sizes of the `heads` experiment (`FULL` and `QUICK` below), validated when made."""

    head_counts: tuple[int, ...] = (1, 2, 4, 8)
    blocks: int = 4  # validation blocks the attention is measured on


FULL = Config()
QUICK = Config(**QUICK_LM, head_counts=(1, 4), blocks=2)


def method(config: Config) -> str:
    counts = ", ".join(map(str, config.head_counts))
    return (
        f"A character-level Shakespeare LM ({config.sizes()}) trained with {counts} heads at the same d_model "
        f"{config.d_model}, on the same batches; per-head attention entropy and mean attended distance on "
        f"{config.blocks} x {config.batch_size} validation blocks."
    )


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(len(config.head_counts) * len(seeds))
    corpus = shakespeare()
    arms = {f"{h} head{'s' * (h > 1)}": Arm(model={"n_heads": h}) for h in config.head_counts}

    def per_head(model: DecoderLM) -> dict:
        stats = [head_statistics(w) for w in attention_maps(model, corpus, config, config.blocks)]
        return {"entropy": [s["entropy"] for s in stats], "distance": [s["distance"] for s in stats]}

    untrained: dict[str, list] = {"entropy": [], "distance": []}
    for seed in seeds:  # the same model as the most-heads arm's, seeded the same, before any training
        torch.manual_seed(seed)
        model = DecoderLM(config.model_config(corpus.vocab_size, n_heads=config.head_counts[-1]))
        for key, value in per_head(model).items():
            untrained[key].append(value)
    return {
        "heads": list(config.head_counts),
        "arms": train_arms(
            config, seeds, arms, progress, corpus=corpus, measure=lambda trained: per_head(trained.model)
        ),
        "untrained": untrained,
    }


def spread(per_layer: list[list[float]]) -> float:
    """The largest within-layer range (max - min over heads) of a per-head figure."""
    return max(max(layer) - min(layer) for layer in per_layer)


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = [
        "heads",
        "parameters",
        "validation loss",
        "mean head entropy (nats)",
        "within-layer range of head entropy",
        "mean attended distance (tokens)",
        "within-layer range of head distance",
    ]
    rows = []
    for arm, r in results["arms"].items():
        entropy = [sum(map(sum, e)) / sum(map(len, e)) for e in r["entropy"]]
        distance = [sum(map(sum, d)) / sum(map(len, d)) for d in r["distance"]]
        rows.append(
            [
                arm,
                r["parameters"],
                pm(r["val_loss"]),
                pm(entropy, 2),
                pm([spread(e) for e in r["entropy"]], 2),
                pm(distance, 1),
                pm([spread(d) for d in r["distance"]], 1),
            ]
        )
    return columns, rows


def widening(results: dict) -> Check:
    """Check 1: training widens the spread of the most-heads model's heads beyond their spread at initialisation
    (a range over more heads is wider by construction, so the untrained model of the same shape is the baseline)."""
    name, most = list(results["arms"])[-1], list(results["arms"].values())[-1]
    what = f"the heads of the {name} model attend differently"
    threshold = (
        "the within-layer range grows by training, over the same model untrained (per seed, 95% interval): "
        "entropy by > 0.5 nats or distance by > 2 tokens"
    )
    trained = {key: [spread(x) for x in most[key]] for key in ("entropy", "distance")}
    figure = f"trained range: entropy {pm(trained['entropy'], 2)} nats, distance {pm(trained['distance'], 1)} tokens"
    if "untrained" not in results:
        return Check(what, threshold, f"{figure}; {RERUN}", False, INCONCLUSIVE)
    gains = {
        key: paired_difference(trained[key], [spread(x) for x in results["untrained"][key]])
        for key in ("entropy", "distance")
    }
    outcomes = [decide(gains["entropy"], 0.5), decide(gains["distance"], 2.0)]
    outcome = "holds" if "holds" in outcomes else INCONCLUSIVE if INCONCLUSIVE in outcomes else "does not hold"
    figure += f"; growth: entropy {gains['entropy'].text(2)}, distance {gains['distance'].text(1)}"
    return Check(what, threshold, figure, False, outcome)


def checks(results: dict) -> list[Check]:
    arms, names = list(results["arms"].values()), list(results["arms"])
    loss = [mean_std(r["val_loss"])[0] for r in arms]
    return [
        widening(results),
        interval_check(
            f"{names[-1]} model the text at least as well as one head of the same width",
            f"{names[-1]} - {names[0]} validation loss (paired by seed) < 0 (95% interval)",
            paired_difference(arms[-1]["val_loss"], arms[0]["val_loss"]),
            0.0,
            above=False,
            detail=f"{names[-1]} {loss[-1]:.3f}, {names[0]} {loss[0]:.3f}",
        ),
    ]


def plots(results: dict, directory: Path) -> list[Path]:
    fig, (scatter, lm) = figure(2)
    for arm, r in results["arms"].items():
        entropy = [x for layer in r["entropy"][0] for x in layer]  # seed 0, every layer and head
        distance = [x for layer in r["distance"][0] for x in layer]
        scatter.scatter(distance, entropy, label=arm, alpha=0.8)
    scatter.set(
        xlabel="mean attended distance (tokens)", ylabel="attention entropy (nats)", title="one point per head (seed 0)"
    )
    scatter.legend()
    curves(lm, {arm: r["val_curves"] for arm, r in results["arms"].items()}, marker="o")
    lm.set(title="LM validation loss")
    return [save(fig, directory / "heads.png")]
