#!/usr/bin/env python
"""Training throughput of kqv's `DecoderLM` against two peers, on the CPU, in fp32 and bf16.

The three models are GPT-2-shaped and as alike as each library allows:

* kqv     `DecoderLM(ModelConfig(position="learned", activation="gelu_tanh", norm_first=True, ...))`
* hf      `transformers.GPT2LMHeadModel(GPT2Config(...))`, random init, `attn_implementation="sdpa"`
* xtrans  `x_transformers.TransformerWrapper(..., attn_layers=Decoder(..., attn_flash=True))`, learned absolute
          positions (its default), tanh GELU, tied embeddings

All of them train on the same random token batches with AdamW (lr 3e-4; by default the fused CPU kernel, the
fastest AdamW on CPU and the one `kqv.train.optimizer` makes, the same for every model). Every (model, precision)
pair gets its own model and optimizer, built once and warmed up; then the pairs run round-robin, `--steps` timed
steps each per round, for `--rounds` rounds, with the order rotated every round, so that whatever the machine does
meanwhile hits all pairs alike. The reported figure is the median over rounds of tokens per second (batch *
context / step time), a step being zero_grad + forward + loss + backward + optimizer step. bf16 is
`torch.autocast("cpu", torch.bfloat16)` around forward and loss, with fp32 weights and optimizer, the usual
mixed-precision recipe.

Beside the ratios to peers, each figure is also given as a fraction of the machine's measured matmul peak: the same
run times a large square `torch.matmul` (`--peak-size`, default 2048) in fp32 and in bf16 before the rounds and
after them, and keeps the best (the least disturbed by other load). A model's training FLOPs per token are
6N + 12 L d T (Chowdhery et al. 2022, appendix B; Kaplan et al. 2020): 6N for the forward and backward matmuls of
N parameters (all of them: the tied token embedding is also the output layer; the position table, 0.7% of N
here, is only looked up), plus the attention scores and weighted sums, 12 per layer per d_model per context
position (counted for the full square, as the kernels compute it). Fraction of peak = tokens/s x FLOPs per
token / peak FLOP/s of the run's precision.

The loss is the model's own where it has one (kqv: `model(ids, targets)`); for the peers it is
`F.cross_entropy(logits.float(), targets)`, which is what HF's `ForCausalLMLoss` does too. Under CPU autocast
cross-entropy runs in fp32 anyway, so the `.float()` costs nothing extra there.

    python benchmarks/train_throughput.py                # full run, writes benchmarks/results/train_throughput.json
    python benchmarks/train_throughput.py --quick        # tiny shapes, seconds: a smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kqv_lab import benchmarking as harness

RESULTS = harness.results_path("train_throughput")


@dataclass
class Shape:
    vocab: int = 8192
    d_model: int = 384
    heads: int = 6
    layers: int = 6
    d_ff: int = 1536
    context: int = 256
    batch: int = 8


FULL = Shape()
QUICK = Shape(vocab=512, d_model=64, heads=2, layers=2, d_ff=256, context=32, batch=2)


# ---------------------------------------------------------------------------------------------------------------
# The three models. Each builder returns (model, loss(model, ids, targets) -> scalar).

LossFn = Callable[[nn.Module, Tensor, Tensor], Tensor]


def logits_loss(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


def build_kqv(s: Shape, args: argparse.Namespace) -> tuple[nn.Module, LossFn]:
    from kqv import DecoderLM

    config = harness.gpt2_shaped(s.vocab, s.d_model, s.heads, s.layers, s.d_ff, s.context)
    return DecoderLM(config), lambda model, ids, targets: model(ids, targets)


def build_hf(s: Shape, args: argparse.Namespace) -> tuple[nn.Module, LossFn]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=s.vocab,
        n_positions=s.context,
        n_embd=s.d_model,
        n_layer=s.layers,
        n_head=s.heads,
        n_inner=s.d_ff,
        activation_function=args.hf_act,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    config._attn_implementation = args.hf_attn
    model = GPT2LMHeadModel(config)
    if model.config._attn_implementation != args.hf_attn:
        raise RuntimeError(
            f"GPT2 ignored attn_implementation={args.hf_attn!r}, got {model.config._attn_implementation!r}"
        )
    return model, lambda model, ids, targets: logits_loss(model(input_ids=ids, use_cache=False).logits, targets)


def build_xtrans(s: Shape, args: argparse.Namespace) -> tuple[nn.Module, LossFn]:
    from x_transformers import Decoder, TransformerWrapper

    model = TransformerWrapper(
        num_tokens=s.vocab,
        max_seq_len=s.context,
        tie_embedding=True,
        use_abs_pos_emb=True,
        attn_layers=Decoder(
            dim=s.d_model,
            depth=s.layers,
            heads=s.heads,
            attn_dim_head=s.d_model // s.heads,
            ff_mult=s.d_ff / s.d_model,
            ff_custom_activation=nn.GELU(approximate="tanh"),
            attn_flash=args.xt_flash,
        ),
    )
    return model, lambda model, ids, targets: logits_loss(model(ids), targets)


BUILDERS = {"kqv": build_kqv, "hf": build_hf, "xtrans": build_xtrans}
PEERS = ("hf", "xtrans")


def count_parameters(model: nn.Module) -> int:
    """Distinct trainable parameters; tied weights counted once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())


