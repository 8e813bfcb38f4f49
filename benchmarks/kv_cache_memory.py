#!/usr/bin/env python
"""KV-cache bytes per token and greedy decoding speed of multi-head, grouped-query and multi-query attention.

One small Llama-shaped decoder (4 layers, d_model 256, 8 query heads of 32 dimensions, RoPE, RMSNorm, SwiGLU, no
biases; random weights) is built with `model.n_kv_heads` = 8 (multi-head attention), 2 (grouped-query attention,
Ainslie et al. 2023) and 1 (multi-query attention, Shazeer 2019). For each, the KV cache's size is measured from the
cache tensors themselves (`KVCache.keys` and `.values` of every layer after a prompt and a few decoded tokens:
their bytes over batch x cached tokens), beside the closed form 2 x layers x n_kv_heads x head_dim x 4 bytes
(fp32). Then `DecoderLM.generate` decodes greedily in two cases: a short prompt at batch 1 (the weights dominate
each step) and a long prompt at batch 4 (reading the cache weighs more). Rounds are interleaved over the three models
and the figure is the median over rounds of new tokens per second (batch x new tokens / wall time), on one
thread by default (`--threads`): on a machine shared with other work, torch's threads waiting for each other
would be what is measured.

    python benchmarks/kv_cache_memory.py           # writes benchmarks/results/kv_cache_memory.json (under a minute)
    python benchmarks/kv_cache_memory.py --quick   # a tiny model, seconds: a smoke test (writes nothing unless
                                                   # --output is given)
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from kqv import DecoderLM, ModelConfig
from kqv_lab import benchmarking as harness

NAME = "kv_cache_memory"


@dataclass(frozen=True)
class Shape:
    vocab: int = 512
    d_model: int = 256
    heads: int = 8
    layers: int = 4
    d_ff: int = 512
    cases: tuple[tuple[int, int, int], ...] = ((1, 16, 64), (4, 512, 32))  # (batch, prompt, new tokens)


FULL = Shape()
QUICK = Shape(vocab=37, d_model=64, heads=8, layers=2, d_ff=64, cases=((1, 4, 6), (2, 24, 4)))


def build(shape: Shape, kv_heads: int, seed: int) -> DecoderLM:
    """The decoder of `shape` with `kv_heads` key/value heads, in eval mode."""
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=shape.vocab,
        d_model=shape.d_model,
        n_heads=shape.heads,
        n_kv_heads=kv_heads,
        n_layers=shape.layers,
        d_ff=shape.d_ff,
        max_len=max(prompt + new for _, prompt, new in shape.cases),
        dropout=0.0,
        position="rope",
        norm="rmsnorm",
        activation="swiglu",
        bias=False,
    )
    return DecoderLM(config).eval()


def cache_bytes_per_token(model: DecoderLM, batch: int = 2, prompt: int = 5, steps: int = 3) -> float:
    """Bytes the self-attention caches of every layer hold per sequence and token, measured on the cache tensors
    after a prompt and `steps` decoded tokens."""
    cache = model.new_cache()
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt + steps))
    with torch.inference_mode():
        model(ids[:, :prompt], cache=cache)
        for t in range(prompt, prompt + steps):
            model(ids[:, t : t + 1], cache=cache)
    held = 0
    for self_cache, _ in cache:
        assert self_cache.length == prompt + steps
        held += sum(t.numel() * t.element_size() for t in (self_cache.keys, self_cache.values))
    return held / (batch * (prompt + steps))


def closed_form_bytes_per_token(config: ModelConfig) -> int:
    """Keys and values, every layer, n_kv_heads heads of head_dim fp32 numbers each."""
    return 2 * config.n_layers * config.kv_heads * config.head_dim * 4


def time_generation(models: dict[int, DecoderLM], case: tuple[int, int, int], rounds: int) -> dict[int, list[float]]:
    """Seconds of greedy `generate` per model, `rounds` interleaved rounds (the order alternating each round)."""
    batch, prompt, new = case
    ids = torch.randint(0, next(iter(models.values())).config.vocab_size, (batch, prompt))
    seconds: dict[int, list[float]] = {kv: [] for kv in models}
    for model in models.values():  # warm up: the first call allocates
        model.generate(ids, 2, temperature=0)
    for round_ in range(rounds):
        order = list(models) if round_ % 2 == 0 else list(models)[::-1]
        for kv in order:
            start = time.perf_counter()
            models[kv].generate(ids, new, temperature=0)
            seconds[kv].append(time.perf_counter() - start)
    return seconds


def measure(shape: Shape, rounds: int, seed: int) -> list[dict]:
    """One row per n_kv_heads: the cache's bytes per token (measured and closed form), parameters and tokens/s."""
    kv_options = sorted({shape.heads, max(1, shape.heads // 4), 1}, reverse=True)
    models = {kv: build(shape, kv, seed) for kv in kv_options}
    timings = [time_generation(models, case, rounds) for case in shape.cases]
    rows = []
    for kv, model in models.items():
        measured = cache_bytes_per_token(model)
        row = {
            "n_heads": shape.heads,
            "n_kv_heads": kv,
            "attention": "multi-head" if kv == shape.heads else "multi-query" if kv == 1 else "grouped-query",
            "cache_bytes_per_token": measured,
            "closed_form_bytes_per_token": closed_form_bytes_per_token(model.config),
            "parameters": sum(p.numel() for p in model.parameters()),
            "generation": [],
        }
        for (batch, prompt, new), seconds in zip(shape.cases, timings):
            median = statistics.median(seconds[kv])
            row["generation"].append(
                {
                    "batch": batch,
                    "prompt": prompt,
                    "new_tokens": new,
                    "cache_mb_at_end": measured * batch * (prompt + new) / 1e6,
                    "tokens_per_s": batch * new / median,
                    "rounds_seconds": seconds[kv],
                }
            )
        rows.append(row)
    multi_head = rows[0]["cache_bytes_per_token"]
    for row in rows:
        row["cache_over_multi_head"] = row["cache_bytes_per_token"] / multi_head
    return rows


def table(rows: list[dict]) -> str:
    cases = [(g["batch"], g["prompt"]) for g in rows[0]["generation"]]
    header = ["n_kv_heads", "attention", "cache bytes/token", "vs multi-head", "parameters"]
    header += [f"tok/s (batch {b}, prompt {p})" for b, p in cases]
    lines = [header]
    for row in rows:
        lines.append(
            [
                str(row["n_kv_heads"]),
                row["attention"],
                f"{row['cache_bytes_per_token']:,.0f}",
                f"{row['cache_over_multi_head']:.3f}",
                f"{row['parameters']:,}",
                *(f"{g['tokens_per_s']:,.0f}" for g in row["generation"]),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = harness.arguments(
        harness.summary(__doc__), quick="a tiny model and one round: a smoke test", output=None, seed=True, threads=1
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds per case (default 5)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    shape = QUICK if args.quick else FULL
    rows = measure(shape, 1 if args.quick else args.rounds, args.seed)
    print(table(rows), flush=True)
    path = harness.output_path(args, NAME, quick=args.quick)
    if path is not None:
        record = {
            "benchmark": NAME,
            "quick": args.quick,
            "shape": asdict(shape),
            "rounds": 1 if args.quick else args.rounds,
            "precision": "fp32",
            "rows": rows,
        }
        harness.write_record(path, record, seeds=[args.seed], started=started)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
