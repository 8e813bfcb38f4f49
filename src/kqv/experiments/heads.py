"""`heads`: one attention head can only look one way; several heads can look several ways at once.

The lecture: for word i, self-attention "looks" where x_i^T Q^T K x_j is high, but maybe we want to focus on
different j for different reasons. Multi-head attention runs h attention operations with their own Q, K, V of
d/h dimensions each, in parallel, at the same cost as one head of d dimensions.

How it is tested: the small Shakespeare LM trained with 1, 2, 4 and 8 heads at the same d_model (so the same
parameter count, reported) on the same batches. Measured: validation loss, and per head of the trained models the
entropy of its attention (nats) and its mean attended distance sum_j w_ij (i - j) in tokens, on validation
blocks; how differently the heads attend is the spread of those per-head figures within a layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .base import Check, Progress, mean_std, pm
from .lm import QUICK_LM, Arm, LMConfig, Trained, attention_maps, head_statistics, shakespeare, train_arms
from .plotting import curves, figure, save

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

    def per_head(trained: Trained) -> dict:
        stats = [head_statistics(w) for w in attention_maps(trained.model, corpus, config, config.blocks)]
        return {"entropy": [s["entropy"] for s in stats], "distance": [s["distance"] for s in stats]}

    return {
        "heads": list(config.head_counts),
        "arms": train_arms(config, seeds, arms, progress, corpus=corpus, measure=per_head),
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


def checks(results: dict) -> list[Check]:
    arms = list(results["arms"].values())
    names = list(results["arms"])
    most = arms[-1]
    loss = [mean_std(r["val_loss"])[0] for r in arms]
    best = min(range(1, len(arms)), key=loss.__getitem__)
    distance_range = mean_std([spread(d) for d in most["distance"]])[0]
    entropy_range = mean_std([spread(e) for e in most["entropy"]])[0]
    return [
        Check(
            f"the heads of the {names[-1]} model attend differently",
            "within some layer, head entropies differ by >= 0.5 nats or mean distances by >= 2 tokens",
            f"entropy range {entropy_range:.2f} nats, distance range {distance_range:.1f} tokens",
            entropy_range >= 0.5 or distance_range >= 2.0,
        ),
        Check(
            "several heads model the text at least as well as one head of the same width",
            "the best multi-head validation loss <= the one-head loss",
            f"{names[best]} {loss[best]:.3f}, {names[0]} {loss[0]:.3f}",
            loss[best] <= loss[0],
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
