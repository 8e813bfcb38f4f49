"""What every benchmark script shares, said once: its arguments (a parser with the common flags: `--quick`, the
results path, `--seed`, `--threads`), how it times (`timed`: warm-up calls, then timed rounds, a GPU synchronised
around each; `matmul_peak`, the machine's practical FLOP/s), the machine it runs on, where its results go
(`benchmarks/results/NAME.json`) and how its record is written (`write_record`: the JSON with the machine, the
command, the date and the commit, written atomically, from `kqv_lab.measuring`).

A script imports it as `from kqv_lab import benchmarking as harness`, builds its parser with
`harness.arguments(harness.summary(__doc__), quick=..., output=harness.results_path("NAME"))`, adds its own flags,
times with `harness.timed(fn, warmup=..., repeats=...)` and writes with `harness.write_record(path, record)`;
`docs/gen_tables.py` reads what lands in `benchmarks/results/`. The benchmarks reach kqv only through its public
API, as this module does (tests/test_public_api.py).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kqv import ModelConfig
from kqv_lab.measuring import command, machine, write_json, write_record

__all__ = ["RESULTS", "ROOT", "Timing", "arguments", "command", "gpt2_shaped", "machine", "matmul_peak"]
__all__ += ["output_path", "results_path", "summary", "timed", "write_json", "write_record"]

ROOT = Path(__file__).resolve().parents[2]  # the repository's root (src/kqv_lab/benchmarking.py in a checkout)
RESULTS = ROOT / "benchmarks" / "results"  # what docs/gen_tables.py reads


def results_path(name: str) -> Path:
    """Where the benchmark `name` writes its record by default: benchmarks/results/NAME.json."""
    return RESULTS / f"{name}.json"


def summary(doc: str | None) -> str:
    """A script's docstring's first paragraph: its parser's description."""
    return (doc or "").split("\n\n")[0]


def arguments(
    description: str,
    *,
    whole: bool = False,
    quick: str | None = None,
    output: Path | None = None,
    output_flag: str | None = "--output",
    output_help: str | None = None,
    seed: bool = False,
    threads: int | None | bool = False,
) -> argparse.ArgumentParser:
    """A benchmark's parser with the flags it shares with the others: `--quick` (its help, where given), the
    results path (`output_flag`, default `output`, read as `args.output`; None: no such flag), `--seed` (default 0) and
    `--threads` (torch's threads, default `threads`; False: no such flag). `whole` keeps the description's own
    line breaks (a docstring given in full)."""
    formatter = argparse.RawDescriptionHelpFormatter if whole else argparse.HelpFormatter
    parser = argparse.ArgumentParser(description=description, formatter_class=formatter)
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick)
    if output_flag is not None:
        parser.add_argument(output_flag, dest="output", type=Path, default=output, help=output_help)
    if seed:
        parser.add_argument("--seed", type=int, default=0, help="the seed (default 0)")
    if threads is not False:
        help = f"torch threads (default {threads})" if threads else "torch threads (default: torch's own)"
        parser.add_argument("--threads", type=int, default=threads, help=help)
    return parser


def seed_list(text: str) -> list[int]:
    """`--seeds 1,2,3`: the seeds, comma-separated."""
    try:
        return [int(seed) for seed in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"seeds are whole numbers separated by commas, e.g. 1,2,3; got {text!r}"
        ) from None


def measured_in_scratch(
    name: str, args: argparse.Namespace, measure: Callable[[Path], dict], show: Callable[[dict], None], **fields: Any
) -> dict:
    """The record of benchmark `name`: `measure` run in a scratch directory of its own (removed after), under its
    name, `--quick` and `fields`; shown (`show`: its table) and written where `args` says (`output_path`)."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"kqv-{name.replace('_', '-')}-") as scratch:
        measured = measure(Path(scratch))
    record = {"benchmark": name, "quick": args.quick, **fields, **measured}
    show(record)
    write_record(output_path(args, name), record, started=started)
    return record


def output_path(args: argparse.Namespace, name: str, *, quick: bool = False) -> Path | None:
    """Where a run writes its record: `--output` where given, else nothing for a smoke test (`quick`), else
    `results_path(name)`."""
    if args.output is not None:
        return args.output
    return None if quick else results_path(name)


@dataclass(frozen=True)
class Timing:
    """What `timed` measured: each round's wall-clock and process CPU seconds per call, and the last call's result."""

    seconds: list[float]
    cpu_seconds: list[float]
    result: Any

    @property
    def median(self) -> float:
        """The median round's seconds per call: the figure a benchmark reports (robust to one slow round)."""
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        """The fastest round's seconds per call: a peak (what the machine can do, not what it usually does)."""
        return min(self.seconds)


def synchronize() -> None:
    """Wait for a GPU's queued kernels (it runs asynchronously: a time must end at its last kernel); no-op on a CPU."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], *, repeats: int = 1, warmup: int = 0, inner: int = 1) -> Timing:
    """Call `fn` `warmup` times untimed (the first calls allocate, compile, fill caches), collect garbage, then time
    `repeats` rounds of `inner` calls each: each round's seconds per call by the wall clock and by the process's CPU
    time, a GPU synchronised before and after each round. The one timer of the benchmarks."""
    for _ in range(warmup):
        fn()
    gc.collect()
    seconds, cpu_seconds, result = [], [], None
    for _ in range(repeats):
        synchronize()
        started, cpu_started = time.perf_counter(), time.process_time()
        for _ in range(inner):
            result = fn()
        synchronize()
        seconds.append((time.perf_counter() - started) / inner)
        cpu_seconds.append((time.process_time() - cpu_started) / inner)
    return Timing(seconds, cpu_seconds, result)


def matmul_peak(dtype: torch.dtype, n: int, *, repeats: int = 3, device: str | torch.device = "cpu") -> float:
    """FLOP/s of the best of `repeats` (n x n) @ (n x n) matmuls in `dtype` on `device`, after one warm-up: the
    machine's practical peak for the threads (or the GPU) this run uses."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    return 2 * n**3 / timed(lambda: torch.matmul(a, b), repeats=repeats, warmup=1).best


def gpt2_shaped(vocab: int, d_model: int, heads: int, layers: int, d_ff: int, max_len: int) -> ModelConfig:
    """kqv's config of a GPT-2 at this shape, as `kqv.interop` reads a `GPT2Config` (pre-LN decoder, learned
    positions, LayerNorm, tanh-approximated GELU, biases, tied output embedding) with no dropout: the decoder the
    speed benchmarks race against Hugging Face's GPT-2 and nanoGPT."""
    sizes = dict(vocab_size=vocab, d_model=d_model, n_heads=heads, n_layers=layers, d_ff=d_ff, max_len=max_len)
    return ModelConfig(
        **sizes,
        position="learned",
        activation="gelu_tanh",
        norm="layernorm",
        norm_first=True,
        dropout=0.0,
        bias=True,
        tie_embeddings=True,
    )
