"""`parallelism`: a recurrent layer needs one sequential step per token; self-attention needs one per layer.

The lecture: an RNN's hidden state at step t needs the state at step t - 1, so a sequence of n tokens takes O(n)
operations that cannot run in parallel ("future RNN hidden states can't be computed in full before past RNN hidden
states have been computed"), which is bad for parallel hardware; self-attention's number of unparallelisable
operations does not grow with the sequence length (Vaswani et al. 2017, Table 1: O(n) against O(1) sequential
operations, at O(n d^2) against O(n^2 d) work per layer).

How it is tested: the wall time of one forward and backward pass of an LSTM layer (`torch.nn.LSTM`, the layer
`kqv.nn.rnn` builds its encoder and decoder from) against one causal self-attention layer of the same width
(kqv's `MultiHeadAttention`), at sequence lengths from 64 to 4,096 with a fixed number of tokens per batch
(batch = tokens / length). The LSTM's work is the same at every length; only how much of it is sequential
changes. Attention's work grows with the length (n^2 d), so at long lengths it can lose on a CPU: the experiment
shows where (`--device cuda` times both layers on a GPU, the parallel hardware the claim is about). With two
threads it also shows which layer a second core helps. Timings depend on the machine's load: results.json
records the load average, and figures taken on a loaded machine are upper bounds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from kqv.nn import ModelConfig, MultiHeadAttention

from .base import FAILS, HOLDS, INCONCLUSIVE, TRAINING_DEVICE, Check, ExperimentConfig, ExperimentError, Progress, pm
from .plotting import figure, log_log, save
from .statistics import interval_check, paired_ratio

NAME = "parallelism"
CLAIM = "an LSTM needs n sequential steps, self-attention 1: at fixed tokens per batch the LSTM slows as n grows"
LECTURE = (
    "Recurrent models have O(sequence length) unparallelizable operations: future hidden states can't be "
    "computed before past hidden states have been computed, which inhibits training on very large datasets. "
    "Self-attention's number of unparallelizable operations does not increase with sequence length."
)
FIELDS = ("lengths", "tokens", "threads", "lstm_ms", "attention_ms", "sequential_steps")


@dataclass
class Config(ExperimentConfig):
    """The sizes of the `parallelism` experiment (`FULL` and `QUICK` below), validated when made."""

    d_model: int = 256
    n_heads: int = 4
    lengths: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096)
    tokens: int = 4096  # tokens per batch at every length
    repeats: int = 3  # timed passes per seed (the median is kept)
    threads: tuple[int, ...] = (1, 2)
    seeds: int = 3

    def check(self) -> None:
        super().check()
        if any(self.tokens % n for n in self.lengths):
            raise ExperimentError(f"tokens ({self.tokens}) must be a multiple of every length {list(self.lengths)}")


FULL = Config()
QUICK = Config(d_model=32, n_heads=2, lengths=(16, 64, 256), tokens=256, repeats=2, threads=(1,), seeds=1)


def method(config: Config) -> str:
    return (
        f"One forward + backward pass of an LSTM layer and of a causal self-attention layer, both of width "
        f"{config.d_model} ({config.n_heads} heads), fp32, at lengths {', '.join(map(str, config.lengths))} with "
        f"{config.tokens:,} tokens per batch; median of {config.repeats} timed passes after one warm-up, per "
        f"seed (random inputs), at {' and '.join(map(str, config.threads))} torch thread(s)."
    )


def layers(config: Config) -> dict[str, nn.Module]:
    attention = MultiHeadAttention(
        ModelConfig(
            vocab_size=1, d_model=config.d_model, n_heads=config.n_heads, max_len=max(config.lengths), dropout=0.0
        )
    )
    return {"lstm": nn.LSTM(config.d_model, config.d_model, batch_first=True), "attention": attention}


def passes(name: str, layer: nn.Module) -> Callable[[Tensor], Tensor]:
    """x (batch, time, d_model) -> output of the same shape."""
    if name == "lstm":
        return lambda x: layer(x)[0]
    return lambda x: layer(x, causal=True)[0]


def time_pass(forward: Callable[[Tensor], Tensor], x: Tensor, repeats: int) -> float:
    """Median milliseconds of forward + backward, after one untimed warm-up pass."""
    times = []
    for i in range(repeats + 1):
        x.grad = None
        started = time.perf_counter()
        forward(x).square().mean().backward()
        if x.is_cuda:  # a GPU runs asynchronously: wait for the pass's last kernel
            torch.cuda.synchronize(x.device)
        if i:
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(len(config.threads) * len(config.lengths) * 2 * len(seeds))
    timings = {"lstm": {}, "attention": {}}
    device = torch.device(TRAINING_DEVICE.get())  # `kqv experiment run parallelism --device cuda`: on a GPU
    previous = torch.get_num_threads()
    try:
        for threads in config.threads:
            torch.set_num_threads(threads)
            for name in timings:
                timings[name][str(threads)] = [[] for _ in config.lengths]
            for seed in seeds:
                torch.manual_seed(seed)
                built = {name: layer.to(device) for name, layer in layers(config).items()}
                for j, length in enumerate(config.lengths):
                    x = torch.randn(config.tokens // length, length, config.d_model, requires_grad=True, device=device)
                    for name, layer in built.items():
                        ms = time_pass(passes(name, layer), x, config.repeats)
                        timings[name][str(threads)][j].append(ms)
                        progress.step(f"{threads} thread(s) n={length} {name} {ms:.0f} ms")
    finally:
        torch.set_num_threads(previous)
    return {
        "lengths": list(config.lengths),
        "tokens": config.tokens,
        "threads": list(config.threads),
        "lstm_ms": timings["lstm"],
        "attention_ms": timings["attention"],
        "sequential_steps": {"lstm": list(config.lengths), "attention": [1] * len(config.lengths)},
    }


def _mean(values: list[float]) -> float:
    return statistics.fmean(values)


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = ["length n", "batch", "sequential steps LSTM / attention (by construction)"]
    for threads in map(str, results["threads"]):
        columns += [f"LSTM ms ({threads} thr.)", f"attention ms ({threads} thr.)", f"LSTM / attention ({threads} thr.)"]
    rows = []
    for j, n in enumerate(results["lengths"]):
        row = [n, results["tokens"] // n, f"{n} / 1"]
        for threads in map(str, results["threads"]):
            lstm, attention = results["lstm_ms"][threads][j], results["attention_ms"][threads][j]
            row += [pm(lstm, 1), pm(attention, 1), round(_mean(lstm) / _mean(attention), 2)]
        rows.append(row)
    return columns, rows


def _all(checks: list[Check]) -> str:
    """The outcome of several interval decisions that must all hold."""
    outcomes = {c.outcome for c in checks}
    return FAILS if FAILS in outcomes else INCONCLUSIVE if INCONCLUSIVE in outcomes else HOLDS


def checks(results: dict) -> list[Check]:
    one = str(min(results["threads"]))
    lengths = results["lengths"]
    lstm, attention = results["lstm_ms"][one], results["attention_ms"][one]
    short = [j for j, n in enumerate(lengths) if n <= 512]
    faster = {j: paired_ratio(lstm[j], attention[j]) for j in short}
    found = [
        interval_check(
            f"at fixed tokens per batch the LSTM slows down as its sequential steps grow ({one} thread)",
            "LSTM time at the longest length / at the shortest > 2 (per seed, 95% interval)",
            paired_ratio(lstm[-1], lstm[0]),
            2.0,
            detail=f"{_mean(lstm[-1]):.1f} ms at n={lengths[-1]} vs {_mean(lstm[0]):.1f} ms at n={lengths[0]}",
        ),
        Check(
            f"self-attention is faster than the LSTM at training lengths (n <= 512, {one} thread)",
            "LSTM / attention time > 1 at every measured n <= 512 (per seed, 95% interval)",
            ", ".join(f"n={lengths[j]}: {r.text(3)}" for j, r in faster.items()) + " (LSTM / attention)",
            False,
            _all([interval_check("", "", r, 1.0) for r in faster.values()]) if short else FAILS,
        ),
    ]
    if len(results["threads"]) > 1:
        more = str(max(results["threads"]))
        speedup = {
            name: [a / b for a, b in zip(results[f"{name}_ms"][one][-1], results[f"{name}_ms"][more][-1])]
            for name in ("lstm", "attention")
        }
        found.append(
            interval_check(
                f"a second core helps attention more than the LSTM at the longest length (n={lengths[-1]})",
                f"attention's speed-up from {one} to {more} threads / the LSTM's > 1 (per seed, 95% interval)",
                paired_ratio(speedup["attention"], speedup["lstm"]),
                1.0,
                detail=f"attention {_mean(speedup['attention']):.2f}x, LSTM {_mean(speedup['lstm']):.2f}x",
            )
        )
    return found


def plots(results: dict, directory: Path) -> list[Path]:
    fig, (times, steps) = figure(2)
    for threads in map(str, results["threads"]):
        for name, marker in (("lstm", "o"), ("attention", "s")):
            values = results[f"{name}_ms"][threads]
            means = [_mean(v) for v in values]
            stds = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
            times.errorbar(
                results["lengths"],
                means,
                yerr=stds,
                marker=marker,
                capsize=3,
                linestyle="-" if threads == "1" else "--",
                label=f"{name}, {threads} thread(s)",
            )
    log_log(
        times,
        "sequence length n (tokens per batch fixed)",
        "forward + backward (ms)",
        f"{results['tokens']:,} tokens per batch",
    )
    times.legend()
    for name, marker in (("lstm", "o"), ("attention", "s")):  # counted from the algorithms, not measured
        steps.plot(results["lengths"], results["sequential_steps"][name], marker=marker, linestyle=":", label=name)
    log_log(
        steps,
        "sequence length n",
        "sequential steps per layer (by construction)",
        "by construction, not measured: n for the LSTM, 1 for attention",
    )
    steps.legend()
    return [save(fig, directory / "parallelism.png")]
