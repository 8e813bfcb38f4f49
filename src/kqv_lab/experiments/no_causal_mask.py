"""`no-causal-mask`: a decoder trained without its causal mask cheats.

The lecture: to use self-attention in a decoder we must not look at the future when predicting a sequence, so the
attention scores to future words are set to -infinity. Without the mask, position t sees token t + 1, the very
token it is asked to predict: the training loss falls far below what an honest model reaches, but the model has
learned to copy, not to predict, and fails as soon as the future is hidden (when it is evaluated causally or
generates text).

How it is tested: the same small Shakespeare LM trained twice on the same batches, once honestly and once with
its causal mask switched off in training (`ablations.peeking`). For both: the final training loss (as each trained),
the validation loss evaluated causally, and samples generated from the same prompt. A control on uniformly random
tokens (nothing to learn): the honest model's loss must stay at ln V while the peeking one still collapses,
which shows that its low loss is leakage, not learning (huggingface/transformers#48745 reports the same collapse).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from kqv.jobs import generate_text
from kqv.nn import DecoderLM

from .ablations import peeking, set_peeking
from .base import Check, Progress, control, mean_std, pm
from .lm import QUICK_LM, Arm, LMConfig, Trained, random_tokens, shakespeare, train_arms, validation_loss
from .plotting import curves, figure, save
from .statistics import interval_check, paired_difference, paired_ratio

NAME = "no-causal-mask"
CLAIM = "a decoder trained without its causal mask reaches a far lower training loss, yet fails when evaluated causally"
LECTURE = (
    "To use self-attention in decoders, we need to ensure we can't peek at the future. To enable "
    "parallelization, we mask out attention to future words by setting attention scores to -infinity."
)
FIELDS = ("arms", "control", "ln_vocab")
ARMS = {"causal": Arm(), "no mask": Arm(lambda config: peeking(DecoderLM(config)))}


@dataclass
class Config(LMConfig):
    """The sizes of the `no-causal-mask` experiment (`FULL` and `QUICK` below), validated when made."""

    control_steps: int = 150  # training steps on random tokens
    control_vocab: int = 64
    sample_chars: int = 200
    prompt: str = "ROMEO:\n"


FULL = Config()
QUICK = Config(**QUICK_LM, control_steps=60, sample_chars=60)


def method(config: Config) -> str:
    return (
        f"A character-level Shakespeare LM ({config.sizes()}) trained with and without its causal mask on the "
        f"same batches; the no-mask model is then evaluated with the mask on ({config.eval_batches} validation "
        f"blocks) and samples {config.sample_chars} characters after {config.prompt!r} (temperature 0.8, "
        f"top-k 40). "
        f"Control: {config.control_steps} steps on uniformly random tokens (V = {config.control_vocab}), seed 0."
    )


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(len(ARMS) * (len(seeds) + 1))
    corpus = shakespeare()

    def honestly(trained: Trained) -> dict:
        """The validation loss with the causal mask on, and a sample (generation sees no future either)."""
        set_peeking(trained.model, False)
        trained.model.eval()
        sample = generate_text(
            trained.model,
            corpus.tokenizer,
            config.prompt,
            config.sample_chars,
            temperature=0.8,
            top_k=40,
            generator=torch.Generator().manual_seed(0),
        )
        return {"val_loss_causal": validation_loss(trained.model, corpus, config), "samples": sample}

    arms = train_arms(config, seeds, ARMS, progress, corpus=corpus, measure=honestly)
    control = train_arms(
        config,
        seeds[:1],
        {
            arm: Arm(spec.build, train={"steps": config.control_steps, "checkpoint_every": config.control_steps})
            for arm, spec in ARMS.items()
        },
        progress,
        corpus=random_tokens(config.control_vocab, 200_000),
    )
    return {"arms": arms, "control": control, "ln_vocab": math.log(config.control_vocab)}


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = [
        "model",
        "training loss (as trained)",
        "validation loss (as trained)",
        "validation loss, evaluated causally",
        f"training loss on random tokens (ln V = {results['ln_vocab']:.3f})",
    ]
    rows = [
        [
            arm,
            pm(r["train_loss"]),
            pm(r["val_loss"]),
            pm(r["val_loss_causal"]),
            pm(results["control"][arm]["train_loss"]),
        ]
        for arm, r in results["arms"].items()
    ]
    return columns, rows


def checks(results: dict) -> list[Check]:
    arms, ln_v = results["arms"], results["ln_vocab"]
    train = {arm: mean_std(arms[arm]["train_loss"])[0] for arm in arms}
    causal = {arm: mean_std(arms[arm]["val_loss_causal"])[0] for arm in arms}
    on_random = {arm: mean_std(results["control"][arm]["train_loss"])[0] for arm in arms}
    return [
        interval_check(
            "without the mask the training loss is much lower",
            "no-mask training loss / the causal one < 1/2 (per seed, 95% interval)",
            paired_ratio(arms["no mask"]["train_loss"], arms["causal"]["train_loss"]),
            0.5,
            above=False,
            detail=f"no mask {train['no mask']:.3f}, causal {train['causal']:.3f}",
        ),
        interval_check(
            "evaluated causally, the no-mask model is much worse",
            "its causal validation loss - the causal model's > 0.5 (per seed, 95% interval)",
            paired_difference(arms["no mask"]["val_loss_causal"], arms["causal"]["val_loss_causal"]),
            0.5,
            detail=f"no mask {causal['no mask']:.3f}, causal {causal['causal']:.3f}",
        ),
        control(
            Check(
                "control: on random tokens only the no-mask model's loss falls",
                "causal >= 0.95 ln V and no mask <= 0.5 ln V",
                f"causal {on_random['causal']:.3f}, no mask {on_random['no mask']:.3f}, ln V {ln_v:.3f}",
                on_random["causal"] >= 0.95 * ln_v and on_random["no mask"] <= 0.5 * ln_v,
            )
        ),
    ]


def notes(results: dict) -> str:
    shown = [f"{arm}:\n\n```\n{json.dumps(r['samples'][0])}\n```" for arm, r in results["arms"].items()]
    return (
        "Samples (seed 0, the same prompt and sampling generator; as JSON strings, newlines as \\n):\n\n"
        + "\n\n".join(shown)
    )


def plots(results: dict, directory: Path) -> list[Path]:
    fig, (shakespeare_ax, control_ax) = figure(2)
    curves(shakespeare_ax, {arm: r["train_curves"] for arm, r in results["arms"].items()})
    shakespeare_ax.set(title="training loss on Shakespeare (each as trained)")
    curves(control_ax, {arm: c["train_curves"] for arm, c in results["control"].items()})
    control_ax.axhline(results["ln_vocab"], color="k", linestyle=":", label="ln V")
    control_ax.set(title="control: training loss on random tokens")
    control_ax.legend()
    return [save(fig, directory / "no-causal-mask.png")]
