#!/usr/bin/env python
"""Real tokens per second of every kind of training data against plain text, on the same model and context.

Each row is a `kqv train lm` run of the quick model (`--config quick`, 3.2M parameters) at `data.context` 160 and
batch 32 on the same invented world (`kqv_lab.worlds`: one paragraph per person, and questions about them), or with
`--data DIR` on real text, CS224N assignment 5's `wiki.txt` and its birthplace questions:

- **plain text**: the biographies as one text, cut into blocks (every token real);
- **span corruption**, with and without CS224N's random prefix (`data.random_prefix`), the loss on every token;
- **pairs**: the questions as prompt -> answer examples;
- **mixture**: the text under span corruption with a random prefix, and the questions, weighted 1:1;

each of the last three padded (`data.packing=false`) and packed (`data.packing=true`). A row's figure is the median,
over its log records after the first, of `tokens_per_s` in metrics.jsonl: the tokens the model reads that are not
padding, per second of training (updates only; `kqv.train.ahead` makes the batches ahead, and each record's
`batch_ms` and `wait_ms`, host milliseconds making a batch and waiting for one, are reported too). Rows alternate
over `--rounds`, and each row's figure is the median over rounds; the ratio is to plain text's.

    python benchmarks/example_throughput.py            # a table; writes benchmarks/results/example_throughput.json
    python benchmarks/example_throughput.py --quick    # few updates, a smoke test, writes nothing
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import kqv
from kqv_lab import benchmarking as harness
from kqv_lab import worlds

RESULTS = harness.results_path("example_throughput")
SPAN = ['data.objective="span_corruption"', 'data.span_loss="all"', "data.span_rate=0.25", "data.span_max=160"]
PREFIX = ["data.random_prefix=true"]
A5_FILES = ("wiki.txt", "birth_places_train.tsv")  # --data: the text and the questions of the birthplace task


def rows(text: Path, pairs: Path) -> dict[str, list[str]]:
    """Each row's settings (`--set` values) on the biographies `text` and the questions `pairs`."""
    mixture = f'data.sources=[{{path="{text}"}}, {{path="{pairs}"}}]'
    table = {"plain text": [f'data.path="{text}"']}
    kinds = {
        "span corruption": [f'data.path="{text}"', *SPAN],
        "span corruption, random prefix": [f'data.path="{text}"', *SPAN, *PREFIX],
        "pairs": [f'data.path="{pairs}"'],
        "mixture: span corruption, random prefix + pairs": [mixture, *SPAN, *PREFIX, "data.prompt_loss_weight=1"],
    }
    for name, settings in kinds.items():
        for packing in ("false", "true"):
            table[f"{name}, {'packed' if packing == 'true' else 'padded'}"] = [*settings, f"data.packing={packing}"]
    return table


def run_row(settings: list[str], updates: int, log_every: int, context: int, out: Path) -> dict[str, float]:
    """One training of `updates` updates; the median tokens/s, batch_ms and wait_ms of its log records but the
    first."""
    common = [
        f"data.context={context}",
        "train.budget_minutes=0",
        f"train.log_every={log_every}",
        f"train.eval_every={10**6}",
        f"train.checkpoint_every={10**6}",
        "train.eval_batches=1",
        "sample.count=1",
        "sample.max_new_tokens=8",
    ]
    kqv.train("lm", "quick", out=out, steps=updates, overrides=[*common, *settings], quiet=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "tokens_per_s" in r][1:]
    return {key: statistics.median(r[key] for r in logged) for key in ("tokens_per_s", "batch_ms", "wait_ms")}


def main() -> int:
    parser = harness.arguments(
        __doc__.splitlines()[0],
        quick="few updates and people: a smoke test, writes nothing",
        output=None,
        output_help=f"JSON path (default {RESULTS}; quick: none)",
    )
    parser.add_argument("--updates", type=int, default=None, help="updates per row (default 60; quick 6)")
    parser.add_argument("--rounds", type=int, default=None, help="alternations of the rows (default 2; quick 1)")
    parser.add_argument("--people", type=int, default=None, help="the world's people (default 3000; quick 200)")
    parser.add_argument("--context", type=int, default=160, help="data.context (default 160)")
    parser.add_argument(
        "--style", choices=["varied", "encyclopedia"], default="varied",
        help="the biographies: the world generator's default (varied wordings, 76-150 characters) or its encyclopedia",
    )  # fmt: skip
    parser.add_argument(
        "--data", type=Path, metavar="DIR",
        help="real text instead of a world: CS224N assignment 5's folder (wiki.txt, birth_places_train.tsv)",
    )  # fmt: skip
    parser.add_argument("--only", action="append", default=None, help="run only rows whose name contains this")
    args = parser.parse_args()
    if args.data is not None and not all((args.data / name).is_file() for name in A5_FILES):
        parser.error(f"--data {args.data} holds no {' and '.join(A5_FILES)}: give the assignment's folder")
    updates, rounds = args.updates or (6 if args.quick else 60), args.rounds or (1 if args.quick else 2)
    log_every = 2 if args.quick else 10
    people = args.people or (200 if args.quick else 3000)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kqv-example-throughput-") as scratch:
        work = Path(scratch)
        if args.data is not None:
            table = rows(*(args.data / name for name in A5_FILES))
        else:
            style = {"style": "encyclopedia"} if args.style == "encyclopedia" else {}
            worlds.write_world(work / "world", people, 0, **style)
            table = rows(work / "world" / "biographies.txt", work / "world" / "questions-seen.tsv")
        chosen = [name for name in table if not args.only or any(part in name for part in args.only)]
        measured: dict[str, list[dict[str, float]]] = {name: [] for name in chosen}
        for r in range(rounds):
            for name in chosen:
                out = work / f"run-{r}-{len(measured[name])}-{chosen.index(name)}"
                measured[name].append(run_row(table[name], updates, log_every, args.context, out))
                print(f"round {r + 1}: {name}: {measured[name][-1]['tokens_per_s']:,.0f} tokens/s", flush=True)
    summary = {
        name: {key: statistics.median(m[key] for m in per_round) for key in per_round[0]}
        for name, per_round in measured.items()
    }
    plain = summary.get("plain text", {}).get("tokens_per_s")
    print(f"\n| data (quick model, context {args.context}, batch 32) | real tokens/s | vs plain text | host ms/batch "
          "| waited ms/batch |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, figures in summary.items():
        figures["ratio"] = figures["tokens_per_s"] / plain if plain else None
        ratio = f"{figures['ratio']:.2f}" if figures["ratio"] is not None else "-"
        print(f"| {name} | {figures['tokens_per_s']:,.0f} | {ratio} | {figures['batch_ms']:.1f} "
              f"| {figures['wait_ms']:.1f} |")  # fmt: skip
    output = harness.output_path(args, "example_throughput", quick=args.quick)
    if output is not None:
        record = {
            "benchmark": "example_throughput",
            "model": "quick",
            "context": args.context,
            "batch": 32,
            "people": None if args.data else people,
            "style": "cs224n-a5" if args.data else args.style,
            "updates": updates,
            "rounds": rounds,
            "rows": summary,
            "per_round": measured,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "minutes": (time.perf_counter() - started) / 60,
            "command": " ".join(["python benchmarks/example_throughput.py", *sys.argv[1:]]),
        }
        harness.write_record(output, record)
        print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
