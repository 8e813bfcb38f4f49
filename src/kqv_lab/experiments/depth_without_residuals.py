"""`depth-without-residuals`: deep stacks train because of residual connections and layer normalisation.

The lecture: residual connections, x_l = F(x_{l-1}) + x_{l-1}, are a trick to help models train better: the
gradient is great through the residual connection, so it does not vanish through many layers, and the model is
biased towards the identity. Layer normalisation is a trick to help models train faster: it cuts down on
uninformative variation in hidden values by normalising each to zero mean and unit variance within a layer.

How it is tested: the Shakespeare LM (pre-LN, as kqv builds it) at several depths, trained in four forms on the same
batches: as built; without residual connections (`ablations.without_residuals`: each sublayer's output replaces
the stream); without any LayerNorm (`ablations.without_norms`); without both. A run "fails to train" when its loss
becomes non-finite or its validation loss stays within 0.1 nats of the loss of predicting characters by their
frequency alone (the unigram loss: it has learned nothing from context).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kqv.nn import DecoderLM

from .ablations import without_norms, without_residuals
from .base import Check, Progress, control, mean_std, pm
from .lm import QUICK_LM, Arm, LMConfig, shakespeare, train_arms, unigram_loss
from .plotting import curves, figure, save
from .statistics import interval_check, paired_difference

NAME = "depth-without-residuals"
CLAIM = "deep stacks without residual connections (or without LayerNorm) train far worse or not at all"
LECTURE = (
    "Residual connections are a trick to help models train better: instead of X_i = Layer(X_{i-1}), let "
    "X_i = X_{i-1} + Layer(X_{i-1}), so we only have to learn the residual from the previous layer; the "
    "gradient is great through the residual connection. Layer normalization is a trick to help models train "
    "faster: it cuts down on uninformative variation in hidden vector values by normalizing to unit mean and "
    "standard deviation within each layer."
)
FIELDS = ("depths", "arms", "unigram_loss")
FORMS = {
    "residual + LayerNorm": DecoderLM,
    "no residual": lambda config: without_residuals(DecoderLM(config)),
    "no LayerNorm": lambda config: without_norms(DecoderLM(config)),
    "neither": lambda config: without_norms(without_residuals(DecoderLM(config))),
}
FAIL_MARGIN = 0.1  # a run within this many nats of the unigram loss has learned nothing from context


@dataclass
class Config(LMConfig):
    """The sizes of the `depth-without-residuals` experiment (`FULL` and `QUICK` below), validated when made."""

    depths: tuple[int, ...] = (8, 16)


FULL = Config(d_model=32, n_heads=4, d_ff=128, context=32, batch_size=16, steps=150, eval_every=50, seeds=2)
QUICK = Config(**{**QUICK_LM, "n_layers": 2, "steps": 40, "eval_every": 40}, depths=(2, 3))


def method(config: Config) -> str:
    return (
        f"A character-level Shakespeare LM ({config.sizes().replace(f'{config.n_layers} layers', 'L layers')}) "
        f"at depths L = {', '.join(map(str, config.depths))}, each trained as built (pre-LN), without residual "
        f"connections, without LayerNorm, and without both, on the same batches."
    )


def arm_name(form: str, depth: int) -> str:
    return f"{form}, {depth} layers"


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(len(FORMS) * len(config.depths) * len(seeds))
    arms = {
        arm_name(form, depth): Arm(build, model={"n_layers": depth})
        for depth in config.depths
        for form, build in FORMS.items()
    }
    corpus = shakespeare()
    return {
        "depths": list(config.depths),
        "unigram_loss": unigram_loss(corpus),
        "arms": train_arms(config, seeds, arms, progress, corpus=corpus),
    }


def failed(results: dict, arm: str) -> list[bool]:
    r = results["arms"][arm]
    limit = results["unigram_loss"] - FAIL_MARGIN
    return [diverged or not loss < limit for diverged, loss in zip(r["diverged"], r["val_loss"])]


def _losses(results: dict, arm: str) -> list[float]:
    """Validation loss per seed; a diverged run counts as the unigram loss (it learned nothing)."""
    r = results["arms"][arm]
    return [results["unigram_loss"] if d else v for d, v in zip(r["diverged"], r["val_loss"])]


def _loss(results: dict, arm: str) -> float:
    """Mean validation loss over seeds, a diverged run counting as the unigram loss."""
    return mean_std(_losses(results, arm))[0]


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = ["depth", "form", "validation loss", "failed to train (seeds)", "diverged (seeds)"]
    rows = []
    for depth in results["depths"]:
        for form in FORMS:
            arm = arm_name(form, depth)
            r = results["arms"][arm]
            finite = [v for d, v in zip(r["diverged"], r["val_loss"]) if not d]
            seeds = len(r["diverged"])
            rows.append(
                [
                    depth,
                    form,
                    pm(finite) if finite else "diverged",
                    f"{sum(failed(results, arm))}/{seeds}",
                    f"{sum(r['diverged'])}/{seeds}",
                ]
            )
    rows.append(["", "unigram loss (no context)", round(results["unigram_loss"], 3), "", ""])
    return columns, rows


def checks(results: dict) -> list[Check]:
    deepest, limit = results["depths"][-1], results["unigram_loss"] - 0.3
    baseline = {d: _loss(results, arm_name("residual + LayerNorm", d)) for d in results["depths"]}
    no_residual = _loss(results, arm_name("no residual", deepest))
    no_norm = _loss(results, arm_name("no LayerNorm", deepest))
    reference = _losses(results, arm_name("residual + LayerNorm", deepest))
    return [
        control(
            Check(
                "with residuals and LayerNorm every depth trains",
                f"validation loss <= unigram loss - 0.3 = {limit:.3f} at every depth",
                ", ".join(f"{d} layers: {v:.3f}" for d, v in baseline.items()),
                all(v <= limit for v in baseline.values()),
            )
        ),
        interval_check(
            f"without residual connections the {deepest}-layer stack trains far worse",
            "validation loss - residual + LayerNorm's > 0.2 nats (paired by seed, 95% interval; a diverged run "
            "counts as the unigram loss)",
            paired_difference(_losses(results, arm_name("no residual", deepest)), reference),
            0.2,
            detail=f"{no_residual:.3f} vs {baseline[deepest]:.3f}",
        ),
        interval_check(
            f"without LayerNorm the {deepest}-layer stack trains worse",
            "validation loss - residual + LayerNorm's > 0.05 nats (paired by seed, 95% interval; a diverged run "
            "counts as the unigram loss)",
            paired_difference(_losses(results, arm_name("no LayerNorm", deepest)), reference),
            0.05,
            detail=f"{no_norm:.3f} vs {baseline[deepest]:.3f}",
        ),
    ]


def plots(results: dict, directory: Path) -> list[Path]:
    fig, axes = figure(len(results["depths"]))
    for ax, depth in zip(axes, results["depths"]):
        curves(ax, {form: results["arms"][arm_name(form, depth)]["train_curves"] for form in FORMS})
        ax.axhline(results["unigram_loss"], color="k", linestyle=":", label="unigram loss")
        ax.set(title=f"{depth} layers: training loss", ylim=(None, results["unigram_loss"] + 1.0))
        ax.legend()
    return [save(fig, directory / "depth-without-residuals.png")]
