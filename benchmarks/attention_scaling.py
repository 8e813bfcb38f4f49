#!/usr/bin/env python
"""Time and peak memory of attention as the sequence grows: the lecture's "what if n >= 50,000?".

One head, head_dim 64, batch 1, fp32, for n = 1k ... 64k, every method causal unless said otherwise:

* reference         kqv's plain `scaled_dot_product_attention` with a causal mask: builds n x n scores. Run only
                    while its n x n matrices fit `--budget-gb` (computed before anything is allocated);
                    larger n are reported as "exceeds budget".
* sdpa              torch's `F.scaled_dot_product_attention(is_causal=True)`, bias-free: the speed to match.
* blockwise_relative, blockwise_alibi
                    kqv's exact `blockwise_attention` with Shaw relative positions (k = 16, key and value side)
                    and with ALiBi: what SDPA cannot do without an n x n bias.
* linformer         `LinformerAttention`, k = 256, the published non-causal form.
* linformer_causal  the cumulative causal variant, k = 256.
* bigbird           `BigBirdAttention`, 64-token blocks, 1 window block each side, 1 global, 2 random.
* local             `LocalAttention` (Liu et al. 2018), 256-token blocks: O(n * 256).
* memory_compressed `MemoryCompressedAttention` (Liu et al. 2018), compression 3, causal (compressed earlier
                    blocks + the query's own block), queries in chunks of 512: O(n^2 / 3) time, and memory
                    bounded by a chunk's scores forward (training keeps every chunk's n / 3 scores per query).

Each (method, n) runs in a fresh subprocess, so its peak memory is its own: the worker allocates its inputs and
parameters, warms up on a short input, then reads its peak resident set size (getrusage ru_maxrss) as the
baseline; the figure reported is the peak after the timed passes minus that baseline. "forward" is the forward
pass under `torch.no_grad()`; "train" is forward + backward (gradients of queries, keys, values and parameters).
Times are the best of a few repeats (fewer at large n). The machine may be shared: `--threads 1` gives steadier
numbers than torch's default when other work competes for the cores.

    python benchmarks/attention_scaling.py --threads 1                 # full run, ~10-15 minutes on 2 cores
    python benchmarks/attention_scaling.py --quick                     # up to 4k, one repeat: a smoke test
    python benchmarks/attention_scaling.py --max-n 16384 --methods sdpa blockwise_alibi
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kqv_lab import benchmarking as harness

RESULTS = harness.results_path("attention_scaling")
PLOT = harness.ROOT / "docs" / "attention_scaling.png"
LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
METHODS = [
    "reference",
    "sdpa",
    "blockwise_relative",
    "blockwise_alibi",
    "linformer",
    "linformer_causal",
    "bigbird",
    "local",
    "memory_compressed",
]
HEAD_DIM = 64
REFERENCE_BYTES_PER_SCORE = {"forward": 13, "train": 25}  # bool mask + fp32 copies of scores alive at the peak


def reference_need_gb(n: int, phase: str) -> float:
    """Memory the plain reference needs for its n x n matrices: the causal mask (1 byte a score) and fp32 scores,
    masked scores, weights (3 copies forward; twice that with the gradients of training)."""
    return n * n * REFERENCE_BYTES_PER_SCORE[phase] / 2**30


def repeats_for(n: int, quick: bool) -> int:
    return 1 if quick or n >= 32768 else 2 if n >= 8192 else 3


# ---------------------------------------------------------------------------------------------------------------
# The worker: one method at one length, in its own process


def build(method: str, n: int):
    """(attend(q, k, v) -> output, parameters) for one method."""
    import torch.nn.functional as F

    from kqv import causal_mask, scaled_dot_product_attention
    from kqv.nn import (
        ALiBiPositions,
        BigBirdAttention,
        LinformerAttention,
        LocalAttention,
        MemoryCompressedAttention,
        RelativePositions,
        blockwise_attention,
    )

    if method == "reference":
        return lambda q, k, v: scaled_dot_product_attention(q, k, v, mask=causal_mask(q.shape[2], k.shape[2]))[0], []
    if method == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), []
    if method.startswith("blockwise"):
        positions = RelativePositions(HEAD_DIM, 16) if method == "blockwise_relative" else ALiBiPositions(1)
        return (
            lambda q, k, v: blockwise_attention(q, k, v, positions=positions, causal=True),
            list(positions.parameters()),
        )
    if method.startswith("linformer"):
        module = LinformerAttention(max_len=n, k=256)
        return lambda q, k, v: module(q, k, v, causal=method == "linformer_causal"), list(module.parameters())
    if method == "bigbird":
        module = BigBirdAttention(block=64, window=1, global_blocks=1, random_blocks=2)
        return lambda q, k, v: module(q, k, v, causal=True), []
    if method == "local":
        return lambda q, k, v: LocalAttention(256)(q, k, v, causal=True), []
    if method == "memory_compressed":
        module = MemoryCompressedAttention(HEAD_DIM, 3)
        return lambda q, k, v: module(q, k, v, causal=True), list(module.parameters())
    raise ValueError(f"unknown method {method!r}; choose from {METHODS}")


def worker(method: str, n: int, repeats: int, threads: int | None) -> dict:
    import torch

    from kqv.nn import peak_rss_bytes

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    attend, parameters = build(method, n)
    warm_up = [torch.randn(1, 1, min(n, 256), HEAD_DIM, requires_grad=True) for _ in range(3)]
    for _ in range(2):  # exactly as timed below: a first backward(gradient) costs ~1.5 s of one-time set-up
        attend(*warm_up).backward(torch.randn_like(warm_up[0]))
    q, k, v = (torch.randn(1, 1, n, HEAD_DIM, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, 1, n, HEAD_DIM)
    baseline = peak_rss_bytes()
    result = {"method": method, "n": n, "threads": torch.get_num_threads(), "repeats": repeats}

    forward, forward_cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        with torch.no_grad():
            attend(q, k, v)
        forward.append(time.perf_counter() - start)
        forward_cpu.append(time.process_time() - start_cpu)
    result.update(forward_s=min(forward), forward_cpu_s=min(forward_cpu))
    result["forward_peak_mb"] = (peak_rss_bytes() - baseline) / 2**20

    train, train_cpu = [], []
    for _ in range(repeats):
        for t in (q, k, v, *parameters):
            t.grad = None
        start, start_cpu = time.perf_counter(), time.process_time()
        attend(q, k, v).backward(grad)
        train.append(time.perf_counter() - start)
        train_cpu.append(time.process_time() - start_cpu)
    result.update(train_s=min(train), train_cpu_s=min(train_cpu))
    result["train_peak_mb"] = (peak_rss_bytes() - baseline) / 2**20
    return result


# ---------------------------------------------------------------------------------------------------------------
# The driver


def run_case(method: str, n: int, args: argparse.Namespace) -> dict:
    if method == "reference" and reference_need_gb(n, "train") > args.budget_gb:
        need = reference_need_gb(n, "train")
        return {"method": method, "n": n, "status": f"exceeds budget ({need:.1f} GB > {args.budget_gb:g} GB)"}
    command = [sys.executable, __file__, "--worker", method, str(n), str(repeats_for(n, args.quick))]
    if args.threads:
        command += ["--threads", str(args.threads)]
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=args.timeout,
            check=False,
            env={**os.environ, "PYTHONPATH": str(harness.ROOT / "src")},
        )
    except subprocess.TimeoutExpired:
        return {"method": method, "n": n, "status": f"timeout after {args.timeout} s"}
    if done.returncode != 0:
        return {"method": method, "n": n, "status": "failed: " + done.stderr.strip().splitlines()[-1]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result.update(status="ok", wall_s=time.perf_counter() - start)
    return result


def cell(result: dict) -> str:
    if result["status"] != "ok":
        return "exceeds budget" if result["status"].startswith("exceeds") else result["status"].split()[0]
    return (
        f"{result['forward_s']:.2f}/{result['train_s']:.2f}s "
        f"{result['forward_peak_mb']:.0f}/{result['train_peak_mb']:.0f}MB"
    )


def print_table(results: list[dict], methods: list[str], lengths: list[int]) -> None:
    by_key = {(r["method"], r["n"]): r for r in results}
    width = max(24, *(len(cell(r)) + 2 for r in results))
    print("\nwall time forward / forward+backward (s), peak memory above inputs forward / forward+backward (MB)")
    print(f"{'n':>7} " + "".join(f"{m:>{width}}" for m in methods))
    for n in lengths:
        print(f"{n:>7} " + "".join(f"{cell(by_key[m, n]) if (m, n) in by_key else '-':>{width}}" for m in methods))
    print("\nCPU time of forward+backward (s): steadier than wall time when other work shares the cores")
    print(f"{'n':>7} " + "".join(f"{m:>20}" for m in methods))
    for n in lengths:
        row = [by_key.get((m, n), {}) for m in methods]
        print(
            f"{n:>7} " + "".join(f"{r['train_cpu_s']:>20.2f}" if r.get("status") == "ok" else f"{'-':>20}" for r in row)
        )


def plot(results: list[dict], methods: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
    for method in methods:
        rows = [r for r in results if r["method"] == method and r["status"] == "ok"]
        if not rows:
            continue
        ns = [r["n"] for r in rows]
        time_ax.plot(ns, [r["train_cpu_s"] for r in rows], marker="o", label=method)
        memory_ax.plot(ns, [max(r["train_peak_mb"], 1.0) for r in rows], marker="o", label=method)
    labels = ("forward + backward CPU time (s)", "forward + backward peak memory above inputs (MB)")
    for ax, label in zip((time_ax, memory_ax), labels):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    time_ax.legend(fontsize=8)
    fig.suptitle("Attention at long n: 1 head, head_dim 64, batch 1, fp32, CPU (one thread)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = harness.arguments(harness.summary(__doc__), quick="n up to 4096, one repeat", output=RESULTS, threads=None)
    parser.add_argument("--max-n", type=int, default=LENGTHS[-1])
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--budget-gb", type=float, default=4.0, help="memory the reference's n x n matrices may use")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per (method, n) before giving up")
    parser.add_argument("--plot", type=Path, default=PLOT)
    parser.add_argument("--replot", action="store_true", help="only redraw the plot from the --output JSON")
    parser.add_argument("--worker", nargs=3, metavar=("METHOD", "N", "REPEATS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        method, n, repeats = args.worker
        print(json.dumps(worker(method, int(n), int(repeats), args.threads)))
        return
    if args.replot:
        plot(json.loads(args.output.read_text())["results"], args.methods, args.plot)
        return

    lengths = [n for n in LENGTHS if n <= min(args.max_n, 4096 if args.quick else args.max_n)]
    results = []
    start = time.perf_counter()
    for n in lengths:
        for method in args.methods:
            result = run_case(method, n, args)
            results.append(result)
            print(f"{method:>20} n={n:>6}: {cell(result)}", flush=True)
    print_table(results, args.methods, lengths)
    import torch

    report = {
        "command": "python benchmarks/attention_scaling.py " + " ".join(sys.argv[1:]),
        "setup": {
            "heads": 1,
            "head_dim": HEAD_DIM,
            "batch": 1,
            "dtype": "float32",
            "causal": "all but linformer",
            "budget_gb": args.budget_gb,
            "threads": args.threads or torch.get_num_threads(),
            "torch": torch.__version__,
            "total_s": time.perf_counter() - start,
        },
        "results": results,
    }
    harness.write_record(args.output, report)
    plot(results, args.methods, args.plot)
    print(f"\nwrote {args.output} and {args.plot} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
