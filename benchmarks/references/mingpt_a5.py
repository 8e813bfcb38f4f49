"""The CS224N assignment 5 peer: the assignment's own minGPT code, run on the same machine and data as kqv.

Nothing of the assignment is copied here: `--mingpt DIR` names the `src/` folder of a public solved copy of the
assignment (e.g. `git clone https://github.com/tlemenestrel/minGPT_birthplace_prediction`, then
`--mingpt minGPT_birthplace_prediction/src`), whose `dataset.py`, `model.py`, `trainer.py` and `utils.py` this
script imports and drives as its `run.py` does: the vanilla GPT (4 layers, 8 heads, width 256, block 128) pretrained
by span corruption on `wiki.txt` (`CharCorruptionDataset`), then fine-tuned on questions (`NameDataset`), then
asked each development question greedily (`utils.sample`, 32 characters, the answer up to the next mask symbol).
Leave the copy's `birth_dev.tsv` (the assignment's held-out judge) alone: this script is given its own files.

What changes from `run.py`, so that it runs within a CPU budget:

* pretraining runs for `--epochs` passes over wiki.txt (the course: 650; a fraction cuts the last pass), or stops
  after `--minutes` of wall time (checked before each batch); `--pace` only times it;
* `--settings course` keeps the course's hyperparameters (batch 128, learning rate 6e-3, cosine decay to 10% over
  200 epochs' tokens: far beyond what a CPU reads in half an hour, so its learning rate stays near the top);
  `--settings cpu` ends the cosine with the budget (`final_tokens` the budget's epochs of tokens; with `--minutes`,
  those a throwaway copy's 20 seconds of training say the budget reads), the course's batch and peak learning rate;
* fine-tuning is the course's: 10 epochs, batch 256, learning rate 6e-4;
* one torch thread per run unless `--threads` says otherwise.

Prints one JSON line: exact match on the development questions, epochs, minutes and padded tokens read.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

PROBE_S = 20.0  # --settings cpu: seconds of a throwaway copy's training that time the budget's tokens


class OutOfTime(Exception):
    """Raised inside the assignment's training loop when the budget is spent (its Trainer has no budget)."""


class Budgeted(torch.utils.data.Dataset):
    """A dataset that raises OutOfTime once `deadline` (time.monotonic()) has passed: the assignment's Trainer reads
    examples in its own loop (num_workers=0), so this stops it between batches."""

    def __init__(self, dataset, deadline: float, batch_size: int = 128):
        self.dataset, self.deadline, self.batch_size = dataset, deadline, batch_size
        self.stoi, self.itos, self.block_size = dataset.stoi, dataset.itos, dataset.block_size
        self.read, self.last_batch = 0, math.inf  # examples handed out; the batches allowed in all

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, k):
        if time.monotonic() > self.deadline or self.read >= self.last_batch * self.batch_size:
            raise OutOfTime
        self.read += 1
        return self.dataset[k]


def pretrain(modules, model, corpus, settings: str, epochs: float | None, minutes: float | None) -> dict:
    """Span-corruption pretraining with the course's optimizer, for `epochs` passes over wiki.txt (fractional: cut
    inside the last) or for `minutes` of wall time; `settings` "cpu" ends the cosine schedule with the budget."""
    trainer = modules["trainer"]
    tokens_per_epoch = len(corpus) * corpus.block_size
    config = trainer.TrainerConfig(
        max_epochs=650,
        batch_size=128,
        learning_rate=6e-3,
        lr_decay=True,
        warmup_tokens=512 * 20,
        final_tokens=200 * tokens_per_epoch,
        num_workers=0,
    )
    if settings == "cpu":
        budget_tokens = epochs * tokens_per_epoch if epochs is not None else pace(modules, model, corpus) * minutes * 60
        config.final_tokens = max(1, int(budget_tokens))
    start = time.monotonic()
    stop = Budgeted(corpus, start + minutes * 60 if minutes is not None else math.inf)
    if epochs is not None:
        config.max_epochs = math.ceil(epochs)
        stop.last_batch = int(epochs * len(corpus) / config.batch_size)  # batches in all, the last epoch cut
    run = trainer.Trainer(model, stop, None, config)
    try:
        run.train()
    except OutOfTime:
        pass
    read = int(run.tokens)
    spent = (time.monotonic() - start) / 60
    return {"pretrain_minutes": spent, "pretrain_tokens_padded": read, "epochs": read / tokens_per_epoch}


def pace(modules, model, corpus, seconds: float = PROBE_S) -> float:
    """Padded tokens a second of the course's pretraining, timed on a throwaway copy of `model` for `seconds`."""
    trainer = modules["trainer"]
    config = trainer.TrainerConfig(
        max_epochs=650, batch_size=128, learning_rate=6e-3, lr_decay=True, warmup_tokens=512 * 20, num_workers=0
    )
    config.final_tokens = 200 * len(corpus) * corpus.block_size  # lr_decay: the Trainer counts tokens only then
    probe = trainer.Trainer(copy.deepcopy(model), Budgeted(corpus, time.monotonic() + seconds), None, config)
    probe.tokens = 0
    start = time.monotonic()
    try:
        probe.train()
    except OutOfTime:
        pass
    return float(probe.tokens or 0) / (time.monotonic() - start) if probe.tokens else 0.0


