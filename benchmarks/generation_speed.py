#!/usr/bin/env python
"""Greedy decoding speed of kqv's `DecoderLM.generate` against Hugging Face `generate`, on the same weights.

The model is GPT-2-shaped (6 layers, d_model 384, 6 heads, d_ff 1536, vocabulary 8,192: 14M parameters) with
random weights; `kqv.interop.to_hf` copies the very same weights into a `transformers.GPT2LMHeadModel`
(SDPA attention, its default), so both libraries compute the same function. Each case (batch size, precision)
decodes `--new-tokens` tokens greedily after a `--prompt`-token prompt. Rounds are interleaved (kqv, HF, kqv,
...; the order alternates every round) so that whatever else the machine does hits both alike; the figure is the
median over rounds of new tokens per second (batch * new tokens / wall time), and the ratio kqv / HF is also
taken within each round ("paired"), then the median.

Precisions:
* fp32: both models as they are; kqv's tokens must equal Hugging Face's (reported as `identical`).
* bf16: both models copied once into bf16 (kqv: `kqv.nn.generation.in_dtype`, what `generate(dtype=torch.bfloat16)`
  does on every call; HF: `.to(torch.bfloat16)`), so the copy is not timed for either; reported is each
  one's agreement with the fp32 tokens (the fraction of new tokens equal to fp32 greedy's, position by position).
  Without native bf16 matmul (AVX512-BF16 or AMX) this path is slow on a CPU; it is measured anyway.
* int8: kqv's `generate(dtype=torch.qint8)` path (every `nn.Linear` quantised by torch's dynamic quantisation,
  copied once, untimed) against HF in fp32: GPT-2's projections are `Conv1D` modules, which torch's dynamic
  quantisation does not cover, so HF has no int8 counterpart here (`hf_precision` says so in the JSON).

    python benchmarks/generation_speed.py              # full run, writes benchmarks/results/generation_speed.json
    python benchmarks/generation_speed.py --threads 1,2 --precision fp32 --batches 1  # fp32 at batch 1, at 1
                                                       # and at 2 threads (each thread count in turn)
    python benchmarks/generation_speed.py --quick      # tiny model, seconds: a smoke test (writes nothing unless
                                                       # --output is given)
    python benchmarks/generation_speed.py --run runs/lm  # also: agreement of bf16 and int8 greedy tokens with
                                                         # fp32's on a trained LM (e.g. `kqv train lm --config quick`)
    python benchmarks/generation_speed.py --device cuda  # on a CUDA GPU (fp32 and bf16; int8 is CPU-only), writes
                                                         # benchmarks/results/generation_speed_cuda.json

The floor: at batch 1 an exact fp32 decoder must at least read every weight once per token. In the fp32 cases a
third runner, `floor`, does only that: a sum over each of kqv's linear layers' weights (~56 MB), once per new token,
on torch's threads, interleaved with the other two; a reduction streams memory at about the machine's read
bandwidth. `floor_over_hf` (floor tokens/s over HF's, median of per-round ratios) bounds the kqv/HF ratio any
exact decoder could reach on this machine at this load; `kqv_over_floor` (kqv tokens/s over the floor's, at most
1) says how close kqv's whole step comes to it. `weights_gb_per_s` is the floor's read rate.

Random weights give nearly flat logits, so the agreement figures above say little about a real model; `--run DIR`
adds, for a trained run, the fraction of greedy tokens each low-precision path (and fp32 through `generate`'s
general path, without `DecodeStep`) shares with fp32 (position by position, after each of `TRAINED_PROMPTS`), and
how many continuations are identical throughout.
"""

from __future__ import annotations

import copy
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from kqv.nn import Accelerator, in_dtype, model_device
from kqv_lab import benchmarking as harness

RESULTS = harness.results_path("generation_speed")


@dataclass
class Shape:
    vocab: int = 8192
    d_model: int = 384
    heads: int = 6
    layers: int = 6
    d_ff: int = 1536
    prompt: int = 16
    new_tokens: int = 256


