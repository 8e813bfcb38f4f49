"""The masked-language-model job: pretrain a BERT-style encoder (Devlin et al. 2019).

An encoder sees the whole sequence, so it cannot be trained to predict the next token; BERT corrupts the input
instead and asks for the originals (`kqv.data.masking`), with the loss at the selected positions only. Training
blocks come from the LM job's corpora (`kqv.data`: Shakespeare by default). Every evaluation hides 15% of the
validation tokens behind [MASK] (no random or kept tokens: the model must infer each from its context alone) and
reports the accuracy of the model there, `masked_accuracy`, next to `unigram_accuracy`, the accuracy of always
answering the token most frequent among those positions.

A run directory holds `run.toml` (with `task = "mlm"`), `tokenizer/` (with the special tokens' ids),
`tokens.safetensors`, `checkpoint/`, `metrics.jsonl`, `loss.png` and `summary.json`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from ..data.batches import batch_generator, sample_batch
from ..data.masking import mask_tokens
from ..data.vocabulary import Vocabulary
from ..errors import ConfigError
from ..nn.config import ModelConfig
from ..nn.devices import on_device_of
from ..nn.heads import MaskedLM, predicted_positions
from ..train.layout import RunFiles
from ..train.options import TrainerOptions
from ..train.preflight import check_memory, check_splits
from ..train.runs import RunConfig
from ..validation import Config
from .base import Job, Outcome, TrainedRun, Training
from .offers import ExportsHF
from .run_tokens import TextSplits, build_text, describe_corpus, prepare_corpus


@dataclass
class MLMDataConfig(Config):
    """The corpus and its blocks, as for the LM job, with a BPE vocabulary that includes BERT's special tokens."""

    section: ClassVar[str] = "data"
    path: str | None = None  # None: Shakespeare's complete works, as for the LM job
    tokenizer: Literal["char", "bpe"] = "bpe"
    vocab_size: int = 2048  # bpe only, special tokens included
    context: int = 128  # tokens per training block
    val_fraction: float = 0.1

    def check(self) -> None:
        if self.context < 2:
            raise ConfigError(f"data.context must be at least 2, got {self.context}")


@dataclass
class MaskingConfig(Config):
    """BERT's corruption: the share of tokens selected, and how a selected token is hidden."""

    section: ClassVar[str] = "masking"
    mask_prob: float = 0.15
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1

    def check(self) -> None:
        if not 0 < self.mask_prob < 1:
            raise ConfigError(f"masking.mask_prob must be in (0, 1), got {self.mask_prob}")
        if self.mask_token_prob < 0 or self.random_token_prob < 0 or self.mask_token_prob + self.random_token_prob > 1:
            raise ConfigError(
                "masking.mask_token_prob and masking.random_token_prob must be non-negative and add "
                f"up to at most 1, got {self.mask_token_prob} and {self.random_token_prob}"
            )


@dataclass
class MLMRunConfig(RunConfig):
    """The whole job: `model` is the ModelConfig (its vocab_size decided by the vocabulary; max_len defaults to
    data.context)."""

    task: ClassVar[str] = "mlm"
    data: MLMDataConfig = field(default_factory=MLMDataConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)

    def model_defaults(self) -> dict[str, Any]:
        return {"max_len": self.data.context}


@torch.no_grad()
def masked_accuracy(model: torch.nn.Module, batches: list[tuple[Tensor, ...]]) -> dict[str, float]:
    """Accuracy at the masked positions, and that of always answering the most frequent token there; a batch is
    (inputs, targets, ...)."""
    correct, answers = 0, []
    for inputs, targets, *_ in batches:
        inputs, targets = on_device_of(model, (inputs, targets))
        masked = targets != -100
        correct += int((model(inputs).argmax(dim=-1)[masked] == targets[masked]).sum())
        answers.append(targets[masked])
    answers = torch.cat(answers).cpu()
    most_frequent = int(answers.mode().values)
    return {
        "masked_accuracy": correct / len(answers),
        "unigram_accuracy": float((answers == most_frequent).float().mean()),
        "masked_tokens": len(answers),
    }


@dataclass(repr=False)  # TrainedRun.__repr__: the model is too long to print
class MLMRun(TrainedRun, ExportsHF):
    """A trained MLM run; its tokenizer is the encoder's `Vocabulary`."""

    @property
    def vocabulary(self) -> Vocabulary:
        return self.tokenizer

    def export_hf(self, directory: str | Path, *, merge: bool = False) -> Path:
        """Write the run as a Hugging Face BERT directory (`kqv.jobs.export.export_hf`): `BertForMaskedLM`'s
        config.json and model.safetensors, and the tokenizer with [PAD] [CLS] [SEP] [MASK], which
        `transformers.AutoModelForMaskedLM` and `AutoTokenizer` load with the run's logits and ids. BERT's format
        holds learned positions (`--set model.position="learned"` at training), LayerNorm and GELU; anything else
        is refused by name, nothing written. `merge`: nothing to merge in an MLM run."""
        from .export import export_hf

        vocabulary = self.vocabulary
        return export_hf(
            self.model, vocabulary.tokenizer, directory, self.run_dir, "BertForMaskedLM", vocabulary.specials
        )


