"""`scaling-laws`: does the loss fall as a power law in model size, as Kaplan et al. 2020 found?

The lecture (on why scale matters): the loss of a language model falls smoothly and predictably as a power law in
its number of parameters, its data and its compute (Kaplan et al. 2020, "Scaling Laws for Neural Language Models":
L(N) = (N_c / N)^alpha_N with alpha_N about 0.076 for non-embedding parameters N, at 768 to 1.5e9 parameters and
far more data).

How it is tested: Shakespeare character LMs of six sizes (non-embedding parameters from about 20k to 5M: width and
depth grow together, 16-dimensional heads), trained on the same token budget with the same schedule; the learning
rate shrinks with width as lr = base * min(1, sqrt(64 / d_model)), a rule fixed in advance. The fit is
L(N) = (N_c / N)^alpha_N + L_inf, by least squares (scipy's curve_fit), with the standard errors of the parameters
from its covariance and the residual of every point. The irreducible term L_inf stands for what a finite budget on a
small corpus cannot remove. The compute-matched frontier: every size's validation loss against training compute
C = 6 N tokens, and the lowest loss any size reaches at each compute, fitted as L(C) = (C_c / C)^alpha_C + L_inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import optimize, stats

from kqv.nn import count_parameters

from .base import FAILS, HOLDS, INCONCLUSIVE, Check, ExperimentError, Progress
from .lm import Arm, LMConfig, train_arms
from .plotting import figure, log_log, save
from .statistics import Interval, decide, t_quantile

NAME = "scaling-laws"
CLAIM = "validation loss falls as a power law in non-embedding parameters, L(N) = (N_c/N)^alpha_N + L_inf"
LECTURE = (
    "Scaling laws: the loss of a language model improves smoothly and predictably, as a power law, as we "
    "increase model size, data and compute (Kaplan et al. 2020), which is why ever larger models are trained."
)
FIELDS = ("sizes", "tokens", "fit_n", "fit_c", "frontier", "paper")
PAPER = {
    "source": "Kaplan et al. 2020, 'Scaling Laws for Neural Language Models', equations (1.1)-(1.3)",
    "alpha_n": 0.076,
    "n_c": 8.8e13,
    "alpha_c_min": 0.050,
    "range": "768 to 1.5e9 non-embedding parameters, WebText2 (22B tokens), BPE",
}


@dataclass
class Config(LMConfig):
    """The sizes of the `scaling-laws` experiment (`FULL` and `QUICK` below), validated when made."""

    PAIRED = (("widths", "depths"),)

    widths: tuple[int, ...] = (32, 48, 64, 128, 192, 256)
    depths: tuple[int, ...] = (2, 3, 4, 3, 4, 6)
    head_dim: int = 16

    def check(self) -> None:
        super().check()
        if any(w % self.head_dim for w in self.widths):
            raise ExperimentError(
                f"every width must be a multiple of head_dim ({self.head_dim}), got {list(self.widths)}"
            )


FULL = Config(context=64, batch_size=32, steps=450, warmup_steps=45, eval_every=50, eval_batches=8, seeds=1)
QUICK = Config(
    widths=(16, 24, 32, 48, 64, 80),
    depths=(1, 1, 1, 1, 1, 1),
    head_dim=8,
    context=32,
    batch_size=8,
    steps=30,
    warmup_steps=5,
    eval_every=15,
    eval_batches=2,
    seeds=1,
)


def learning_rate(config: Config, width: int) -> float:
    return config.lr * min(1.0, math.sqrt(64 / width))


def method(config: Config) -> str:
    sizes = ", ".join(f"{w}x{d}" for w, d in zip(config.widths, config.depths))
    return (
        f"Character-level Shakespeare LMs of width x depth {sizes} (d_ff 4 x width, {config.head_dim}-dimensional "
        f"heads, RoPE), each trained for {config.steps} steps of {config.batch_size} x {config.context} tokens "
        f"({config.steps * config.batch_size * config.context:,} tokens), AdamW, {config.warmup_steps} warm-up "
        f"steps and cosine decay, peak lr {config.lr:g} x min(1, sqrt(64 / width)), fp32; validation loss on "
        f"{config.eval_batches} x {config.batch_size} blocks every {config.eval_every} steps."
    )


def power_law(x: np.ndarray, log_scale: float, alpha: float, floor: float) -> np.ndarray:
    """(x_c / x)^alpha + floor, with log_scale = ln x_c (fitted in logs: x_c spans many orders of magnitude)."""
    return np.exp(alpha * (log_scale - np.log(x))) + floor


def fit_power_law(x: list[float], loss: list[float]) -> dict:
    """Least-squares fit of loss = (x_c / x)^alpha + floor: parameters, standard errors, residuals."""
    x_arr, y = np.asarray(x, dtype=float), np.asarray(loss, dtype=float)
    start = (float(np.log(x_arr.max())) + 5.0, 0.3, float(y.min()) * 0.8)
    bounds = ([0.0, 1e-4, 0.0], [200.0, 5.0, float(y.min())])
    try:
        params, covariance = optimize.curve_fit(power_law, x_arr, y, p0=start, bounds=bounds, maxfev=20_000)
    except (RuntimeError, ValueError) as error:
        return {"ok": False, "error": str(error)}
    errors = np.sqrt(np.clip(np.diag(covariance), 0, None))
    residuals = y - power_law(x_arr, *params)
    return {
        "ok": bool(np.all(np.isfinite(errors))),
        "alpha": float(params[1]),
        "alpha_error": float(errors[1]),
        "log_scale": float(params[0]),
        "log_scale_error": float(errors[0]),
        "floor": float(params[2]),
        "floor_error": float(errors[2]),
        "residuals": residuals.tolist(),
        "x": x_arr.tolist(),
        "loss": y.tolist(),
    }


def frontier(curves: list[list[tuple[float, float]]], points: int = 12) -> list[tuple[float, float]]:
    """The lowest loss any curve [(compute, loss)] reaches at each of `points` log-spaced computes (log-linear
    interpolation within each curve's own range). A curve that ended at less compute counts with its final loss:
    that budget could have trained it, so the frontier never rises with compute."""
    low = min(c[0][0] for c in curves)
    high = max(c[-1][0] for c in curves)
    found = []
    for compute in np.geomspace(low, high, points):
        values = [
            float(np.interp(np.log(compute), np.log([p[0] for p in c]), [p[1] for p in c]))
            for c in curves
            if c[0][0] <= compute
        ]  # np.interp holds the last value
        if values:
            found.append((float(compute), min(values)))
    return found


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(len(config.widths) * len(seeds))
    arms = {
        f"{w}x{d}": Arm(
            model={"d_model": w, "n_layers": d, "d_ff": 4 * w, "n_heads": w // config.head_dim},
            train={"lr": learning_rate(config, w)},
        )
        for w, d in zip(config.widths, config.depths)
    }
    trained = train_arms(
        config,
        seeds,
        arms,
        progress,
        measure=lambda t: {"non_embedding": count_parameters(t.model, exclude_embeddings=True)},
    )
    tokens_per_step = config.batch_size * config.context
    sizes, curves = [], []
    for name, r in trained.items():
        n = r["non_embedding"][0]
        loss = float(np.mean(r["val_loss"]))
        curve = [
            (6 * n * step * tokens_per_step, float(np.mean([c[i][1] for c in r["val_curves"]])))
            for i, (step, _) in enumerate(r["val_curves"][0])
        ]
        sizes.append(
            {
                "name": name,
                "non_embedding": n,
                "parameters": r["parameters"],
                "val_loss": loss,
                "val_losses": r["val_loss"],
                "lr": arms[name].train["lr"],
                "compute_curve": curve,
            }
        )
        curves.append(curve)
    edge = frontier(curves)
    return {
        "sizes": sizes,
        "tokens": config.steps * tokens_per_step,
        "paper": PAPER,
        "fit_n": fit_power_law([s["non_embedding"] for s in sizes], [s["val_loss"] for s in sizes]),
        "frontier": edge,
        "fit_c": fit_power_law([c for c, _ in edge], [loss for _, loss in edge]),
    }


def table(results: dict) -> tuple[list[str], list[list]]:
    fit = results["fit_n"]
    columns = [
        "model (width x depth)",
        "non-embedding parameters N",
        "parameters",
        "peak lr",
        "validation loss",
        "fit residual",
    ]
    rows = [
        [
            s["name"],
            s["non_embedding"],
            s["parameters"],
            s["lr"],
            round(s["val_loss"], 4),
            round(fit["residuals"][i], 4) if fit["ok"] else "",
        ]
        for i, s in enumerate(results["sizes"])
    ]
    for key, label in (("fit_n", "L(N)"), ("fit_c", "L(C), frontier")):
        f = results[key]
        rows.append(
            [
                f"fit {label}",
                (
                    f"alpha = {f['alpha']:.3f} ± {f['alpha_error']:.3f}, L_inf = "
                    f"{f['floor']:.3f} ± {f['floor_error']:.3f}"
                )
                if f["ok"]
                else f"fit failed: {f.get('error', 'no error estimate')}",
                "",
                "",
                "",
                "",
            ]
        )
    return columns, rows


def checks(results: dict) -> list[Check]:
    sizes, fit, paper = results["sizes"], results["fit_n"], results["paper"]
    rho = float(stats.spearmanr([s["non_embedding"] for s in sizes], [s["val_loss"] for s in sizes]).statistic)
    found = [
        Check(
            "the loss falls as the model grows",
            "Spearman correlation of N and loss <= -0.8",
            f"rho = {rho:+.2f}",
            rho <= -0.8,
        )
    ]
    if not fit["ok"]:
        return found + [
            Check("the power law fits", "curve_fit converges with finite errors", fit.get("error", "?"), False)
        ]
    worst = max(abs(r) for r in fit["residuals"])
    alpha = alpha_interval(fit)
    fits = Check(
        "a power law with an irreducible term fits the points",
        "alpha_N > 0 (95% interval, t with points - 3 df) and every |residual| <= 0.05 nats",
        f"alpha_N = {alpha.text()}; largest |residual| {worst:.3f}",
        False,
        FAILS if worst > 0.05 else decide(alpha, 0.0),
    )
    low, high = paper["alpha_n"] / 3, paper["alpha_n"] * 3
    within = decide(alpha, low) == HOLDS and decide(alpha, high, above=False) == HOLDS
    outside = alpha.high < low or alpha.low > high
    size = (HOLDS if within else FAILS if outside else INCONCLUSIVE) if fits.holds else INCONCLUSIVE
    return found + [
        fits,
        Check(
            f"alpha_N is of the size Kaplan et al. found ({paper['alpha_n']})",
            f"alpha_N's 95% interval within a factor 3 of {paper['alpha_n']} (between {low:.3f} and {high:.3f}); "
            "decided only when the fit check holds",
            f"alpha_N = {alpha.text()}" + ("" if fits.holds else "; inconclusive: the fit check does not hold"),
            False,
            size,
        ),
    ]


def alpha_interval(fit: dict) -> Interval:
    """alpha_N with its 95% interval: the fit's standard error times Student's t with (points - 3) df."""
    half = t_quantile(len(fit["x"]) - 3) * fit["alpha_error"]
    return Interval(fit["alpha"], fit["alpha"] - half, fit["alpha"] + half, len(fit["x"]))


def notes(results: dict) -> str:
    paper, fit_c = results["paper"], results["fit_c"]
    compute = (
        f"; the compute frontier fits alpha_C = {fit_c['alpha']:.3f} ± {fit_c['alpha_error']:.3f} against their "
        f"alpha_C(min) = {paper['alpha_c_min']}"
        if fit_c["ok"]
        else ""
    )
    return (
        f"**Beside the paper.** {paper['source']}: alpha_N = {paper['alpha_n']}, N_c = {paper['n_c']:.1e}, over "
        f"{paper['range']}{compute}. Here every model saw the same {results['tokens']:,} characters: the larger "
        f"ones are far from converged, which the irreducible term L_inf partly absorbs."
    )


def plots(results: dict, directory: Path) -> list[Path]:
    fig, (by_size, by_compute) = figure(2)
    n = np.array([s["non_embedding"] for s in results["sizes"]], dtype=float)
    loss = np.array([s["val_loss"] for s in results["sizes"]])
    by_size.plot(n, loss, "o", label="trained models")
    fit = results["fit_n"]
    if fit["ok"]:
        grid = np.geomspace(n.min() / 1.5, n.max() * 1.5, 100)
        by_size.plot(
            grid,
            power_law(grid, fit["log_scale"], fit["alpha"], fit["floor"]),
            "-",
            label=f"fit: alpha_N = {fit['alpha']:.3f} ± {fit['alpha_error']:.3f}, L_inf = {fit['floor']:.2f}",
        )
        for x, y, r in zip(n, loss, fit["residuals"]):
            by_size.annotate(f"{r:+.3f}", (x, y), textcoords="offset points", xytext=(4, 6), fontsize=7)
    log_log(
        by_size,
        "non-embedding parameters N",
        "validation loss (nats)",
        f"{results['tokens']:,} training tokens each (labels: residuals)",
    )
    by_size.legend(fontsize=8)
    for s in results["sizes"]:
        by_compute.plot(*zip(*s["compute_curve"]), "-", alpha=0.7, label=s["name"])
    by_compute.plot(*zip(*results["frontier"]), "k--", linewidth=2, label="frontier")
    log_log(by_compute, "training compute C = 6 N tokens (FLOPs)", "validation loss (nats)", "compute-matched frontier")
    by_compute.legend(fontsize=7)
    return [save(fig, directory / "scaling-laws.png")]
