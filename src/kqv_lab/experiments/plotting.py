"""Figures for the experiments: matplotlib's object API on an Agg canvas (no pyplot state, no display)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from kqv.train import write_png


def figure(panels: int = 1, width: float = 5.5, height: float = 4.0) -> tuple[Figure, list[Axes]]:
    """A figure with `panels` side-by-side axes."""
    fig = Figure(figsize=(width * panels, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    for ax in axes:
        ax.grid(alpha=0.3)
    return fig, list(axes)


def log_log(ax: Axes, xlabel: str, ylabel: str, title: str) -> None:
    """A panel with both axes on log scales, as the experiments draw sizes against costs (power laws are lines)."""
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel, title=title)


def save(fig: Figure, path: str | Path) -> Path:
    """Write the figure as a PNG atomically (drawn into memory, then through a temporary file: `write_png`)."""
    path = Path(path)
    write_png(path, fig)
    return path


def mean_band(ax: Axes, x: Sequence[float], runs: Sequence[Sequence[float]], label: str, **style) -> None:
    """The mean of several runs' curves as a line, with a band of +- one standard deviation."""
    length = min(len(run) for run in runs)
    values = np.array([list(run)[:length] for run in runs], dtype=float)
    x = np.asarray(list(x)[:length], dtype=float)
    mean = values.mean(axis=0)
    line = ax.plot(x, mean, label=label, **style)[0]
    if len(runs) > 1:
        std = values.std(axis=0, ddof=1)
        ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)


def curves(ax: Axes, arms: dict[str, list[list[tuple[int, float]]]], **style) -> None:
    """Loss curves of several arms, each a list over seeds of [(step, loss)]: mean +- std per arm."""
    for label, runs in arms.items():
        runs = [run for run in runs if run]
        if runs:
            steps = [step for step, _ in runs[0]]
            mean_band(ax, steps, [[loss for _, loss in run] for run in runs], label, **style)
    ax.set(xlabel="training step", ylabel="loss (nats/token)")
    ax.legend()