def check_mlm_run(config: MLMRunConfig, processes: int) -> Callable[[TextSplits], None]:
    """What an MLM training checks once its vocabulary and data exist, before it writes anything: the memory of
    one process's rows of a batch (of `processes`) and a block of context + 1 tokens in each split
    (`kqv.train.preflight`)."""

    def check(splits: TextSplits) -> None:
        train, vocabulary = config.train, splits.tokenizer
        check_memory(
            config.model, train.batch_size, config.data.context, vocabulary.size, train.device,
            precision=train.precision, processes=processes, parallel=train.parallel,
        )  # fmt: skip
        check_splits({"train": splits.train, "val": splits.val}, config.data.context, vocabulary.size)

    return check


MLMTraining = Training[MLMRunConfig, TextSplits, None]  # `MLMJob.train`'s (its tokenizer a `Vocabulary`)


@dataclass(frozen=True)
class Vocabularies:
    """The MLM job's `kqv.jobs.run_tokens.TokenizerSource`: a vocabulary learned from the text as its [data] says, or
    the one a resumed run saved."""

    data: MLMDataConfig

    def make_tokenizer(self, text: str) -> Vocabulary:
        return Vocabulary.train(self.data.tokenizer, text, self.data.vocab_size)

    def load_tokenizer(self, run_dir: Path) -> Vocabulary:
        return load_vocabulary(run_dir)


def load_vocabulary(run_dir: Path) -> Vocabulary:
    """The vocabulary an MLM run saved (its tokenizer/)."""
    return Vocabulary.load(RunFiles(run_dir).tokenizer_dir)


class MLMJob(Job):
    """`kqv train mlm`: masked-language-model pretraining of an encoder."""

    name = "mlm"
    help = "pretrain a BERT-style encoder by masked language modelling (Shakespeare)"
    config_class = MLMRunConfig
    run_class = MLMRun
    noun = "masked-LM"

    def load_tokenizer(self, run_dir: Path) -> Vocabulary:
        return load_vocabulary(run_dir)

    def build_model(self, model_config: ModelConfig, config: RunConfig, values: dict[str, Any]) -> MaskedLM:
        return MaskedLM(model_config)

    def make_corpus(self, training: MLMTraining) -> TextSplits:
        """The vocabulary and the encoded train and validation splits (`kqv.jobs.run_tokens.prepare_corpus`)."""
        data = training.config.data
        return prepare_corpus(
            Vocabularies(data),
            training.run,
            build=lambda vocabularies: build_text(vocabularies, data.path, data.val_fraction, data.tokenizer == "char"),
            read=TextSplits.from_tensors,
            check=check_mlm_run(training.config, training.run.topology.world_size),
        )

    def make_model(self, training: MLMTraining) -> MaskedLM:
        vocabulary = training.data.tokenizer
        return self.start(training.config, training.run, training.config.model.replace(vocab_size=vocabulary.size))

    def trainer_options(self, training: MLMTraining) -> TrainerOptions:
        """Random blocks corrupted by BERT's masking for each update; for evaluation, blocks of the validation split
        with every selected token hidden, and the masked-token accuracy over `train.eval_batches` of them."""
        config, splits = training.config, training.data
        vocabulary, tokens = splits.tokenizer, {"train": splits.train, "val": splits.val}
        context, seed, batch = config.data.context, config.train.seed, config.train.batch_size
        masking = config.masking.to_dict()
        hidden = {**masking, "mask_token_prob": 1.0, "random_token_prob": 0.0}  # evaluation: every selected hidden

        def masked_batch(split: str, i: int, options: dict[str, float]) -> tuple[Tensor, Tensor, Tensor]:
            generator = batch_generator(seed, i)
            blocks = sample_batch(tokens[split], batch, context, generator)[0]  # (batch, context): inputs only
            inputs, targets = mask_tokens(blocks, generator, vocabulary, **options)
            return inputs, targets, predicted_positions(targets)  # found here, on the host: no sync in the step

        evaluation = [masked_batch("val", -i - 1, hidden) for i in range(config.train.eval_batches)]
        return TrainerOptions(
            train_batches=lambda i: masked_batch("train", i, masking),
            val_batches=lambda i: masked_batch("val", -i - 1, hidden),
            loss_fn=lambda model, batch: model(batch[0], batch[1], predicted=batch[2]),
            loss_terms=lambda batch: float((batch[1] != -100).sum()),  # the hidden tokens the loss averages over
            tokens_per_batch=batch * context,
            eval_fn=lambda model: masked_accuracy(model, evaluation),
        )

    def describe(self, training: MLMTraining) -> str:
        splits = training.data
        return describe_corpus(training, splits.tokenizer, splits.tokenizer.size, len(splits.train))

    def outcome(self, training: MLMTraining) -> Outcome:
        final = training.result.final
        return Outcome(
            {
                "masked_accuracy": final.get("masked_accuracy"),
                "unigram_accuracy": final.get("unigram_accuracy"),
                "masked_tokens": int(final.get("masked_tokens", 0)),
            }
        )

    def conclusion(self, training: MLMTraining, summary: dict[str, Any]) -> str:
        return (
            f"masked-token accuracy {summary['masked_accuracy']:.1%} on {summary['masked_tokens']:,} hidden "
            f"validation tokens (always answering the most frequent one: {summary['unigram_accuracy']:.1%}) after "
            f"{summary['steps']} steps in {training.result.minutes}"
        )


JOB = MLMJob()
load_mlm_run, train_mlm = JOB.load, JOB.train
