"""The classification job: a `SequenceClassifier` learns the labels of a TSV file of `text<TAB>label` lines.

A deterministic share is held out as the dev set, whose accuracy is reported with the majority-class baseline.
Starting from an MLM run (`init = "runs/mlm"`) fine-tunes its encoder and reuses its vocabulary; otherwise
everything is trained from scratch. A run directory holds `run.toml` (with `task = "cls"` and the label names),
`tokenizer/`, `checkpoint/`, `metrics.jsonl`, `loss.png` and `summary.json`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from ..data.batches import batch_generator
from ..data.padding import pad_batch
from ..data.tsv import read_tsv, split_examples
from ..data.vocabulary import Vocabulary
from ..errors import DATA_FILE, ConfigError, DataError, option
from ..nn.config import ModelConfig
from ..nn.devices import on_device_of
from ..nn.heads import SequenceClassifier
from ..nn.models import count_parameters
from ..train.layout import RunFiles
from ..train.options import TrainerOptions
from ..train.runs import RunConfig, read_run
from ..train.slices import is_sliced, set_slices
from ..validation import Config
from .base import Job, Outcome, TrainedRun, Training
from .mlm import MLMJob

Example = tuple[str, str]  # (text, label)


@dataclass
class ClsDataConfig(Config):
    """The TSV file, its dev share, and the vocabulary when not starting from an MLM run."""

    section: ClassVar[str] = "data"
    path: str | None = None  # a TSV file of text<TAB>label lines (required)
    tokenizer: Literal["char", "bpe"] = "char"  # when not starting from an MLM run
    vocab_size: int = 1024
    max_tokens: int = 128  # [CLS] + text, longer texts are cut
    dev_fraction: float = 0.1
    init: str | None = None  # an MLM run directory whose encoder and vocabulary to start from

    def check(self) -> None:
        if not 0 < self.dev_fraction < 1:
            raise ConfigError(f"data.dev_fraction must be in (0, 1), got {self.dev_fraction}")
        if self.max_tokens < 2:
            raise ConfigError(f"data.max_tokens must be at least 2 ([CLS] and one token), got {self.max_tokens}")


@dataclass
class HeadConfig(Config):
    """How the encoder's outputs become one vector per text."""

    section: ClassVar[str] = "head"
    pooling: Literal["first", "mean"] = "mean"


@dataclass
class ClsRunConfig(RunConfig):
    """The whole job: `model` is the ModelConfig (its vocab_size decided by the vocabulary; max_len defaults to
    data.max_tokens); when fine-tuning an MLM run only its dropout is used, if given."""

    task: ClassVar[str] = "cls"
    run_tables: ClassVar[tuple[str, ...]] = ("labels",)
    data: ClsDataConfig = field(default_factory=ClsDataConfig)
    head: HeadConfig = field(default_factory=HeadConfig)

    def model_defaults(self) -> dict[str, Any]:
        return {"max_len": self.data.max_tokens}


@dataclass(repr=False)  # TrainedRun.__repr__: the model is too long to print
class ClsRun(TrainedRun):
    """A trained classifier; `labels[i]` is the name of class i."""

    @property
    def labels(self) -> list[str]:
        return self.values["labels"]["names"]


class LabelledBatches:
    """The encoded examples of a split as batches (ids, attention_mask, targets), and dev accuracy."""

    def __init__(
        self, examples: list[Example], vocabulary: Vocabulary, labels: list[str], max_tokens: int, batch_size: int
    ):
        self.ids = [[vocabulary.cls_id, *vocabulary.encode(text)[: max_tokens - 1]] for text, _ in examples]
        self.targets = torch.tensor([labels.index(label) for _, label in examples])
        self.pad_id, self.batch_size = vocabulary.pad_id, batch_size

    def take(self, rows: list[int]) -> tuple[Tensor, Tensor, Tensor]:
        return (*pad_batch([self.ids[r] for r in rows], self.pad_id), self.targets[rows])

    def random(self, seed: int, i: int) -> tuple[Tensor, Tensor, Tensor]:
        """Training batch i: rows drawn with the generator of batch i."""
        return self.take(torch.randint(len(self.ids), (self.batch_size,), generator=batch_generator(seed, i)).tolist())

    def cyclic(self, i: int) -> tuple[Tensor, Tensor, Tensor]:
        """Validation batch i: the next `batch_size` rows, wrapping around."""
        start = (i * self.batch_size) % len(self.ids)
        return self.take([(start + j) % len(self.ids) for j in range(self.batch_size)])

    @torch.no_grad()
    def accuracy(self, model: torch.nn.Module, majority: int) -> dict[str, float]:
        correct = 0
        for start in range(0, len(self.ids), self.batch_size):
            rows = list(range(start, min(start + self.batch_size, len(self.ids))))
            ids, attention_mask, targets = on_device_of(model, self.take(rows))
            correct += int((model(ids, attention_mask=attention_mask).argmax(dim=-1) == targets).sum())
        return {
            "dev_accuracy": correct / len(self.ids),
            "majority_accuracy": float((self.targets == majority).float().mean()),
        }


def read_examples(data: ClsDataConfig, seed: int) -> tuple[list[Example], list[Example], list[Example], list[str]]:
    """The TSV file's examples, their train and dev split, and the sorted labels (at least two)."""
    if data.path is None:
        raise ConfigError(f"classification needs a TSV file of text<TAB>label lines: give {option(DATA_FILE)}")
    examples = read_tsv(data.path)
    train, dev = split_examples(examples, data.dev_fraction, seed)
    labels = sorted({label for _, label in examples})
    if len(labels) < 2:
        raise DataError(f"{data.path} has only the label {labels}; classification needs at least two")
    return examples, train, dev, labels


