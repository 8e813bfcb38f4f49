"""`no-query-key-maps`: without learned query and key maps, each token attends mostly to itself.

The lecture: in self-attention without projections, q_i = k_i = v_i = x_i, and the score x_i . x_i = |x_i|^2 is
usually the largest of x_i . x_j, so each word attends to itself; the learned matrices W_Q and W_K let a word
look for something other than itself ("x_i^T Q^T K x_j": a low-rank bilinear form of the pair).

How it is tested: the small Shakespeare LM trained twice on the same batches: once as kqv builds it, and once with
queries and keys set to the layer's (normed) input itself, scores x_i . x_j / sqrt(d_k) per head, values keeping
their learned W_V (`ablations.without_query_key_maps`; this removes 2 d_model^2 weights per layer, reported).
Measured: the mean attention weight on the query's own position (the diagonal) in the trained models, over every
layer and head, against the uniform causal baseline (mean of 1 / (i + 1)), and the validation loss.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from kqv.nn import DecoderLM

from .ablations import without_query_key_maps
from .base import Check, Progress, mean_std, pm
from .lm import QUICK_LM, Arm, LMConfig, Trained, attention_maps, head_statistics, shakespeare, train_arms
from .plotting import curves, figure, save
from .statistics import interval_check, mean_interval, paired_difference, paired_ratio

NAME = "no-query-key-maps"
CLAIM = "attention from x.x^T (no W_Q, W_K) puts most of its weight on each token itself"
LECTURE = (
    "Without the query and key matrices, x_i^T x_j is largest for j = i: each word mostly attends to itself. "
    "The learned Q and K let the model attend to other words (x_i^T Q^T K x_j is a low-rank bilinear form)."
)
FIELDS = ("arms", "uniform_diagonal")
ARMS = {"learned W_Q, W_K": Arm(), "x . x (no W_Q, W_K)": Arm(lambda config: without_query_key_maps(DecoderLM(config)))}


@dataclass
class Config(LMConfig):
    """The sizes of the `no-query-key-maps` experiment (`FULL` and `QUICK` below), validated when made."""

    blocks: int = 4  # validation blocks the attention is measured on


FULL = Config()
QUICK = Config(**QUICK_LM, blocks=2)


def method(config: Config) -> str:
    return (
        f"A character-level Shakespeare LM ({config.sizes()}) trained with learned query and key maps and with "
        f"scores from the normed input x . x^T / sqrt(d_k), on the same batches; the attention weights of every "
        f"layer and head measured on {config.blocks} x {config.batch_size} validation blocks."
    )


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(len(ARMS) * len(seeds))
    corpus = shakespeare()

    def diagonal(trained: Trained) -> dict:
        maps = attention_maps(trained.model, corpus, config, config.blocks)
        per_layer = [head_statistics(w)["diagonal"] for w in maps]
        return {"diagonal": statistics.fmean(x for layer in per_layer for x in layer), "diagonal_per_head": per_layer}

    uniform = statistics.fmean(1 / (i + 1) for i in range(config.context))
    return {
        "arms": train_arms(config, seeds, ARMS, progress, corpus=corpus, measure=diagonal),
        "uniform_diagonal": uniform,
    }


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = ["attention", "mean weight on itself", "validation loss", "parameters"]
    rows = [[arm, pm(r["diagonal"]), pm(r["val_loss"]), r["parameters"]] for arm, r in results["arms"].items()]
    rows.append(["uniform causal attention (baseline)", round(results["uniform_diagonal"], 3), "", ""])
    return columns, rows


def checks(results: dict) -> list[Check]:
    learned, plain = (results["arms"][arm] for arm in ARMS)
    diagonal = {"learned": mean_std(learned["diagonal"])[0], "plain": mean_std(plain["diagonal"])[0]}
    return [
        interval_check(
            "without W_Q, W_K most attention goes to the token itself",
            "mean diagonal weight > 0.5 (95% interval over seeds)",
            mean_interval(plain["diagonal"]),
            0.5,
        ),
        interval_check(
            "learned maps look elsewhere",
            "diagonal weight without maps / with them > 2 (per seed, 95% interval)",
            paired_ratio(plain["diagonal"], learned["diagonal"]),
            2.0,
            detail=f"{diagonal['plain']:.3f} vs {diagonal['learned']:.3f}",
        ),
        interval_check(
            "the LM without the maps is worse",
            "validation loss - the learned maps' > 0.02 nats (paired by seed, 95% interval)",
            paired_difference(plain["val_loss"], learned["val_loss"]),
            0.02,
            detail=f"{pm(plain['val_loss'])} vs {pm(learned['val_loss'])}",
        ),
    ]


def plots(results: dict, directory: Path) -> list[Path]:
    fig, (heads, lm) = figure(2)
    for offset, (arm, r) in enumerate(results["arms"].items()):
        per_head = [x for layer in r["diagonal_per_head"][0] for x in layer]  # seed 0, layer-major
        heads.bar([i + 0.4 * offset for i in range(len(per_head))], per_head, width=0.4, label=arm)
    heads.axhline(results["uniform_diagonal"], color="k", linestyle=":", label="uniform causal")
    heads.set(xlabel="layer x head (seed 0)", ylabel="mean weight on itself", ylim=(0, 1), title="diagonal attention")
    heads.legend()
    curves(lm, {arm: r["val_curves"] for arm, r in results["arms"].items()}, marker="o")
    lm.set(title="LM validation loss")
    return [save(fig, directory / "no-query-key-maps.png")]
