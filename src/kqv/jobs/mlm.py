"""The masked-language-model job: pretrain a BERT-style encoder (Devlin et al. 2019).

Masked LM (Devlin et al. 2019). An encoder sees the whole sequence, so it cannot be trained to predict the next
token; BERT corrupts the input instead and asks for the originals: 15% of the tokens are selected, 80% of those
become [MASK], 10% a random token, 10% stay as they are (so the model cannot learn that only [MASK] needs
predicting), and the loss is the cross-entropy at the selected positions only. Training blocks come from the LM
job's corpora (`kqv.data`: Shakespeare by default). Every evaluation hides 15% of the validation tokens behind
[MASK] (no random or kept tokens: the model must infer each from its context alone) and reports the accuracy of
the model there, `masked_accuracy`, next to `unigram_accuracy`, the accuracy of always answering the token most
frequent among those positions.

A run directory holds `run.toml` (with `task = "mlm"`), `tokenizer/`, `tokens.safetensors`, `checkpoint/`,
`metrics.jsonl`, `loss.png` and `summary.json`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from ..data.batches import batch_generator, sample_batch
from ..data.masking import mask_tokens
from ..data.shakespeare import load_text, split_text
from ..data.tokenizers import encode_text
from ..data.vocabulary import Vocabulary
from ..nn.config import ModelConfig
from ..nn.heads import MaskedLM
from ..nn.models import count_parameters
from ..train.checkpoints import load_weights, read_checkpoint
from .encoder import TOKENIZER_DIR, TOKENS_FILE, EncoderRunConfig, make_trainer, read_run, write_run_config


def prepare_mlm_data(config: EncoderRunConfig, run_dir: Path, resume: bool) -> tuple[Vocabulary, dict[str, Tensor]]:
    """The vocabulary and encoded splits: loaded from the run when resuming, else built and saved."""
    if resume and (run_dir / TOKENS_FILE).exists():
        return Vocabulary.load(run_dir / TOKENIZER_DIR), load_file(run_dir / TOKENS_FILE)
    data = config.data
    text = load_text(data.path)
    train_text, val_text = split_text(text, data.val_fraction)
    vocabulary = Vocabulary.train(data.tokenizer, text if data.tokenizer == "char" else train_text, data.vocab_size)
    tokens = {"train": encode_text(vocabulary.tokenizer, train_text), "val": encode_text(vocabulary.tokenizer, val_text)}
    run_dir.mkdir(parents=True, exist_ok=True)
    vocabulary.save(run_dir / TOKENIZER_DIR)
    save_file(tokens, run_dir / TOKENS_FILE)
    return vocabulary, tokens


@torch.no_grad()
def masked_accuracy(model: torch.nn.Module, batches: list[tuple[Tensor, Tensor]]) -> dict[str, float]:
    """Accuracy at the masked positions, and that of always answering the most frequent token there."""
    correct, answers = 0, []
    for inputs, targets in batches:
        masked = targets != -100
        correct += int((model(inputs).argmax(dim=-1)[masked] == targets[masked]).sum())
        answers.append(targets[masked])
    answers = torch.cat(answers)
    most_frequent = int(answers.mode().values)
    return {"masked_accuracy": correct / len(answers),
            "unigram_accuracy": float((answers == most_frequent).float().mean()), "masked_tokens": len(answers)}


def train_mlm(config: EncoderRunConfig, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
              quiet: bool = False) -> dict[str, Any]:
    """Pretrain a `MaskedLM` as configured; write the run directory and return the summary."""
    run_dir = Path(run_dir)
    if resume:
        read_checkpoint(run_dir)  # a clear error before any work if there is nothing to resume
    vocabulary, tokens = prepare_mlm_data(config, run_dir, resume and not overwrite)
    context, seed, batch = config.data.context, config.train.seed, config.train.batch_size
    model_config = ModelConfig.from_dict({"max_len": context, **config.model, "vocab_size": vocabulary.size})
    write_run_config(run_dir, config, model_config)
    torch.manual_seed(seed)
    model = MaskedLM(model_config)
    masking = asdict(config.masking)
    hidden = {**masking, "mask_token_prob": 1.0, "random_token_prob": 0.0}  # evaluation: every selected token hidden

    def blocks(ids: Tensor, generator: torch.Generator) -> Tensor:
        return sample_batch(ids, batch, context, generator)[0]  # (batch, context): the inputs, not the next tokens

    def train_batches(i: int) -> tuple[Tensor, Tensor]:
        generator = batch_generator(seed, i)
        return mask_tokens(blocks(tokens["train"], generator), generator, vocabulary, **masking)

    def val_batches(i: int) -> tuple[Tensor, Tensor]:
        generator = batch_generator(seed, -i - 1)
        return mask_tokens(blocks(tokens["val"], generator), generator, vocabulary, **hidden)

    def loss_fn(model: torch.nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, targets = batch
        return model(inputs, targets)

    evaluation = [val_batches(i) for i in range(config.train.eval_batches)]
    if not quiet:
        print(f"kqv: {count_parameters(model):,} parameters, {len(tokens['train']):,} training tokens "
              f"({config.data.tokenizer} tokenizer, vocabulary {vocabulary.size}), run directory {run_dir}")
    trainer = make_trainer(model, config, run_dir, resume, overwrite, quiet, train_batches=train_batches,
                           loss_fn=loss_fn, val_batches=val_batches, tokens_per_batch=batch * context,
                           eval_fn=lambda model: masked_accuracy(model, evaluation))
    started = time.perf_counter()
    final = trainer.train()
    summary = {"steps": trainer.step, "train_seconds": round(time.perf_counter() - started, 1),
               "parameters": count_parameters(model), "final_train_loss": final.get("train_loss"),
               "final_val_loss": final.get("val_loss"), "masked_accuracy": final.get("masked_accuracy"),
               "unigram_accuracy": final.get("unigram_accuracy"), "masked_tokens": int(final.get("masked_tokens", 0))}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if not quiet:
        print(f"kqv: masked-token accuracy {summary['masked_accuracy']:.1%} on {summary['masked_tokens']:,} "
              f"hidden validation tokens (always answering the most frequent one: "
              f"{summary['unigram_accuracy']:.1%}) after {trainer.step} steps in "
              f"{summary['train_seconds'] / 60:.1f} min")
    return summary


@dataclass
class MLMRun:
    model: MaskedLM
    vocabulary: Vocabulary
    run_dir: Path


def load_mlm_run(run_dir: str | Path) -> MLMRun:
    """A trained MLM run: its model (weights from safetensors) and vocabulary."""
    run_dir = Path(run_dir)
    _, model_config = read_run(run_dir, "mlm")
    model = MaskedLM(model_config)
    load_weights(model, run_dir)
    return MLMRun(model.eval(), Vocabulary.load(run_dir / TOKENIZER_DIR), run_dir)
