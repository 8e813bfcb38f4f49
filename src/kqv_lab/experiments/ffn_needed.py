"""`ffn-needed`: attention only re-averages values; the feed-forward network adds the per-position processing.

The lecture: "there are no elementwise nonlinearities in self-attention; stacking more self-attention layers just
re-averages value vectors". Each output of an attention head is sum_j w_ij v_j with w_ij >= 0 and sum_j w_ij = 1,
a convex combination of the value vectors, so it lies in their convex hull; the fix is a feed-forward network
applied to each output vector.

How it is tested, in two parts:
1. the closed form, on trained models: every head output of every layer, recorded with its weights and values
   (kqv's plain kernel), lies inside the box [min_j v_j, max_j v_j] (per coordinate, over the keys it may attend
   to: a necessary condition of lying in the convex hull), its weights are >= 0 and sum to 1; and how much a
   layer's head outputs spread across positions against its values' spread (averaging pulls them together);
2. the small Shakespeare LM trained as kqv builds it, and attention-only (each block's FFN removed, its norm too)
   with as many more layers as keep the parameter count equal (L (1 + d_ff / 2d) layers: an FFN has 2 d d_ff
   weights, an attention layer 4 d^2), on the same batches.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from kqv.nn import AttentionCall, DecoderLM, FullAttention

from .ablations import self_attention_layers
from .base import Check, ExperimentError, Progress, by_construction, control, pm
from .lm import QUICK_LM, VAL_SEED, Arm, LMConfig, Trained, lm_batch, shakespeare, train_arms, unigram_loss
from .plotting import curves, figure, save
from .statistics import interval_check, paired_difference

NAME = "ffn-needed"
CLAIM = "attention outputs are convex combinations of values; at equal parameters an LM without FFNs is worse"
LECTURE = (
    "Problem: there are no elementwise nonlinearities in self-attention; stacking more self-attention layers "
    "just re-averages value vectors. Easy fix: add a feed-forward network to post-process each output vector."
)
FIELDS = ("arms", "layers", "unigram_loss")
WITH, WITHOUT = "with FFN", "attention only"


@dataclass
class Config(LMConfig):
    """The sizes of the `ffn-needed` experiment (`FULL` and `QUICK` below), validated when made."""

    blocks: int = 2  # validation blocks the attention outputs are recorded on


FULL = Config()
QUICK = Config(**QUICK_LM, blocks=1)


def attention_only_layers(config: LMConfig) -> int:
    """Layers of the attention-only arm with the parameters of n_layers full blocks: each full block is one
    attention layer (4 d^2) and an FFN (2 d d_ff), i.e. 1 + d_ff / (2 d) attention layers."""
    return round(config.n_layers * (1 + config.d_ff / (2 * config.d_model)))


def method(config: Config) -> str:
    return (
        f"A character-level Shakespeare LM ({config.sizes()}) trained as kqv builds it and, on the same batches, "
        f"with every FFN removed and {attention_only_layers(config)} layers instead of {config.n_layers} (equal "
        f"parameters); head outputs, weights and values of every layer recorded on {config.blocks} x "
        f"{config.batch_size} validation blocks."
    )


class NoFeedForward(nn.Module):
    """A feed-forward network that outputs nothing: the residual stream passes the block unchanged."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.zeros_like(x)


def without_feed_forward(model: nn.Module) -> nn.Module:
    """Remove every block's FFN and the norm in front of it (pre-LN: the norm feeds only the FFN)."""
    for block in model.modules():
        if hasattr(block, "feed_forward") and hasattr(block, "feed_forward_residual"):
            if not block.feed_forward_residual.norm_first:
                raise ExperimentError(
                    "without_feed_forward needs pre-LN blocks (norm_first=True): a post-LN block norms the stream "
                    "itself after the FFN, so removing the FFN would change more than the FFN"
                )
            block.feed_forward = NoFeedForward()
            block.feed_forward_residual.norm = nn.Identity()
    return model


class RecordingAttention(FullAttention):
    """Full attention by the plain kernel that keeps its last weights, values and outputs (batch, heads, ...)."""

    def __init__(self):
        super().__init__("never", fused=False)
        self.record: dict[str, Tensor] = {}

    def attend(
        self, queries: Tensor, keys: Tensor, values: Tensor, call: AttentionCall
    ) -> tuple[Tensor, Tensor | None]:
        output, weights = super().attend(queries, keys, values, call._replace(need_weights=True))
        self.record = {"values": values, "output": output, "weights": weights}
        return output, weights


def convexity(record: dict[str, Tensor]) -> dict[str, float]:
    """How far one causal layer's head outputs are from convex combinations of its values: the largest step
    outside the per-coordinate box of the values each query may attend to, the largest |sum of weights - 1|, the
    most negative weight, and the spread (std over positions) of the outputs over that of the values."""
    values, output, weights = record["values"], record["output"], record["weights"]
    upper, lower = values.cummax(dim=2).values, values.cummin(dim=2).values  # over keys j <= i: (b, h, time, hd)
    outside = torch.maximum(output - upper, lower - output).clamp_min(0)
    return {
        "outside_box": float(outside.max()),
        "sum_error": float((weights.sum(-1) - 1).abs().max()),
        "most_negative": float(weights.min().clamp_max(0).abs()),
        "spread": float(output.std(dim=2).mean() / values.std(dim=2).mean()),
    }


