#!/usr/bin/env python
"""Which part of the Transformer, computed in bf16, costs the quick MT job its per-update learning?

`kqv train mt` in bf16 autocast learned less per update than in fp32 on the quick config with seed 0 (dev loss
3.82 against 3.56 after 1,000 updates, `benchmarks/results/mt_precision_per_update.json`; with seed 1 the two were
level, 3.67 and 3.65: docs/translation.md). This script runs `kqv train mt` with
one part of the model taken out of autocast, computed in fp32 forward and backward, so that a run whose loss
follows fp32's names the part whose bf16 rounding matters:

    attention-core     scores, softmax and weighted sum (kqv.nn.cores.fused_attention)
    query-key-value    the query, key and value projections of every attention (self and cross)
    attention-output   the output projection of every attention
    feed-forward       both linear layers of every feed-forward network
    output-layer       the output projection and its cross-entropy (kqv.nn.losses.linear_cross_entropy)

    python benchmarks/mt_precision_parts.py run feed-forward --config quick --threads 1 --steps 800 \\
        --set train.precision=bf16 --set train.max_minutes=0 --set train.eval_every=800 \\
        --set train.checkpoint_every=800 --out runs/parts/feed-forward
    python benchmarks/mt_precision_parts.py table runs/p_fp32 runs/p_bf16 runs/parts/*  # training loss at
        # 500-800 updates side by side; writes benchmarks/results/mt_precision_parts.json

Same seed and data for every run; one thread each so that two can run at once without touching each other's
numbers (threads do not change them either: docs/translation.md).
"""

from __future__ import annotations

import json
import sys
import tomllib
import types
from pathlib import Path

import torch
import torch.nn.functional as F

from kqv_lab import benchmarking as harness

RESULTS = harness.results_path("mt_precision_parts")
STEPS = (500, 600, 700, 800)


def fp32_linear(layer: torch.nn.Linear) -> None:
    """Make `layer` compute in fp32 under autocast, forward and backward."""

    def forward(self, x):
        with torch.autocast("cpu", enabled=False):
            return F.linear(x.float(), self.weight, self.bias)

    layer.forward = types.MethodType(forward, layer)


def linears_in_fp32(module_class: type, names: tuple[str, ...]) -> None:
    """Every `module_class` built from now on computes its linear layers `names` in fp32."""
    build = module_class.__init__

    def init(self, *args, **kwargs):
        build(self, *args, **kwargs)
        for name in names:
            fp32_linear(getattr(self, name))

    module_class.__init__ = init


def attention_core_in_fp32() -> None:
    import kqv.nn.cores as cores

    attend = cores.fused_attention

    def fp32_attention(queries, keys, values, **options):
        if queries.dtype != torch.bfloat16:
            return attend(queries, keys, values, **options)
        with torch.autocast("cpu", enabled=False):
            return attend(queries.float(), keys.float(), values.float(), **options).to(torch.bfloat16)

    cores.fused_attention = fp32_attention


def output_layer_in_fp32() -> None:
    import kqv.nn.losses as losses

    apply = losses._LinearCrossEntropy.apply

    def fp32_apply(hidden, weight, bias, targets, smoothing, ignore_index, dtype, grad_enabled):
        return apply(hidden, weight, bias, targets, smoothing, ignore_index, torch.float32, grad_enabled)

    losses._LinearCrossEntropy.apply = fp32_apply


def keep_in_fp32(part: str) -> None:
    from kqv import FeedForward, MultiHeadAttention

    if part == "attention-core":
        attention_core_in_fp32()
    elif part == "query-key-value":
        linears_in_fp32(MultiHeadAttention, ("to_queries", "to_keys_values"))
    elif part == "attention-output":
        linears_in_fp32(MultiHeadAttention, ("to_output",))
    elif part == "feed-forward":
        linears_in_fp32(FeedForward, ("up", "down"))
    elif part == "output-layer":
        output_layer_in_fp32()


def table(run_dirs: list[Path], output: Path) -> dict:
    """Training loss at STEPS (and the dev loss, if the run evaluated) of each run, printed and written."""
    rows = {}
    for run in run_dirs:
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        losses = {r["step"]: r["train_loss"] for r in records if "train_loss" in r}
        precision = tomllib.loads((run / "run.toml").read_text())["train"]["precision"]  # "auto": bf16 where native
        rows[run.name] = {
            "train_loss": {step: losses.get(step) for step in STEPS},
            "val_loss": next((r["val_loss"] for r in reversed(records) if "val_loss" in r), None),
            "precision": precision,
        }
    print(f"{'run':24s} {'precision':9s} " + " ".join(f"{'loss@' + str(s):>9s}" for s in STEPS))
    for name, row in rows.items():
        print(
            f"{name:24s} {row['precision']:9s} "
            + " ".join(
                f"{row['train_loss'][s]:9.3f}" if row["train_loss"][s] is not None else f"{'-':>9s}" for s in STEPS
            )
        )
    result = {
        "benchmark": "mt_precision_parts",
        "steps": list(STEPS),
        "runs": rows,
        "command": "python benchmarks/mt_precision_parts.py run PART --config quick --threads 1 --steps 800 "
        "--set train.precision=bf16 --set train.max_minutes=0 --set train.eval_every=800 "
        "--set train.checkpoint_every=800 --out runs/parts/PART (two at a time)",
    }
    harness.write_record(output, result)
    print(f"wrote {output}")
    return result


PARTS = ["attention-core", "query-key-value", "attention-output", "feed-forward", "output-layer", "none"]


def main(argv: list[str] | None = None) -> int:
    parser = harness.arguments(harness.summary(__doc__), output_flag=None)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="kqv train mt with one part in fp32; the rest are kqv's arguments")
    run.add_argument("part", choices=PARTS)
    show = commands.add_parser("table", help="training losses of finished runs, side by side")
    show.add_argument("runs", nargs="+", type=Path)
    show.add_argument("--output", type=Path, default=RESULTS)
    args, rest = parser.parse_known_args(argv)
    if args.command == "table":
        table(args.runs, args.output)
        return 0
    keep_in_fp32(args.part)
    from kqv.cli import main as kqv

    return kqv(["train", "mt", *rest])


if __name__ == "__main__":
    sys.exit(main())