FULL = Shape()
QUICK = Shape(vocab=97, d_model=32, heads=2, layers=2, d_ff=64, prompt=4, new_tokens=12)


def build_models(s: Shape, seed: int) -> tuple[nn.Module, nn.Module]:
    """kqv's DecoderLM and the Hugging Face GPT2LMHeadModel holding the same (random) weights, both in eval."""
    from kqv import DecoderLM
    from kqv.interop import to_hf

    torch.manual_seed(seed)
    config = harness.gpt2_shaped(s.vocab, s.d_model, s.heads, s.layers, s.d_ff, s.prompt + s.new_tokens)
    model = DecoderLM(config).eval()
    with torch.no_grad():  # GPT-2's init leaves biases and norms at 0/1: give them values so a mapping slip shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.02 * torch.randn_like(p))
    return model, to_hf(model).eval()


def kqv_generate(model: nn.Module, ids: Tensor, new: int) -> Tensor:
    return model.generate(ids, new, temperature=0)[:, ids.shape[1] :]


def hf_generate(model: nn.Module, ids: Tensor, new: int) -> Tensor:
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )
    return out[:, ids.shape[1] :]


def linear_weights(model: nn.Module) -> list[Tensor]:
    """The weight of every `nn.Linear` of the model, in the order a token meets them."""
    return [m.weight for m in model.modules() if type(m) is nn.Linear]


def weight_read_floor(model: nn.Module, new: int):
    """A runner doing only what an exact decoder cannot avoid at batch 1: reading every `nn.Linear` weight once
    per token (a sum over each, in model order), nothing else."""
    weights = linear_weights(model)

    def run() -> None:
        with torch.inference_mode():
            for _ in range(new):
                for weight in weights:
                    weight.sum()

    return run


def run_case(
    kqv: nn.Module,
    hf: nn.Module,
    ids: Tensor,
    new: int,
    precision: str,
    rounds: int,
    reference: dict[str, Tensor] | None,
) -> dict:
    """Interleaved rounds of kqv and HF generating `new` tokens for `ids`; tokens/s, ratios and token checks."""
    runners = {"kqv": lambda: kqv_generate(kqv, ids, new), "hf": lambda: hf_generate(hf, ids, new)}
    if precision == "fp32":
        runners["floor"] = weight_read_floor(kqv, new)
    outputs = {name: run() for name, run in runners.items()}  # warm-up (and the tokens to check)
    times: dict[str, list[float]] = {name: [] for name in runners}
    for r in range(rounds):
        for name in list(runners) if r % 2 == 0 else list(runners)[::-1]:
            timing = harness.timed(runners[name])
            seconds, out = timing.seconds[0], timing.result
            if name != "floor" and not torch.equal(out, outputs[name]):
                raise RuntimeError(f"{name} {precision} greedy tokens changed between rounds")
            times[name].append(seconds)
    tokens = ids.shape[0] * new
    row = {
        "batch": ids.shape[0],
        "precision": precision,
        "new_tokens": new,
        "hf_precision": "fp32" if precision == "int8" else precision,
        "kqv_tokens_per_s": tokens / statistics.median(times["kqv"]),
        "hf_tokens_per_s": tokens / statistics.median(times["hf"]),
        "kqv_over_hf_paired": statistics.median(h / k for k, h in zip(times["kqv"], times["hf"])),
        "rounds_seconds": times,
    }
    row["kqv_over_hf"] = row["kqv_tokens_per_s"] / row["hf_tokens_per_s"]
    if "floor" in times:  # the exact fp32 floor: every weight read once per token
        row["floor_tokens_per_s"] = tokens / statistics.median(times["floor"])
        weight_bytes = sum(weight.numel() * weight.element_size() for weight in linear_weights(kqv))
        row["weights_gb_per_s"] = new * weight_bytes / statistics.median(times["floor"]) / 1e9
        row["floor_over_hf"] = statistics.median(h / f for h, f in zip(times["hf"], times["floor"]))
        row["kqv_over_floor"] = statistics.median(f / k for k, f in zip(times["kqv"], times["floor"]))
    row["kqv_hf_identical"] = bool(torch.equal(outputs["kqv"], outputs["hf"]))
    row["kqv_hf_agreement"] = (outputs["kqv"] == outputs["hf"]).float().mean().item()
    if reference is not None:  # agreement of the low-precision tokens with fp32 greedy's
        row["kqv_agreement_with_fp32"] = (outputs["kqv"] == reference["kqv"]).float().mean().item()
        row["hf_agreement_with_fp32"] = (outputs["hf"] == reference["hf"]).float().mean().item()
    row["outputs"] = outputs
    return row


