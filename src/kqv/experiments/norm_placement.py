"""`norm-placement`: post-LN needs learning-rate warm-up; pre-LN trains without it.

The lecture: the Transformer block can put layer normalisation after each residual addition (post-LN, as in
Vaswani et al. 2017) or before each sublayer, inside the residual branch (pre-LN); pre-LN is easier to train.
Xiong et al. 2020 ("On Layer Normalization in the Transformer Architecture") show why: at initialisation post-LN's
gradients near the output are large, so it needs a warm-up stage with a small learning rate, while pre-LN's are
well-behaved and it trains without warm-up.

How it is tested: a 6-layer Shakespeare LM, post-LN (`norm_first=False`) and pre-LN (`norm_first=True`), each
trained with and without linear warm-up, at three peak learning rates, on the same batches (equal token budget;
the two placements have the same parameters but pre-LN's final norm). A run "failed" when its loss became
non-finite or its validation loss stayed within 0.1 nats of the unigram loss (it learned nothing from context).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from .base import FAILS, HOLDS, INCONCLUSIVE, Check, Progress, mean_std, pm
from .lm import QUICK_LM, Arm, LMConfig, shakespeare, train_arms, unigram_loss
from .plotting import figure, save
from .statistics import decide, interval_check, paired_difference

NAME = "norm-placement"
CLAIM = "post-LN without warm-up trains badly or diverges at higher learning rates; pre-LN trains without warm-up"
LECTURE = (
    "Post-LN puts layer normalization after each residual addition, as the original Transformer does; "
    "pre-LN puts it before each sublayer, inside the residual branch, and is easier to train."
)
FIELDS = ("lrs", "warmup_steps", "arms", "unigram_loss", "paper")
FAIL_MARGIN = 0.1
PAPER = (
    "Xiong et al. 2020, IWSLT14 De-En (BLEU curves of the paper's figures, read off by a secondary source: "
    "approximate): post-LN with Adam and no warm-up reaches about 8.45 BLEU against about 34 with 4,000 warm-up "
    "steps; with 500 warm-up steps 31.16 BLEU at lr 5e-4 but 2.77 at lr 1e-3; pre-LN without warm-up reaches "
    "about 34 BLEU in fewer epochs. On BERT pre-training post-LN diverged at lr 3e-4."
)


@dataclass
class Config(LMConfig):
    """The sizes of the `norm-placement` experiment (`FULL` and `QUICK` below), validated when made."""

    lrs: tuple[float, ...] = (1e-3, 3e-3, 1e-2)


FULL = Config(n_layers=6, batch_size=16, steps=300, warmup_steps=60, eval_every=60, seeds=2)
QUICK = Config(**{**QUICK_LM, "n_layers": 2, "steps": 30, "warmup_steps": 10, "eval_every": 30}, lrs=(3e-2,))


def method(config: Config) -> str:
    return (
        f"A character-level Shakespeare LM ({config.sizes().replace(f'lr {config.lr:g} (AdamW, ', '(AdamW, ')}) "
        f"as post-LN and pre-LN, with {config.warmup_steps} linear warm-up steps and with none, at peak learning "
        f"rates {', '.join(f'{lr:g}' for lr in config.lrs)} (cosine decay after the peak in both cases)."
    )


def arm_name(placement: str, warmup: bool, lr: float) -> str:
    return f"{placement}, {'warm-up' if warmup else 'no warm-up'}, lr {lr:g}"


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(4 * len(config.lrs) * len(seeds))
    arms = {
        arm_name(placement, warmup, lr): Arm(
            model={"norm_first": placement == "pre-LN"},
            train={"lr": lr, "warmup_steps": config.warmup_steps if warmup else 0},
        )
        for placement, warmup, lr in itertools.product(("post-LN", "pre-LN"), (True, False), config.lrs)
    }
    corpus = shakespeare()
    return {
        "lrs": list(config.lrs),
        "warmup_steps": config.warmup_steps,
        "unigram_loss": unigram_loss(corpus),
        "paper": PAPER,
        "arms": train_arms(config, seeds, arms, progress, corpus=corpus),
    }


def scored(results: dict, arm: str) -> list[float]:
    """The arm's validation loss per seed, a diverged run counting as the unigram loss."""
    r, unigram = results["arms"][arm], results["unigram_loss"]
    return [unigram if diverged else loss for diverged, loss in zip(r["diverged"], r["val_loss"])]


