"""`multihead-cost`: h attention heads of d/h dimensions cost what one head of d dimensions costs.

The lecture: multi-head attention computes h attention operations, each with its own query, key and value maps of
d/h dimensions, "at the same computational cost" as one head: the projections are the same d x d matrices
(reshaped into h blocks), and the scores and weighted sums do h products of d/h dimensions instead of one of d.

How it is tested: kqv's `MultiHeadAttention` at a fixed d_model with 1, 2, 4, 8 and 16 heads (head dimension
d_model / h), one forward + backward pass on random inputs, with kqv's default kernel (torch's fused SDPA) and with
the plain reference kernel that builds every head's n x n weights. Per seed (fresh weights and inputs), the fastest
of several timed passes and its ratio to the one-head time of the same seed; the FLOPs of each pass from torch's
FLOP counter (plain kernel: its matrix products are what the lecture counts); and the bytes the plain kernel keeps
for backward (autograd's saved tensors), where the h n x n weight matrices show up.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kqv.nn import FullAttention, ModelConfig, MultiHeadAttention

from .base import Check, ExperimentConfig, ExperimentError, Progress, by_construction, mean_std, pm
from .plotting import figure, log_log, save
from .quadratic_cost import fastest_pass, flops, saved_bytes
from .statistics import all_of, decide, paired_ratio

NAME = "multihead-cost"
CLAIM = "h heads of d/h dimensions take the same FLOPs and about the same time as one head of d"
LECTURE = (
    "Multi-head attention: let Q_l, K_l, V_l each be of dimension d x d/h, where h is the number of attention "
    "heads; each head performs attention independently and the outputs of all heads are combined. Even though "
    "we compute h many attention heads, it's not really more costly: the same amount of computation as one head."
)
FIELDS = ("heads", "lengths", "d_model", "batch", "kernels", "ms", "ratio", "flops", "saved_bytes")
KERNELS = {"fused (kqv default)": True, "plain": False}


@dataclass
class Config(ExperimentConfig):
    """The sizes of the `multihead-cost` experiment (`FULL` and `QUICK` below), validated when made."""

    d_model: int = 256
    heads: tuple[int, ...] = (1, 2, 4, 8, 16)
    lengths: tuple[int, ...] = (128, 512)
    batch: int = 4
    repeats: int = 7  # timed passes per seed (the fastest is kept)
    seeds: int = 5

    def check(self) -> None:
        super().check()
        if self.heads[0] != 1 or any(self.d_model % h for h in self.heads):
            raise ExperimentError(
                f"heads must start at 1 (the baseline) and divide d_model {self.d_model}, got {list(self.heads)}"
            )


FULL = Config()
QUICK = Config(d_model=32, heads=(1, 4), lengths=(32,), batch=2, repeats=2, seeds=1)


def method(config: Config) -> str:
    return (
        f"kqv's MultiHeadAttention at d_model {config.d_model} with {', '.join(map(str, config.heads))} heads, "
        f"one forward + backward pass of a batch of {config.batch} random sequences of "
        f"{' and '.join(map(str, config.lengths))} tokens (fp32, 1 thread), with the fused SDPA kernel and the "
        f"plain one; fastest of {config.repeats} timed passes after a warm-up, per seed; FLOPs from torch's FLOP "
        f"counter and bytes saved for backward, both with the plain kernel."
    )


def layer(d_model: int, heads: int, fused: bool) -> MultiHeadAttention:
    config = ModelConfig(vocab_size=1, d_model=d_model, n_heads=heads, max_len=1 << 20, dropout=0.0)
    attention = MultiHeadAttention(config)
    attention.core = FullAttention("never", fused=fused)
    return attention


def output_of(attention: MultiHeadAttention):
    """x (batch, n, d_model) -> the layer's output, without its weights."""
    return lambda x: attention(x)[0]


