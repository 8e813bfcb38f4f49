"""The classification job: a `SequenceClassifier` learns the labels of a TSV file of `text<TAB>label` lines.

A deterministic share is held out as the dev set, whose accuracy is reported with the majority-class baseline.
Starting from an MLM run (`init = "runs/mlm"`) fine-tunes its encoder and reuses its tokenizer; otherwise
everything is trained from scratch. A run directory holds `run.toml` (with `task = "cls"` and the label names),
`tokenizer/`, `checkpoint/`, `metrics.jsonl`, `loss.png` and `summary.json`.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..data.batches import batch_generator
from ..data.padding import pad_batch
from ..data.tsv import read_tsv, split_examples
from ..data.vocabulary import Vocabulary
from ..nn.config import ModelConfig
from ..nn.heads import SequenceClassifier
from ..nn.models import count_parameters
from ..train.checkpoints import read_checkpoint
from .encoder import TOKENIZER_DIR, EncoderRunConfig, make_trainer, read_run, write_run_config
from .mlm import load_mlm_run


def train_cls(config: EncoderRunConfig, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
              quiet: bool = False) -> dict[str, Any]:
    """Fine-tune (or train from scratch) a `SequenceClassifier` on a TSV file; return the summary."""
    run_dir, data = Path(run_dir), config.data
    if data.path is None:
        raise ValueError("kqv train cls needs a TSV file of text<TAB>label lines: pass --data file.tsv")
    if resume:
        read_checkpoint(run_dir)
    examples = read_tsv(data.path)
    train, dev = split_examples(examples, data.dev_fraction, config.train.seed)
    labels = sorted({label for _, label in examples})
    if len(labels) < 2:
        raise ValueError(f"{data.path} has only the label {labels}; classification needs at least two")
    pretrained = load_mlm_run(data.init) if data.init else None
    if pretrained is not None:
        vocabulary = pretrained.vocabulary
        model_config = pretrained.model.config.replace(**{k: v for k, v in config.model.items() if k == "dropout"})
    elif resume and (run_dir / TOKENIZER_DIR).exists():
        vocabulary = Vocabulary.load(run_dir / TOKENIZER_DIR)
        model_config = read_run(run_dir, "cls")[1]
    else:
        texts = [text for text, _ in (examples if data.tokenizer == "char" else train)]  # chars: all, or dev fails
        vocabulary = Vocabulary.train(data.tokenizer, "\n".join(texts), data.vocab_size)
        model_config = ModelConfig.from_dict({"max_len": data.max_tokens, **config.model,
                                              "vocab_size": vocabulary.size})
    max_tokens = min(data.max_tokens, model_config.max_len) if model_config.position == "learned" else data.max_tokens
    run_dir.mkdir(parents=True, exist_ok=True)
    vocabulary.save(run_dir / TOKENIZER_DIR)
    write_run_config(run_dir, config, model_config, labels={"names": labels})
    torch.manual_seed(config.train.seed)
    model = SequenceClassifier(model_config, len(labels), config.head.pooling)
    if pretrained is not None:
        model.encoder.load_state_dict(pretrained.model.encoder.state_dict())

    def encode_examples(part: list[tuple[str, str]]) -> tuple[list[list[int]], Tensor]:
        ids = [[vocabulary.cls_id, *vocabulary.encode(text)[:max_tokens - 1]] for text, _ in part]
        return ids, torch.tensor([labels.index(label) for _, label in part])

    train_ids, train_labels = encode_examples(train)
    dev_ids, dev_labels = encode_examples(dev)
    batch, seed = config.train.batch_size, config.train.seed

    def take(ids: list[list[int]], targets: Tensor, rows: list[int]) -> tuple[Tensor, Tensor, Tensor]:
        return (*pad_batch([ids[r] for r in rows], vocabulary.pad_id), targets[rows])

    def train_batches(i: int) -> tuple[Tensor, Tensor, Tensor]:
        rows = torch.randint(len(train_ids), (batch,), generator=batch_generator(seed, i)).tolist()
        return take(train_ids, train_labels, rows)

    def val_batches(i: int) -> tuple[Tensor, Tensor, Tensor]:
        start = (i * batch) % len(dev_ids)
        return take(dev_ids, dev_labels, [(start + j) % len(dev_ids) for j in range(batch)])

    def loss_fn(model: torch.nn.Module, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        ids, attention_mask, targets = batch
        return model(ids, targets, attention_mask=attention_mask)

    majority = Counter(train_labels.tolist()).most_common(1)[0][0]

    @torch.no_grad()
    def accuracy(model: torch.nn.Module) -> dict[str, float]:
        correct = 0
        for start in range(0, len(dev_ids), batch):
            rows = list(range(start, min(start + batch, len(dev_ids))))
            ids, attention_mask, targets = take(dev_ids, dev_labels, rows)
            correct += int((model(ids, attention_mask=attention_mask).argmax(dim=-1) == targets).sum())
        return {"dev_accuracy": correct / len(dev_ids),
                "majority_accuracy": float((dev_labels == majority).float().mean())}

    if not quiet:
        start = "the encoder of " + str(data.init) if pretrained is not None else "scratch"
        print(f"kqv: {count_parameters(model):,} parameters from {start}, {len(train)} training and {len(dev)} dev "
              f"examples, {len(labels)} labels, run directory {run_dir}")
    trainer = make_trainer(model, config, run_dir, resume, overwrite, quiet, train_batches=train_batches,
                           loss_fn=loss_fn, val_batches=val_batches, eval_fn=accuracy)
    started = time.perf_counter()
    final = trainer.train()
    summary = {"steps": trainer.step, "train_seconds": round(time.perf_counter() - started, 1),
               "parameters": count_parameters(model), "train_examples": len(train), "dev_examples": len(dev),
               "labels": labels, "final_train_loss": final.get("train_loss"), "final_val_loss": final.get("val_loss"),
               "dev_accuracy": final.get("dev_accuracy"), "majority_accuracy": final.get("majority_accuracy")}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if not quiet:
        print(f"kqv: dev accuracy {summary['dev_accuracy']:.1%} on {len(dev)} examples (majority class: "
              f"{summary['majority_accuracy']:.1%}) after {trainer.step} steps in "
              f"{summary['train_seconds'] / 60:.1f} min")
    return summary
