#!/usr/bin/env python
"""A corpus bigger than memory: prepare `--gigabytes` of text into a token corpus on disk (`kqv prepare`), train a
small language model on it for `--updates` updates (`kqv train lm --data DIR`), and record the training process's
peak resident memory (it must stay under `--limit-mb`, 1,500 MB by default) and the prepare's throughput.

The text is Shakespeare's complete works (the corpus kqv trains on by default) written again and again, each copy
with its paragraphs in a new seeded order, into `--files` files: about 2 GB, more than the training process may
hold. The prepare (`kqv prepare`, its BPE of `--vocab-size` tokens trained on its default 32 MiB sample) and the
training (`kqv train lm`) each run in a child process of their own: the training's peak RSS is the one its run's
summary.json records (`getrusage` of the process itself, which starts from this small parent's, not the prepare's),
the prepare's is `getrusage(RUSAGE_CHILDREN)` read after it ends. The prepare's time includes training its BPE.

    python benchmarks/token_corpus.py                                 # 2 GB, 50 updates: the figures in the docs
    python benchmarks/token_corpus.py --gigabytes 0.01 --updates 5 --output /dev/null   # a smoke run
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kqv.data import load_text
from kqv_lab import benchmarking as harness

TRAIN = {  # a small model: what is measured is the data's memory, not the model's
    "model.d_model": 128,
    "model.n_layers": 2,
    "model.n_heads": 4,
    "model.d_ff": 512,
    "data.context": 256,
    "data.val_fraction": 0.0005,
    "train.batch_size": 16,
    "train.eval_every": 25,
    "train.eval_batches": 2,
    "train.checkpoint_every": 50,
    "train.warmup_steps": 5,
}


def write_corpus(directory: Path, total_bytes: int, files: int, seed: int = 0) -> int:
    """`files` text files of about `total_bytes` in all: copies of Shakespeare, each one's paragraphs shuffled."""
    paragraphs = load_text(None).split("\n\n")
    generator, written = random.Random(seed), 0
    directory.mkdir(parents=True, exist_ok=True)
    for index in range(files):
        with open(directory / f"part-{index:03d}.txt", "w", encoding="utf-8") as out:
            while written < total_bytes * (index + 1) // files:
                generator.shuffle(paragraphs)
                copy = "\n\n".join(paragraphs) + "\n\n"
                out.write(copy)
                written += len(copy.encode("utf-8"))
    return written


def prepare(text: Path, corpus: Path, vocab_size: int) -> tuple[float, float, dict]:
    """`kqv prepare` in a child process: its seconds, its peak RSS (MB) and the corpus's manifest."""
    command = [sys.executable, "-m", "kqv.cli", "prepare", str(text), "--out", str(corpus)]
    started = time.perf_counter()
    subprocess.run([*command, "--vocab-size", str(vocab_size)], check=True)
    seconds = time.perf_counter() - started
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: KiB; the only child so far
    return seconds, peak_kb / 1024, json.loads((corpus / "manifest.json").read_text())


def train(corpus: Path, run: Path, updates: int) -> dict:
    """`kqv train lm --data CORPUS` in a child process: its run's summary (with its peak RSS)."""
    sets = [f"{key}={value}" for key, value in TRAIN.items()]
    command = [sys.executable, "-m", "kqv.cli", "train", "lm", "--data", str(corpus), "--out", str(run)]
    command += ["--steps", str(updates), "--quiet", *(arg for s in sets for arg in ("--set", s))]
    subprocess.run(command, check=True)
    return json.loads((run / "summary.json").read_text())


def main() -> None:
    parser = harness.arguments(__doc__, whole=True, output=harness.results_path("token_corpus"))
    parser.add_argument("--gigabytes", type=float, default=2.0, help="text to generate (default 2)")
    parser.add_argument("--files", type=int, default=8, help="text files it is written into (default 8)")
    parser.add_argument("--updates", type=int, default=50)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--limit-mb", type=float, default=1500.0, help="the training process's most RSS")
    parser.add_argument("--work", help="where the text, corpus and run go (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="kqv-token-corpus-"))
    try:
        started = time.perf_counter()
        text_bytes = write_corpus(work / "text", int(args.gigabytes * 1e9), args.files)
        generated = time.perf_counter() - started
        seconds, prepare_peak_mb, manifest = prepare(work / "text", work / "corpus", args.vocab_size)
        tokens = manifest["tokens"]
        summary = train(work / "corpus", work / "run", args.updates)
        peak_mb = summary["peak_rss_mb"]
        record = {
            "text_bytes": text_bytes,
            "text_files": args.files,
            "generate_seconds": round(generated, 1),
            "tokens": tokens,
            "dtype": manifest["dtype"],
            "array_bytes": (work / "corpus" / "tokens.bin").stat().st_size,
            "vocab_size": manifest["vocab_size"],
            "bpe_sample_bytes": manifest["tokenizer"]["sample_bytes"],
            "prepare_seconds": round(seconds, 1),
            "prepare_mb_per_s": round(text_bytes / seconds / 1e6, 2),
            "prepare_tokens_per_s": round(tokens / seconds),
            "prepare_peak_rss_mb": round(prepare_peak_mb, 1),
            "parent_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "train": {**TRAIN, "updates": args.updates},
            "train_peak_rss_mb": peak_mb,
            "final_train_loss": summary.get("final_train_loss"),
            "final_val_loss": summary.get("final_val_loss"),
            "limit_mb": args.limit_mb,
            "under_limit": peak_mb < args.limit_mb,
        }
        print(json.dumps(record, indent=1))
        if str(args.output) != "/dev/null":
            print(f"wrote {harness.write_record(args.output, record)}")
        if not record["under_limit"]:
            sys.exit(f"the training process peaked at {peak_mb:.0f} MB, over {args.limit_mb:.0f} MB")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
