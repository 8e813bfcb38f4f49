#!/usr/bin/env python
"""The Transformer against the LSTM-with-attention baseline it replaced, at equal wall-clock training time.

Both models translate German -> English (the verse-aligned Bible, `kqv.data.bible`), with the same joint BPE, the
same data split and batches (the LSTM run copies the Transformer run's prepared data), the same optimizer,
schedule, label smoothing and token budget per batch: only `[model]` differs (configs/mt-quick.toml and
configs/mt-lstm.toml). To give both the same machine, they train at the same time, in two processes with one torch
thread each, so whatever else the machine runs slows both alike; each stops after `--minutes` of training time
(evaluation excluded: `train.max_minutes`). Every evaluation records dev BLEU (greedy, 200 sentences) against
training time; at the end each translates the whole test split with beam search (beam 4).

    python benchmarks/mt_compare.py --minutes 20          # about 30 minutes of wall-clock
    python benchmarks/mt_compare.py --minutes 1 --out /tmp/mt-smoke     # a smoke test

Writes OUT/{data,transformer,lstm}/ (run directories), benchmarks/results/mt_compare.json, and
benchmarks/results/mt_compare.png (dev BLEU against training minutes); prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kqv_lab import benchmarking as harness
from kqv_lab.experiments.rnn_vs_transformer import plot_curves, read_runs, side_by_side


def main() -> None:
    parser = harness.arguments(__doc__, whole=True, output_flag=None, threads=1)
    parser.add_argument("--minutes", type=float, default=20.0, help="training time of each model (default 20)")
    parser.add_argument("--pair", default="de-en")
    parser.add_argument("--out", default="runs/mt-compare", help="directory for the runs")
    parser.add_argument("--eval-every", type=int, default=40, help="evaluate every N updates (default 40)")
    parser.add_argument("--results", default=str(harness.RESULTS), help="where to write the JSON and PNG")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a config override for both models, e.g. --set data.max_tokens=1000 (repeatable)",
    )
    parser.add_argument("--name", default="mt_compare", help="file name of the JSON and PNG (default mt_compare)")
    parser.add_argument("--report-only", action="store_true", help="only re-read finished runs and report")
    args = parser.parse_args()
    out = Path(args.out)

    overrides = [
        f"data.pair={json.dumps(args.pair)}",
        f"train.max_minutes={args.minutes}",
        "train.steps=1000000",
        f"train.eval_every={args.eval_every}",
        f"train.checkpoint_every={args.eval_every}",
        *args.set,
    ]
    if not args.report_only:
        out.mkdir(parents=True, exist_ok=True)
        print(
            f"training both models for {args.minutes:g} min each, at the same time, {args.threads} thread(s) each",
            flush=True,
        )
        side_by_side(out, overrides, threads=args.threads)
    report(out, Path(args.results), args)


def report(out: Path, results: Path, args: argparse.Namespace) -> None:
    rows, curves = read_runs(out)
    table = [
        "| model | parameters | training time | updates | training tokens | training FLOPs (est.) | "
        "dev loss | test BLEU | test chrF |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind, s in rows.items():
        table.append(
            f"| {kind} | {s['parameters'] / 1e6:.1f}M | {s['train_seconds'] / 60:.1f} min | {s['steps']:,} | "
            f"{s['train_tokens'] / 1e6:.2f}M | {s['train_flops']:.2e} | {s['final_val_loss']:.3f} | "
            f"{s['test_bleu']:.2f} | {s['test_chrf']:.2f} |"
        )
    gap = rows["transformer"]["test_bleu"] - rows["lstm"]["test_bleu"]
    print("\n".join(table))
    print(
        f"\nTransformer - LSTM: {gap:+.2f} test BLEU (beam {rows['transformer']['beam_size']}, "
        f"{rows['transformer']['test_sentences']} test verses)"
    )
    results.mkdir(parents=True, exist_ok=True)
    record = {
        "minutes": args.minutes,
        "pair": args.pair,
        "threads_per_model": args.threads,
        "overrides": args.set,
        "runs": rows,
        "dev_bleu_curves": curves,
        "bleu_gap": gap,
        "table": "\n".join(table),
    }
    harness.write_record((results / f"{args.name}.json"), record)
    title = f"{args.pair} Bible: Transformer vs LSTM with attention, side by side, {args.threads} thread(s) each"
    plot_curves(curves, results / f"{args.name}.png", title)
    print(f"wrote {results / (args.name + '.json')} and {results / (args.name + '.png')}")


if __name__ == "__main__":
    main()
