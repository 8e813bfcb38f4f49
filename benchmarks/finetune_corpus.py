"""nanoGPT's fine-tuning recipe in kqv: pretrain on one corpus, fine-tune on another, against training from scratch.

A small character-level GPT is pretrained on the first million characters of Shakespeare's complete works (the
embedded default corpus). Then, for each seed, two runs train on the first million characters of the English Bible
(the World English Bible, one cleaned verse per line, from `kqv.data.bible`) with the same model, batch,
learning-rate schedule and number of updates: one starts from the pretrained weights (`kqv.train("lm",
init=PRETRAINED, ...)`, i.e. `kqv train lm --init`), the other from random weights. Equal updates of the same model
and batch are equal work, so this compares them at equal wall-clock (the measured seconds are recorded too). The
figure is each run's validation loss on the Bible's held-out split (nats per character, the job's final perplexity),
with the pretrained model's loss there before any fine-tuning beside.

Tokenizer: the fine-tune keeps the source's character tokenizer; every character of the WEB also occurs in
Shakespeare, so no text is changed (a character it lacks would be dropped and counted in the JSON's
`dropped_characters`; the full run drops none). The scratch runs build their tokenizer from the Bible text.

    python benchmarks/finetune_corpus.py            # the measured sizes (about 12 minutes on the shared 2-core machine)
    python benchmarks/finetune_corpus.py --quick    # tiny sizes, seconds: checks the script, measures nothing

Writes benchmarks/results/finetune_corpus.json (or --output) and prints a table.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import kqv
from kqv.data import bible_dir, clean_verse, load_text, read_bible, split_text
from kqv_lab import benchmarking as harness

OUTPUT = harness.results_path("finetune_corpus")
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}  # two-sided 95%

# Sizes: FULL is what docs/fine-tuning.md reports; QUICK only exercises the code (tests/test_finetune_results.py).
FULL = {
    "model": {"d_model": 96, "n_heads": 4, "n_layers": 3, "d_ff": 384},
    "context": 64,
    "batch_size": 16,
    "pretrain_steps": 250,
    "finetune_steps": 80,
    "lr": 2e-3,
    "pretrain_chars": 1_000_000,  # the first million characters (the runs read far fewer tokens than that)
    "finetune_chars": 1_000_000,
}
QUICK = {
    "model": {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64},
    "context": 32,
    "batch_size": 4,
    "pretrain_steps": 4,
    "finetune_steps": 3,
    "lr": 2e-3,
    "pretrain_chars": 30_000,
    "finetune_chars": 20_000,
}


def bible_text() -> str:
    """The World English Bible, one cleaned verse per line, in canonical order."""
    verses = read_bible(bible_dir(), "en")
    return "\n".join(clean_verse(verses[key]) for key in sorted(verses)) + "\n"


def keep_known(text: str, chars: set[str]) -> tuple[str, dict[str, int]]:
    """`text` without the characters outside `chars` (the source tokenizer's), and how often each was dropped."""
    dropped: dict[str, int] = {}
    for char in set(text) - chars:
        dropped[char] = text.count(char)
    return "".join(c for c in text if c in chars) if dropped else text, dropped


def overrides(sizes: dict, steps: int, seed: int, data_path: Path | None) -> list[str]:
    """The run's settings: one model, batch and schedule for every run, no time budget, few side evaluations."""
    sets = [f"model.{name}={value}" for name, value in sizes["model"].items()]
    sets += [
        f"data.context={sizes['context']}",
        f"train.batch_size={sizes['batch_size']}",
        f"train.steps={steps}",
        f"train.lr={sizes['lr']}",
        f"train.warmup_steps={max(1, steps // 10)}",
        "train.budget_minutes=0",
        f"train.seed={seed}",
        f"train.eval_every={steps}",
        "train.eval_batches=4",
        f"train.checkpoint_every={steps}",
        f"train.log_every={max(1, steps // 10)}",
        "sample.count=1",
        "sample.max_new_tokens=20",
        'sample.prompt="\\n"',
    ]
    if data_path is not None:
        sets.append(f"data.path={json.dumps(str(data_path))}")
    return sets


def train(out: Path, sets: list[str], init: Path | None = None) -> dict:
    """One kqv training run; its figures: validation loss (nats/char), updates, seconds, parameters."""
    started = time.perf_counter()
    summary = kqv.train("lm", "quick", out=out, overrides=sets, init=init, quiet=True, overwrite=True)
    return {
        "val_loss": summary["val"]["loss"],
        "val_tokens": summary["val"]["tokens"],
        "final_train_loss": summary["final_train_loss"],
        "steps": summary["steps"],
        "train_seconds": summary["train_seconds"],
        "wall_seconds": round(time.perf_counter() - started, 1),
        "parameters": summary["parameters"],
    }


def spread(values: list[float]) -> dict:
    """Mean, sample standard deviation and a 95% t interval of the mean (none for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "std": None, "ci95": None, "values": values}
    std = statistics.stdev(values)
    half = T_975[len(values) - 1] * std / math.sqrt(len(values))
    return {"mean": mean, "std": std, "ci95": [mean - half, mean + half], "values": values}


def verdict(difference: dict) -> str:
    """'pretraining helps' / 'pretraining hurts' when the paired difference's interval excludes 0, else
    'inconclusive' (also for a single seed)."""
    interval = difference["ci95"]
    if interval is None or interval[0] <= 0 <= interval[1]:
        return "inconclusive"
    return "pretraining helps" if interval[1] < 0 else "pretraining hurts"


def measure(sizes: dict, seeds: list[int], work: Path) -> dict:
    shakespeare = load_text(None)
    if sizes["pretrain_chars"]:
        shakespeare = shakespeare[: sizes["pretrain_chars"]]
        (work / "shakespeare.txt").write_text(shakespeare, encoding="utf-8")
    pretrain_path = work / "shakespeare.txt" if sizes["pretrain_chars"] else None
    print(f"pretraining on Shakespeare ({len(shakespeare):,} characters)", file=sys.stderr, flush=True)
    pretrained = train(work / "pretrain", overrides(sizes, sizes["pretrain_steps"], 0, pretrain_path))
    source = kqv.load(work / "pretrain", device="cpu")
    bible, dropped = keep_known(bible_text()[: sizes["finetune_chars"]], set(source.tokenizer.chars))
    bible_path = work / "bible-en.txt"
    bible_path.write_text(bible, encoding="utf-8")
    val_path = work / "bible-en-val.txt"
    val_path.write_text(split_text(bible, 0.1)[1], encoding="utf-8")  # the split every Bible run holds out
    zero_shot = source.evaluate(val_path, max_tokens=200_000).loss  # the job scores the same prefix
    runs = []
    for seed in seeds:
        for arm, init in (("fine-tuned", work / "pretrain"), ("from scratch", None)):
            print(f"seed {seed}: {arm}", file=sys.stderr, flush=True)
            sets = overrides(sizes, sizes["finetune_steps"], seed, bible_path)
            runs.append({"arm": arm, "seed": seed, **train(work / f"{arm.split()[0]}-{seed}", sets, init)})
    by_arm = {arm: [r for r in runs if r["arm"] == arm] for arm in ("fine-tuned", "from scratch")}
    paired = [f["val_loss"] - s["val_loss"] for f, s in zip(by_arm["fine-tuned"], by_arm["from scratch"])]
    difference = spread(paired)
    return {
        "pretrain": pretrained | {"corpus": "Shakespeare's complete works", "characters": len(shakespeare)},
        "finetune_corpus": {"name": "World English Bible", "characters": len(bible), "dropped_characters": dropped},
        "pretrained_val_loss_before_finetuning": zero_shot,
        "runs": runs,
        "val_loss": {arm: spread([r["val_loss"] for r in rs]) for arm, rs in by_arm.items()},
        "train_seconds": {arm: spread([r["train_seconds"] for r in rs]) for arm, rs in by_arm.items()},
        "difference_finetuned_minus_scratch": difference,
        "verdict": verdict(difference),
    }


def print_table(record: dict) -> None:
    print(
        f"pretrained on Shakespeare, {record['pretrain']['steps']} updates: Bible val loss before fine-tuning "
        f"{record['pretrained_val_loss_before_finetuning']:.3f}"
    )
    print("| arm | seeds | updates | val loss (mean, 95% CI) | train seconds (mean) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for arm, loss in record["val_loss"].items():
        interval = "" if loss["ci95"] is None else f" [{loss['ci95'][0]:.3f}, {loss['ci95'][1]:.3f}]"
        steps = record["runs"][0]["steps"]
        seconds = record["train_seconds"][arm]["mean"]
        print(f"| {arm} | {len(loss['values'])} | {steps} | {loss['mean']:.3f}{interval} | {seconds:.1f} |")
    difference = record["difference_finetuned_minus_scratch"]
    print(f"fine-tuned - scratch: {difference['mean']:+.3f} ({record['verdict']})")


def main(argv: list[str] | None = None) -> int:
    parser = harness.arguments(
        __doc__.splitlines()[0],
        quick="tiny sizes that only check the script (seconds)",
        output=None,
        output_help=f"JSON path (default {OUTPUT.relative_to(harness.ROOT)})",
    )
    parser.add_argument(
        "--seeds",
        type=harness.seed_list,
        default=[1, 2, 3],
        help="seeds of the fine-tune/scratch pairs (default 1,2,3)",
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    threads = __import__("torch").get_num_threads()
    arms = partial(measure, sizes, args.seeds)
    fields = dict(sizes=sizes, seeds=args.seeds, torch_threads=threads)
    harness.measured_in_scratch("finetune_corpus", args, arms, print_table, **fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())