TRAINED_PROMPTS = [
    "ROMEO:\n",
    "To be, or not to be",
    "KING HENRY:\nOnce more unto the breach",
    "First Citizen:\n",
    "O, what a noble mind",
    "JULIET:\nWherefore art thou",
    "The quality of mercy",
    "Now is the winter",
]


def encode_known(tokenizer, prompt: str) -> list[int]:
    """The prompt's ids, leaving out characters a character-level tokenizer never saw (a small test run's)."""
    from kqv.errors import DataError

    try:
        return tokenizer.encode(prompt)
    except DataError:
        known = "".join(c for c in prompt if c.isascii() and _encodes(tokenizer, c))
        return tokenizer.encode(known)


def _encodes(tokenizer, text: str) -> bool:
    from kqv.errors import DataError

    try:
        tokenizer.encode(text)
        return True
    except DataError:
        return False


def general_path(model: nn.Module):
    """An object whose `generate` is the model's with `DecodeStep` switched off: `generate`'s general path."""
    from unittest import mock

    from kqv.nn import DecodeStep

    class GeneralPath:
        def generate(self, *args, **kwargs):
            with mock.patch.object(DecodeStep, "supports", staticmethod(lambda _: False)):
                return model.generate(*args, **kwargs)

    return GeneralPath()