@dataclass
class ClsData:
    """A classification training's data: the train and dev examples, the labels, the vocabulary and model config,
    and the MLM run whose encoder it starts from (None: from scratch)."""

    train: list[Example]
    dev: list[Example]
    labels: list[str]
    vocabulary: Vocabulary
    model_config: ModelConfig
    pretrained: TrainedRun | None


ClsTraining = Training[ClsRunConfig, ClsData, None]  # `ClsJob.train`'s


class ClsJob(Job):
    """`kqv train cls`: an encoder with a classification head on labelled text, from scratch or an mlm run's encoder."""

    name = "cls"
    help = "train a sequence classifier on a TSV file of text<TAB>label lines"
    config_class = ClsRunConfig
    run_class = ClsRun
    noun = "classification"
    load_tokenizer = MLMJob.load_tokenizer

    def build_model(
        self, model_config: ModelConfig, config: ClsRunConfig, values: dict[str, Any]
    ) -> SequenceClassifier:
        return SequenceClassifier(model_config, len(values["labels"]["names"]), config.head.pooling)

    def make_corpus(self, training: ClsTraining) -> ClsData:
        """The examples, their split and labels, and the vocabulary and model config: a pretrained MLM run's (with
        `data.init`), a resumed run's, or new ones; the vocabulary is saved into the run."""
        config, run = training.config, training.run
        examples, train, dev, labels = read_examples(config.data, config.train.seed)
        pretrained = MLMJob().load(config.data.init) if config.data.init else None
        resume = run.if_exists == "resume"
        vocabulary, model_config = self._vocabulary(config, run.path, resume, pretrained, examples, train)
        if run.writes:
            run.path.mkdir(parents=True, exist_ok=True)
            run.write_tokenizer(vocabulary.files())
        return ClsData(train, dev, labels, vocabulary, model_config, pretrained)

    def make_model(self, training: ClsTraining) -> SequenceClassifier:
        """A classifier, its encoder the pretrained MLM run's when there is one."""
        data = training.data
        model = self.start(training.config, training.run, data.model_config, labels={"names": data.labels})
        if data.pretrained is not None and is_sliced(model):  # FSDP: this process's rows of it (kqv.train.slices)
            set_slices(model, {f"encoder.{k}": v for k, v in data.pretrained.model.encoder.state_dict().items()})
        elif data.pretrained is not None:
            model.encoder.load_state_dict(data.pretrained.model.encoder.state_dict())
        return model

    def trainer_options(self, training: ClsTraining) -> TrainerOptions:
        """Random training batches; the dev set in turn for the loss, and whole for the accuracy (beside always
        answering the majority class of the training examples)."""
        config, data = training.config, training.data
        learned = data.model_config.position == "learned"
        max_tokens = min(config.data.max_tokens, data.model_config.max_len) if learned else config.data.max_tokens
        train_set, dev_set = (
            LabelledBatches(part, data.vocabulary, data.labels, max_tokens, config.train.batch_size)
            for part in (data.train, data.dev)
        )
        majority = Counter(train_set.targets.tolist()).most_common(1)[0][0]
        return TrainerOptions(
            train_batches=lambda i: train_set.random(config.train.seed, i),
            val_batches=dev_set.cyclic,
            loss_fn=lambda model, batch: model(batch[0], batch[2], attention_mask=batch[1]),
            eval_fn=lambda model: dev_set.accuracy(model, majority),
        )

    def describe(self, training: ClsTraining) -> str:
        data = training.data
        start = f"the encoder of {training.config.data.init}" if data.pretrained is not None else "scratch"
        return (
            f"{count_parameters(training.model):,} parameters from {start}, {len(data.train)} training and "
            f"{len(data.dev)} dev examples, {len(data.labels)} labels, run directory {training.run.destination}"
        )

    def outcome(self, training: ClsTraining) -> Outcome:
        data, final = training.data, training.result.final
        return Outcome(
            {
                "train_examples": len(data.train),
                "dev_examples": len(data.dev),
                "labels": data.labels,
                "dev_accuracy": final.get("dev_accuracy"),
                "majority_accuracy": final.get("majority_accuracy"),
            }
        )

    def conclusion(self, training: ClsTraining, summary: dict[str, Any]) -> str:
        return (
            f"dev accuracy {summary['dev_accuracy']:.1%} on {summary['dev_examples']} examples (majority class: "
            f"{summary['majority_accuracy']:.1%}) after {summary['steps']} steps in "
            f"{training.result.minutes}"
        )

    def _vocabulary(
        self,
        config: ClsRunConfig,
        run_dir: Path,
        resume: bool,
        pretrained: TrainedRun | None,
        examples: list[Example],
        train: list[Example],
    ) -> tuple[Vocabulary, ModelConfig]:
        """The vocabulary and model config: the MLM run's, the resumed run's, or new ones."""
        if pretrained is not None:
            dropout = {"dropout": config.model.dropout} if "dropout" in config.model_options else {}
            return pretrained.tokenizer, pretrained.model.config.replace(**dropout)
        if resume and RunFiles(run_dir).tokenizer_dir.exists():
            return self.load_tokenizer(run_dir), self.model_config_of_run(read_run(run_dir, self.name))
        data = config.data
        texts = [text for text, _ in (examples if data.tokenizer == "char" else train)]  # chars: all, or dev fails
        vocabulary = Vocabulary.train(data.tokenizer, "\n".join(texts), data.vocab_size)
        model_config = config.model.replace(vocab_size=vocabulary.size)
        return vocabulary, model_config


JOB = ClsJob()
train_cls = JOB.train
