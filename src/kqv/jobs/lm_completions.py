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

`Pairs` is this corpus kind of the LM job (`kqv.jobs.lm_corpus`), loaded as `LoadedPairs`; `Examples` and
`LoadedExamples`, what it shares with the documents of `kqv.jobs.lm_documents`.
"""

from __future__ import annotations

import json
import math
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from ..data.completions import (
    DEFAULT_KIND,
    check_examples,
    check_lengths,
    encode_examples,
    end_of_text,
    is_pairs_file,
    read_examples,
    split_examples,
)
from ..data.documents import apply_template, has_mask, mask_symbol, templated
from ..data.example_batches import EncodedExamples, ExampleBatch, ExampleBatches, PackedBatch
from ..data.mixture import MixtureBatches
from ..data.tokenizers import Tokenizer, make_tokenizer
from ..errors import MAX_TOKENS, MIXTURE, ConfigError, option
from ..nn.config import ModelConfig
from ..nn.cores import packed_mask
from ..nn.experts import with_auxiliary_loss
from ..nn.generation import GenerationConfig
from ..nn.losses import weighted_cross_entropy
from ..train.config import TrainConfig
from ..train.options import TrainerOptions
from ..train.topology import Topology
from .lm_corpus import DEFAULTS, Corpus, LoadedCorpus, Settings
from .lm_data import DataConfig
from .run_tokens import Tensors, TokenizerSource
from .sampling import SampleConfig
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


def build_examples(tokenizers: TokenizerSource, data: DataConfig) -> tuple[Tokenizer, Tensors]:
    """The tokenizer (`tokenizers.make_tokenizer(text)`) and the encoded splits of the pairs in `data.path`, as
    tokens.safetensors holds them (`LoadedPairs.tensors`): `train` and `val` (every example's ids, one after
    another), `train_lengths` and `val_lengths` (each example's prompt and completion token counts), `chars` (the
    characters of each split) and the training examples' kinds of question (`kind_tensors`). What it refuses, it
    refuses before anything is written."""
    examples, template = read_examples(data.path), data.template
    text = "".join(apply_template(template, example.prompt, "") + example.completion for example in examples)
    tokenizer = tokenizers.make_tokenizer(text)
    end_of_text(tokenizer)  # a DataError when the tokenizer has none
    mask = mask_symbol(data.mask, tokenizer.kind)
    examples = templated(examples, template, tokenizer, mask, str(data.path))  # data.template, if any
    check_examples(examples, tokenizer, str(data.path))
    tokens: dict[str, Tensor] = {}
    chars = []
    for split, chosen in zip(SPLITS, split_examples(len(examples), data.val_fraction, str(data.path))):
        part = [examples[k] for k in chosen]
        ids = encode_examples(part, tokenizer)
        check_lengths(part, ids["lengths"], data.context, str(data.path))
        tokens[split], tokens[f"{split}_lengths"] = ids["ids"], ids["lengths"]
        chars.append(sum(len(example.prompt) + len(example.completion) for example in part))
        if split == "train":
            tokens.update(kind_tensors([example.kind for example in part]))
    tokens["chars"] = torch.tensor(chars)
    return tokenizer, tokens


def kind_tensors(kinds: list[str] | tuple[str, ...]) -> Tensors:
    """The kinds of question of a run's training examples, stored with its tokens so that `kqv eval` groups its
    baselines by them without the file of pairs: `train_kinds` (each example's index into the names) and
    `kind_names` (the names as the UTF-8 bytes of a JSON list)."""
    names = sorted(set(kinds))
    index = {name: k for k, name in enumerate(names)}
    return {
        "train_kinds": torch.tensor([index[kind] for kind in kinds], dtype=torch.int32),
        "kind_names": json_tensor(names),
    }


def json_tensor(value: Any) -> Tensor:
    """`value` as the UTF-8 bytes of its JSON: text that tokens.safetensors (tensors alone) can hold."""
    return torch.tensor(list(json.dumps(value).encode()), dtype=torch.uint8)


def from_json_tensor(tensor: Tensor) -> Any:
    """The value `json_tensor` stored."""
    return json.loads(bytes(tensor.tolist()).decode())


def packable(model: ModelConfig, packing: bool | str) -> bool:
    """Whether `model` takes packed rows: a packed row's mask is block-diagonal, which only full attention takes
    (the sparse kinds take padding masks only). data.packing=true (`packing`) on a model with another kind in some
    layer is refused, before anything is written (`LoadedExamples.check`) and wherever packing is decided."""
    kinds = sorted(set(model.layer_attention_kinds()) - {"full"})
    if packing is True and kinds:
        raise ConfigError(
            f"data.packing needs attention='full' in every layer (a packed row's mask keeps each example to "
            f"itself, which {', '.join(kinds)} attention cannot take); set data.packing=false"
        )
    return not kinds


def decide_packing(model: ModelConfig, packing: bool | str, batches: ExampleBatches) -> bool:
    """Whether the rows of `batches` (not yet packed, no batch made) are packed for `model`: data.packing's
    `packing`, decided here alone, once per batch maker and before its first batch. A model that cannot take packed
    rows (`packable`) pads them; elsewhere "auto" packs where the first pass's batches would hold a larger share of
    real tokens packed than padded (`ExampleBatches.fills`). A packed row costs about what a row of plain text of
    its width costs (`benchmarks/example_throughput.py`), and a batch is as wide as its longest row, so the fuller
    layout is the faster: examples cut at random or of different lengths pack, and examples of about one length,
    too long for two to share a row, are padded."""
    if not packable(model, packing):
        return False
    if packing != "auto":
        return bool(packing)
    padded, packed = batches.fills()
    return packed > padded


def example_batches(batches: ExampleBatches, model: ModelConfig, packing: bool | str) -> ExampleBatches:
    """`batches` with its packing decided for `model` (`decide_packing`): what every batch maker of examples is
    made through, before any batch."""
    return replace(batches, packing=decide_packing(model, packing, batches))


def batch_options(data: DataConfig, train: TrainConfig) -> dict[str, Any]:
    """What every `ExampleBatches` of a training takes from its settings (pairs, and each source of a mixture)."""
    return {
        "batch_size": train.batch_size,
        "context": data.context,
        "seed": train.seed,
        "prompt_loss_weight": data.prompt_loss_weight,
    }


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


def example_loss(model: nn.Module, batch: ExampleBatch) -> Tensor:
    """The loss of a batch of examples (`ExampleBatches.batch`, a `PackedBatch` or a `PaddedBatch`): the model's
    mean cross-entropy over the targets that count (completion, end of text, and the prompt unless its weight is
    0), or, with `weights`, the weighted mean of the cross-entropy computed from the logits. Nothing is read back
    to the host."""
    if isinstance(batch, PackedBatch):  # (batch, 1, time, time): each example sees only itself, from position 0
        mask, positions = packed_mask(batch.sequences), batch.positions
    else:  # (batch, time): padding (after the example, so a causal model never sees it)
        mask, positions = batch.attention_mask, None
    if batch.weights is None:
        return model(batch.ids, batch.targets, attention_mask=mask, positions=positions)
    logits = model(batch.ids, attention_mask=mask, positions=positions)
    return with_auxiliary_loss(model, weighted_cross_entropy(logits, batch.targets, batch.weights))


def held_out_loss(model: nn.Module, examples: EncodedExamples, batch_size: int) -> dict[str, float]:
    """The completion loss of (up to `SCORED_EXAMPLES` of) a pair run's validation `examples` given their prompts
    (`kqv.jobs.scoring.completion_nats`): `loss` (nats per completion token, the end of text included),
    `perplexity`, `bits_per_token`, `tokens` and `examples` scored."""
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


@dataclass(frozen=True, eq=False)
class LoadedExamples(LoadedCorpus):
    """A corpus of examples, loaded (pairs, or documents made into examples: `kqv.jobs.lm_documents.LoadedDocuments`):
    its tokenizer (with an end of text), its `train` and `val` examples, and the characters of each split
    (`chars`); batches pad or pack them, and the completion loss of the held-out examples is the run's figure."""

    tokenizer: Tokenizer
    train: EncodedExamples
    val: EncodedExamples
    chars: tuple[int, int]
    data: DataConfig

    @property
    def train_tokens(self) -> int:
        return len(self.train.ids)

    @property
    def val_tokens(self) -> int:
        return len(self.val.ids)

    def check(self, model: ModelConfig, prompt: str) -> None:
        packable(model, self.data.packing)  # the examples' lengths were checked as they were encoded

    def trainer_options(self, train: TrainConfig, topology: Topology, model: ModelConfig) -> TrainerOptions:
        """train_batches, val_batches, loss_fn, loss_terms and tokens_per_batch of a training of `model` on the
        examples, each split's packing decided (`example_batches`)."""
        options, packing = batch_options(self.data, train), self.data.packing
        training = example_batches(ExampleBatches(self.train, shuffle=True, **options), model, packing)
        validation = example_batches(ExampleBatches(self.val, shuffle=False, **options), model, packing)
        return example_options(training, validation)

    def score(self, model: nn.Module, train: TrainConfig) -> dict[str, float]:
        """The completion loss of the validation examples (`held_out_loss`, a batch's size at a time)."""
        return held_out_loss(model, self.val, train.batch_size)

    def samples(self, model: nn.Module, sample: SampleConfig) -> list[str]:
        """Completions of the first `sample.count` validation prompts, sampled as [sample] says and stopped at the
        end of text: each the prompt, then its completion."""
        examples, tokenizer = self.val, self.tokenizer
        prompts = [tokenizer.decode(examples.parts(k)[0]) for k in range(min(sample.count, len(examples)))]
        options = {"max_new_tokens": sample.max_new_tokens, "temperature": sample.temperature, "top_k": sample.top_k}
        answers = complete(model, tokenizer, prompts, GenerationConfig(**options))
        return [prompt + answer for prompt, answer in zip(prompts, answers)]

    def held_out(self, model: nn.Module, max_tokens: int | None) -> dict[str, Any]:
        """The validation examples' completion loss (`held_out_loss`), the examples scored whole (so `max_tokens`
        is refused)."""
        if max_tokens is not None:
            raise ConfigError(f"a pair run's validation examples are scored whole; drop {option(MAX_TOKENS)}")
        figures = held_out_loss(model, self.val, BATCH_SIZE)
        source = f"the completions of the {figures.pop('examples')} held-out validation examples"
        return {"source": source, **figures}

    @abstractmethod
    def answers(self) -> tuple[list[str], list[str]] | None:
        """The completions of the pairs the run trained on and their kinds of question (None: it trained on none)."""

    def conclusion(self, val: dict[str, float], after: str) -> str:
        return f"validation completion loss {val['loss']:.3f} nats/token over {val['examples']} examples {after}"


@dataclass(frozen=True, eq=False)
class LoadedPairs(LoadedExamples):
    """A file of pairs, loaded: its examples (`LoadedExamples`) and the kind of question of each training example
    (`kinds`; None for a run trained before its kinds were stored: `DEFAULT_KIND` each)."""

    kinds: tuple[str, ...] | None

    def answers(self) -> tuple[list[str], list[str]]:
        """The completions of the run's training examples and their kinds."""
        kinds = self.kinds or (DEFAULT_KIND,) * len(self.train)
        return fine_tuning_answers(self.tokenizer, self.train), list(kinds)

    def tensors(self) -> Tensors:
        """tokens.safetensors's tensors (`build_examples`): each split's ids and lengths, the training examples'
        kinds, the characters of each split."""
        train, val = self.train, self.val
        kinds = {} if self.kinds is None else kind_tensors(self.kinds)
        return {"train": train.ids, "train_lengths": train.lengths, **kinds, "val": val.ids,
                "val_lengths": val.lengths, "chars": torch.tensor(self.chars)}  # fmt: skip

    @classmethod
    def from_tensors(cls, tokenizer: Tokenizer, tensors: Tensors, data: DataConfig) -> LoadedPairs:
        """The corpus `tensors()` stored (a run trained before its kinds were stored has none)."""
        kinds = None
        if (index := tensors.get("train_kinds")) is not None:
            names = from_json_tensor(tensors["kind_names"])
            kinds = tuple(names[k] for k in index.tolist())
        train = EncodedExamples(tensors["train"], tensors["train_lengths"])
        val = EncodedExamples(tensors["val"], tensors["val_lengths"])
        return cls(tokenizer, train, val, tuple(tensors["chars"].tolist()), data, kinds)


class Examples(Corpus):
    """A corpus of examples (pairs, or documents made into examples: `kqv.jobs.lm_documents.Documents`): a tokenizer
    with an end of text (`LoadedExamples`). `corrupt`: whether spans of its documents are masked (span
    corruption)."""

    corrupt = False

    def mask(self) -> str | None:
        """The mask symbol of span corruption, or of a template with `{mask}`."""
        if self.corrupt or has_mask(self.data.template):
            return mask_symbol(self.data.mask, self.data.tokenizer)
        return None

    def make_tokenizer(self, text: str) -> Tokenizer:
        return pairs_tokenizer(self.data.tokenizer, text, self.data.vocab_size, self.mask())

    def trained_answers(self, trained: Callable[[], LoadedExamples]) -> tuple[list[str], list[str]] | None:
        return trained().answers()


def pair_advice(data: DataConfig, given: list[str]) -> str:
    named, several = " and ".join(f"data.{name}" for name in given), len(given) > 1
    return (
        f"{named} {'apply' if several else 'applies'} to a file of prompt -> completion pairs (data.path a .tsv "
        f"or .jsonl file), not to text ({data.path or 'Shakespeare'}); drop {'them' if several else 'it'}"
    )


# The prompt's weight, packing and the template: how examples of pairs are weighted, batched and written (packing
# off asks for what a text does anyway, and is not refused)
PAIR_SETTINGS = Settings(
    ("prompt_loss_weight", "packing", "template"),
    pair_advice,
    given=lambda data, name: getattr(data, name) not in (getattr(DEFAULTS, name), False),
)


class Pairs(Examples):
    """A file of prompt -> completion pairs (data.path a .tsv or .jsonl file: the module docstring)."""

    settings = (PAIR_SETTINGS,)

    @staticmethod
    def reads(data: DataConfig) -> bool:
        return data.path is not None and is_pairs_file(data.path)

    @classmethod
    def check_as_source(cls, path: str | None, data: DataConfig) -> None:
        if data.objective == "span_corruption" and not data.sources:
            raise ConfigError(
                f"data.objective='span_corruption' masks spans of text documents, and {path} is a file of "
                f"pairs; give a text, or mix them: {option(MIXTURE, path=path)}"
            )

    def build(self, tokenizers: TokenizerSource) -> LoadedPairs:
        return self.read(*build_examples(tokenizers, self.data))

    def read(self, tokenizer: Tokenizer, tensors: Tensors) -> LoadedPairs:
        return LoadedPairs.from_tensors(tokenizer, tensors, self.data)