def trained_agreement(run_dir: Path, new_tokens: int) -> dict:
    """Greedy continuations of TRAINED_PROMPTS by a trained LM in fp32, bf16 and int8, and in fp32 by `generate`'s
    general path (without DecodeStep, whose batch-1 products sum in another order): each other path's token
    agreement with fp32 and the number of continuations identical to fp32's."""
    from kqv.jobs import load_run

    run = load_run(run_dir)
    model = run.model.eval()
    outputs: dict[str, list[Tensor]] = {}
    for precision, lowered in (
        ("fp32", model),
        ("fp32 general path", general_path(model)),
        ("bf16", in_dtype(model, torch.bfloat16)),
        ("int8", in_dtype(model, torch.qint8)),
    ):
        outputs[precision] = []
        for prompt in TRAINED_PROMPTS:
            ids = torch.tensor([encode_known(run.tokenizer, prompt)])
            new = (
                min(new_tokens, model.config.max_len - ids.shape[1] + 1)
                if model.config.position == "learned"
                else new_tokens
            )
            outputs[precision].append(lowered.generate(ids, new, temperature=0)[0, ids.shape[1] :])
    result = {
        "run": str(run_dir),
        "prompts": len(TRAINED_PROMPTS),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    for precision in ("fp32 general path", "bf16", "int8"):
        pairs = list(zip(outputs[precision], outputs["fp32"]))
        result[precision] = {
            "agreement_with_fp32": sum(int((a == b).sum()) for a, b in pairs) / sum(b.numel() for _, b in pairs),
            "identical_continuations": sum(bool(torch.equal(a, b)) for a, b in pairs),
        }
    return result


def measure(
    models: dict,
    precisions: list[str],
    s: Shape,
    batches: list[int],
    threads: list[int | None],
    rounds: int,
    seed: int,
    device: torch.device | str = "cpu",
) -> list[dict]:
    """Every (threads, batch, precision) case in turn; each row says its thread count."""
    rows = []
    for count in threads:
        if count:
            torch.set_num_threads(count)
        for batch in batches:
            ids = torch.randint(1, s.vocab, (batch, s.prompt), generator=torch.Generator().manual_seed(seed + batch))
            ids = ids.to(device)  # the same prompts on every device
            reference = None
            for precision in precisions:
                row = {
                    "threads": torch.get_num_threads(),
                    **run_case(*models[precision], ids, s.new_tokens, precision, rounds, reference),
                }
                reference = reference or row["outputs"]
                rows.append(row)
                print(
                    f"  threads {row['threads']} batch {batch} {precision}: kqv {row['kqv_tokens_per_s']:,.1f} "
                    f"tokens/s, HF {row['hf_tokens_per_s']:,.1f} (paired ratio {row['kqv_over_hf_paired']:.2f})",
                    flush=True,
                )
    return rows


def profile_step(kqv: nn.Module, hf: nn.Module, s: Shape, top: int = 8) -> dict[str, list]:
    """Where each library's time goes at batch 1 in fp32: torch.profiler over one `generate`, the `top` operators
    by self CPU time as [name, share of the total]. Matrix-vector products are aten::addmm / aten::mm."""
    from torch.profiler import ProfilerActivity, profile

    ids = torch.randint(1, s.vocab, (1, s.prompt), generator=torch.Generator().manual_seed(1))
    ids = ids.to(model_device(kqv))
    shares = {}
    for name, run in (
        ("kqv", lambda: kqv_generate(kqv, ids, s.new_tokens)),
        ("hf", lambda: hf_generate(hf, ids, s.new_tokens)),
    ):
        run()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events)
        shares[name] = [[e.key, e.self_cpu_time_total / total] for e in events[:top]]
        print(
            f"\n{name} profile (batch 1, fp32, share of self CPU time): "
            + ", ".join(f"{key} {share:.1%}" for key, share in shares[name])
        )
    return shares


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'thr':>3s} {'batch':>5s} {'prec':5s} {'kqv tok/s':>10s} {'HF tok/s':>10s} {'kqv/HF':>7s} "
        f"{'paired':>7s} "
        f"{'floor tok/s':>11s} {'GB/s':>5s} {'floor/HF':>8s} {'kqv/floor':>9s} {'tokens':>22s}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for row in rows:
        if row["precision"] == "fp32":
            check = "identical" if row["kqv_hf_identical"] else f"DIFFER ({row['kqv_hf_agreement']:.1%} agree)"
        elif row["hf_precision"] == "fp32":
            check = f"vs fp32 {row['kqv_agreement_with_fp32']:.1%} (HF in fp32)"
        else:
            check = f"vs fp32 {row['kqv_agreement_with_fp32']:.1%} / HF {row['hf_agreement_with_fp32']:.1%}"
        print(
            f"{row['threads']:3d} {row['batch']:5d} {row['precision']:5s} {row['kqv_tokens_per_s']:10,.1f} "
            f"{row['hf_tokens_per_s']:10,.1f} {row['kqv_over_hf']:7.2f} {row['kqv_over_hf_paired']:7.2f} "
            + (
                f"{row['floor_tokens_per_s']:11,.1f} {row['weights_gb_per_s']:5.1f} {row['floor_over_hf']:8.2f} "
                f"{row['kqv_over_floor']:9.2f} "
                if "floor_over_hf" in row
                else f"{'':11s} {'':5s} {'':8s} {'':9s} "
            )
            + f"{check:>22s}"
        )


