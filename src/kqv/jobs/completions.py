"""The LM job on prompt -> completion pairs: `kqv train lm --data qa.tsv` (or .jsonl), with or without `--init`.

When `data.path` names a file of pairs (`kqv.data.completions.is_pairs_file`), the LM job trains the model to
continue each prompt with its completion and the end of text, instead of modelling a text:

- the examples are read, checked (a completion may not hold the end of text; an example longer than
  data.context + 1 tokens is refused, naming its line) and encoded with the run's tokenizer (a new one learns
  the end of text: the newline for "char", `<eos>` for "bpe"; a fine-tune's is its source's), split into train
  and validation examples, and stored in the run's tokens.safetensors with the training examples' kinds of
  question, so neither a resume nor `kqv eval`'s per-kind baselines need the source file;
- batches pad or pack the examples (`kqv.data.example_batches`: `data.packing`), and the loss is on the
  completion and its end of text, the prompt's tokens weighted by `data.prompt_loss_weight` (default 0);
- the run's outcome is the completion loss of the validation examples, and samples.txt holds completions of
  validation prompts, each stopped at the end of text.

`Pairs` is this corpus kind of the LM job (`kqv.jobs.lm_corpus`); `Examples`, what it shares with the documents of
`kqv.jobs.sources`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..data.completions import (
    DEFAULT_KIND,
    Example,
    check_examples,
    check_lengths,
    encode_examples,
    end_of_text,
    is_pairs_file,
    read_examples,
    split_examples,
)
from ..data.documents import apply_template, has_mask, mask_symbol, templated
from ..data.example_batches import EncodedExamples, ExampleBatches
from ..data.mixture import MixtureBatches
from ..data.tokenizers import Tokenizer, make_tokenizer
from ..errors import MAX_TOKENS, ConfigError, option
from ..nn.config import ModelConfig
from ..nn.cores import packed_mask
from ..nn.experts import with_auxiliary_loss
from ..nn.generation import GenerationConfig
from ..nn.losses import weighted_cross_entropy
from ..train.config import TrainConfig
from ..train.layout import RunFiles
from ..train.options import TrainerOptions
from ..train.topology import Topology
from .corpus import load_tokens
from .lm_corpus import Corpus, Splits, refuse_document_options, refuse_span_options
from .lm_data import DataConfig
from .sampling import SampleConfig, save_samples
from .scoring import BATCH_SIZE, complete, completion_nats, fine_tuning_answers

SCORED_EXAMPLES = 2_000  # the validation examples the run's final completion loss scores
SPLITS = ("train", "val")


def pairs_tokenizer(kind: str, text: str, vocab_size: int, mask: str | None = None) -> Tokenizer:
    """A new tokenizer for the pairs' `text` that has an end of text: "char" learns the newline with the text's
    characters, "bpe" gets the special token `<eos>` (`kqv.data.completions.end_of_text`); and the mask symbol
    `mask` where one is given (`kqv.data.documents`: a reserved character, or a special token)."""
    if kind == "char":
        return make_tokenizer(kind, text + "\n" + (mask or ""))
    return make_tokenizer(kind, text, vocab_size, special_tokens=("<eos>", *((mask,) if mask else ())))


def build_examples(maker: Any, data: DataConfig) -> tuple[Tokenizer, dict[str, Tensor]]:
    """The tokenizer (`maker.make_tokenizer(data, text)`) and the encoded splits of the pairs in `data.path`:
    `train` and `val` (every example's ids, one after another), `train_lengths` and `val_lengths` (each example's
    prompt and completion token counts), `chars` (the characters of each split) and the training examples' kinds
    of question (`kind_tensors`). What it refuses, it refuses before anything is written."""
    examples, template = read_examples(data.path), data.template
    text = "".join(apply_template(template, example.prompt, "") + example.completion for example in examples)
    tokenizer = maker.make_tokenizer(data, text)
    end_of_text(tokenizer)  # a DataError when the tokenizer has none
    mask = mask_symbol(data.mask, getattr(tokenizer, "kind", "bpe"))
    examples = templated(examples, template, tokenizer, mask, str(data.path))  # data.template, if any
    check_examples(examples, tokenizer, str(data.path))
    tokens: dict[str, Tensor] = {}
    chars = []
    for split, chosen in zip(SPLITS, split_examples(len(examples), data.val_fraction)):
        part = [examples[k] for k in chosen]
        ids = encode_examples(part, tokenizer)
        check_lengths(part, ids["lengths"], data.context, str(data.path))
        tokens[split], tokens[f"{split}_lengths"] = ids["ids"], ids["lengths"]
        chars.append(sum(len(example.prompt) + len(example.completion) for example in part))
        if split == "train":
            tokens.update(kind_tensors(part))
    tokens["chars"] = torch.tensor(chars)
    return tokenizer, tokens


def kind_tensors(examples: list[Example]) -> dict[str, Tensor]:
    """The kinds of question of a run's training `examples`, stored with its tokens so that `kqv eval` groups its
    baselines by them without the file of pairs: `train_kinds` (each example's index into the names) and
    `kind_names` (the names as the UTF-8 bytes of a JSON list)."""
    names = sorted({example.kind for example in examples})
    index = {name: k for k, name in enumerate(names)}
    return {
        "train_kinds": torch.tensor([index[example.kind] for example in examples], dtype=torch.int32),
        "kind_names": json_tensor(names),
    }


def json_tensor(value: Any) -> Tensor:
    """`value` as the UTF-8 bytes of its JSON: text that tokens.safetensors (tensors alone) can hold."""
    return torch.tensor(list(json.dumps(value).encode()), dtype=torch.uint8)


def from_json_tensor(tensor: Tensor) -> Any:
    """The value `json_tensor` stored."""
    return json.loads(bytes(tensor.tolist()).decode())


def stored_kinds(tokens: dict[str, Tensor]) -> list[str]:
    """The kinds of question of a run's training examples (`kind_tensors`); `DEFAULT_KIND` for each in a run that
    stored none (one trained before its kinds were stored)."""
    if "train_kinds" not in tokens:
        return [DEFAULT_KIND] * len(tokens["train_lengths"])
    names = from_json_tensor(tokens["kind_names"])
    return [names[k] for k in tokens["train_kinds"].tolist()]


def encoded(tokens: dict[str, Tensor], split: str) -> EncodedExamples:
    return EncodedExamples(tokens[split], tokens[f"{split}_lengths"])


def check_packing(model: ModelConfig, packing: bool | str) -> None:
    """Packing gives attention a block-diagonal mask, which only full attention takes (the sparse kinds take
    padding masks only); "auto" is settled before (`DataConfig.settle_packing`)."""
    kinds = sorted(set(model.layer_attention_kinds()) - {"full"})
    if packing is True and kinds:
        raise ConfigError(
            f"data.packing needs attention='full' in every layer (a packed row's mask keeps each example to "
            f"itself, which {', '.join(kinds)} attention cannot take); set data.packing=false"
        )


def batch_options(data: DataConfig, train: TrainConfig) -> dict[str, Any]:
    """What every `ExampleBatches` of a training takes from its settings (pairs, and each source of a mixture)."""
    return {
        "batch_size": train.batch_size,
        "context": data.context,
        "seed": train.seed,
        "packing": data.packing,
        "prompt_loss_weight": data.prompt_loss_weight,
    }


def trainer_options(data: DataConfig, train: TrainConfig, tokens: dict[str, Tensor]) -> TrainerOptions:
    """train_batches, val_batches, loss_fn, loss_terms and tokens_per_batch of a training on pairs."""
    options = batch_options(data, train)
    training = ExampleBatches(encoded(tokens, "train"), shuffle=True, **options)
    return example_options(training, ExampleBatches(encoded(tokens, "val"), shuffle=False, **options))


def example_options(
    training: ExampleBatches | MixtureBatches, validation: ExampleBatches | MixtureBatches
) -> TrainerOptions:
    """The Trainer's options for batches of examples (`training`'s and `validation`'s, of pairs or of a mixture):
    their loss on the completions, and the tokens each training batch holds."""
    return TrainerOptions(
        train_batches=training.batch,
        loss_fn=example_loss,
        loss_terms=ExampleBatches.loss_terms,  # under torchrun (kqv.train.distributed.share)
        val_batches=validation.batch,
        tokens_per_batch=training.tokens,
    )


def example_loss(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """The loss of a batch of examples (`ExampleBatches.batch`): the model's mean cross-entropy over the targets
    that count (completion, end of text, and the prompt unless its weight is 0), or, with `weights`, the weighted
    mean of the cross-entropy computed from the logits. Nothing is read back to the host."""
    if "sequences" in batch:
        mask = packed_mask(batch["sequences"])  # (batch, 1, time, time): each example sees only itself
    else:
        mask = batch["attention_mask"]  # (batch, time): padding (after the example, so a causal model never sees it)
    positions = batch.get("positions")
    if "weights" not in batch:
        return model(batch["ids"], batch["targets"], attention_mask=mask, positions=positions)
    logits = model(batch["ids"], attention_mask=mask, positions=positions)
    return with_auxiliary_loss(model, weighted_cross_entropy(logits, batch["targets"], batch["weights"]))


def held_out_loss(model: nn.Module, tokens: dict[str, Tensor], batch_size: int) -> dict[str, float]:
    """The completion loss of (up to `SCORED_EXAMPLES` of) a pair run's validation examples given their prompts
    (`kqv.jobs.scoring.completion_nats`): `loss` (nats per completion token, the end of text included),
    `perplexity`, `bits_per_token`, `tokens` and `examples` scored."""
    examples = encoded(tokens, "val")
    pairs = [examples.parts(k) for k in range(min(len(examples), SCORED_EXAMPLES))]
    nats, count = completion_nats(model, [p for p, _ in pairs], [c for _, c in pairs], batch_size)
    loss = nats / count
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 700)),
        "bits_per_token": loss / math.log(2),
        "tokens": count,
        "examples": len(pairs),
    }


def held_out_evaluation(model: nn.Module, tokens: dict[str, Tensor], max_tokens: int | None) -> dict[str, Any]:
    """The fields of `LMRun.evaluate()`'s `LMEvaluation` for a pair run: its validation examples' completion loss
    (`held_out_loss`), the examples scored whole (so `max_tokens` is refused)."""
    if max_tokens is not None:
        raise ConfigError(f"a pair run's validation examples are scored whole; drop {option(MAX_TOKENS)}")
    figures = held_out_loss(model, tokens, BATCH_SIZE)
    source = f"the completions of the {figures.pop('examples')} held-out validation examples"
    return {"source": source, **figures}


def score_and_sample(
    model: nn.Module, tokenizer: Tokenizer, tokens: dict[str, Tensor], batch_size: int, sample: SampleConfig,
    run_dir: Path,
) -> tuple[dict[str, float], list[str]]:  # fmt: skip
    """A pair run's outcome: the completion loss of its validation examples (`held_out_loss`, `batch_size` at a
    time), and completions of the first `sample.count` validation prompts, sampled as [sample] says and stopped at
    the end of text, written to samples.txt (the prompt, then its completion)."""
    val, examples = held_out_loss(model, tokens, batch_size), encoded(tokens, "val")
    prompts = [tokenizer.decode(examples.parts(k)[0]) for k in range(min(sample.count, len(examples)))]
    options = {"max_new_tokens": sample.max_new_tokens, "temperature": sample.temperature, "top_k": sample.top_k}
    answers = complete(model, tokenizer, prompts, GenerationConfig(**options))
    samples = [prompt + answer for prompt, answer in zip(prompts, answers)]
    save_samples(RunFiles(run_dir).samples_file, samples)
    return val, samples


class Examples(Corpus):
    """A corpus of examples (pairs, or documents made into examples: `kqv.jobs.sources.Documents`): a tokenizer
    with an end of text, batches that pad or pack them, and the completion loss of the held-out examples as the
    run's figure. `corrupt`: whether spans of its documents are masked (span corruption)."""

    corrupt = False

    def mask(self) -> str | None:
        """The mask symbol of span corruption, or of a template with `{mask}`."""
        if self.corrupt or has_mask(self.data.template):
            return mask_symbol(self.data.mask, self.data.tokenizer)
        return None

    def make_tokenizer(self, data: DataConfig, text: str) -> Tokenizer:
        return pairs_tokenizer(data.tokenizer, text, data.vocab_size, self.mask())

    def sample_prompt(self, tokenizer: Tokenizer, tokens: Splits) -> str | None:
        return None  # samples complete the validation examples' own prompts

    def check_data(self, model: ModelConfig, tokenizer: Tokenizer, tokens: Splits, prompt: str) -> None:
        check_packing(model, self.data.packing)  # the examples' lengths were checked as they were encoded

    def outcome(
        self, model: nn.Module, tokenizer: Tokenizer, tokens: Splits, train: TrainConfig, sample: SampleConfig,
        run_dir: Path,
    ) -> tuple[dict[str, float], list[str]]:  # fmt: skip
        return score_and_sample(model, tokenizer, tokens, train.batch_size, sample, run_dir)

    def held_out(self, model: nn.Module, run_dir: Path, max_tokens: int | None) -> dict[str, Any]:
        return held_out_evaluation(model, load_tokens(run_dir), max_tokens)


class Pairs(Examples):
    """A file of prompt -> completion pairs (data.path a .tsv or .jsonl file: the module docstring)."""

    @staticmethod
    def reads(data: DataConfig) -> bool:
        return data.path is not None and is_pairs_file(data.path)

    def check(self) -> None:
        refuse_span_options(self.data)
        refuse_document_options(self.data)

    def build(self, maker: Any, data: DataConfig) -> tuple[Tokenizer, Splits]:
        return build_examples(maker, data)

    def trainer_options(
        self, train: TrainConfig, tokenizer: Tokenizer, tokens: Splits, topology: Topology
    ) -> TrainerOptions:
        return trainer_options(self.data, train, tokens)

    def trained_answers(self, tokenizer: Tokenizer, run_dir: Path) -> tuple[list[str], list[str]] | None:
        """The completions of the run's training examples and their kinds, both from its tokens.safetensors."""
        tokens = load_tokens(run_dir)
        return fine_tuning_answers(tokenizer, tokens), stored_kinds(tokens)
