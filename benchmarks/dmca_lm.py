#!/usr/bin/env python
"""A Transformer-DMCA-style long-context result on Shakespeare (character level), after Liu et al. 2018's table
(Transformer-D L=4000: 2.22 -> DMCA L=11000: 2.05 -> DMCA + MoE-128: 1.93 test perplexity on WikiSum).

Four arms of the lm job (`kqv.jobs.lm`), the same small decoder (d_model 128, 4 layers, 4 heads, RoPE), the same
number of updates and the same tokens per update (batch x context = 2,048), fp32:

* full          full attention at context 128 (batch 16): the context it can afford;
* full+switch   the same with a Switch feed-forward (4 experts) in every other block;
* dmca          layer_pattern "local,memory_compressed" at a 4x longer context, 512 (batch 4): local blocks of
                64 tokens, keys and values compressed 3-fold;
* dmca+switch   the same with the Switch feed-forward.

Reported per arm: validation loss (nats/character) and perplexity on 200,000 held-out characters, each model
scored at its own context (the lm job's `kqv.train.perplexity.perplexity`: every token once, in non-overlapping
blocks of its context, so a token has on average half the context before it),
update throughput (tokens/s: load-dependent on a shared machine) and peak resident memory (each arm runs in its
own process). Loss after a fixed number of updates does not depend on load.

    OMP_NUM_THREADS=1 python benchmarks/dmca_lm.py                 # 4 arms x 600 updates, ~5-10 minutes an arm
    OMP_NUM_THREADS=1 python benchmarks/dmca_lm.py --steps 30     # a smoke run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from kqv_lab import benchmarking as harness

RESULTS = harness.results_path("dmca_lm")
TOKENS_PER_UPDATE = 2048
SEED_TABLE = {
    "Transformer-D, L=4000": 2.22216,
    "Transformer-DMCA, no MoE, L=11000": 2.05159,
    "Transformer-DMCA, MoE-128, L=11000": 1.92871,
    "Transformer-DMCA, MoE-256, L=7500": 1.90325,
}
ARMS = {
    "full": dict(context=128, model={}),
    "full+switch": dict(context=128, model={"ffn": "switch", "experts.count": 4, "experts.every": 2}),
    "dmca": dict(
        context=512,
        model={"layer_pattern": "local,memory_compressed", "local.block": 64, "memory_compressed.compression": 3},
    ),
    "dmca+switch": dict(
        context=512,
        model={
            "layer_pattern": "local,memory_compressed",
            "local.block": 64,
            "memory_compressed.compression": 3,
            "ffn": "switch",
            "experts.count": 4,
            "experts.every": 2,
        },
    ),
}


def overrides(arm: str, steps: int) -> list[str]:
    spec = ARMS[arm]
    model = {
        "d_model": 128,
        "n_heads": 4,
        "n_layers": 4,
        "d_ff": 512,
        "dropout": 0.0,
        "position": "rope",
        **spec["model"],
    }
    values = {f"model.{k}": v for k, v in model.items()}
    values.update(
        {
            "data.context": spec["context"],
            "train.batch_size": TOKENS_PER_UPDATE // spec["context"],
            "train.steps": steps,
            "train.budget_minutes": 0,  # exactly these steps (the quick config plans to a budget)
            "train.warmup_steps": max(1, steps // 10),
            "train.lr": 2e-3,
            "train.precision": "fp32",
            "train.eval_every": steps,
            "train.eval_batches": 4,
            "train.checkpoint_every": steps,
            "train.log_every": max(1, steps // 5),
            "sample.count": 1,
            "sample.max_new_tokens": 20,
        }
    )
    return [f"{k}={json.dumps(v)}" for k, v in values.items()]


def worker(arm: str, steps: int) -> dict:
    """Train one arm in a temporary run directory and score it; runs in its own process."""
    import torch

    from kqv.jobs import get_job
    from kqv.nn import peak_rss_bytes

    JOB = get_job("lm")

    torch.manual_seed(0)
    config = JOB.load_config(Path(str(resources.files("kqv") / "configs" / "lm-quick.toml")), overrides(arm, steps))
    with tempfile.TemporaryDirectory() as run_dir:
        summary = JOB.train(config, run_dir, quiet=True)
    val = summary["val"]
    return {
        "arm": arm,
        "context": config.data.context,
        "batch_size": config.train.batch_size,
        "steps": steps,
        "parameters": summary["parameters"],
        "val_loss": val["loss"],
        "val_perplexity": val["perplexity"],
        "val_tokens": val["tokens"],
        "train_seconds": summary["train_seconds"],
        "tokens_per_s": steps * TOKENS_PER_UPDATE / max(summary["train_seconds"], 1e-9),
        "peak_rss_mb": peak_rss_bytes() / 2**20,
    }


def print_table(results: list[dict]) -> None:
    print(f"\n{'arm':<14}{'context':>8}{'val loss':>10}{'ppl':>8}{'tok/s':>9}{'peak MB':>9}")
    for r in results:
        print(
            f"{r['arm']:<14}{r['context']:>8}{r['val_loss']:>10.4f}{r['val_perplexity']:>8.3f}"
            f"{r['tokens_per_s']:>9.0f}{r['peak_rss_mb']:>9.0f}"
        )
    print(
        "\nLiu et al. 2018 (WikiSum, test perplexity): "
        + ", ".join(f"{name} {value}" for name, value in SEED_TABLE.items())
    )


def main() -> None:
    parser = harness.arguments(harness.summary(__doc__), output=RESULTS)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps)))
        return
    results, start = [], time.perf_counter()
    for arm in args.arms:
        done = subprocess.run(
            [sys.executable, __file__, "--worker", arm, "--steps", str(args.steps)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            raise SystemExit(f"arm {arm} failed:\n{done.stderr[-3000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"{arm}: val loss {results[-1]['val_loss']:.4f} ({time.perf_counter() - start:.0f} s)", flush=True)
    print_table(results)
    report = {
        "command": "OMP_NUM_THREADS=1 python benchmarks/dmca_lm.py " + " ".join(sys.argv[1:]),
        "setup": {
            "tokens_per_update": TOKENS_PER_UPDATE,
            "precision": "fp32",
            "d_model": 128,
            "n_layers": 4,
            "corpus": "Shakespeare, character level (kqv.data.shakespeare)",
            "note": "tokens/s on a shared (loaded) machine: an upper bound on time, not a speed claim",
        },
        "seed_table": SEED_TABLE,
        "results": results,
    }
    harness.write_record(args.output, report)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
