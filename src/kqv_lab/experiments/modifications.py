"""`modifications`: which of the Transformer's popular modifications help? A small Narang et al. 2021.

The lecture shows Narang et al. 2021, "Do Transformer Modifications Transfer Across Implementations and
Applications?" (Table 1): of dozens of modifications tried in one code base (T5, 223M parameters, C4), few beat the
vanilla Transformer by much, and those that did were mostly simple: GLU feed-forward variants (SwiGLU, GeGLU),
RMSNorm, and mixture-of-experts layers (Switch Transformer, with far more parameters).

How it is tested: the small Shakespeare LM as the vanilla block (ReLU feed-forward, LayerNorm, pre-LN, tied input
and output embeddings), against single changes of it: GELU, SwiGLU and GeGLU (with d_ff cut to 2/3 so the
feed-forward keeps its parameter count), RMSNorm, post-LN and untied embeddings; all on the same batches, at least
3 seeds each, ranked by mean validation loss. A Switch-style mixture-of-experts feed-forward is a row only when
kqv's `ModelConfig` offers `ffn="switch"`; without it the row is left out and the report says so.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from pathlib import Path

from scipy import stats

from kqv.nn import ModelConfig

from .base import FAILS, HOLDS, INCONCLUSIVE, Check, Progress, mean_std, pm
from .lm import QUICK_LM, Arm, LMConfig, train_arms
from .plotting import figure, save
from .statistics import decide, paired_difference

NAME = "modifications"
CLAIM = "of single modifications to the vanilla block, GLU feed-forwards help most, as Narang et al. 2021 found"
LECTURE = (
    "Do Transformer modifications transfer? Narang et al. 2021 re-implemented dozens of them in one code base: "
    "most did not improve on the vanilla Transformer; the ones that did (e.g. GLU variants, RMSNorm) were "
    "mostly small changes."
)
FIELDS = ("arms", "paper", "switch_available")
# Narang et al. 2021, Table 1: (early loss at 65k steps, mean over 5 runs; final loss at 524k steps), T5-base on C4
PAPER = {
    "vanilla (ReLU)": (2.182, 1.838),
    "GELU": (2.179, 1.838),
    "SwiGLU": (2.127, 1.789),
    "GeGLU": (2.130, 1.792),
    "RMSNorm": (2.167, 1.821),
    "untied embeddings": (2.195, 1.834),
    "Switch MoE": (2.135, 1.758),
}
PAPER_SOURCE = (
    "Narang et al. 2021, Table 1 (T5-base-sized encoder-decoder on C4; early loss at 65k steps, mean of 5 "
    "runs; final loss at 524k steps); post-LN is not a row of that table"
)


def switch_available() -> bool:
    """Whether this kqv's ModelConfig has the Switch mixture-of-experts feed-forward (`ffn="switch"`)."""
    hint = typing.get_type_hints(ModelConfig).get("ffn")
    return hint is not None and "switch" in typing.get_args(hint)


@dataclass
class Config(LMConfig):
    """The sizes of the `modifications` experiment (`FULL` and `QUICK` below), validated when made."""

    pass


FULL = Config(seeds=3)
QUICK = Config(**{**QUICK_LM, "steps": 30, "eval_every": 30})


def arms(config: Config) -> dict[str, Arm]:
    glu_d_ff = round(2 * config.d_ff / 3)
    found = {
        "vanilla (ReLU)": {},
        "GELU": {"activation": "gelu"},
        "SwiGLU": {"activation": "swiglu", "d_ff": glu_d_ff},
        "GeGLU": {"activation": "geglu", "d_ff": glu_d_ff},
        "RMSNorm": {"norm": "rmsnorm"},
        "post-LN": {"norm_first": False},
        "untied embeddings": {"tie_embeddings": False},
    }
    if switch_available():
        found["Switch MoE"] = {"ffn": "switch"}
    return {name: Arm(model={"activation": "relu", **changes}) for name, changes in found.items()}


def method(config: Config) -> str:
    moe = "a Switch MoE row" if switch_available() else "no MoE row (kqv's ModelConfig has no ffn='switch' yet)"
    return (
        f"A character-level Shakespeare LM ({config.sizes()}) as the vanilla block (ReLU, LayerNorm, pre-LN, tied "
        f"embeddings) and with one change each: {', '.join(list(arms(config))[1:])}; GLU variants use d_ff "
        f"{round(2 * config.d_ff / 3)}; {moe}. Ranked by mean validation loss over the seeds."
    )


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    chosen = arms(config)
    progress.plan(len(chosen) * len(seeds))
    return {
        "arms": train_arms(config, seeds, chosen, progress),
        "paper": {k: list(v) for k, v in PAPER.items()},
        "paper_source": PAPER_SOURCE,
        "switch_available": "Switch MoE" in chosen,
    }