def finetune(modules, model, corpus, train_tsv: Path, epochs: int = 10) -> float:
    """The course's fine-tune: `epochs` (10) passes over the questions, batch 256, learning rate 6e-4; its minutes."""
    dataset, trainer = modules["dataset"], modules["trainer"]
    start = time.monotonic()
    questions = dataset.NameDataset(corpus, train_tsv.read_text(encoding="utf-8"))
    config = trainer.TrainerConfig(
        max_epochs=epochs,
        batch_size=256,
        learning_rate=6e-4,
        lr_decay=True,
        warmup_tokens=512 * 20,
        final_tokens=200 * len(corpus) * corpus.block_size,
        num_workers=0,
    )
    trainer.Trainer(model, questions, None, config).train()
    return (time.monotonic() - start) / 60


def answer(modules, model, corpus, dev_tsv: Path) -> tuple[int, int, list[str]]:
    """Greedy answers to the development questions, as the assignment's `run.py evaluate` asks them."""
    utils = modules["utils"]
    mask = "\u2047"
    lines = [line.split("\t") for line in dev_tsv.read_text(encoding="utf-8").splitlines() if line.strip()]
    got = []
    for question, _ in lines:
        x = torch.tensor([corpus.stoi[c] for c in question + mask], dtype=torch.long)[None, ...]
        out = utils.sample(model, x, 32, sample=False)[0]
        completion = "".join(corpus.itos[int(i)] for i in out)
        got.append(completion.split(mask)[1])
    correct = sum(g == expected.strip() for g, (_, expected) in zip(got, lines, strict=True))
    return correct, len(lines), got


def assignment_modules(folder: Path) -> dict:
    """The assignment's modules, loaded from `folder` under their own names, each after those it imports
    (model.py imports attention.py), so they import each other as in the assignment's own folder."""
    loaded = {}
    for name in ("attention", "model", "utils", "trainer", "dataset"):
        path = folder / f"{name}.py"
        if not path.is_file():
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        loaded[name] = module
    return loaded


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mingpt", type=Path, required=True, help="the assignment's src/ folder (see the docstring)")
    parser.add_argument("--wiki", type=Path, required=True)
    parser.add_argument("--train", type=Path, required=True, help="the fine-tuning questions (prompt<TAB>answer)")
    parser.add_argument("--dev", type=Path, required=True, help="the development questions scored")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--epochs", type=float, help="pretraining's passes over wiki.txt (the course: 650)")
    budget.add_argument("--minutes", type=float, help="pretraining's wall-time budget")
    budget.add_argument("--pace", action="store_true", help="only time pretraining (padded tokens/s) and print it")
    parser.add_argument("--finetune-epochs", type=int, default=10, help="the course's 10")
    parser.add_argument("--settings", choices=("course", "cpu"), default="course")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--predictions", type=Path, help="write each development answer here, one per line")
    args = parser.parse_args(argv)
    for name in ("dataset.py", "model.py", "trainer.py", "utils.py"):
        if not (args.mingpt / name).is_file():
            parser.error(f"--mingpt {args.mingpt} holds no {name}: give the assignment copy's src/ folder")
    torch.set_num_threads(args.threads)
    modules = assignment_modules(args.mingpt)
    random.seed(args.seed)
    modules["utils"].set_seed(args.seed)
    start = time.monotonic()
    corpus = modules["dataset"].CharCorruptionDataset(args.wiki.read_text(encoding="utf-8"), 128)
    config = modules["model"].GPTConfig(corpus.vocab_size, corpus.block_size, n_layer=4, n_head=8, n_embd=256)
    model = modules["model"].GPT(config)
    if args.pace:
        print(json.dumps({"padded_tokens_per_s": pace(modules, model, corpus, 60.0), "threads": args.threads}))
        return {}
    record = {"settings": args.settings, "seed": args.seed, "threads": args.threads}
    record |= {"budget_epochs": args.epochs, "budget_minutes": args.minutes}
    record |= pretrain(modules, model, corpus, args.settings, args.epochs, args.minutes)
    record["finetune_minutes"] = finetune(modules, model, corpus, args.train, args.finetune_epochs)
    correct, n, got = answer(modules, model, corpus, args.dev)
    record |= {"correct": correct, "n": n, "exact_match": correct / n, "minutes": (time.monotonic() - start) / 60}
    record["parameters"] = sum(p.numel() for p in model.parameters())
    if args.predictions is not None:
        args.predictions.write_text("".join(g + "\n" for g in got), encoding="utf-8")
    print(json.dumps(record))
    return record


if __name__ == "__main__":
    main()