def measure(config: Config, n: int, h: int, seed: int) -> tuple[dict[str, float], int, int]:
    """Median ms per kernel, FLOPs and bytes saved for backward (plain kernel) of h heads at length n."""
    torch.manual_seed(seed)
    x = torch.randn(config.batch, n, config.d_model, requires_grad=True)
    ms = {
        kernel: fastest_pass(output_of(layer(config.d_model, h, fused)), x, config.repeats)
        for kernel, fused in KERNELS.items()
    }
    plain = layer(config.d_model, h, fused=False)
    weights = {p.untyped_storage().data_ptr() for p in plain.parameters()}
    return ms, flops(output_of(plain), x), saved_bytes(output_of(plain), x, weights)


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(len(seeds) * len(config.lengths) * len(config.heads))
    ms = {kernel: {str(n): {str(h): [] for h in config.heads} for n in config.lengths} for kernel in KERNELS}
    counted = {str(n): {} for n in config.lengths}
    saved = {str(n): {} for n in config.lengths}
    for seed in seeds:
        for n in config.lengths:
            for h in config.heads:
                times, counted[str(n)][str(h)], saved[str(n)][str(h)] = measure(config, n, h, seed)
                for kernel, value in times.items():
                    ms[kernel][str(n)][str(h)].append(value)
                progress.step(f"n={n} h={h}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in times.items()))
    ratio = {
        kernel: {
            n: {h: [t / one for t, one in zip(times, by_h["1"])] for h, times in by_h.items()}
            for n, by_h in by_n.items()
        }
        for kernel, by_n in ms.items()
    }
    return {
        "heads": list(config.heads),
        "lengths": list(config.lengths),
        "d_model": config.d_model,
        "batch": config.batch,
        "kernels": list(KERNELS),
        "ms": ms,
        "ratio": ratio,  # per seed: time with h heads / time with one head, same seed and kernel
        "flops": counted,
        "saved_bytes": saved,
    }


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = ["n", "heads", "head dim"]
    for kernel in results["kernels"]:
        columns += [f"{kernel} ms", f"{kernel} / 1 head"]
    columns += ["GFLOP (plain)", "FLOPs / 1 head", "saved MB (plain)"]
    rows = []
    for n in map(str, results["lengths"]):
        for h in map(str, results["heads"]):
            row = [int(n), int(h), results["d_model"] // int(h)]
            for kernel in results["kernels"]:
                row += [pm(results["ms"][kernel][n][h], 2), pm(results["ratio"][kernel][n][h], 3)]
            row += [
                round(results["flops"][n][h] / 1e9, 4),
                round(results["flops"][n][h] / results["flops"][n]["1"], 4),
                round(results["saved_bytes"][n][h] / 2**20, 3),
            ]
            rows.append(row)
    return columns, rows


# thresholds, fixed before the experiment ran
SAME_FLOPS = 1.01  # largest / smallest FLOP count over the head counts (counted: an exact check)
SAME_TIME = 1.25  # time with h heads / with one head (per seed, 95% interval), at most


def checks(results: dict) -> list[Check]:
    found = []
    spread = {n: max(by_h.values()) / min(by_h.values()) for n, by_h in results["flops"].items()}
    found.append(
        by_construction(
            Check(
                "h heads do the same floating-point work as one head",
                f"largest / smallest FLOP count over the head counts <= {SAME_FLOPS} at every n (counted, the same "
                "on every seed: an exact check, no interval)",
                ", ".join(f"n={n}: {s:.4f}" for n, s in spread.items()),
                all(s <= SAME_FLOPS for s in spread.values()),
            )
        )
    )
    for kernel in results["kernels"]:
        ratios = {  # per seed: time with h heads / with one head, same seed and kernel
            (n, h): paired_ratio(r, [1.0] * len(r))
            for n, by_h in results["ratio"][kernel].items()
            for h, r in by_h.items()
            if h != "1"
        }
        worst = max(ratios, key=lambda key: ratios[key].mean)
        found.append(
            Check(
                f"h heads take about the time of one head ({kernel} kernel)",
                f"time with h heads / with one head < {SAME_TIME} for every h and n (per seed, 95% interval)",
                f"largest {ratios[worst].text()} (n={worst[0]}, h={worst[1]}); "
                + ", ".join(f"n={n} h={h}: {r.text()}" for (n, h), r in ratios.items()),
                False,
                all_of([decide(r, SAME_TIME, above=False) for r in ratios.values()]),
            )
        )
    return found


def plots(results: dict, directory: Path) -> list[Path]:
    fig, (times, memory) = figure(2)
    heads = results["heads"]
    for kernel, style in zip(results["kernels"], ("-", "--")):
        for n in map(str, results["lengths"]):
            ratios = [results["ratio"][kernel][n][str(h)] for h in heads]
            means = [mean_std(r)[0] for r in ratios]
            stds = [mean_std(r)[1] for r in ratios]
            times.errorbar(heads, means, yerr=stds, marker="o", capsize=3, linestyle=style, label=f"{kernel}, n={n}")
    times.axhline(1.0, color="k", linewidth=0.8)
    times.axhline(SAME_TIME, color="grey", linestyle=":", label=f"threshold {SAME_TIME}")
    times.set(
        xscale="log",
        xlabel="heads h (head dim = d_model / h)",
        ylabel="time / one head's time",
        title=f"forward + backward, d_model {results['d_model']}",
    )
    times.legend(fontsize=7)
    for n in map(str, results["lengths"]):
        memory.plot(heads, [results["saved_bytes"][n][str(h)] / 2**20 for h in heads], "o-", label=f"saved, n={n}")
        memory.plot(
            heads,
            [results["flops"][n][str(h)] / results["flops"][n]["1"] for h in heads],
            "s--",
            label=f"FLOPs / one head's, n={n}",
        )
    log_log(memory, "heads h", "MB saved for backward; FLOP ratio", "plain kernel: memory and FLOPs")
    memory.legend(fontsize=7)
    for ax in (times, memory):
        ax.set_xticks(heads, [str(h) for h in heads])
        ax.set_xticks([], minor=True)
    return [save(fig, directory / "multihead-cost.png")]
