"""`no-positions`: self-attention without position information sees a bag of words.

The lecture: self-attention doesn't build in order information; we need to encode the order of the sentence in
our keys, queries and values. Without positions, permuting the input permutes the output the same way: the
model cannot tell "the chef who ran the store" from any reordering of it.

How it is tested, in two parts:
1. permutation equivariance, measured: for an `Encoder` (bidirectional) built with `position="none"`, the largest
   difference between encoder(permuted ids) and the permuted encoder(ids), against the same encoder with learned
   positions; and the same for a causal `DecoderLM` without positions, which is *not* equivariant because its
   mask tells each position how many tokens precede it (Haviv et al. 2022, "Transformer Language Models without
   Positional Encodings Still Learn Positional Information");
2. the small Shakespeare LM trained without positions, with learned absolute positions and with RoPE, on the same
   batches: validation loss. Expect a small gap for a causal LM, for the reason above; it is reported as measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kqv.nn import DecoderLM, Encoder

from .base import FAILS, HOLDS, INCONCLUSIVE, Check, Progress, by_construction, mean_std, pm
from .lm import QUICK_LM, Arm, LMConfig, train_arms
from .plotting import curves, figure, save
from .statistics import decide, paired_difference

NAME = "no-positions"
CLAIM = "without positions an encoder is permutation-equivariant (a bag of words) and an LM trains worse"
LECTURE = (
    "Self-attention doesn't build in order information; we need to encode the order of the sentence in our "
    "keys, queries, and values. Without it, self-attention is an operation on sets."
)
FIELDS = ("equivariance", "arms")
ARMS = {
    "none": Arm(model={"position": "none"}),
    "learned": Arm(model={"position": "learned"}),
    "rope": Arm(model={"position": "rope"}),
}
MODELS = {
    "Encoder, no positions": ("encoder", "none"),
    "Encoder, learned positions": ("encoder", "learned"),
    "DecoderLM, no positions (causal)": ("decoder", "none"),
}


@dataclass
class Config(LMConfig):
    """The sizes of the `no-positions` experiment (`FULL` and `QUICK` below), validated when made."""

    permutations: int = 20  # random permutations per seed for the equivariance test


FULL = Config()
QUICK = Config(**QUICK_LM, permutations=5)


def method(config: Config) -> str:
    return (
        f"(1) For randomly initialised models (d_model {config.d_model}, {config.n_layers} layers, eval mode), "
        f"the largest |f(P x) - P f(x)| over {config.permutations} random permutations P of {config.context} "
        f"random tokens (fp32); (2) a character-level Shakespeare LM ({config.sizes()}) trained with no, learned "
        f"and RoPE positions on the same batches."
    )


def equivariance_error(kind: str, position: str, config: Config, seed: int) -> float:
    """max |f(ids[:, perm]) - f(ids)[:, perm]| over random permutations, for hidden states f."""
    torch.manual_seed(seed)
    model_config = config.model_config(97, position=position)
    model = (Encoder(model_config) if kind == "encoder" else DecoderLM(model_config)).eval()
    hidden = model if kind == "encoder" else lambda ids: model.decoder(ids)[0]
    generator = torch.Generator().manual_seed(seed)
    worst = 0.0
    with torch.no_grad():
        for _ in range(config.permutations):
            ids = torch.randint(0, 97, (2, config.context), generator=generator)
            perm = torch.randperm(config.context, generator=generator)
            worst = max(worst, float((hidden(ids[:, perm]) - hidden(ids)[:, perm]).abs().max()))
    return worst


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(len(seeds) * (len(MODELS) + len(ARMS)))
    equivariance = {name: [] for name in MODELS}
    for seed in seeds:
        for name, (kind, position) in MODELS.items():
            equivariance[name].append(equivariance_error(kind, position, config, seed))
            progress.step(f"{name}: {equivariance[name][-1]:.2e}")
    return {"equivariance": equivariance, "arms": train_arms(config, seeds, ARMS, progress)}


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = ["model", "max |f(Px) - P f(x)| (largest over seeds)", "LM validation loss", "LM parameters"]
    rows = [[name, f"{max(errors):.2e}", "", ""] for name, errors in results["equivariance"].items()]
    rows += [[f"LM, {arm} positions", "", pm(r["val_loss"]), r["parameters"]] for arm, r in results["arms"].items()]
    return columns, rows


def checks(results: dict) -> list[Check]:
    errors = {name: max(values) for name, values in results["equivariance"].items()}
    arms = results["arms"]
    loss = {arm: mean_std(r["val_loss"])[0] for arm, r in arms.items()}
    gaps = {arm: paired_difference(arms["none"]["val_loss"], arms[arm]["val_loss"]) for arm in ("learned", "rope")}
    outcomes = {decide(gap, 0.02) for gap in gaps.values()}
    return [
        by_construction(
            Check(
                "an encoder without positions permutes its output exactly as its input",
                "max error <= 1e-4 without positions and >= 1e-2 with learned positions",
                f"{errors['Encoder, no positions']:.1e} without, {errors['Encoder, learned positions']:.1e} with",
                errors["Encoder, no positions"] <= 1e-4 and errors["Encoder, learned positions"] >= 1e-2,
            )
        ),
        Check(
            "an LM without positions is worse than one with them",
            "validation loss without positions - with each positional scheme (learned, RoPE) > 0.02 nats "
            "(paired by seed, 95% interval)",
            f"none {loss['none']:.3f}, learned {loss['learned']:.3f}, rope {loss['rope']:.3f}; gap to learned "
            f"{gaps['learned'].text()}, to rope {gaps['rope'].text()}",
            False,
            FAILS if FAILS in outcomes else INCONCLUSIVE if INCONCLUSIVE in outcomes else HOLDS,
        ),
    ]


def plots(results: dict, directory: Path) -> list[Path]:
    fig, (errors, lm) = figure(2)
    names = list(results["equivariance"])
    errors.bar(range(len(names)), [max(max(v), 1e-12) for v in results["equivariance"].values()])
    errors.set_xticks(range(len(names)), [n.replace(", ", ",\n") for n in names], fontsize=8)
    errors.set(yscale="log", ylabel="max |f(Px) - P f(x)|", title="permutation equivariance (fp32)")
    curves(lm, {arm: r["val_curves"] for arm, r in results["arms"].items()}, marker="o")
    lm.set(title="LM validation loss")
    return [save(fig, directory / "no-positions.png")]