def ranking(results: dict) -> list[str]:
    return sorted(results["arms"], key=lambda arm: mean_std(results["arms"][arm]["val_loss"])[0])


def rank_agreement(results: dict) -> tuple[float, list[str]]:
    """Spearman's rank correlation between our mean validation losses and the paper's final losses."""
    common = [arm for arm in results["arms"] if arm in results["paper"]]
    ours = [mean_std(results["arms"][arm]["val_loss"])[0] for arm in common]
    theirs = [results["paper"][arm][1] for arm in common]
    return float(stats.spearmanr(ours, theirs).statistic), common


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = ["rank", "block", "parameters", "validation loss", "vs vanilla", "paper: early loss", "paper: final loss"]
    vanilla = mean_std(results["arms"]["vanilla (ReLU)"]["val_loss"])[0]
    rows = []
    for rank, arm in enumerate(ranking(results), 1):
        r, paper = results["arms"][arm], results["paper"].get(arm)
        loss = mean_std(r["val_loss"])[0]
        rows.append(
            [
                rank,
                arm,
                r["parameters"],
                pm(r["val_loss"]),
                f"{loss - vanilla:+.3f}",
                paper[0] if paper else "not in Table 1",
                paper[1] if paper else "",
            ]
        )
    return columns, rows


def checks(results: dict) -> list[Check]:
    arms = results["arms"]
    loss = {arm: mean_std(r["val_loss"])[0] for arm, r in arms.items()}
    gains = {glu: paired_difference(arms["vanilla (ReLU)"]["val_loss"], arms[glu]["val_loss"]) for glu in GLUS}
    outcomes = {decide(gain, 0.0) for gain in gains.values()}
    rho, common = rank_agreement(results)
    return [
        Check(
            "GLU feed-forwards beat the vanilla ReLU block (Narang et al.: SwiGLU 1.789, GeGLU 1.792 vs 1.838)",
            "vanilla - GLU validation loss > 0 for both SwiGLU and GeGLU (paired by seed, 95% interval)",
            f"SwiGLU {loss['SwiGLU']:.3f}, GeGLU {loss['GeGLU']:.3f}, vanilla {loss['vanilla (ReLU)']:.3f}; gain "
            + ", ".join(f"{glu} {gain.text()}" for glu, gain in gains.items()),
            False,
            FAILS if FAILS in outcomes else INCONCLUSIVE if INCONCLUSIVE in outcomes else HOLDS,
        ),
        Check(
            f"the ranking agrees with the paper's on the {len(common)} rows both have",
            "Spearman rank correlation with the paper's final losses >= 0.5",
            f"rho = {rho:+.2f}",
            rho >= 0.5,
        ),
    ]


GLUS = ("SwiGLU", "GeGLU")


def notes(results: dict) -> str:
    moe = (
        ""
        if results["switch_available"]
        else " The Switch mixture-of-experts row is left out: kqv's ModelConfig "
        "does not offer ffn='switch' in this version."
    )
    return f"**Beside the paper.** Paper figures: {results['paper_source']}.{moe}"


def plots(results: dict, directory: Path) -> list[Path]:
    fig, (ours, paper) = figure(2, width=6.0)
    order = ranking(results)
    means = [mean_std(results["arms"][a]["val_loss"]) for a in order]
    ours.barh(range(len(order)), [m for m, _ in means], xerr=[s for _, s in means], capsize=3)
    ours.set_yticks(range(len(order)), order)
    ours.invert_yaxis()
    low = min(m - s for m, s in means)
    ours.set(
        xlim=(low - 0.05, max(m + s for m, s in means) + 0.02),
        xlabel="validation loss (mean ± std)",
        title="this run (best first)",
    )
    shared = [a for a in order if a in results["paper"]]
    paper.barh(range(len(shared)), [results["paper"][a][1] for a in shared], color="tab:orange")
    paper.set_yticks(range(len(shared)), shared)
    paper.invert_yaxis()
    paper.set(xlim=(1.7, 1.9), xlabel="final loss (Narang et al. 2021, Table 1)", title="the paper, in our order")
    return [save(fig, directory / "modifications.png")]