def outcome(results: dict, arm: str) -> tuple[float, int]:
    """(mean validation loss, a diverged run counting as the unigram loss; number of failed seeds)."""
    losses = scored(results, arm)
    return mean_std(losses)[0], sum(loss >= results["unigram_loss"] - FAIL_MARGIN for loss in losses)


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = ["placement", "warm-up"] + [f"lr {lr:g}" for lr in results["lrs"]]
    rows = []
    for placement, warmup in itertools.product(("post-LN", "pre-LN"), (True, False)):
        row = [placement, f"{results['warmup_steps']} steps" if warmup else "none"]
        for lr in results["lrs"]:
            arm = arm_name(placement, warmup, lr)
            r = results["arms"][arm]
            finite = [v for d, v in zip(r["diverged"], r["val_loss"]) if not d]
            failed = outcome(results, arm)[1]
            note = f" (failed {failed}/{len(r['val_loss'])})" if failed else ""
            row.append((pm(finite) if finite else "diverged") + note)
        rows.append(row)
    return columns, rows


def checks(results: dict) -> list[Check]:
    top, lrs = results["lrs"][-1], results["lrs"]
    post = {warm: outcome(results, arm_name("post-LN", warm, top)) for warm in (False, True)}
    post_gap = paired_difference(*(scored(results, arm_name("post-LN", warm, top)) for warm in (False, True)))
    pre_failed = sum(outcome(results, arm_name("pre-LN", False, lr))[1] for lr in lrs)
    pre_gaps = {
        lr: paired_difference(*(scored(results, arm_name("pre-LN", warm, lr)) for warm in (False, True))) for lr in lrs
    }
    pre = [decide(gap, FAIL_MARGIN, above=False) for gap in pre_gaps.values()]
    worst = max(pre_gaps.values(), key=lambda gap: gap.mean)
    return [
        interval_check(
            f"post-LN without warm-up trains clearly worse than with warm-up at the highest lr ({top:g})",
            "no warm-up - warm-up validation loss > 0.1 nats, per seed (a failed run scored at the unigram loss; "
            "95% interval)",
            post_gap,
            FAIL_MARGIN,
            detail=f"no warm-up {post[False][0]:.3f} (failed {post[False][1]}), warm-up {post[True][0]:.3f} "
            f"(failed {post[True][1]})",
        ),
        Check(
            "pre-LN trains without warm-up at every lr",
            "no failed run without warm-up, and at every lr no warm-up - warm-up validation loss < 0.1 nats "
            "(per seed, 95% interval)",
            f"failed runs {pre_failed}; largest gap to warm-up {worst.text()}",
            False,
            FAILS if pre_failed or FAILS in pre else INCONCLUSIVE if INCONCLUSIVE in pre else HOLDS,
        ),
    ]


def notes(results: dict) -> str:
    return f"**Beside the paper.** {results['paper']}"


def plots(results: dict, directory: Path) -> list[Path]:
    fig, (loss_ax,) = figure(1, width=6.5)
    for placement, warmup in itertools.product(("post-LN", "pre-LN"), (True, False)):
        losses = [outcome(results, arm_name(placement, warmup, lr))[0] for lr in results["lrs"]]
        loss_ax.plot(
            results["lrs"],
            losses,
            "o-" if placement == "pre-LN" else "s--",
            label=f"{placement}, {'warm-up' if warmup else 'no warm-up'}",
        )
    loss_ax.axhline(results["unigram_loss"], color="k", linestyle=":", label="unigram loss (learned nothing)")
    loss_ax.set(
        xscale="log",
        xlabel="peak learning rate",
        ylabel="validation loss (diverged = unigram)",
        title="final validation loss",
    )
    loss_ax.legend()
    return [save(fig, directory / "norm-placement.png")]
