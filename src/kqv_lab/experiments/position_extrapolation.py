"""`position-extrapolation`: which position scheme still works on inputs longer than the training length?

The lecture: learned absolute position embeddings are flexible but "definitely can't extrapolate to indices outside
1, ..., n"; sinusoidal ones were hoped to extrapolate ("periodicity indicates that maybe absolute position isn't as
important") but in practice they do not; relative schemes (Shaw et al. 2018), RoPE (Su et al. 2021) and ALiBi (Press
et al. 2022, "Train Short, Test Long") build in distances instead of absolute indices.

How it is tested: the same small character-level Shakespeare LM trained at context 128 with sinusoidal, learned,
Shaw relative, RoPE and ALiBi positions (the same batches, so the same token budget; only the position parameters
differ, reported), then evaluated at 64 ... 1,024 tokens on the same validation text (the same tokens at every length,
cut into more windows at shorter lengths, so lengths differ only in context): perplexity over whole windows
(non-overlapping evaluation) and over the last tokens of each window only (each of those has nearly the whole window
as context, like the sliding-window evaluation of Press et al.'s Appendix B). Learned positions past their `max_len`
raise kqv's clear error, recorded as "cannot".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from kqv.errors import DataError

from .base import FAILS, HOLDS, INCONCLUSIVE, Check, Progress, by_construction, mean_std, pm
from .lm import QUICK_LM, Arm, EncodedSplits, LMConfig, Trained, shakespeare, train_arms
from .plotting import figure, log_log, save
from .statistics import decide, interval_check, paired_difference, paired_ratio

NAME = "position-extrapolation"
CLAIM = "trained at 128 tokens, sinusoidal and learned positions fail on longer inputs while ALiBi stays flat"
LECTURE = (
    "Learned absolute position embeddings definitely can't extrapolate to indices outside 1, ..., n. "
    "Sinusoidal position representations: periodicity indicates that maybe absolute position isn't as "
    "important, and maybe they can extrapolate to longer sequences as periods restart; but not really."
)
FIELDS = ("train_length", "eval_lengths", "arms", "paper")
SCHEMES = ("sinusoidal", "learned", "relative", "rope", "alibi")
# Press et al. 2022 (ALiBi), WikiText-103, 16 layers, d = 1024: validation perplexity
PAPER = {
    "source": (
        "Press et al. 2022, 'Train Short, Test Long' (ICLR 2022), WikiText-103, 16 layers, d = 1,024: "
        "Figure 1 (perplexity against evaluation length for L = 512 and 1,024; exact values in the "
        "appendix tables)"
    ),
    "alibi_trained_512": {"512": 19.73, "3072": 18.40},
    "sinusoidal_trained_3072": {"3072": 18.67},
    "shape": (
        "sinusoidal trained at L = 512 improves only up to about L + 20 tokens and degrades after L + 50; "
        "rotary improves up to about L + 200; the T5 bias to L + 600-800; ALiBi keeps improving up to 3,072 "
        "(6x its training length); learned absolute positions have no embedding past L"
    ),
}


@dataclass
class Config(LMConfig):
    """The sizes of the `position-extrapolation` experiment (`FULL` and `QUICK` below), validated when made."""

    eval_lengths: tuple[int, ...] = (64, 128, 256, 512, 1024)
    eval_windows: int = 16  # windows of every evaluation length
    tail: int = 32  # the last tokens of each window, scored for the sliding-window figure
    scale_embeddings: bool = True  # sqrt(d_model) x token embeddings, as Vaswani et al. do with sinusoids


FULL = Config(context=128, batch_size=16, steps=400, eval_every=100)
QUICK = Config(
    **{**QUICK_LM, "context": 32, "steps": 30, "eval_every": 30}, eval_lengths=(16, 32, 64, 128), eval_windows=4, tail=8
)


def method(config: Config) -> str:
    return (
        f"A character-level Shakespeare LM ({config.sizes()}, token embeddings scaled by sqrt(d_model): "
        f"{config.scale_embeddings}) trained with {', '.join(SCHEMES)} positions on the same batches; "
        f"evaluated on the same {config.eval_windows * max(config.eval_lengths):,} validation tokens cut into "
        f"windows of each length "
        f"{', '.join(map(str, config.eval_lengths))}: perplexity over every token, and over the last {config.tail} "
        f"tokens of each window. Shaw relative positions clip distances at 16, kqv's default."
    )


def window_losses(
    model: torch.nn.Module, corpus: EncodedSplits, length: int, windows: int, tail: int
) -> dict[str, float]:
    """Mean loss over every position and over the last `tail` positions of `windows` windows of `length` tokens."""
    ids = corpus.val[: windows * length + 1].long()
    inputs, targets = ids[:-1].view(windows, length), ids[1:].view(windows, length)
    model.eval()
    with torch.no_grad():
        logits = model(inputs)  # (windows, length, vocab)
    losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(windows, length)
    return {"all": float(losses.mean()), "tail": float(losses[:, -tail:].mean())}


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(len(SCHEMES) * len(seeds))
    corpus = shakespeare()
    arms = {s: Arm(model={"position": s, "scale_embeddings": config.scale_embeddings}) for s in SCHEMES}

    tokens = config.eval_windows * max(config.eval_lengths)  # the same text at every length

    def extrapolate(trained: Trained) -> dict:
        results = {}
        for length in config.eval_lengths:
            try:
                results[str(length)] = window_losses(trained.model, corpus, length, tokens // length, config.tail)
            except DataError as error:  # learned positions past max_len: kqv's clear error
                results[str(length)] = {"cannot": str(error).split(";")[0]}
        return {"eval": results}

    return {
        "train_length": config.context,
        "eval_lengths": list(config.eval_lengths),
        "eval_tokens": tokens,  # every length scores (up to a window's rounding) these same first tokens
        "paper": PAPER,
        "arms": train_arms(config, seeds, arms, progress, corpus=corpus, measure=extrapolate),
    }


def perplexities(results: dict, scheme: str, length: int, kind: str = "all") -> list[float] | None:
    """exp(loss) per seed, or None when the scheme cannot run at that length."""
    runs = [run[str(length)] for run in results["arms"][scheme]["eval"]]
    return None if any("cannot" in r for r in runs) else [math.exp(r[kind]) for r in runs]


def table(results: dict) -> tuple[list[str], list[list]]:
    lengths = results["eval_lengths"]
    columns = ["positions", "parameters"] + [f"ppl @ {n}" for n in lengths] + [f"last-tokens ppl @ {lengths[-1]}"]
    rows = []
    for scheme, r in results["arms"].items():
        row = [scheme, r["parameters"]]
        for n in lengths:
            values = perplexities(results, scheme, n)
            row.append("cannot" if values is None else pm(values, 2))
        tail = perplexities(results, scheme, lengths[-1], "tail")
        rows.append(row + ["cannot" if tail is None else pm(tail, 2)])
    return columns, rows


RERUN = (
    "inconclusive: each length scored a different slice of text; needs rerun "
    "(`kqv experiment run position-extrapolation --out docs/experiments`)"
)


def checks(results: dict) -> list[Check]:
    train, longest = results["train_length"], results["eval_lengths"][-1]
    ppl = lambda scheme, n: perplexities(results, scheme, n)
    learned_cannot = [n for n in results["eval_lengths"] if n > train and ppl("learned", n) is None]
    others = [s for s in SCHEMES if s != "alibi" and ppl(s, longest) is not None]
    found = [
        interval_check(
            f"sinusoidal positions degrade past the training length ({train})",
            f"perplexity at {longest} / at {train} > 1.2 (per seed, 95% interval)",
            paired_ratio(ppl("sinusoidal", longest), ppl("sinusoidal", train)),
            1.2,
        ),
        interval_check(
            "ALiBi stays flat",
            f"perplexity at {longest} / at {train} < 1.05 (per seed, 95% interval)",
            paired_ratio(ppl("alibi", longest), ppl("alibi", train)),
            1.05,
            above=False,
        ),
        by_construction(
            Check(
                "learned positions cannot run past max_len",
                f"a clear error at every length > {train} (kqv's own refusal: reported, not evidence)",
                f"'cannot' at {learned_cannot}",
                learned_cannot == [n for n in results["eval_lengths"] if n > train],
            )
        ),
    ]
    gaps = {s: paired_difference(ppl("alibi", longest), ppl(s, longest)) for s in others}
    outcomes = {decide(gap, 0.0, above=False) for gap in gaps.values()}
    found.append(
        Check(
            "ALiBi extrapolates best (as in Press et al.)",
            f"ALiBi - each other scheme's perplexity at {longest} < 0 (paired by seed, 95% interval)",
            ", ".join(f"{s} {gap.text(2)}" for s, gap in gaps.items()),
            False,
            FAILS if FAILS in outcomes else INCONCLUSIVE if INCONCLUSIVE in outcomes else HOLDS,
        )
    )
    if "eval_tokens" not in results:  # made before every length scored the same text
        undecided = lambda c: dataclasses.replace(c, outcome=INCONCLUSIVE, figure=f"{c.figure}; {RERUN}")
        found = [c if c.what.startswith("learned") else undecided(c) for c in found]
    return found


def notes(results: dict) -> str:
    paper = results["paper"]
    return (
        f"**Beside the paper.** {paper['source']}: {paper['shape']}. ALiBi trained at 512 tokens: perplexity "
        f"{paper['alibi_trained_512']['512']} at 512 and {paper['alibi_trained_512']['3072']} at 3,072 evaluation "
        f"tokens, better than sinusoidal trained at 3,072 ({paper['sinusoidal_trained_3072']['3072']})."
    )


def plots(results: dict, directory: Path) -> list[Path]:
    fig, axes = figure(2)
    for ax, kind, title in zip(axes, ("all", "tail"), ("every token of each window", "last tokens of each window")):
        for scheme in SCHEMES:
            points = [
                (n, mean_std(v)[0])
                for n in results["eval_lengths"]
                if (v := perplexities(results, scheme, n, kind)) is not None
            ]
            ax.plot(*zip(*points), "o-", label=scheme)
        ax.axvline(results["train_length"], color="k", linestyle=":", label="training length")
        log_log(ax, "evaluation length (tokens)", "perplexity", title)
        ax.set_xticks(results["eval_lengths"], [str(n) for n in results["eval_lengths"]])
        ax.legend()
    return [save(fig, directory / "position-extrapolation.png")]
