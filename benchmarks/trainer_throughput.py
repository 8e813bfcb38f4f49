#!/usr/bin/env python
"""Tokens per second of kqv's whole training loop (`kqv.train.Trainer`), not just the model's step.

`train_throughput.py` times zero_grad + forward + backward + AdamW on the bare model; this times what a user's
run does between two log lines: the Trainer's update (micro-batches, autocast, clipping, the non-finite guard,
the learning-rate schedule), its bookkeeping and its logging, on the model of `configs/lm-quick.toml` (character
vocabulary, context 128, batch 32) with random token batches made on the host as the jobs make them.

The time of U updates is the wall time of a training to `--warmup + U` updates less that of one to `--warmup`
updates, each in a fresh run directory, so start-up (building the optimizer, opening the run) cancels out; the two
trainings alternate `--rounds` times and the median counts. Checkpoints and evaluation are pushed past the end.

    python benchmarks/trainer_throughput.py           # a table; writes benchmarks/results/trainer_throughput.json
    python benchmarks/trainer_throughput.py --quick   # tiny model, a smoke test, writes nothing
    python benchmarks/ab_compare.py --base REV --name trainer -- benchmarks/trainer_throughput.py --output {out}
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from kqv import DecoderLM, ModelConfig
from kqv.train import TrainConfig, Trainer
from kqv_lab import benchmarking as harness

RESULTS = harness.results_path("trainer_throughput")
FULL = dict(vocab_size=84, d_model=256, n_heads=8, n_layers=4, d_ff=1024, max_len=128, dropout=0.1)
QUICK = dict(vocab_size=37, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=32, dropout=0.1)


def timed_training(model_args: dict, steps: int, batch: int, context: int, precision: str) -> float:
    """Seconds for a fresh Trainer to run `steps` updates on random batches (log every 50, nothing else)."""
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(**model_args))
    vocab = model_args["vocab_size"]

    def batches(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, vocab, (batch, context + 1), generator=g)
        return ids[:, :-1], ids[:, 1:]

    config = TrainConfig(
        steps=steps,
        batch_size=batch,
        lr=1e-3,
        warmup_steps=10,
        log_every=50,
        eval_every=10**9,
        checkpoint_every=10**9,
        precision=precision,
        device="cpu",
    )
    with tempfile.TemporaryDirectory(prefix="kqv-trainer-bench-") as scratch:
        started = time.perf_counter()
        Trainer(
            model, config, Path(scratch) / "run", train_batches=batches, loss_fn=lambda m, b: m(b[0], b[1]), quiet=True
        ).train()
        return time.perf_counter() - started


def main() -> int:
    parser = harness.arguments(
        __doc__.splitlines()[0],
        quick="tiny model, few updates: a smoke test",
        output=None,
        output_help=f"JSON path (default {RESULTS}; quick: none)",
        threads=None,
    )
    parser.add_argument("--updates", type=int, default=None, help="timed updates (default 100; quick 10)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed updates first (default 20; quick 3)")
    parser.add_argument("--rounds", type=int, default=None, help="alternations (default 3; quick 1)")
    parser.add_argument("--precision", default="fp32", help="train.precision (fp32, bf16, auto)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model_args = QUICK if args.quick else FULL
    updates = args.updates or (10 if args.quick else 100)
    warmup = args.warmup or (3 if args.quick else 20)
    rounds = args.rounds or (1 if args.quick else 3)
    batch, context = (4, 32) if args.quick else (32, 128)
    per_round = []
    for _ in range(rounds):
        short = timed_training(model_args, warmup, batch, context, args.precision)
        long = timed_training(model_args, warmup + updates, batch, context, args.precision)
        per_round.append(updates * batch * context / max(long - short, 1e-9))
    tokens_per_s = statistics.median(per_round)
    print(f"| updates | batch x context | precision | threads | tokens/s (median of {rounds}) |")
    print("| ---: | ---: | --- | ---: | ---: |")
    print(f"| {updates} | {batch} x {context} | {args.precision} | {torch.get_num_threads()} | {tokens_per_s:,.0f} |")
    output = harness.output_path(args, "trainer_throughput", quick=args.quick)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "benchmark": "trainer_throughput",
            "model": model_args,
            "updates": updates,
            "warmup": warmup,
            "batch": batch,
            "context": context,
            "precision": args.precision,
            "threads": torch.get_num_threads(),
            "tokens_per_s": tokens_per_s,
            "rounds_tokens_per_s": per_round,
            "cpu": harness.machine(),
            "torch": torch.__version__,
            "load_average_end": os.getloadavg(),
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        }
        harness.write_record(output, record)
        print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
