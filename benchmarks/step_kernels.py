#!/usr/bin/env python
"""torch's dropout and output loss against kqv's, at the shapes of a quick MT training step.

Two pieces of a training step are pure overhead on a CPU with little memory bandwidth or no MKL random numbers:

- dropout masks: `F.dropout` draws them with `bernoulli_`, parallel through MKL on Intel CPUs only, one thread
  elsewhere; `kqv.nn.dropout.dropout` makes four masks from each 64-bit draw;
- the output layer's cross-entropy: `F.linear` + `F.cross_entropy` on a (tokens, vocab) logits matrix against
  `kqv.nn.losses.linear_cross_entropy`, a block of rows at a time.

Each pair runs interleaved for `--rounds` rounds (forward + backward for the loss) and the table gives median
milliseconds and torch / kqv. The shapes are those of a 2,000-token-budget batch of the quick MT Transformer
(d_model 256, d_ff 1024, vocabulary 8,000): about 1,800 target tokens.

    python benchmarks/step_kernels.py     # writes benchmarks/results/step_kernels.json
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kqv.nn import dropout, linear_cross_entropy
from kqv.train import native_bf16
from kqv_lab import benchmarking as harness

TOKENS, D_MODEL, D_FF, VOCAB = 1800, 256, 1024, 8000


def mean_ms(fn: Callable[[], object], inner: int = 5) -> float:
    """Milliseconds per call of fn, averaged over `inner` calls after one untimed call."""
    return harness.timed(fn, warmup=1, inner=inner).seconds[0] * 1e3


def dropout_pairs(dtype: torch.dtype) -> dict[str, tuple[Callable, Callable]]:
    pairs = {}
    for name, shape in (
        ("residual branch (tokens, d_model)", (TOKENS, D_MODEL)),
        ("feed-forward (tokens, d_ff)", (TOKENS, D_FF)),
    ):
        x = torch.randn(shape, dtype=dtype)
        pairs[f"dropout {name}"] = (lambda x=x: F.dropout(x, 0.1, True), lambda x=x: dropout(x, 0.1, True))
    return pairs


def loss_pair(precision: str) -> tuple[Callable, Callable]:
    torch.manual_seed(0)
    head = nn.Linear(D_MODEL, VOCAB, bias=False)
    hidden = torch.randn(TOKENS, D_MODEL, requires_grad=True)
    targets = torch.randint(0, VOCAB, (TOKENS,))

    def run(fused: bool) -> None:
        hidden.grad, head.weight.grad = None, None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = (
                linear_cross_entropy(hidden, head, targets, label_smoothing=0.1)
                if fused
                else F.cross_entropy(head(hidden).float(), targets, label_smoothing=0.1)
            )
        loss.backward()

    return (lambda: run(False)), (lambda: run(True))


def main() -> None:
    parser = harness.arguments(
        harness.summary(__doc__), output=harness.results_path("step_kernels"), output_flag="--out", threads=None
    )
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    precisions = ["fp32"] + (["bf16"] if native_bf16() else [])
    rows = []
    for precision in precisions:
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        pairs = {**dropout_pairs(dtype), "output projection + cross-entropy, forward + backward": loss_pair(precision)}
        for name, (theirs, ours) in pairs.items():
            torch_times, kqv_times = [], []
            for _ in range(args.rounds):  # interleaved, so drift slows both alike
                torch_times.append(mean_ms(theirs))
                kqv_times.append(mean_ms(ours))
            torch_ms, kqv_ms = statistics.median(torch_times), statistics.median(kqv_times)
            rows.append(
                {
                    "kernel": name,
                    "precision": precision,
                    "torch_ms": round(torch_ms, 2),
                    "kqv_ms": round(kqv_ms, 2),
                    "torch_over_kqv": round(torch_ms / kqv_ms, 2),
                }
            )
            print(
                f"{name:58s} {precision:5s} torch {torch_ms:8.2f} ms   kqv {kqv_ms:8.2f} ms   "
                f"torch/kqv {torch_ms / kqv_ms:5.2f}",
                flush=True,
            )
    result = {
        "native_bf16": native_bf16(),
        "shapes": {"tokens": TOKENS, "d_model": D_MODEL, "d_ff": D_FF, "vocab": VOCAB},
        "rounds": args.rounds,
        "rows": rows,
    }
    harness.write_record(args.output, result)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