def record_layers(model: DecoderLM, ids: Tensor) -> list[dict[str, float]]:
    """`convexity` of every self-attention layer of the model on ids, its cores swapped back afterwards."""
    layers = self_attention_layers(model)
    cores = [layer.core for layer in layers]
    recorders = [RecordingAttention() for _ in layers]
    try:
        for layer, recorder in zip(layers, recorders):
            layer.core = recorder
        model.eval()
        with torch.no_grad():
            model(ids)
        return [convexity(recorder.record) for recorder in recorders]
    finally:
        for layer, core in zip(layers, cores):
            layer.core = core


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(2 * len(seeds))
    corpus = shakespeare()
    layers = {WITH: config.n_layers, WITHOUT: attention_only_layers(config)}
    arms = {
        WITH: Arm(),
        WITHOUT: Arm(lambda model_config: without_feed_forward(DecoderLM(model_config)), {"n_layers": layers[WITHOUT]}),
    }
    ids = torch.cat([lm_batch(corpus.val, config, VAL_SEED, i)[0] for i in range(config.blocks)])

    def recorded(trained: Trained) -> dict:
        return {"layers": record_layers(trained.model, ids)}

    return {
        "arms": train_arms(config, seeds, arms, progress, corpus=corpus, measure=recorded),
        "layers": layers,
        "unigram_loss": unigram_loss(corpus),
    }


def _worst(results: dict, arm: str, key: str) -> float:
    """The largest value of a `convexity` figure over every seed and layer of an arm."""
    return max(layer[key] for seed in results["arms"][arm]["layers"] for layer in seed)


def _spread(results: dict, arm: str) -> list[float]:
    """Per seed: the mean over layers of the output spread / value spread."""
    return [statistics.fmean(layer["spread"] for layer in seed) for seed in results["arms"][arm]["layers"]]


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = [
        "model",
        "layers",
        "parameters",
        "validation loss",
        "largest step outside the values' box",
        "largest |sum of weights - 1|",
        "output spread / value spread",
    ]
    rows = [
        [
            arm,
            results["layers"][arm],
            r["parameters"],
            pm(r["val_loss"]),
            f"{_worst(results, arm, 'outside_box'):.1e}",
            f"{_worst(results, arm, 'sum_error'):.1e}",
            pm(_spread(results, arm)),
        ]
        for arm, r in results["arms"].items()
    ]
    rows.append(["unigram (no context)", "", "", round(results["unigram_loss"], 3), "", "", ""])
    return columns, rows


# thresholds, fixed before the experiment ran
CONVEX = 1e-5  # fp32: outputs outside the values' box, |sum of weights - 1|, negative weights, at most
SAME_SIZE = 0.02  # |parameters without FFN / with FFN - 1|, at most
WORSE = 0.05  # nats: validation loss without FFN - with FFN (paired by seed, 95% interval)
LEARNS = 0.3  # nats below the unigram loss on every seed: both arms learned something (else inconclusive)


def checks(results: dict) -> list[Check]:
    worst = {
        key: max(_worst(results, arm, key) for arm in results["arms"])
        for key in ("outside_box", "sum_error", "most_negative")
    }
    params = {arm: r["parameters"] for arm, r in results["arms"].items()}
    size = params[WITHOUT] / params[WITH] - 1
    unigram = results["unigram_loss"]  # a run without a finite loss is scored at it (it learnt nothing)
    losses = {arm: [v if math.isfinite(v) else unigram for v in r["val_loss"]] for arm, r in results["arms"].items()}
    floor = unigram - LEARNS
    unlearnt = [arm for arm, values in losses.items() if any(loss >= floor for loss in values)]
    return [
        by_construction(
            Check(
                "every attention head output is a convex combination of its values",
                f"outside the values' box, |sum of weights - 1| and negative weights all <= {CONVEX:g} (a closed-form "
                "identity up to fp32 rounding, over every seed and layer: an exact check, no interval)",
                ", ".join(f"{key} {value:.1e}" for key, value in worst.items()),
                all(value <= CONVEX for value in worst.values()),
            )
        ),
        control(
            Check(
                "the two LMs have the same number of parameters",
                f"|without / with - 1| <= {SAME_SIZE} (a count: an exact check)",
                f"{params[WITHOUT]:,} vs {params[WITH]:,}: {size:+.4f}",
                abs(size) <= SAME_SIZE,
            )
        ),
        interval_check(
            "at equal parameters the LM without FFNs is worse",
            f"validation loss without - with FFN > {WORSE} nats (paired by seed, 95% interval); inconclusive unless "
            f"every seed of both arms is below unigram - {LEARNS}",
            paired_difference(losses[WITHOUT], losses[WITH]),
            WORSE,
            failed_arm=f"did not learn (not below {floor:.3f}): {', '.join(unlearnt)}" if unlearnt else None,
            detail=f"losses {pm(losses[WITH])} and {pm(losses[WITHOUT])}, unigram {results['unigram_loss']:.3f}",
        ),
    ]


def plots(results: dict, directory: Path) -> list[Path]:
    fig, (lm, spread) = figure(2)
    curves(lm, {arm: r["val_curves"] for arm, r in results["arms"].items()}, marker="o")
    lm.axhline(results["unigram_loss"], color="grey", linestyle=":", label="unigram")
    lm.set(title="LM validation loss (equal parameters)")
    lm.legend()
    for arm, r in results["arms"].items():
        per_layer = [layer["spread"] for layer in r["layers"][0]]  # seed 0
        spread.plot(range(1, len(per_layer) + 1), per_layer, "o-", label=arm)
    spread.axhline(1.0, color="k", linewidth=0.8)
    spread.set(
        xlabel="layer",
        ylabel="std of head outputs / std of values (over positions)",
        title="attention averages (seed 0)",
    )
    spread.legend()
    return [save(fig, directory / "ffn-needed.png")]
