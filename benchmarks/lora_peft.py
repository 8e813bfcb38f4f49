#!/usr/bin/env python
"""kqv's own LoRA (`kqv.nn.lora`) against Hugging Face `peft`'s, on the same GPT-2: trainable parameters, tokens/s
of a training step and peak memory (issue 34: "with peft or in kqv's own modules, whichever a benchmark and the code
say is better").

One random-weight GPT-2 (`transformers.GPT2LMHeadModel` from a config, seed 0: n_layer 4, n_embd 256, 8 heads,
context 128) is adapted two ways with rank 8, alpha 16, no dropout, on attention's projections:

* **kqv**: the GPT-2 converted by `kqv.interop.from_hf`, then `add_lora` on to_queries, to_keys_values and
  to_output (kqv keeps the query projection apart from the keys' and values', so it has two adapters where GPT-2's
  fused c_attn has one);
* **peft**: `peft.get_peft_model` with `LoraConfig(target_modules=["attn.c_attn", "attn.c_proj"])` on the GPT-2
  itself (Conv1D layers, `fan_in_fan_out=True`);
* **kqv-full**, for scale: the converted GPT-2 with every weight training (no adapters).

A step is zero_grad, forward, cross-entropy, backward and AdamW over the trainable parameters (fp32) on random
token batches. Each side runs in a fresh process (peak memory is the process's: `ru_maxrss` on the CPU,
`torch.cuda.max_memory_allocated` on a GPU), the sides alternate `--rounds` times and the median counts. Before
timing, each side checks that its adapted model starts as the GPT-2 (B = 0: the logits of `transformers`).

    python benchmarks/lora_peft.py                 # a table; writes benchmarks/results/lora_peft.json
    python benchmarks/lora_peft.py --quick         # tiny model, a few steps: a smoke test, writes nothing
    python benchmarks/lora_peft.py --device cuda   # on a GPU

Needs `peft` (`pip install -e '.[bench]'`); kqv itself does not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from kqv_lab import benchmarking as harness

RESULTS = harness.results_path("lora_peft")
FULL = dict(vocab_size=512, n_positions=128, n_embd=256, n_layer=4, n_head=8)
QUICK = dict(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)
SIDES = ("kqv", "peft", "kqv-full")
RANK, ALPHA = 8, 16.0


def gpt2(model_args: dict[str, Any]) -> torch.nn.Module:
    """The random-weight GPT-2 both sides adapt (seed 0, no dropout: the same model every time)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(**model_args, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config).eval()


def adapted(side: str, model_args: dict[str, Any]) -> tuple[torch.nn.Module, Any]:
    """The model of `side` and its loss function loss(model, ids, targets)."""
    hf = gpt2(model_args)
    if side == "peft":
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=["attn.c_attn", "attn.c_proj"],
            fan_in_fan_out=True,
        )  # fmt: skip
        model = get_peft_model(hf, config)

        def loss(m, ids, targets):
            logits = m(input_ids=ids).logits
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

        return model, loss
    from kqv.interop import from_hf
    from kqv.nn import LoRAConfig, add_lora

    model = from_hf(hf)
    if side == "kqv":
        add_lora(model, LoRAConfig(RANK, ALPHA, 0.0, ("to_queries", "to_keys_values", "to_output")))
    return model, lambda m, ids, targets: m(ids, targets)


def starts_as_gpt2(model: torch.nn.Module, side: str, model_args: dict[str, Any]) -> float:
    """The largest difference between the adapted model's logits and the GPT-2's, before any update."""
    ids = torch.randint(0, model_args["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = gpt2(model_args)(input_ids=ids).logits
        logits = model(input_ids=ids).logits if side == "peft" else model(ids)
    return (logits - expected).abs().max().item()


def run_side(side: str, model_args: dict[str, Any], steps: int, warmup: int, batch: int, device: str) -> dict:
    """Time `steps` training steps of `side` after `warmup` untimed ones, in this process."""
    from kqv.nn import peak_rss_bytes

    model, loss_fn = adapted(side, model_args)
    difference = starts_as_gpt2(model, side, model_args)
    model = model.to(device).train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    context, vocab = model_args["n_positions"], model_args["vocab_size"]
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    started = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            sync(device)
            started = time.perf_counter()
        ids = torch.randint(0, vocab, (batch, context + 1), generator=torch.Generator().manual_seed(step)).to(device)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model, ids[:, :-1], ids[:, 1:]).backward()
        optimizer.step()
    sync(device)
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else peak_rss_bytes()
    return {
        "side": side,
        "trainable_parameters": sum(p.numel() for p in trainable),
        "total_parameters": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
        "tokens_per_s": steps * batch * context / seconds,
        "peak_memory_mb": peak / 1e6,
        "peak_memory_kind": "cuda max_memory_allocated" if device.startswith("cuda") else "process peak RSS",
        "start_logit_difference": difference,
    }


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def in_a_fresh_process(side: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--side", side, "--device", args.device]
    command += ["--quick"] * args.quick + ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {side} side failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: dict[str, dict]) -> str:
    lines = [
        "| side | trainable parameters | total parameters | tokens/s (median) | peak memory (MB) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for side, r in results.items():
        lines.append(
            f"| {side} | {r['trainable_parameters']:,} | {r['total_parameters']:,} | {r['tokens_per_s']:,.0f} "
            f"| {r['peak_memory_mb']:,.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = harness.arguments(
        __doc__.splitlines()[0],
        quick="tiny model, a few steps: a smoke test",
        output=None,
        output_help=f"JSON path (default {RESULTS}; quick: none)",
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps per round (default 30; quick 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 5; quick 1)")
    parser.add_argument("--rounds", type=int, default=None, help="alternations of the sides (default 3; quick 1)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--side", choices=SIDES, default=None, help=argparse.SUPPRESS)  # one side, in its process
    args = parser.parse_args()
    args.steps = args.steps or (3 if args.quick else 30)
    args.warmup = args.warmup or (1 if args.quick else 5)
    model_args = QUICK if args.quick else FULL
    batch = 2 if args.quick else 16
    if args.side is not None:
        print(json.dumps(run_side(args.side, model_args, args.steps, args.warmup, batch, args.device)))
        return 0
    rounds = args.rounds or (1 if args.quick else 3)
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for _ in range(rounds):
        for side in SIDES:
            runs[side].append(in_a_fresh_process(side, args))
    results = {
        side: {
            **found[0],
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in found),
            "peak_memory_mb": statistics.median(r["peak_memory_mb"] for r in found),
            "rounds_tokens_per_s": [r["tokens_per_s"] for r in found],
        }
        for side, found in runs.items()
    }
    for side, r in results.items():
        if r["start_logit_difference"] > 1e-4:
            raise SystemExit(
                f"the {side} side does not start as the GPT-2: logits differ by {r['start_logit_difference']}"
            )
    print(table(results))
    output = harness.output_path(args, "lora_peft", quick=args.quick)
    if output is not None:
        write(output, results, model_args, batch, rounds, args)
    return 0


def write(output: Path, results: dict, model_args: dict, batch: int, rounds: int, args: argparse.Namespace) -> None:
    import peft

    record = {
        "benchmark": "lora_peft",
        "model": model_args,
        "lora": {"rank": RANK, "alpha": ALPHA, "dropout": 0.0},
        "batch": batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": rounds,
        "device": args.device,
        "results": results,
        "peft": peft.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": harness.machine(),
        "load_average_end": os.getloadavg(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    harness.write_record(output, record)
    print(f"wrote {output}")


if __name__ == "__main__":
    sys.exit(main())
