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
from ..errors import ConfigError, DataError
from ..nn.config import ModelConfig
from ..nn.devices import on_device_of
from ..nn.heads import SequenceClassifier
from ..nn.models import count_parameters
from ..train.runs import TOKENIZER_DIR, RunConfig, read_run
from ..validation import Config
from .base import Job, TrainedRun
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
        raise ConfigError("kqv train cls needs a TSV file of text<TAB>label lines: pass --data file.tsv")
    examples = read_tsv(data.path)
    train, dev = split_examples(examples, data.dev_fraction, seed)
    labels = sorted({label for _, label in examples})
    if len(labels) < 2:
        raise DataError(f"{data.path} has only the label {labels}; classification needs at least two")
    return examples, train, dev, labels


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

    def train(
        self,
        config: ClsRunConfig,
        run_dir: str | Path,
        *,
        resume: bool = False,
        overwrite: bool = False,
        quiet: bool = False,
    ) -> dict[str, Any]:
        """Fine-tune (or train from scratch) a `SequenceClassifier` on a TSV file; return the summary."""
        with self.open_run(run_dir, resume=resume, overwrite=overwrite) as run:
            data = config.data
            examples, train, dev, labels = read_examples(data, config.train.seed)
            pretrained = MLMJob().load(data.init) if data.init else None
            vocabulary, model_config = self._vocabulary(config, run.path, resume, pretrained, examples, train)
            if run.writes:
                run.path.mkdir(parents=True, exist_ok=True)
                vocabulary.save(run.tokenizer_dir)
            model = self.start(config, run, model_config, labels={"names": labels})
            if pretrained is not None:
                model.encoder.load_state_dict(pretrained.model.encoder.state_dict())
            learned = model_config.position == "learned"
            max_tokens = min(data.max_tokens, model_config.max_len) if learned else data.max_tokens
            train_set, dev_set = (
                LabelledBatches(part, vocabulary, labels, max_tokens, config.train.batch_size) for part in (train, dev)
            )
            majority = Counter(train_set.targets.tolist()).most_common(1)[0][0]
            quiet = quiet or not run.writes  # under torchrun rank 0 speaks for every process
            if not quiet:
                start = "the encoder of " + str(data.init) if pretrained is not None else "scratch"
                print(
                    f"kqv: {count_parameters(model):,} parameters from {start}, {len(train)} training and "
                    f"{len(dev)} dev examples, {len(labels)} labels, run directory {run.destination}"
                )
            result = self.fit(
                self.make_trainer(
                    model,
                    config,
                    run,
                    quiet=quiet,
                    train_batches=lambda i: train_set.random(config.train.seed, i),
                    val_batches=dev_set.cyclic,
                    loss_fn=lambda model, batch: model(batch[0], batch[2], attention_mask=batch[1]),
                    eval_fn=lambda model: dev_set.accuracy(model, majority),
                )
            )
            if not run.writes:
                return {}  # under torchrun rank 0 alone writes the run's summary
            summary = self.summarise(
                run.path,
                result,
                model,
                train_examples=len(train),
                dev_examples=len(dev),
                labels=labels,
                dev_accuracy=result.final.get("dev_accuracy"),
                majority_accuracy=result.final.get("majority_accuracy"),
            )
            if not quiet:
                print(
                    f"kqv: dev accuracy {summary['dev_accuracy']:.1%} on {len(dev)} examples (majority class: "
                    f"{summary['majority_accuracy']:.1%}) after {summary['steps']} steps in "
                    f"{result.wall_seconds / 60:.1f} min"
                )
            return summary

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
        if resume and (run_dir / TOKENIZER_DIR).exists():
            return self.load_tokenizer(run_dir), self.model_config_of_run(read_run(run_dir, self.name))
        data = config.data
        texts = [text for text, _ in (examples if data.tokenizer == "char" else train)]  # chars: all, or dev fails
        vocabulary = Vocabulary.train(data.tokenizer, "\n".join(texts), data.vocab_size)
        model_config = config.model.replace(vocab_size=vocabulary.size)
        return vocabulary, model_config


JOB = ClsJob()
train_cls = JOB.train
