"""The Vision Transformer job: a `ViT` learns scikit-learn's 8x8 handwritten digits (`kqv train vit`).

The 1,797 images are split once, by a seeded shuffle, into test, validation and training parts; pixels are
standardised with the training part's mean and deviation. The ViT trains with the shared Trainer (validation loss
and accuracy every `eval_every` updates); then, unless `data.baseline = "none"`, a baseline without attention
(`mlp` or `conv`, from `kqv.nn.vision`) trains on the same batches with the same optimizer for the ViT's training
time, and its test accuracy after the same number of updates is kept too; every accuracy goes into summary.json:
honest numbers, no augmentation. `kqv eval RUN` prints
the test accuracy; `kqv attention RUN` draws [CLS]'s attention over the patches of a few test images.
A run directory holds `run.toml` (task = "vit", the image shape and pixel statistics), `checkpoint/`,
`metrics.jsonl`, `loss.png` and `summary.json`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from ..data.batches import batch_generator
from ..data.digits import DIGITS_CLASSES, DIGITS_SHAPE, load_digits_images, split_indices, standardise
from ..errors import IMAGES, ConfigError, option
from ..nn.config import ModelConfig
from ..nn.devices import on_device_of
from ..nn.models import count_parameters
from ..nn.vision import ConvClassifier, MLPClassifier, ViT
from ..train.options import TrainerOptions
from ..train.runs import RunConfig
from ..validation import Config, check_at_least
from .base import Job, Outcome, TrainedRun, Training
from .offers import Evaluates, ShowsAttention

BASELINES = {"mlp": MLPClassifier, "conv": ConvClassifier}


@dataclass
class VitDataConfig(Config):
    """The patches, the held-out shares of the digits, and the baseline trained beside the ViT."""

    section: ClassVar[str] = "data"
    patch_size: int = 2
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    baseline: Literal["mlp", "conv", "none"] = "mlp"

    def check(self) -> None:
        if not (
            0 < self.val_fraction < 1 and 0 < self.test_fraction < 1 and self.val_fraction + self.test_fraction < 1
        ):
            raise ConfigError(
                f"data.val_fraction ({self.val_fraction}) and data.test_fraction "
                f"({self.test_fraction}) must be in (0, 1) and leave some training images"
            )


@dataclass
class VitRunConfig(RunConfig):
    """The whole job: `model` is the ModelConfig (vocab_size is unused by a ViT; max_len defaults to the number
    of patches + [CLS])."""

    task: ClassVar[str] = "vit"
    run_tables: ClassVar[tuple[str, ...]] = ("images",)
    data: VitDataConfig = field(default_factory=VitDataConfig)

    @property
    def n_tokens(self) -> int:
        """The patches of an 8x8 digit, plus [CLS]."""
        return 1 + (DIGITS_SHAPE[-1] // self.data.patch_size) ** 2

    def model_defaults(self) -> dict[str, Any]:
        return {"max_len": self.n_tokens}


@dataclass
class Digits:
    """The standardised digits of one run, split: images (n, 1, 8, 8) and labels (n,) per part."""

    images: dict[str, Tensor]
    labels: dict[str, Tensor]
    mean: float
    std: float

    @classmethod
    def load(cls, data: VitDataConfig, seed: int, stats: tuple[float, float] | None = None) -> Digits:
        images, labels = load_digits_images()
        parts = split_indices(len(labels), data.val_fraction, data.test_fraction, seed)
        mean, std = stats or (float(images[parts["train"]].mean()), float(images[parts["train"]].std()))
        return cls(
            {k: standardise(images[i], mean, std) for k, i in parts.items()},
            {k: labels[i] for k, i in parts.items()},
            mean,
            std,
        )

    def batch(self, part: str, batch_size: int, seed: int, i: int) -> tuple[Tensor, Tensor]:
        rows = torch.randint(len(self.labels[part]), (batch_size,), generator=batch_generator(seed, i))
        return self.images[part][rows], self.labels[part][rows]

    @torch.no_grad()
    def accuracy(self, model: nn.Module, part: str) -> float:
        was_training = model.training
        model.eval()
        predicted = torch.cat(
            [model(on_device_of(model, chunk)).argmax(-1).cpu() for chunk in self.images[part].split(256)]
        )
        model.train(was_training)
        return float((predicted == self.labels[part]).float().mean())


def train_baseline(
    name: str, config: VitRunConfig, digits: Digits, seconds: float, steps: int | None = None
) -> dict[str, Any]:
    """The baseline on the ViT's batches (in the same order, continued past its last one), with AdamW at the same
    learning rate, for the ViT's training time (`seconds`, updates only); its test accuracy after as many updates as
    the ViT (`steps`: as many as its budget planned; default `train.steps`) is recorded too. Equal time is the fair
    budget (a baseline's update is cheaper); equal updates is the one that does not depend on the machine's load."""
    torch.manual_seed(config.train.seed)
    model, train = BASELINES[name](DIGITS_SHAPE, DIGITS_CLASSES), config.train
    optimizer = torch.optim.AdamW(model.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    result: dict[str, Any] = {"baseline": name, "baseline_parameters": count_parameters(model)}
    step, spent, steps = 0, 0.0, train.steps if steps is None else steps
    while step < steps or spent < seconds:
        started = time.perf_counter()
        loss = model(*digits.batch("train", train.batch_size, train.seed, step))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        spent, step = spent + time.perf_counter() - started, step + 1
        if step == steps:
            result["baseline_test_accuracy_same_steps"] = digits.accuracy(model, "test")
        if spent >= seconds and "baseline_steps" not in result:
            result.update(
                baseline_steps=step,
                baseline_seconds=round(spent, 1),
                baseline_test_accuracy=digits.accuracy(model, "test"),
            )
    return result


@dataclass(frozen=True)
class VitEvaluation:
    """What `VitRun.evaluate` measured: the accuracy on the `test_images` held-out digits."""

    test_accuracy: float
    test_images: int

    def to_dict(self) -> dict[str, float]:
        return {"test_accuracy": self.test_accuracy, "test_images": self.test_images}


@dataclass(frozen=True)
class ClsAttention:
    """[CLS]'s attention over the patches of some test images: `maps` (layers, images, grid_h, grid_w), heads
    averaged; the images (images, height, width), their true and predicted digits."""

    maps: Tensor
    images: Tensor
    labels: list[int]
    predicted: list[int]

    def __repr__(self) -> str:
        layers, images, height, width = self.maps.shape
        return f"ClsAttention({layers} layers over {height}x{width} patches of {images} images)"


@dataclass(repr=False)  # TrainedRun.__repr__: the model is too long to print
class VitRun(TrainedRun, Evaluates, ShowsAttention):
    """A trained Vision Transformer: its test accuracy, and where [CLS] looks."""

    def test_digits(self) -> Digits:
        return Digits.load(
            self.config.data, self.config.train.seed, (self.values["images"]["mean"], self.values["images"]["std"])
        )

    def evaluate(self) -> VitEvaluation:
        """The accuracy on the held-out test digits (the same split as in training)."""
        digits = self.test_digits()
        return VitEvaluation(digits.accuracy(self.model, "test"), len(digits.labels["test"]))

    def attention(self, images: int = 4) -> ClsAttention:
        """[CLS]'s attention over the patches of the first `images` test images, and the model's guesses."""
        check_at_least(option(IMAGES), images, 1)
        digits = self.test_digits()
        pixels, labels = digits.images["test"][:images], digits.labels["test"][:images]  # (images, 1, h, w)
        with torch.no_grad():
            on_model = on_device_of(self.model, pixels)
            maps = self.model.cls_attention(on_model).mean(dim=2).cpu()  # (layers, images, grid_h, grid_w), heads mean
            predicted = self.model(on_model).argmax(-1)
        return ClsAttention(maps, pixels[:, 0], labels.tolist(), predicted.tolist())


VitTraining = Training[VitRunConfig, Digits, None]  # `VitJob.train`'s


class VitJob(Job):
    """`kqv train vit`: a Vision Transformer on 8x8 digits, trained beside a baseline."""

    name = "vit"
    help = "train a Vision Transformer on scikit-learn's 8x8 handwritten digits, beside a baseline"
    config_class = VitRunConfig
    run_class = VitRun
    noun = "vision"

    def build_model(self, model_config: ModelConfig, config: VitRunConfig, values: dict[str, Any]) -> ViT:
        images = values["images"]
        return ViT(model_config, tuple(images["shape"]), config.data.patch_size, images["classes"])

    def load_tokenizer(self, run_dir: Path) -> None:
        return None  # images need none

    def make_corpus(self, training: VitTraining) -> Digits:
        """The digits, split and standardised."""
        return Digits.load(training.config.data, training.config.train.seed)

    def make_model(self, training: VitTraining) -> nn.Module:
        digits = training.data
        images = {"shape": list(DIGITS_SHAPE), "classes": DIGITS_CLASSES, "mean": digits.mean, "std": digits.std}
        return self.start(training.config, training.run, training.config.model.replace(vocab_size=1), images=images)

    def trainer_options(self, training: VitTraining) -> TrainerOptions:
        """Random batches of the training and validation images; the validation accuracy at each evaluation."""
        digits, seed, batch_size = training.data, training.config.train.seed, training.config.train.batch_size
        return TrainerOptions(
            train_batches=lambda i: digits.batch("train", batch_size, seed, i),
            val_batches=lambda i: digits.batch("val", batch_size, seed, -i - 1),
            loss_fn=lambda model, batch: model(*batch),
            eval_fn=lambda model: {"val_accuracy": digits.accuracy(model, "val")},
        )

    def describe(self, training: VitTraining) -> str:
        config = training.config
        return (
            f"ViT of {count_parameters(training.model):,} parameters, {config.n_tokens - 1} patches of "
            f"{config.data.patch_size}x{config.data.patch_size} + [CLS], {len(training.data.labels['train'])} "
            f"training images, run directory {training.run.destination}"
        )

    def outcome(self, training: VitTraining) -> Outcome:
        """The test accuracy, and the baseline's (`train_baseline`) for the ViT's training time and updates."""
        config, digits, trainer = training.config, training.data, training.result.trainer
        baseline = (
            {}
            if config.data.baseline == "none"
            else train_baseline(config.data.baseline, config, digits, trainer.train_seconds, trainer.step)
        )
        return Outcome(
            {
                "test_images": len(digits.labels["test"]),
                "test_accuracy": digits.accuracy(training.model, "test"),
                **baseline,
            }
        )

    def conclusion(self, training: VitTraining, summary: dict[str, Any]) -> str:
        against = (
            f" ({summary['baseline']} baseline: {summary['baseline_test_accuracy']:.1%} in the same time, "
            f"{summary['baseline_steps']} steps; {summary['baseline_test_accuracy_same_steps']:.1%} after the same "
            f"steps)"
            if "baseline" in summary
            else ""
        )
        return (
            f"ViT test accuracy {summary['test_accuracy']:.1%} on {summary['test_images']} images{against} after "
            f"{summary['steps']} steps in {training.result.minutes}"
        )


JOB = VitJob()
