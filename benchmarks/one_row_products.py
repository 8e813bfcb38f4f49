#!/usr/bin/env python
"""How fast this CPU reads weights for one row: memory, `F.linear`, and kqv's one-row products side by side.

Decoding at batch 1 multiplies one row by every weight matrix per token, so its speed is the rate at which those
products read the weights. This prints, at each thread count, in GB/s of weights read:

* memory: a sum over a 256 MB tensor (what the memory gives to a plain stream);
* F.linear: `F.linear(x, weight, bias)` on the (out, in) rows `nn.Linear` keeps, what the general path calls;
* (in, out) copy: `torch.addmm` on a contiguous (in, out) copy of every weight, one thread's BLAS call;
* kqv one-row: `kqv.nn.decoding.one_row_product`, what `DecodeStep` uses at batch 1 (the copy only for weights at
  least as wide as deep, and one column block per thread).

The weights are those of `benchmarks/generation_speed.py`'s model (6 layers of query-key-value, output, up and down
projections at d_model 384, d_ff 1536, and the 8,192 x 384 output layer: 56 MB), in model order, so no product
finds its weight in the cache. (The query and key-value projections are two layers there, stacked into one at
batch 1 by `DecodeStep`: the bytes are the same.) Each figure is the median of `--rounds` timed passes, the kinds
interleaved.

    python benchmarks/one_row_products.py            # threads 1 and 2, writes results/one_row_products.json
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kqv.nn import one_row_product
from kqv_lab import benchmarking as harness

RESULTS = harness.results_path("one_row_products")


def model_weights() -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(weight (out, in), bias) of every linear layer of generation_speed.py's model, in the order a token meets
    them."""
    from generation_speed import FULL, build_models  # this script's directory is on sys.path

    model, _ = build_models(FULL, seed=0)
    return [(m.weight.detach(), m.bias) for m in model.modules() if type(m) is torch.nn.Linear]


def runners(weights: list[tuple[torch.Tensor, torch.Tensor | None]]) -> dict[str, Callable[[], object]]:
    rows = [torch.randn(1, weight.shape[1]) for weight, _ in weights]
    copies = [(weight.t().contiguous(), bias) for weight, bias in weights]
    products = [one_row_product(weight, bias, parts=torch.get_num_threads()) for weight, bias in weights]
    stream = torch.randn(64 << 20)  # 256 MB
    return {
        "memory": lambda: stream.sum(),
        "F.linear": lambda: [F.linear(x, w, b) for x, (w, b) in zip(rows, weights)],
        "(in, out) copy": lambda: [
            torch.mm(x, w) if b is None else torch.addmm(b, x, w) for x, (w, b) in zip(rows, copies)
        ],
        "kqv one-row": lambda: [product(x) for x, product in zip(rows, products)],
    }


def measure(threads: int, rounds: int) -> dict[str, float]:
    torch.set_num_threads(threads)
    weights = model_weights()
    weight_bytes = sum(w.numel() * 4 for w, _ in weights)
    kinds = runners(weights)
    sizes = {name: (64 << 20) * 4 if name == "memory" else weight_bytes for name in kinds}
    times: dict[str, list[float]] = {name: [] for name in kinds}
    with torch.inference_mode():
        for run in kinds.values():
            run()
        for _ in range(rounds):
            for name, run in kinds.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    return {name: sizes[name] / statistics.median(times[name]) / 1e9 for name in kinds}


def main(argv: list[str] | None = None) -> int:
    parser = harness.arguments(harness.summary(__doc__), output=RESULTS)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--rounds", type=int, default=21, help="timed passes per kind (default 21)")
    args = parser.parse_args(argv)
    rows = {}
    for threads in [int(t) for t in args.threads.split(",")]:
        rows[threads] = measure(threads, args.rounds)
        print(
            f"threads {threads}: " + ", ".join(f"{name} {rate:.1f} GB/s" for name, rate in rows[threads].items()),
            flush=True,
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    harness.write_record(
        args.output,
        {
            "benchmark": "one_row_products",
            "unit": "GB/s of weights read",
            "rounds": args.rounds,
            "torch": torch.__version__,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "rows": rows,
        },
    )
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
