"""`quadratic-cost`: self-attention costs O(n^2 d) against the feed-forward network's O(n d^2).

The lecture: "computing all pairs of interactions means our computation grows quadratically with the sequence
length"; Vaswani et al. 2017 (Table 1) count O(n^2 d) operations per self-attention layer against O(n d^2) for a
recurrent or position-wise layer, so self-attention is the cheaper of the two while n < d, and the quadratic term
takes over once n passes d (up to constant factors: with d_ff = 4 d the FLOP counts cross at n = 2 d).

How it is tested: at fixed widths d, for sequence lengths n from 32 to 2,048, one forward + backward pass of
(1) the attention core softmax(q k^T / sqrt(d_k)) v alone (kqv's plain reference kernel, which builds the n x n
weights as the lecture writes it), (2) a whole self-attention layer (kqv's `MultiHeadAttention` with that kernel:
projections + core) and (3) kqv's position-wise `FeedForward` (d_ff = 4 d). Per seed, the fastest of several
timed passes; the exponent of n is the slope of log time against log n over the long lengths, fitted per seed.
Memory is counted, not sampled: the bytes of the tensors each pass keeps for its backward pass (autograd's
saved-tensor hooks, each storage once, parameters and the input excluded), for the plain kernel and for torch's
fused SDPA (which never stores the n x n weights). Where the attention layer's time crosses the FFN's is read off
the log-log curves by linear interpolation.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from kqv.nn import FeedForward, FullAttention, ModelConfig, MultiHeadAttention, scaled_dot_product_attention

from .base import INCONCLUSIVE, Check, ExperimentConfig, Progress, mean_std, pm
from .plotting import figure, log_log, save
from .statistics import Interval, all_of, decide_within, mean_interval, paired_ratio

NAME = "quadratic-cost"
CLAIM = "self-attention's time and memory grow as n^2 d, the FFN's as n d^2: attention dominates once n passes ~d"
LECTURE = (
    "Quadratic compute in self-attention: computing all pairs of interactions means our computation grows "
    "quadratically with the sequence length. Per layer, self-attention costs O(n^2 d) against O(n d^2) for "
    "recurrent and feed-forward layers, so it is cheaper when the sequence length n is smaller than d."
)
FIELDS = ("dims", "lengths", "heads", "fit_from", "ms", "saved_bytes", "flops", "exponents", "crossover")
PARTS = ("attention core", "attention layer", "feed-forward")
MEMORY = ("attention core", "attention layer", "attention layer (fused SDPA)", "feed-forward")


@dataclass
class Config(ExperimentConfig):
    """The sizes of the `quadratic-cost` experiment (`FULL` and `QUICK` below), validated when made."""

    dims: tuple[int, ...] = (128, 256)
    lengths: tuple[int, ...] = (32, 64, 128, 256, 512, 1024, 2048)
    heads: int = 4
    fit_from: int = 256  # exponents are fitted over the lengths >= this
    repeats: int = 7  # timed passes per seed and length (the fastest is kept)
    seeds: int = 5


FULL = Config()
QUICK = Config(dims=(32, 64), lengths=(16, 64, 256), fit_from=64, repeats=2, seeds=2)


def method(config: Config) -> str:
    return (
        f"One forward + backward pass (batch 1, fp32, 1 thread) of the attention core, a whole self-attention "
        f"layer ({config.heads} heads, plain kernel) and the feed-forward network (d_ff = 4 d) at d = "
        f"{', '.join(map(str, config.dims))} and n = {', '.join(map(str, config.lengths))}; fastest of "
        f"{config.repeats} timed passes after a warm-up per seed (fresh weights and inputs per seed); exponents "
        f"fitted on log-log over n >= {config.fit_from}; memory = bytes saved for the backward pass; FLOPs of "
        f"forward + backward from torch's FLOP counter."
    )


def build(d: int, heads: int) -> tuple[dict[str, Callable[[Tensor], Tensor]], list[nn.Module]]:
    """x (1, n, d) -> output (1, n, d) of each measured part, freshly initialised; and the layers holding weights."""
    config = ModelConfig(vocab_size=1, d_model=d, n_heads=heads, d_ff=4 * d, max_len=1 << 20, dropout=0.0)
    plain, fused = MultiHeadAttention(config), MultiHeadAttention(config)
    plain.core = FullAttention("never", fused=False)  # the n x n weights, materialised
    fused.core = FullAttention("never", fused=True)  # torch's SDPA
    feed_forward = FeedForward(config)

    def core(x: Tensor) -> Tensor:
        heads_x = x.view(1, x.shape[1], heads, d // heads).transpose(1, 2)  # (1, heads, n, d / heads)
        return scaled_dot_product_attention(heads_x, heads_x, heads_x)[0]

    parts = {
        "attention core": core,
        "attention layer": lambda x: plain(x)[0],
        "attention layer (fused SDPA)": lambda x: fused(x)[0],
        "feed-forward": feed_forward,
    }
    return parts, [plain, fused, feed_forward]


def fastest_pass(forward: Callable[[Tensor], Tensor], x: Tensor, repeats: int) -> float:
    """The fastest of `repeats` timed forward + backward passes, in ms, after one untimed warm-up. The minimum,
    not the median: on a shared machine other work only ever adds time, so the fastest pass is the closest to
    the cost of the computation itself (as `timeit` advises)."""
    times = []
    for i in range(repeats + 1):
        x.grad = None
        started = time.perf_counter()
        forward(x).sum().backward()
        if i:
            times.append((time.perf_counter() - started) * 1000)
    return min(times)


def saved_bytes(forward: Callable[[Tensor], Tensor], x: Tensor, parameters: set[int] = frozenset()) -> int:
    """Bytes of the tensors autograd keeps from forward(x) for the backward pass: each storage once, without the
    input's and without `parameters` (storage pointers of weights, which exist whatever the length)."""
    kept: dict[int, int] = {}
    skip = {x.untyped_storage().data_ptr(), *parameters}

    def pack(tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward(x)
    return sum(kept.values())


def flops(forward: Callable[[Tensor], Tensor], x: Tensor) -> int:
    """Floating-point operations of forward(x) and its backward pass, as torch's FLOP counter counts them
    (matrix products: 2 per multiply-add; elementwise work such as the softmax is not counted)."""
    with FlopCounterMode(display=False) as counter:
        forward(x).sum().backward()
    return counter.get_total_flops()


def exponent(lengths: list[int], values: list[float], start: int) -> float:
    """The slope of log value against log n over the lengths >= start (a least-squares line)."""
    points = [(math.log(n), math.log(v)) for n, v in zip(lengths, values) if n >= start and v > 0]
    return float(np.polyfit(*zip(*points), 1)[0])


def crossover(lengths: list[int], first: list[float], second: list[float]) -> float | None:
    """The n where `first` overtakes `second` (log-log linear interpolation); None if it does not within the
    measured lengths (already above at the shortest, or still below at the longest)."""
    gaps = [math.log(a / b) for a, b in zip(first, second)]
    for j in range(1, len(lengths)):
        if gaps[j - 1] < 0 <= gaps[j]:
            lo, hi = math.log(lengths[j - 1]), math.log(lengths[j])
            return math.exp(lo + (hi - lo) * -gaps[j - 1] / (gaps[j] - gaps[j - 1]))
    return None


def measure_width(config: Config, d: int, seed: int, progress: Progress) -> tuple[dict, dict, dict]:
    """Per part, at every length: fastest ms; bytes saved for backward and FLOPs (both seed-independent)."""
    torch.manual_seed(seed)
    parts, layers = build(d, config.heads)
    weights = {p.untyped_storage().data_ptr() for layer in layers for p in layer.parameters()}
    ms = {part: [] for part in PARTS}
    memory = {part: [] for part in MEMORY}
    counted = {part: [] for part in PARTS}
    for n in config.lengths:
        x = torch.randn(1, n, d, requires_grad=True)
        for part in PARTS:
            ms[part].append(fastest_pass(parts[part], x, config.repeats))
        for part in MEMORY:
            memory[part].append(saved_bytes(parts[part], x, weights))
        for part in PARTS:
            counted[part].append(flops(parts[part], x))
        progress.step(f"d={d} n={n}: attention {ms['attention layer'][-1]:.1f} ms, FFN {ms['feed-forward'][-1]:.1f}")
    return ms, memory, counted


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(len(config.dims) * len(config.lengths) * len(seeds))
    lengths = list(config.lengths)
    ms: dict = {str(d): {part: [] for part in PARTS} for d in config.dims}
    saved: dict = {}
    counted: dict = {}
    for seed in seeds:
        for d in config.dims:
            times, saved[str(d)], counted[str(d)] = measure_width(config, d, seed, progress)
            for part in PARTS:
                ms[str(d)][part].append(times[part])
    exponents = {
        str(d): {
            **{part: [exponent(lengths, run, config.fit_from) for run in ms[str(d)][part]] for part in PARTS},
            **{f"memory {part}": exponent(lengths, saved[str(d)][part], config.fit_from) for part in MEMORY},
        }
        for d in config.dims
    }
    crossings = {
        str(d): [crossover(lengths, a, f) for a, f in zip(ms[str(d)]["attention layer"], ms[str(d)]["feed-forward"])]
        for d in config.dims
    }
    return {
        "dims": list(config.dims),
        "lengths": lengths,
        "heads": config.heads,
        "fit_from": config.fit_from,
        "ms": ms,
        "saved_bytes": saved,  # the same for every seed: sizes, not samples
        "flops": counted,
        "exponents": exponents,
        "crossover": crossings,
        "memory_crossover": {d: _cross(lengths, saved[d]) for d in saved},
        "flop_crossover": {d: _cross(lengths, counted[d]) for d in counted},
    }


def _cross(lengths: list[int], by_part: dict[str, list[float]]) -> float | None:
    return crossover(lengths, by_part["attention layer"], by_part["feed-forward"])


def _mean_curve(runs: list[list[float]]) -> list[float]:
    """The per-length mean over seeds of the per-seed times."""
    return [statistics.fmean(column) for column in zip(*runs)]


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = [
        "d",
        "n",
        "attention core ms",
        "attention layer ms",
        "FFN ms",
        "attention layer / FFN",
        "saved MB attention core",
        "saved MB attention layer (plain)",
        "saved MB attention layer (fused)",
        "saved MB FFN",
        "n x n weights MB",
        "GFLOP attention layer",
        "GFLOP FFN",
    ]
    rows = []
    for d in results["dims"]:
        ms, saved = results["ms"][str(d)], results["saved_bytes"][str(d)]
        for j, n in enumerate(results["lengths"]):
            per_seed = [a[j] / f[j] for a, f in zip(ms["attention layer"], ms["feed-forward"])]
            rows.append(
                [d, n]
                + [pm([run[j] for run in ms[part]], 2) for part in PARTS]
                + [pm(per_seed, 2)]
                + [round(saved[part][j] / 2**20, 3) for part in MEMORY]
                + [round(4 * results["heads"] * n * n / 2**20, 3)]
                + [round(results["flops"][str(d)][part][j] / 1e9, 4) for part in ("attention layer", "feed-forward")]
            )
    for d in results["dims"]:
        e, cross = results["exponents"][str(d)], results["crossover"][str(d)]
        found = [c for c in cross if c is not None]
        rows.append(
            [d, f"exponent of n (n >= {results['fit_from']})"]
            + [pm(e[part], 2) for part in PARTS]
            + [f"time crossover n = {pm(found, 0) if found else 'none'}"]
            + [round(e[f"memory {part}"], 2) for part in MEMORY]
            + [
                f"memory crossover n = {_round(results['memory_crossover'][str(d)])}",
                "FLOP crossover n =",
                _round(results["flop_crossover"][str(d)]),
            ]
        )
    return columns, rows


def _round(value: float | None) -> str:
    return "none" if value is None else f"{value:.0f}"


# thresholds, fixed before the experiment ran
QUADRATIC, LINEAR = (1.7, 2.3), (0.8, 1.2)  # the exponent of n for the n^2 and n terms (time)
QUADRATIC_MEMORY, LINEAR_MEMORY = (1.9, 2.1), (0.9, 1.1)  # memory is counted, not timed: tighter bands
CROSSOVER = (0.5, 4.0)  # the time crossover n / d ("n ~ d" up to the constant factors; FLOPs cross at 2 d)
MOVES = (0.7, 1.4)  # crossover(d_max) / crossover(d_min), relative to d_max / d_min


def _within(value: float | None, band: tuple[float, float]) -> bool:
    return value is not None and band[0] <= value <= band[1]


def _band_check(what: str, threshold: str, intervals: dict[int, Interval], band: tuple[float, float]) -> Check:
    """One check over the widths: every d's interval inside `band` (decided per d, then `all_of`)."""
    return Check(
        what,
        threshold,
        "; ".join(f"d={d}: {interval.text(2)}" for d, interval in intervals.items()),
        False,
        all_of([decide_within(interval, *band) for interval in intervals.values()]),
    )


def checks(results: dict) -> list[Check]:
    dims = results["dims"]
    exponents = lambda part: {d: mean_interval(results["exponents"][str(d)][part]) for d in dims}
    memory = {part: {d: results["exponents"][str(d)][f"memory {part}"] for d in dims} for part in MEMORY}
    cross = {d: results["crossover"][str(d)] for d in dims}
    per_d = lambda values, digits=2: ", ".join(f"d={d}: {v:.{digits}f}" for d, v in values.items())
    missing = [d for d in dims if None in cross[d]]
    crossing = (
        Check(
            "the attention layer overtakes the FFN near n ~ d",
            f"crossover n / d within {list(CROSSOVER)} at every d (95% interval over seeds)",
            "no crossover within the measured lengths on some seeds at d = " + ", ".join(map(str, missing)),
            False,
            INCONCLUSIVE,
        )
        if missing
        else _band_check(
            "the attention layer overtakes the FFN near n ~ d",
            f"crossover n / d within {list(CROSSOVER)} at every d (95% interval over seeds); FLOPs cross at 2 d",
            {d: mean_interval([c / d for c in cross[d]]) for d in dims},
            CROSSOVER,
        )
    )
    found = [
        _band_check(
            "the attention core's time grows as n^2",
            f"exponent of n within {list(QUADRATIC)} at every d (95% interval over seeds)",
            exponents("attention core"),
            QUADRATIC,
        ),
        _band_check(
            "the feed-forward network's time grows as n",
            f"exponent of n within {list(LINEAR)} at every d (95% interval over seeds)",
            exponents("feed-forward"),
            LINEAR,
        ),
        Check(
            "the memory the plain attention core keeps for backward grows as n^2, the FFN's as n",
            f"exponents within {list(QUADRATIC_MEMORY)} and {list(LINEAR_MEMORY)} at every d (counted bytes, the "
            "same on every seed: an exact check, no interval)",
            f"attention core {per_d(memory['attention core'])}; FFN {per_d(memory['feed-forward'])}",
            all(_within(e, QUADRATIC_MEMORY) for e in memory["attention core"].values())
            and all(_within(e, LINEAR_MEMORY) for e in memory["feed-forward"].values()),
        ),
        crossing,
    ]
    if len(dims) > 1 and not missing:
        small, large = min(dims), max(dims)
        moved = paired_ratio(cross[large], [c * large / small for c in cross[small]])
        found.append(
            Check(
                "the crossover moves in proportion to d",
                f"(crossover at d={large} / at d={small}) / {large / small:g} within {list(MOVES)} (per seed, 95% "
                "interval)",
                f"{mean_std(cross[large])[0]:.0f} / {mean_std(cross[small])[0]:.0f}; per seed {moved.text()}",
                False,
                decide_within(moved, *MOVES),
            )
        )
    return found


# one colour and marker per part; one line style per d
LOOK = {
    "attention core": {"color": "C0", "marker": "o"},
    "attention layer": {"color": "C1", "marker": "s"},
    "attention layer (fused SDPA)": {"color": "C2", "marker": "v"},
    "feed-forward": {"color": "C3", "marker": "^"},
}


def plots(results: dict, directory: Path) -> list[Path]:
    fig, (times, memory) = figure(2)
    lengths = results["lengths"]
    for d, style in zip(results["dims"], ("-", "--", ":", "-.")):
        for part in PARTS:
            times.plot(
                lengths, _mean_curve(results["ms"][str(d)][part]), linestyle=style, label=f"{part}, d={d}", **LOOK[part]
            )
        for part in MEMORY:
            values = [b / 2**20 for b in results["saved_bytes"][str(d)][part]]
            memory.plot(lengths, values, linestyle=style, label=f"{part}, d={d}", **LOOK[part])
        times.axvline(d, color="grey", linestyle=style, linewidth=0.8)
        memory.axvline(d, color="grey", linestyle=style, linewidth=0.8)
    log_log(
        times, "sequence length n", "forward + backward (ms)", "time (mean over seeds of the fastest pass); grey: n = d"
    )
    log_log(memory, "sequence length n", "MB saved for backward", "memory kept for the backward pass")
    for ax in (times, memory):
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xticks([], minor=True)
        ax.legend(fontsize=7)
    return [save(fig, directory / "quadratic-cost.png")]
