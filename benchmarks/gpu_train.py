#!/usr/bin/env python
"""Training throughput on one CUDA GPU at GPT-2 small: kqv against nanoGPT's model, Hugging Face GPT-2 and
x-transformers, with and without torch.compile, in tokens/s and model FLOPs utilisation (MFU).

The four models are GPT-2 small (124M parameters: 12 layers, d_model 768, 12 heads, d_ff 3072, vocabulary 50257,
context 1024, tied embeddings, pre-LN, learned positions, tanh GELU), built with random weights:

* kqv     `DecoderLM(harness.gpt2_shaped(...))`: kqv's own config of GPT-2, the one `kqv.interop` (the mapping that
          converts GPT-2 checkpoints) reads from a `GPT2Config` of the shape (tests/test_benchmarks.py)
* nanogpt nanoGPT's model (`benchmarks/references/nanogpt.py`, its architecture rebuilt: fused QKV, SDPA, exact GELU,
          `F.cross_entropy` over every logit), the reference kqv's step is counted against in
          tests/test_losses_devices.py; it needs nothing but torch
* hf      `transformers.GPT2LMHeadModel(GPT2Config(...))`, `attn_implementation="sdpa"`
* xtrans  `x_transformers.TransformerWrapper(..., attn_layers=Decoder(..., attn_flash=True))` at the same shape
          (the builders of `train_throughput.py`, the CPU benchmark)

Each (model, compiled or not) pair gets its own model and fused AdamW (lr 3e-4), is warmed up (which also compiles),
then the pairs run round-robin, `--steps` timed steps each per round for `--rounds` rounds, the order rotated every
round. A step is zero_grad + forward + loss + backward + optimizer step under `torch.autocast("cuda", bf16)` with
fp32 weights and optimizer; the GPU is synchronised around every timed stretch. The figure is the median over
rounds of tokens/s (batch x context / step time).

MFU = tokens/s x training FLOPs per token / peak FLOP/s, where FLOPs per token = 6N + 12 L d T (Chowdhery et al.
2022, appendix B: 6N for the matmuls of N parameters forward and backward, the tied output layer included, plus the
attention scores and weighted sums, counted for the full square), against two peaks: the one measured in the same
run (the best of several large square bf16 matmuls, `--peak-size`, default 8192, before and after the rounds),
and the bf16 dense peak of the GPU's specification sheet (`mfu_spec`: 989 TFLOP/s for an H100 SXM, not the
1,979 of 2:4 sparsity), which nanoGPT's and the papers' MFU divide by; a measured peak is often 650-800 TFLOP/s
on an H100, so MFU by it reads 1.25-1.5x higher. The models default to kqv, nanoGPT's and the peers whose packages
are installed (transformers, x-transformers); kqv's and nanoGPT's need neither. `--dry-run` says what would run and
imports it.

Beside the timed steps, a Trainer-driven row: `kqv train lm --config gpt2` itself (its data, DDP-free
Trainer, compile "auto", ~0.5M-token updates by gradient accumulation) for `--trainer-updates` updates (default
10; 0 leaves it out) on `--trainer-data` (default: this repository's own text, `repository_text`: its docs,
sources, tests and benchmark records, 5.5 MB, enough for GPT-2's 50,257-token BPE, so the row needs no network;
Shakespeare, kqv's default corpus, is downloaded), in a subprocess. Its tokens/s are the median of its
metrics.jsonl after the first update (which compiles); its MFU is the Trainer's own `mfu` field where
metrics.jsonl has one, else tokens/s x (6N + 12 L d T) over the specification peak, N the run's parameters.

And a row of the quick model (`configs/lm-quick.toml`'s [model] and [train], random tokens of a 128-symbol
vocabulary) at `--quick-batch` rows (default 128): the updates/s of kqv's Trainer (its update, schedule,
clipping, non-finite guard and logging; compiled on CUDA as "auto" compiles) against a plain PyTorch loop on the
same model (AdamW, bf16 autocast, clipping, compiled alike), `ratio` = Trainer / plain (`quick_row`).

Every row is its own: a row that fails (a compile error, out of memory, a Trainer that exits) is written with its
`error`, the others still run, and the JSON is rewritten after every row; the exit status is then 1. `--env-json`
and `--tests-xml` put `kqv env --json` and the JUnit summary of the CUDA tests into the same JSON (gpu.sh does).

It refuses to run without CUDA. `--tiny` runs everything at a tiny size on the CPU in fp32 (the peak in fp32, and
torch.compile with the "eager" backend, which traces the models as compile does without generating kernels): a
smoke test of the script, not a measurement.

    python benchmarks/gpu_train.py                  # on a CUDA GPU: writes benchmarks/results/gpu_train.json
    python benchmarks/gpu_train.py --tiny --output /tmp/gpu_train.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from kqv_lab import benchmarking as harness
from train_throughput import Shape, build_hf, build_xtrans, count_parameters, training_flops_per_token, versions

RESULTS = harness.results_path("gpu_train")
SRC = str(harness.ROOT / "src")  # the Trainer row's kqv: this checkout's
# the repository's own text, the Trainer row's default corpus: (folder, pattern), in this order; the notebook and
# the benchmark records (numbers, machine names) take the BPE to GPT-2's 50,257 tokens, which prose and code alone
# (3.7 MB) do not
REPOSITORY_TEXT = [
    (".", "*.md"), ("docs", "*.md"), ("docs", "*.ipynb"), ("src", "**/*.py"), ("tests", "*.py"),
    ("benchmarks", "*.py"), ("benchmarks/results", "*.json"),
]  # fmt: skip
QUICK_CONFIG = harness.ROOT / "src" / "kqv" / "configs" / "lm-quick.toml"
QUICK_VOCAB = 128  # the quick row's random tokens: about a character vocabulary's size
GPT2_SMALL = Shape(vocab=50257, d_model=768, heads=12, layers=12, d_ff=3072, context=1024, batch=8)
TINY = Shape(vocab=256, d_model=32, heads=2, layers=2, d_ff=128, context=32, batch=2)  # d_ff 4 d_model, as nanoGPT


def build_kqv(s: Shape, args: argparse.Namespace):
    """kqv's DecoderLM with GPT-2's config at the shape (`harness.gpt2_shaped`, the config `kqv.interop` reads from a
    `GPT2Config`: tests/test_benchmarks.py; kqv's own model needs no transformers)."""
    from kqv import DecoderLM

    config = harness.gpt2_shaped(s.vocab, s.d_model, s.heads, s.layers, s.d_ff, s.context)
    return DecoderLM(config), lambda model, ids, targets: model(ids, targets)


def build_nanogpt(s: Shape, args: argparse.Namespace):
    """nanoGPT's model at the shape (its MLP is 4 d_model wide, as GPT-2's d_ff), its own loss."""
    from references.nanogpt import NanoGPT, NanoGPTConfig

    config = NanoGPTConfig(block_size=s.context, vocab_size=s.vocab, n_layer=s.layers, n_head=s.heads, n_embd=s.d_model)
    return NanoGPT(config), lambda model, ids, targets: model(ids, targets)[1]


BUILDERS = {"kqv": build_kqv, "nanogpt": build_nanogpt, "hf": build_hf, "xtrans": build_xtrans}
# the package each model is built with
NEEDS = {"kqv": "kqv", "nanogpt": "references.nanogpt", "hf": "transformers", "xtrans": "x_transformers"}
# Dense bf16 tensor-core peaks of the specification sheets (no 2:4 sparsity: H100 SXM's 1,979 TFLOPS is sparse),
# by a name torch.cuda.get_device_name() contains; the first that matches
SPEC_PEAKS = [("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12), ("A100", 312e12)]


def spec_peak(device: str) -> float | None:
    """The bf16 dense peak FLOP/s of `device`'s specification sheet, if kqv knows its name."""
    return next((peak for name, peak in SPEC_PEAKS if name in device), None)


def installed(name: str) -> bool:
    return importlib.util.find_spec(NEEDS[name]) is not None


class Run:
    """One (model, compiled or not) pair: its model, optimizer, step time per round and losses."""

    def __init__(self, name: str, compiled: bool, s: Shape, args: argparse.Namespace, batches: list):
        self.name, self.compiled, self.batches, self.device = name, compiled, batches, args.device
        torch.manual_seed(args.seed)
        model, self.loss_fn = BUILDERS[name](s, args)
        self.model = model.to(args.device).train()
        self.params = count_parameters(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, fused=True)
        if compiled:
            self.model = torch.compile(self.model, backend=args.compile_backend)
        self.tokens_per_step = s.batch * s.context
        self.steps, self.losses, self.tokens_per_s = 0, [], []

    @property
    def label(self) -> str:
        return label(self.name, self.compiled)

    def autocast(self):
        if self.device == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()  # --tiny: fp32 on the CPU

    def step(self) -> Tensor:
        ids, targets = self.batches[self.steps % len(self.batches)]
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss = self.loss_fn(self.model, ids, targets)
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        return loss.detach()

    def timed(self, steps: int) -> float:
        """Tokens/s over `steps` steps after one untimed step, the GPU synchronised before and after."""
        losses: list[Tensor] = []
        timing = harness.timed(lambda: losses.append(self.step()), warmup=1, inner=steps)
        self.losses += [loss.item() for loss in losses[1:]]  # the untimed step's loss left out
        self.tokens_per_s.append(self.tokens_per_step / timing.seconds[0])
        return self.tokens_per_s[-1]


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def make_batches(s: Shape, device: str, seed: int, n: int = 4) -> list[tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(seed)
    tokens = [torch.randint(0, s.vocab, (s.batch, s.context + 1), generator=g) for _ in range(n)]
    return [(t[:, :-1].contiguous().to(device), t[:, 1:].contiguous().to(device)) for t in tokens]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.arguments(
        harness.summary(__doc__), output=None, output_help=f"JSON (default {RESULTS}; --tiny: only if given)", seed=True
    )
    parser.add_argument("--tiny", action="store_true", help="a tiny size on the CPU in fp32: a smoke test")
    parser.add_argument(
        "--models",
        default=None,
        help="comma-separated subset of kqv,nanogpt,hf,xtrans (default: kqv, nanogpt and the installed peers)",
    )
    parser.add_argument("--compile", choices=["both", "no", "yes"], default="both", help="torch.compile or not")
    parser.add_argument("--batch", type=int, default=None, help="rows per step (default 8; 1024 tokens each)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per model per round (default 10)")
    parser.add_argument("--rounds", type=int, default=None, help="round-robin rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per model first, compiling (3)")
    parser.add_argument("--peak-size", type=int, default=None, help="side of the peak's square matmuls (8192)")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--dry-run", action="store_true", help="say what would run and check its imports; no run")
    parser.add_argument(
        "--trainer-updates",
        type=int,
        default=None,
        help="updates of the `kqv train lm --config gpt2` row (10; 0: none)",
    )
    parser.add_argument(
        "--trainer-data", default=None, help="the text the Trainer row trains on (default: the repository's own text)"
    )
    parser.add_argument("--trainer-timeout", type=float, default=300, help="seconds before the Trainer row fails")
    parser.add_argument("--quick-updates", type=int, default=None, help="timed updates of the quick row (50; 0: none)")
    parser.add_argument("--quick-batch", type=int, default=None, help="rows per update of the quick row (128)")
    parser.add_argument("--env-json", type=Path, default=None, help="`kqv env --json`'s output, kept in the JSON")
    parser.add_argument("--tests-xml", type=Path, default=None, help="the CUDA tests' JUnit XML, summed up in the JSON")
    args = parser.parse_args(argv)
    asked = args.models or ",".join(name for name in BUILDERS if installed(name))
    args.names = [n.strip() for n in asked.split(",") if n.strip()]
    if sorted(set(args.names) - set(BUILDERS)):
        parser.error(f"unknown model(s) {sorted(set(args.names) - set(BUILDERS))}; choose from {sorted(BUILDERS)}")
    missing = [f"{name} needs {NEEDS[name]}" for name in args.names if not installed(name)]
    if missing:
        parser.error(f"not installed: {'; '.join(missing)} (pip install it, or leave the model out of --models)")
    args.skipped = [name for name in BUILDERS if name not in args.names]
    args.device = "cpu" if args.tiny else "cuda"
    args.trainer_updates = args.trainer_updates if args.trainer_updates is not None else (2 if args.tiny else 10)
    args.quick_updates = args.quick_updates if args.quick_updates is not None else (4 if args.tiny else 50)
    args.quick_batch = args.quick_batch or (4 if args.tiny else 128)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)
    args.compile_backend = "eager" if args.tiny else "inductor"
    args.hf_attn, args.hf_act, args.xt_flash = "sdpa", "gelu_pytorch_tanh", True  # train_throughput's builders
    return args


def measure(args: argparse.Namespace, s: Shape) -> tuple[list[Run | Failed], float]:
    """Build, warm up and time every pair round-robin; returns the runs (a pair that failed as `Failed`, the
    others timed on) and the best matmul peak."""
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    peak_size = args.peak_size or (128 if args.tiny else 8192)
    peak = harness.matmul_peak(dtype, peak_size, repeats=10, device=args.device)
    batches = make_batches(s, args.device, args.seed)
    compiles = {"both": [False, True], "no": [False], "yes": [True]}[args.compile]
    runs: list[Run | Failed] = []
    for compiled in compiles:
        for name in args.names:
            run, error = attempt(label(name, compiled), Run, name, compiled, s, args, batches)
            runs.append(Failed(name, compiled, error) if error else run)
    for i, run in enumerate(runs):
        if isinstance(run, Failed):
            continue
        started = time.perf_counter()
        _, error = attempt(run.label, warm_up, run, args)
        if error:
            runs[i] = Failed(run.name, run.compiled, error)
            continue
        print(f"  {run.label:16s} {run.params:,} parameters, warm-up {time.perf_counter() - started:.1f} s", flush=True)
    rounds, steps = args.rounds or (1 if args.tiny else 5), args.steps or (2 if args.tiny else 10)
    for r in range(rounds):
        working = [i for i, run in enumerate(runs) if not isinstance(run, Failed)]
        order = working[r % len(working) :] + working[: r % len(working)] if working else []
        line = []
        for i in order:
            tokens_per_s, error = attempt(runs[i].label, runs[i].timed, steps)
            if error:
                runs[i] = Failed(runs[i].name, runs[i].compiled, error)
            else:
                line.append(f"{runs[i].label} {tokens_per_s:,.0f}")
        print(f"  round {r + 1}/{rounds} tokens/s: " + ", ".join(line), flush=True)
    return runs, max(peak, harness.matmul_peak(dtype, peak_size, repeats=10, device=args.device))


def label(name: str, compiled: bool) -> str:
    return f"{name}{' compiled' if compiled else ''}"


def warm_up(run: Run, args: argparse.Namespace) -> None:
    """The untimed steps of `run` (the first compiles)."""
    for _ in range(args.warmup):
        run.step()
    synchronize(args.device)


class Failed:
    """A (model, compiled or not) pair that failed: its row says why, and the others go on."""

    def __init__(self, name: str, compiled: bool, error: str):
        self.name, self.compiled, self.error = name, compiled, error

    @property
    def label(self) -> str:
        return label(self.name, self.compiled)


def attempt(what: str, work: Callable[..., Any], *arguments: Any) -> tuple[Any, str | None]:
    """(`work(*arguments)`, None), or, where it raises, (None, the error as a line: type and message), said with
    its traceback on stderr: one row fails, not the script. A GPU's memory is freed for the next row."""
    try:
        return work(*arguments), None
    except Exception as error:  # noqa: BLE001 -- any failure of one row is that row's result
        traceback.print_exc()
        print(f"  {what}: failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None, f"{type(error).__name__}: {error}"[:2000]


def report(args: argparse.Namespace, s: Shape, runs: list[Run], peak: float) -> dict:
    """The table (printed) and the JSON record: MFU against the peak measured here, and against the bf16 dense
    peak of the device's specification sheet (`SPEC_PEAKS`), which nanoGPT's and the papers' MFU use."""
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    spec = spec_peak(device) if args.device == "cuda" else None
    rows = []
    for run in runs:
        if isinstance(run, Failed):
            rows.append({"model": run.name, "compiled": run.compiled, "error": run.error})
            continue
        tokens_per_s = statistics.median(run.tokens_per_s)
        flops = training_flops_per_token(run.params, s)
        rows.append(
            {
                "model": run.name,
                "compiled": run.compiled,
                "parameters": run.params,
                "tokens_per_s": tokens_per_s,
                "rounds_tokens_per_s": run.tokens_per_s,
                "flops_per_token": flops,
                "mfu": tokens_per_s * flops / peak,
                "mfu_spec": tokens_per_s * flops / spec if spec else None,
                "first_loss": run.losses[0],
                "last_loss": run.losses[-1],
            }
        )
    print(f"\n{'model':16s} {'parameters':>12s} {'tokens/s':>12s} {'MFU':>7s} {'MFU spec':>9s}")
    for row in rows:
        name = label(row["model"], row["compiled"])
        if "error" in row:
            print(f"{name:16s} failed: {row['error'].splitlines()[0]}")
            continue
        by_spec = f"{row['mfu_spec']:>9.1%}" if spec else f"{'n/a':>9s}"
        print(f"{name:16s} {row['parameters']:>12,} {row['tokens_per_s']:>12,.0f} {row['mfu']:>7.1%} {by_spec}")
    print(
        f"peak ({'bf16' if args.device == 'cuda' else 'fp32'} matmul, measured): {peak / 1e12:,.1f} TFLOP/s on "
        f"{device}; specification (bf16 dense): {f'{spec / 1e12:,.0f} TFLOP/s' if spec else 'not known for it'}"
    )
    return {
        "benchmark": "gpu_train",
        "tiny": args.tiny,
        "device": device,
        "precision": "bf16 autocast" if args.device == "cuda" else "fp32",
        "shape": asdict(s),
        "peak_flops": peak,
        "spec_peak_flops": spec,
        "skipped_models": args.skipped,
        "compile_backend": args.compile_backend,
        "rows": rows,
        "versions": versions(),
    }


TRAINER_TINY = [  # --tiny: the gpt2 config at TINY's size on the CPU, one process, uncompiled
    "model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.d_ff=128", "model.max_len=32",
    "data.context=32", "data.vocab_size=300", "train.batch_size=2", "train.tokens_per_update=128",
    "train.device='cpu'", "train.compile=false",
]  # fmt: skip


def trainer_command(args: argparse.Namespace, out: Path) -> list[str]:
    """`kqv train lm --config gpt2` for `args.trainer_updates` updates into `out`: one evaluation and checkpoint,
    at the end, and a short sample."""
    n = args.trainer_updates
    settings = [f"train.steps={n}", f"train.eval_every={n}", f"train.checkpoint_every={n}", "train.eval_batches=2"]
    settings += ["train.log_every=1", "sample.count=1", "sample.max_new_tokens=8", *(TRAINER_TINY * args.tiny)]
    data = ["--data", str(args.trainer_data or out.parent / "repository.txt")]
    command = [sys.executable, "-m", "kqv.cli", "train", "lm", "--config", "gpt2", *data, "--out", str(out)]
    return command + [word for setting in settings for word in ("--set", setting)]


def trainer_row(args: argparse.Namespace, spec: float | None, peak: float | None) -> dict:
    """Run `trainer_command` and read its metrics.jsonl: tokens/s (the median after the first update, which
    compiles), MFU (the Trainer's `mfu` where it logs one, else from tokens/s), peak memory where logged."""
    with tempfile.TemporaryDirectory(prefix="gpu_train-trainer-") as directory:
        out = Path(directory) / "run"
        if not args.trainer_data:
            repository_text(out.parent / "repository.txt")
        command = trainer_command(args, out)
        print("  " + " ".join(command[1:]), flush=True)
        env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
        done = subprocess.run(command, env=env, stderr=subprocess.PIPE, text=True, timeout=args.trainer_timeout)
        sys.stderr.write(done.stderr)
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-5:])
            raise RuntimeError(f"kqv train lm --config gpt2 exited with status {done.returncode}: {tail}")
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        run = tomllib.loads((out / "run.toml").read_text())
    model, data, train = run["model"], run["data"], run["train"]
    steps = [r for r in records if "tokens_per_s" in r]
    timed = steps[1:] or steps
    tokens_per_s = statistics.median(r["tokens_per_s"] for r in timed)
    s = Shape(vocab=0, d_model=model["d_model"], heads=model["n_heads"], layers=model["n_layers"],
              d_ff=model["d_ff"], context=data["context"], batch=train["batch_size"])  # fmt: skip
    parameters = trainer_parameters(model)
    flops = training_flops_per_token(parameters, s)
    logged = [r["mfu"] for r in timed if r.get("mfu") is not None]
    memory = [r["peak_memory_gb"] for r in records if r.get("peak_memory_gb") is not None]
    return {
        "model": "kqv trainer",
        "compiled": train.get("compile"),
        "parameters": parameters,
        "tokens_per_s": tokens_per_s,
        "rounds_tokens_per_s": [r["tokens_per_s"] for r in timed],
        "flops_per_token": flops,
        "mfu": tokens_per_s * flops / peak if peak else None,
        "mfu_spec": statistics.median(logged) if logged else (tokens_per_s * flops / spec if spec else None),
        "mfu_from": "metrics.jsonl" if logged else "tokens/s",
        "peak_memory_gb": max(memory) if memory else None,
        "updates": len(steps),
        "tokens_per_update": train["batch_size"] * train["grad_accum"] * data["context"],
        "first_loss": steps[0]["train_loss"],
        "last_loss": steps[-1]["train_loss"],
        "command": "kqv " + " ".join(command[3:]).replace(str(out.parent), "TMP"),
        "data": str(args.trainer_data) if args.trainer_data else "the repository's own text (repository_text)",
    }


def repository_text(path: Path) -> Path:
    """This repository's own text, written to `path`: its Markdown, notebook, sources, tests and benchmark records
    (`REPOSITORY_TEXT`, each file in name order), about 5.5 MB, what ships with every checkout: a corpus that needs
    no network, enough for a BPE of GPT-2's 50,257 tokens."""
    files = repository_files()
    if not files:
        raise FileNotFoundError(f"no text under {harness.ROOT} ({REPOSITORY_TEXT}): pass --trainer-data")
    path.write_text("\n\n".join(file.read_text(encoding="utf-8", errors="replace") for file in files))
    return path


def repository_files() -> list[Path]:
    return [file for folder, pattern in REPOSITORY_TEXT for file in sorted((harness.ROOT / folder).glob(pattern))]


def trainer_parameters(model: dict) -> int:
    """The parameters of the Trainer row's model (run.toml's [model], its vocabulary the tokenizer's), counted
    on the meta device."""
    from kqv import DecoderLM, ModelConfig

    with torch.device("meta"):
        built = DecoderLM(ModelConfig.from_dict(model))
    return count_parameters(built)


def quick_row(args: argparse.Namespace) -> dict:
    """The quick model at `args.quick_batch` rows: updates/s of kqv's Trainer and of a plain PyTorch loop on the
    same model, batches and optimizer settings, both compiled where "auto" compiles (CUDA), and their ratio."""
    model_config, train = quick_model(args)
    compiled = args.device == "cuda"
    trainer = trainer_updates_per_s(args, model_config, train, compiled)
    plain = plain_updates_per_s(args, model_config, train, compiled)
    print(f"quick model, batch {args.quick_batch}: Trainer {trainer:.2f} updates/s, plain loop {plain:.2f}", flush=True)
    return {
        "model": "quick: kqv trainer / plain loop",
        "compiled": compiled,
        "parameters": count_parameters(build_quick(model_config)),
        "batch": args.quick_batch,
        "context": model_config.max_len,
        "timed_updates": args.quick_updates,
        "trainer_updates_per_s": trainer,
        "plain_updates_per_s": plain,
        "ratio": trainer / plain,
    }


def quick_model(args: argparse.Namespace):
    """configs/lm-quick.toml's model (at --tiny's size with --tiny) over `QUICK_VOCAB` symbols, and its [train]."""
    from kqv import ModelConfig

    config = tomllib.loads(QUICK_CONFIG.read_text())
    model = {**config["model"], "vocab_size": QUICK_VOCAB, "max_len": config["data"]["context"]}
    if args.tiny:
        model.update(d_model=TINY.d_model, n_heads=TINY.heads, n_layers=TINY.layers, d_ff=TINY.d_ff, max_len=32)
    return ModelConfig.from_dict(model), config["train"]


def build_quick(model_config):
    from kqv import DecoderLM

    torch.manual_seed(0)
    return DecoderLM(model_config)


def quick_batches(args: argparse.Namespace, context: int, n: int = 8) -> list[tuple[Tensor, Tensor]]:
    """`n` batches of random tokens on the host, as a job makes them (each update copies one to the device)."""
    g = torch.Generator().manual_seed(args.seed)
    tokens = [torch.randint(0, QUICK_VOCAB, (args.quick_batch, context + 1), generator=g) for _ in range(n)]
    return [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]


QUICK_WARMUP = 10  # updates before the timed ones, in both loops (the first compiles)


def trainer_updates_per_s(args: argparse.Namespace, model_config, train: dict, compiled: bool) -> float:
    """kqv's Trainer for QUICK_WARMUP + `quick_updates` updates, logging every QUICK_WARMUP (its one read of the
    device per log line); updates/s from metrics.jsonl's `elapsed_s` between the first log line and the last."""
    from kqv.train import TrainConfig, Trainer

    batches = quick_batches(args, model_config.max_len)
    steps = QUICK_WARMUP + args.quick_updates
    keys = ("lr", "min_lr_ratio", "warmup_steps", "weight_decay", "grad_clip")
    config = TrainConfig(
        steps=steps, batch_size=args.quick_batch, log_every=QUICK_WARMUP, eval_every=10**9, checkpoint_every=10**9,
        precision="auto" if args.device == "cuda" else "fp32", device=args.device, compile=compiled,
        **{key: train[key] for key in keys},
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpu_train-quick-") as directory:
        run = Trainer(
            build_quick(model_config), config, Path(directory) / "run",
            train_batches=lambda i: batches[i % len(batches)], loss_fn=lambda model, batch: model(*batch), quiet=True,
        )  # fmt: skip
        run.train()
        records = [json.loads(line) for line in run.run.metrics_file.read_text().splitlines() if line.strip()]
    logged = [r for r in records if "elapsed_s" in r and "train_loss" in r]
    first, last = logged[0], logged[-1]
    return (last["step"] - first["step"]) / (last["elapsed_s"] - first["elapsed_s"])


def plain_updates_per_s(args: argparse.Namespace, model_config, train: dict, compiled: bool) -> float:
    """A plain PyTorch loop on the same model and batches: AdamW (fused on CUDA) at the quick config's rate and
    weight decay, bf16 autocast on CUDA, gradient clipping, the batch copied to the device each update;
    QUICK_WARMUP updates, then `quick_updates` timed between two synchronisations."""
    batches = quick_batches(args, model_config.max_len)
    model = build_quick(model_config).to(args.device).train()
    cuda = args.device == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=train["lr"], weight_decay=train["weight_decay"], fused=cuda)
    forward = torch.compile(model) if compiled else model

    def update(i: int) -> None:
        ids, targets = (t.to(args.device, non_blocking=True) for t in batches[i % len(batches)])
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext():
            loss = forward(ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train["grad_clip"])
        optimizer.step()

    updates = itertools.count()
    timing = harness.timed(lambda: update(next(updates)), warmup=QUICK_WARMUP, inner=args.quick_updates)
    return 1 / timing.seconds[0]


def tests_summary(path: Path) -> dict:
    """The JUnit XML of the CUDA tests summed up: counts and the failed tests' names (an XML that is missing or
    unreadable says so)."""
    if not path.exists():
        return {"error": f"{path} was not written (the tests did not run to the end)"}
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as error:
        return {"error": f"{path} is not JUnit XML: {error}"}
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    keys = ("tests", "failures", "errors", "skipped")
    counts = {key: sum(int(suite.get(key, 0)) for suite in suites) for key in keys}
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in root.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return {**counts, "failed": failed, "junit_xml": str(path)}


def dry_run(args: argparse.Namespace) -> int:
    """What a run with `args` would do, its models' packages imported to check them; nothing is measured."""
    for name in args.names:
        importlib.import_module(NEEDS[name])
    s = TINY if args.tiny else GPT2_SMALL
    compiled = {"both": "with and without torch.compile", "no": "eager", "yes": "compiled"}[args.compile]
    print(f"would train {', '.join(args.names)} ({compiled}) at {asdict(s)} on {args.device}", end="")
    print(f"; left out (not asked for, or not installed): {', '.join(args.skipped)}" if args.skipped else "")
    if args.trainer_updates:
        command = trainer_command(args, Path("TMP/run"))
        print(f"would run the Trainer row for {args.trainer_updates} updates: kqv {' '.join(command[3:])}")
        print(f"  its data: {args.trainer_data or 'the repository text, ' + str(len(repository_files())) + ' files'}")
        importlib.import_module("kqv.api")
    if args.quick_updates:
        model_config, _ = quick_model(args)
        print(
            f"would time the quick model ({model_config.d_model} wide, {model_config.n_layers} layers) at batch "
            f"{args.quick_batch}: kqv's Trainer against a plain loop, {args.quick_updates} updates each"
        )
        importlib.import_module("kqv.train")
    checked = ", ".join(NEEDS[name] for name in args.names)
    print(f"would write {harness.output_path(args, 'gpu_train', quick=args.tiny)}; imported: torch, {checked}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.dry_run:
        return dry_run(args)
    if not args.tiny and not torch.cuda.is_available():
        print(
            "gpu_train.py measures training on a CUDA GPU, and torch sees none here (torch.cuda.is_available() is "
            f"False; torch {torch.__version__}). Run it on a machine with an NVIDIA GPU and a CUDA build of torch, "
            "or pass --tiny for a CPU smoke test of the script.",
            file=sys.stderr,
        )
        return 2
    # Dynamo's graph-break and recompilation warnings stay on: a break in kqv's step is a bug (tests/test_syncs.py)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    s = TINY if args.tiny else GPT2_SMALL
    if args.batch:
        s = Shape(**{**asdict(s), "batch": args.batch})
    print(f"shape {asdict(s)} on {args.device}; torch {torch.__version__}", flush=True)
    output = harness.output_path(args, "gpu_train", quick=args.tiny)
    measured, error = attempt("the timed steps", measure, args, s)
    if error:
        record = report(args, s, [], 0.0) | {"peak_flops": None, "rows": [{"model": "timed steps", "error": error}]}
    else:
        record = report(args, s, *measured)
    del measured  # the timed models and their optimizers: the GPU's memory is the next rows'
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    record |= embedded(args)
    save(output, record)
    rows = [("kqv trainer", args.trainer_updates, trainer_row, (args, record["spec_peak_flops"], record["peak_flops"]))]
    rows.append(("quick: kqv trainer / plain loop", args.quick_updates, quick_row, (args,)))
    for name, wanted, work, arguments in rows:
        if wanted:
            row, error = attempt(name, work, *arguments)
            record["rows"].append(row if error is None else {"model": name, "error": error})
            if error is None and name == "kqv trainer":
                mfu = f"{row['mfu_spec']:.1%} ({row['mfu_from']})" if row["mfu_spec"] is not None else "n/a"
                print(f"kqv trainer      {row['parameters']:>12,} {row['tokens_per_s']:>12,.0f} MFU spec {mfu}")
            save(output, record)
    failed = [label(row["model"], row.get("compiled", False)) for row in record["rows"] if "error" in row]
    if failed:
        print(f"failed rows (their errors are in the JSON): {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def embedded(args: argparse.Namespace) -> dict:
    """What gpu.sh's other steps wrote, kept in this JSON: `kqv env --json` and the CUDA tests' summary."""
    record = {}
    if args.env_json:
        try:
            record["env"] = json.loads(args.env_json.read_text())
        except (OSError, ValueError) as error:
            record["env"] = {"error": f"{args.env_json}: {error}"}
    if args.tests_xml:
        record["tests"] = tests_summary(args.tests_xml)
    return record


def save(output: Path | None, record: dict) -> None:
    """Write `record` to `output` (after every row, so a row that never ends leaves the others written)."""
    if output is not None:
        harness.write_record(output, record)
        print(f"wrote {output}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
