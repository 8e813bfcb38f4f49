#!/usr/bin/env python
"""Attention forward + backward through torch's SDPA against plain matmuls, in fp32 and bf16, at the short
lengths of training batches: why `kqv.nn.attention.fused_attention` sends short bf16 inputs to the plain path.

Causal self-attention, head_dim 64; the shapes are those of kqv's configs (lm-quick: batch 32, 4 heads, 128
tokens; the GPT-2-shaped benchmark: batch 8, 6 heads, 256) and longer ones. Each (shape, precision) times both
kernels in alternation and reports the median of the repeats. Prints a table and writes JSON.

    python benchmarks/attention_kernels.py
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from kqv import scaled_dot_product_attention
from kqv_lab import benchmarking as harness

RESULTS = harness.results_path("attention_kernels")
SHAPES = [(32, 4, 128), (8, 6, 256), (4, 6, 512), (2, 6, 1024), (1, 8, 2048)]  # (batch, heads, time)
HEAD_DIM = 64


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def matmul(q, k, v):
    return scaled_dot_product_attention(q, k, v, causal=True)[0]


def seconds(kernel, inputs, grad) -> float:
    """Seconds of one forward and backward of `kernel`."""
    return harness.timed(lambda: kernel(*inputs).backward(grad)).seconds[0]


def main() -> None:
    parser = harness.arguments(harness.summary(__doc__), output=RESULTS)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    rows = []
    print(f"{'shape (batch, heads, time)':>28} {'dtype':>9} {'sdpa ms':>8} {'matmul ms':>10} {'sdpa/matmul':>12}")
    for batch, heads, time_ in SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(0)
            inputs = [torch.randn(batch, heads, time_, HEAD_DIM, dtype=dtype, requires_grad=True) for _ in range(3)]
            grad = torch.randn(batch, heads, time_, HEAD_DIM, dtype=dtype)
            times = {"sdpa": [], "matmul": []}
            for _ in range(2):  # warm-up
                for kernel in (sdpa, matmul):
                    seconds(kernel, inputs, grad)
            for _ in range(args.repeats):
                for name, kernel in (("sdpa", sdpa), ("matmul", matmul)):
                    times[name].append(seconds(kernel, inputs, grad))
            ms = {name: 1000 * statistics.median(t) for name, t in times.items()}
            rows.append(
                {
                    "batch": batch,
                    "heads": heads,
                    "time": time_,
                    "dtype": str(dtype).removeprefix("torch."),
                    "sdpa_ms": ms["sdpa"],
                    "matmul_ms": ms["matmul"],
                    "sdpa_over_matmul": ms["sdpa"] / ms["matmul"],
                }
            )
            print(
                f"{str((batch, heads, time_)):>28} {rows[-1]['dtype']:>9} {ms['sdpa']:8.1f} {ms['matmul']:10.1f} "
                f"{rows[-1]['sdpa_over_matmul']:12.2f}"
            )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    harness.write_record(
        args.output,
        {
            "command": "python benchmarks/attention_kernels.py",
            "head_dim": HEAD_DIM,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "rows": rows,
        },
    )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