# ---------------------------------------------------------------------------------------------------------------
# Data: a fixed pool of batches drawn from a Zipf-like unigram distribution, so that the loss has something
# learnable (the unigram frequencies) and visibly falls within a few dozen steps.


def make_batches(s: Shape, n: int, seed: int) -> list[tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ranks = torch.arange(1, s.vocab + 1, dtype=torch.float64)
    probs = (1.0 / ranks**1.1)[torch.randperm(s.vocab, generator=g)]
    batches = []
    for _ in range(n):
        tokens = torch.multinomial(probs, s.batch * (s.context + 1), replacement=True, generator=g)
        tokens = tokens.view(s.batch, s.context + 1)
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return batches


# ---------------------------------------------------------------------------------------------------------------
# Training runs


class Run:
    """One (model, precision) pair: its own model and optimizer, a step counter and the losses so far."""

    def __init__(
        self, name: str, precision: str, s: Shape, args: argparse.Namespace, batches: list[tuple[Tensor, Tensor]]
    ):
        self.name, self.precision, self.batches = name, precision, batches
        torch.manual_seed(args.seed)
        self.model, self.loss_fn = BUILDERS[name](s, args)
        self.model.train()
        self.params = count_parameters(self.model)
        opt_kwargs = (
            {"foreach": True} if args.optimizer == "foreach" else {"fused": True} if args.optimizer == "fused" else {}
        )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, **opt_kwargs)
        self.tokens_per_step = s.batch * s.context
        self.step_count = 0
        self.losses: list[float] = []
        self.round_tokens_per_s: list[float] = []
        self.round_cpu_s_per_step: list[float] = []  # process CPU time: a second, noise-resistant view

    def autocast(self):
        if self.precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(self) -> float:
        ids, targets = self.batches[self.step_count % len(self.batches)]
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss = self.loss_fn(self.model, ids, targets)
        loss.backward()
        self.optimizer.step()
        self.step_count += 1
        value = loss.item()
        self.losses.append(value)
        return value

    def timed(self, steps: int, warmup: int) -> float:
        """Tokens/s over `steps` steps after `warmup` untimed ones; the CPU seconds per step recorded too."""
        timing = harness.timed(self.step, warmup=warmup, inner=steps)
        self.round_cpu_s_per_step.append(timing.cpu_seconds[0])
        tps = self.tokens_per_step / timing.seconds[0]
        self.round_tokens_per_s.append(tps)
        return tps

    @property
    def median(self) -> float:
        return statistics.median(self.round_tokens_per_s)

    def loss_decreased(self) -> bool:
        k = max(1, min(3, len(self.losses) // 4))
        return all(math.isfinite(x) for x in self.losses) and statistics.mean(self.losses[-k:]) < statistics.mean(
            self.losses[:k]
        )


def measure_peaks(precisions: list[str], n: int, peaks: dict[str, float] | None = None) -> dict[str, float]:
    """The best matmul FLOP/s per precision so far (`peaks` from an earlier calibration, if any)."""
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    measured = {p: harness.matmul_peak(dtypes[p], n) for p in precisions}
    return {p: max(measured[p], (peaks or {}).get(p, 0.0)) for p in precisions}


def training_flops_per_token(parameters: int, s: Shape) -> float:
    """6N + 12 L d T: the forward and backward FLOPs of one token's matmuls (see the module docstring)."""
    return 6 * parameters + 12 * s.layers * s.d_model * s.context


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for module in ("transformers", "x_transformers", "kqv"):
        try:
            from importlib.metadata import version

            out[module] = version(module.replace("_", "-"))
        except Exception:  # noqa: BLE001 - reporting only
            out[module] = "?"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = harness.arguments(
        harness.summary(__doc__),
        output_help=f"JSON path (default {RESULTS}; --quick writes nothing unless given)",
        quick="tiny shapes and few steps: a smoke test",
        seed=True,
        threads=None,
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps per model per round (default 2)")
    parser.add_argument("--rounds", type=int, default=None, help="round-robin rounds (default 15)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per model before round 1 (default 3)")
    parser.add_argument("--round-warmup", type=int, default=1, help="untimed steps at the start of every round")
    parser.add_argument("--precision", choices=["fp32", "bf16", "both"], default="both")
    parser.add_argument("--models", default="kqv,hf,xtrans", help="comma-separated subset of kqv,hf,xtrans")
    parser.add_argument(
        "--optimizer",
        choices=["default", "foreach", "fused"],
        default="fused",
        help="AdamW implementation, the same for every model; fused (one kernel for all parameters) "
        "is the fastest on CPU and what kqv.train.optimizer makes",
    )
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--hf-attn", default="sdpa", help="GPT2 attn_implementation (sdpa or eager)")
    parser.add_argument(
        "--hf-act",
        default="gelu_pytorch_tanh",
        help="GPT2 activation_function: gelu_pytorch_tanh (F.gelu(approximate='tanh')) is the same "
        "function as GPT-2's gelu_new, computed by one fused kernel instead of a Python formula",
    )
    parser.add_argument(
        "--xt-flash",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="x-transformers attn_flash (F.scaled_dot_product_attention)",
    )
    parser.add_argument(
        "--peak-size",
        type=int,
        default=None,
        help="side of the square matmuls that measure the machine's peak (default 2048; quick 256)",
    )
    args = parser.parse_args(argv)

    s = QUICK if args.quick else FULL
    steps = args.steps or 2
    rounds = args.rounds or (2 if args.quick else 15)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    if args.threads:
        torch.set_num_threads(args.threads)
    precisions = ["fp32", "bf16"] if args.precision == "both" else [args.precision]
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BUILDERS))
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {sorted(BUILDERS)}")
    if precisions != ["fp32"] and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        print("warning: this CPU has no native bf16 support; bf16 numbers will be slow", file=sys.stderr)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    print(
        f"shape {asdict(s)}; {rounds} rounds x {steps} timed steps (+{args.round_warmup} untimed per round, "
        f"+{warmup} warm-up); threads {torch.get_num_threads()}; AdamW {args.optimizer}; torch {torch.__version__}",
        flush=True,
    )
    load_start = os.getloadavg()
    if load_start[0] > 0.5:
        print(
            f"note: load average {load_start[0]:.2f} before starting: other processes share the CPU, so expect "
            f"noise; the interleaving spreads it over all models alike",
            flush=True,
        )
    peak_size = args.peak_size or (256 if args.quick else 2048)
    peaks = measure_peaks(precisions, peak_size)
    batches = make_batches(s, 8, args.seed)
    runs = [Run(name, precision, s, args, batches) for precision in precisions for name in names]
    for run in runs:
        for _ in range(warmup):
            run.step()
        print(
            f"  built and warmed up {run.name:7s} {run.precision}: {run.params:,} parameters, "
            f"loss {run.losses[0]:.3f} -> {run.losses[-1]:.3f}",
            flush=True,
        )

    for r in range(rounds):
        order = runs[r % len(runs) :] + runs[: r % len(runs)]
        line = []
        for run in order:
            tps = run.timed(steps, args.round_warmup)
            line.append(f"{run.name}/{run.precision} {tps:,.0f}")
        print(f"  round {r + 1}/{rounds}: " + ", ".join(line), flush=True)

    peaks = measure_peaks(precisions, peak_size, peaks)
    print(
        "matmul peak (best of before and after the rounds, n = "
        + str(peak_size)
        + "): "
        + ", ".join(f"{p} {peaks[p] / 1e9:,.1f} GFLOP/s" for p in precisions),
        flush=True,
    )

    # -----------------------------------------------------------------------------------------------------------
    by_key = {(run.name, run.precision): run for run in runs}
    rows = []
    for precision in precisions:
        kqv = by_key.get(("kqv", precision))
        for name in names:
            run = by_key[(name, precision)]
            ratio = paired = None
            if kqv is not None and name != "kqv":
                ratio = kqv.median / run.median
                # the same ratio taken within each round, then the median: robust to slow drifts in machine load
                paired = statistics.median(a / b for a, b in zip(kqv.round_tokens_per_s, run.round_tokens_per_s))
            tps = run.round_tokens_per_s
            flops_per_token = training_flops_per_token(run.params, s)
            rows.append(
                {
                    "model": name,
                    "precision": precision,
                    "tokens_per_s": run.median,
                    "tokens_per_s_min": min(tps),
                    "tokens_per_s_max": max(tps),
                    "ms_per_step": 1000 * run.tokens_per_step / run.median,
                    "cpu_s_per_step": statistics.median(run.round_cpu_s_per_step),
                    "parameters": run.params,
                    "kqv_over_peer": ratio,
                    "kqv_over_peer_paired": paired,
                    "rounds_tokens_per_s": tps,
                    "model_flops_per_token": flops_per_token,
                    "model_flops_per_s": run.median * flops_per_token,
                    "fraction_of_matmul_peak": run.median * flops_per_token / peaks[precision],
                    "first_loss": run.losses[0],
                    "last_loss": run.losses[-1],
                    "loss_decreased": run.loss_decreased(),
                }
            )

    header = (
        f"{'model':8s} {'prec':5s} {'tokens/s':>10s} {'(min..max)':>17s} {'ms/step':>8s} {'params':>12s} "
        f"{'kqv/peer':>9s} {'paired':>7s} {'of peak':>7s}  loss first -> last"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for row in rows:
        ratio = "" if row["kqv_over_peer"] is None else f"{row['kqv_over_peer']:.3f}"
        paired = "" if row["kqv_over_peer_paired"] is None else f"{row['kqv_over_peer_paired']:.3f}"
        spread = f"({row['tokens_per_s_min']:,.0f}..{row['tokens_per_s_max']:,.0f})"
        ok = "" if row["loss_decreased"] else "  LOSS DID NOT DECREASE"
        print(
            f"{row['model']:8s} {row['precision']:5s} {row['tokens_per_s']:10,.0f} {spread:>17s} "
            f"{row['ms_per_step']:8.1f} {row['parameters']:12,d} {ratio:>9s} {paired:>7s} "
            f"{row['fraction_of_matmul_peak']:7.1%}  "
            f"{row['first_loss']:.3f} -> {row['last_loss']:.3f}{ok}"
        )

    summary = {}
    for precision in precisions:
        peers = [r for r in rows if r["precision"] == precision and r["model"] in PEERS]
        kqv = next((r for r in rows if r["precision"] == precision and r["model"] == "kqv"), None)
        if peers and kqv:
            best = max(peers, key=lambda r: r["tokens_per_s"])
            summary[precision] = {
                "fastest_peer": best["model"],
                "kqv_over_fastest_peer": kqv["tokens_per_s"] / best["tokens_per_s"],
                "kqv_over_fastest_peer_paired": best["kqv_over_peer_paired"],
            }
            print(
                f"{precision}: kqv / fastest peer ({best['model']}) = "
                f"{summary[precision]['kqv_over_fastest_peer']:.3f} (ratio of medians), "
                f"{best['kqv_over_peer_paired']:.3f} (median of per-round ratios)"
            )

    param_counts = {r["model"]: r["parameters"] for r in rows}
    spread = (max(param_counts.values()) - min(param_counts.values())) / max(param_counts.values())
    print(f"parameter counts {param_counts} (spread {100 * spread:.2f}%)")
    failed = [f"{r['model']}/{r['precision']}" for r in rows if not r["loss_decreased"]]
    if failed:
        print(f"SANITY FAILURE: loss did not decrease for {failed}", file=sys.stderr)

    output = harness.output_path(args, "train_throughput", quick=args.quick)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        result = {
            "benchmark": "train_throughput",
            "shape": asdict(s),
            "steps": steps,
            "rounds": rounds,
            "warmup": warmup,
            "round_warmup": args.round_warmup,
            "threads": torch.get_num_threads(),
            "optimizer": args.optimizer,
            "lr": args.lr,
            "hf_attn_implementation": args.hf_attn,
            "hf_activation": args.hf_act,
            "xtrans_attn_flash": args.xt_flash,
            "load_average_start": load_start,
            "load_average_end": os.getloadavg(),
            "quick": args.quick,
            "versions": versions(),
            "bf16_native": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "parameter_spread": spread,
            "matmul_peak_size": peak_size,
            "matmul_peak_flops_per_s": peaks,
            "rows": rows,
            "summary": summary,
            "losses": {f"{run.name}/{run.precision}": run.losses for run in runs},
        }
        harness.write_record(output, result)
        print(f"wrote {output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