def device_name(device: torch.device) -> str:
    """The accelerator in words: its name for a CUDA GPU."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": version("transformers")}


def main(argv: list[str] | None = None) -> int:
    parser = harness.arguments(
        harness.summary(__doc__),
        output_help=f"JSON path (default {RESULTS}; --quick writes nothing unless given)",
        quick="tiny model, few tokens: a smoke test",
        seed=True,
    )
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per case (default 5; quick 2)")
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes (default 1,8)")
    parser.add_argument(
        "--precision", choices=["fp32", "all"], default="all", help="fp32 only, or fp32, bf16 and int8 (default)"
    )
    parser.add_argument("--new-tokens", type=int, default=None, help="new tokens per sequence (default 256)")
    parser.add_argument(
        "--threads",
        default=None,
        help="comma-separated torch thread counts, each measured in turn, e.g. 1,2 (default: torch's own choice)",
    )
    parser.add_argument(
        "--run",
        type=Path,
        default=None,
        help="a trained LM run directory: also report bf16/int8 token agreement with fp32 on it",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also profile one batch-1 fp32 generate of each library (top operators)"
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu (default), cuda, cuda:N or mps: where both libraries decode (int8 is CPU-only: skipped elsewhere)",
    )
    args = parser.parse_args(argv)

    s = QUICK if args.quick else FULL
    if args.new_tokens is not None:
        s.new_tokens = args.new_tokens
    rounds = args.rounds or (2 if args.quick else 5)
    threads = [int(t) for t in args.threads.split(",")] if args.threads else [None]
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()

    device = Accelerator.resolve(args.device).device
    kqv, hf = (model.to(device) for model in build_models(s, args.seed))
    precisions = ["fp32", "bf16", "int8"] if args.precision == "all" else ["fp32"]
    if device.type != "cpu":
        precisions = [p for p in precisions if p != "int8"]  # torch's dynamic quantisation runs on the CPU only
    models = {
        "fp32": (kqv, hf),
        "bf16": (in_dtype(kqv, torch.bfloat16), copy.deepcopy(hf).to(torch.bfloat16)),
        **({"int8": (in_dtype(kqv, torch.qint8), hf)} if "int8" in precisions else {}),
    }
    load_start = os.getloadavg()
    print(
        f"shape {asdict(s)}; {rounds} interleaved rounds per case; threads "
        f"{args.threads or torch.get_num_threads()}; "
        f"load average {load_start[0]:.2f}; torch {torch.__version__}"
        + (f"; device {device_name(device)}" if device.type != "cpu" else ""),
        flush=True,
    )
    batches = [int(b) for b in args.batches.split(",")]
    rows = measure(models, precisions, s, batches, threads, rounds, args.seed, device)
    for row in rows:
        del row["outputs"]
    print_table(rows)
    profiles = profile_step(kqv, hf, s) if args.profile else None
    trained = None
    if args.run is not None:
        trained = trained_agreement(args.run, s.new_tokens)
        print(
            f"\ntrained LM {args.run} ({trained['parameters']:,} parameters), greedy tokens after "
            f"{trained['prompts']} prompts: "
            + "; ".join(
                f"{p} agrees with fp32 on {trained[p]['agreement_with_fp32']:.1%} "
                f"({trained[p]['identical_continuations']}/{trained['prompts']} continuations identical)"
                for p in ("fp32 general path", "bf16", "int8")
            )
        )

    default = RESULTS if device.type == "cpu" else RESULTS.with_name(f"generation_speed_{device.type}.json")
    output = args.output if args.output is not None else (None if args.quick else default)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        result = {
            "benchmark": "generation_speed",
            "shape": asdict(s),
            "rounds": rounds,
            "threads": sorted({row["threads"] for row in rows}),
            "parameters": sum(p.numel() for p in kqv.parameters()),
            "hf_attn_implementation": hf.config._attn_implementation,
            "bf16_native": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
            "load_average_start": load_start,
            "load_average_end": os.getloadavg(),
            "quick": args.quick,
            "versions": versions(),
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "rows": rows,
            "trained": trained,
            "profile": profiles,
            **({"device": device_name(device)} if device.type != "cpu" else {}),
        }
        harness.write_record(output, result)
        print(f"wrote {output}")
    failed = [r for r in rows if r["precision"] == "fp32" and not r["kqv_hf_identical"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
