"""The small character-level Shakespeare language model most experiments train, and what they measure on it.

Every arm of a comparison is trained by kqv's own `Trainer` on the same batches (batch `i` of seed `s` is the
same for every arm) and scored on the same validation blocks (independent of the seed), in fp32 (at these sizes
bf16 autocast is slower on the CPU). A run directory is a temporary one: experiments keep numbers, not weights.
"""

from __future__ import annotations

import functools
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from kqv.data import Tokenizer, batch_generator, encode_text, load_text, make_tokenizer, sample_batch, split_text
from kqv.nn import DecoderLM, ModelConfig, Position, count_parameters
from kqv.train import RunFiles, TrainConfig, Trainer, TrainingDiverged, read_metrics

from .base import TRAINING_DEVICE, ExperimentConfig, Progress

VAL_SEED = 1_000_000_007  # validation blocks are drawn from this seed, whatever the training seed


@dataclass
class EncodedSplits:
    """Token ids to train and validate on (1-D), the vocabulary size, and the tokenizer if there is one."""

    train: Tensor
    val: Tensor
    vocab_size: int
    tokenizer: Tokenizer | None = None


@functools.lru_cache(maxsize=1)
def shakespeare() -> EncodedSplits:
    """Shakespeare's complete works, character-level, 90/10 split as `kqv train lm` makes it (cached per process)."""
    text = load_text()
    train_text, val_text = split_text(text, 0.1)
    tokenizer = make_tokenizer("char", text)
    return EncodedSplits(
        encode_text(tokenizer, train_text), encode_text(tokenizer, val_text), tokenizer.vocab_size, tokenizer
    )


def random_tokens(vocab_size: int, length: int, seed: int = 0) -> EncodedSplits:
    """Uniformly random tokens: nothing to learn, so an honest model's loss stays at ln(vocab_size)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (2 * length,), generator=generator, dtype=torch.int32)
    return EncodedSplits(ids[:length], ids[length:], vocab_size)


@dataclass
class LMConfig(ExperimentConfig):
    """Sizes of the small LM and its training; experiments subclass it to add their own fields.

    `MODEL_FIELDS` and `TRAIN_FIELDS` below say which field sets which field of the ModelConfig and TrainConfig
    every arm is built from; the rest of those configs is fixed for every experiment (`MODEL_FIXED`,
    `TRAIN_FIXED`) or follows from the fields (`train_config`)."""

    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 256
    context: int = 64
    position: Position = "rope"  # kqv's quick LM; sinusoidal sums swamp N(0, 0.02) token embeddings at this size
    batch_size: int = 32
    steps: int = 300
    lr: float = 3e-3
    warmup_steps: int = 30
    eval_every: int = 50
    eval_batches: int = 8
    seeds: int = 3

    def model_config(self, vocab_size: int, **changes: Any) -> ModelConfig:
        """The arm's ModelConfig: the mapped fields, the fixed ones, then the arm's `changes`."""
        values = {target: getattr(self, name) for name, target in MODEL_FIELDS.items()}
        return ModelConfig(**{"vocab_size": vocab_size, **values, **MODEL_FIXED, **changes})

    def train_config(self, seed: int, **changes: Any) -> TrainConfig:
        """The arm's TrainConfig: the mapped fields, the fixed ones, one checkpoint at the end, a train-loss
        record five times per evaluation, then the arm's `changes`."""
        values = {target: getattr(self, name) for name, target in TRAIN_FIELDS.items()}
        derived = {"checkpoint_every": self.steps, "log_every": max(1, self.eval_every // 5), "seed": seed}
        return TrainConfig(**{**values, **TRAIN_FIXED, **derived, **changes})

    def sizes(self) -> str:
        return (
            f"d_model {self.d_model}, {self.n_heads} heads, {self.n_layers} layers, d_ff {self.d_ff}, context "
            f"{self.context}, {self.position} positions; {self.steps} steps of {self.batch_size} x {self.context} "
            f"tokens, lr {self.lr:g} "
            f"(AdamW, {self.warmup_steps} warm-up steps, cosine decay), fp32"
        )


# LMConfig field -> the ModelConfig / TrainConfig field it sets
MODEL_FIELDS = {
    "d_model": "d_model",
    "n_heads": "n_heads",
    "n_layers": "n_layers",
    "d_ff": "d_ff",
    "context": "max_len",
    "position": "position",
}
TRAIN_FIELDS = {
    "steps": "steps",
    "batch_size": "batch_size",
    "lr": "lr",
    "warmup_steps": "warmup_steps",
    "eval_every": "eval_every",
    "eval_batches": "eval_batches",
}
# the same in every experiment: no dropout (short runs, and arms compared on the same batches), fp32
MODEL_FIXED: dict[str, Any] = {"dropout": 0.0}
TRAIN_FIXED: dict[str, Any] = {"precision": "fp32"}


@dataclass
class Trained:
    """A trained arm: the model, its loss curves [(step, loss)], final losses and training time."""

    model: nn.Module
    train_curve: list[tuple[int, float]] = field(default_factory=list)
    val_curve: list[tuple[int, float]] = field(default_factory=list)
    seconds: float = 0.0
    diverged: bool = False

    @property
    def train_loss(self) -> float:
        return self.train_curve[-1][1] if self.train_curve else math.nan

    @property
    def val_loss(self) -> float:
        return self.val_curve[-1][1] if self.val_curve else math.nan


def lm_batch(ids: Tensor, setup: LMConfig, seed: int, i: int) -> tuple[Tensor, Tensor]:
    """Batch i of a seed: (inputs, targets), each (batch_size, context)."""
    return sample_batch(ids, setup.batch_size, setup.context, batch_generator(seed, i))


def validation_loss(model: nn.Module, corpus: EncodedSplits, setup: LMConfig) -> float:
    """Mean next-token loss on the fixed validation blocks (the same for every arm and seed)."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        losses = [model(*lm_batch(corpus.val, setup, VAL_SEED, i)).item() for i in range(setup.eval_batches)]
    model.train(was_training)
    return sum(losses) / len(losses)


def train_lm(
    setup: LMConfig,
    seed: int,
    *,
    build: Callable[[ModelConfig], nn.Module] = DecoderLM,
    corpus: EncodedSplits | None = None,
    model_changes: dict[str, Any] | None = None,
    train_changes: dict[str, Any] | None = None,
) -> Trained:
    """Build `build(model_config)` with torch seeded by `seed`, train it, and return its curves.

    A run that diverges (the Trainer stops it with TrainingDiverged after `max_bad_steps` non-finite updates in a
    row) comes back with `diverged=True` and the curves up to there, for the experiment to score."""
    corpus = corpus or shakespeare()
    torch.manual_seed(seed)
    model = build(setup.model_config(corpus.vocab_size, **(model_changes or {})))
    config = setup.train_config(seed, **{"device": TRAINING_DEVICE.get(), **(train_changes or {})})
    with tempfile.TemporaryDirectory(prefix="kqv-experiment-") as run_dir:
        trainer = Trainer(
            model,
            config,
            run_dir,
            train_batches=lambda i: lm_batch(corpus.train, setup, seed, i),
            loss_fn=lambda m, batch: m(*batch),
            val_batches=lambda i: lm_batch(corpus.val, setup, VAL_SEED, i),
            tokens_per_batch=setup.batch_size * setup.context,
            quiet=True,
        )
        diverged = False
        try:
            trainer.train()
        except TrainingDiverged:
            diverged = True
        model.cpu()  # trained where TRAINING_DEVICE says, measured on the CPU
        records = read_metrics(RunFiles(run_dir).metrics_file) if trainer.step else []
    curve = lambda key: [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return Trained(model, curve("train_loss"), curve("val_loss"), trainer.train_seconds, diverged)


@dataclass
class Arm:
    """One arm of a comparison: how to build the model, and what it changes in the model and training configs."""

    build: Callable[[ModelConfig], nn.Module] = DecoderLM
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)


def train_arms(
    setup: LMConfig,
    seeds: list[int],
    arms: dict[str, Arm],
    progress: Progress,
    *,
    corpus: EncodedSplits | None = None,
    measure: Callable[[Trained], dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Train every arm on every seed (seed-major, so a cut-short run still has every arm of the first seeds).

    Returns per arm: lists over seeds of `val_loss`, `train_loss`, `train_curves`, `val_curves`, `diverged` and of
    every key `measure(trained)` returns, and its `parameters` (distinct trainable parameters)."""
    corpus = corpus or shakespeare()
    results: dict[str, dict[str, Any]] = {name: {} for name in arms}
    for seed in seeds:
        for name, arm in arms.items():
            progress.start(f"{name} seed {seed}")
            trained = train_lm(
                setup, seed, build=arm.build, corpus=corpus, model_changes=arm.model, train_changes=arm.train
            )
            values = {
                "val_loss": trained.val_loss,
                "train_loss": trained.train_loss,
                "train_curves": trained.train_curve,
                "val_curves": trained.val_curve,
                "diverged": trained.diverged,
                **(measure(trained) if measure else {}),
            }
            for key, value in values.items():
                results[name].setdefault(key, []).append(value)
            results[name]["parameters"] = count_parameters(trained.model)
            progress.step(f"{name} seed {seed}: val {trained.val_loss:.3f}")
    return results


# ---------------------------------------------------------------------------------------------------------------
# What attention does in a trained model


def attention_maps(model: DecoderLM, corpus: EncodedSplits, setup: LMConfig, blocks: int = 1) -> list[Tensor]:
    """Self-attention weights of every layer on the first validation blocks: each (batch, heads, time, time)."""
    inputs = torch.cat([lm_batch(corpus.val, setup, VAL_SEED, i)[0] for i in range(blocks)])
    model.eval()
    with torch.no_grad():
        return model.attention_weights(inputs)


def head_statistics(weights: Tensor) -> dict[str, list[float]]:
    """Per head of one layer's weights (batch, heads, time, time): mean entropy (nats), mean attended distance
    sum_j w_ij (i - j) in tokens, and mean weight on the query's own position (the diagonal)."""
    time = weights.shape[-1]
    distance = (torch.arange(time)[:, None] - torch.arange(time)[None, :]).clamp(min=0).float()  # (time, time)
    entropy = -(weights * weights.clamp_min(1e-12).log()).sum(-1)  # (batch, heads, time)
    attended = (weights * distance).sum(-1)  # (batch, heads, time)
    diagonal = weights.diagonal(dim1=-2, dim2=-1)  # (batch, heads, time)
    return {
        "entropy": entropy.mean((0, 2)).tolist(),
        "distance": attended.mean((0, 2)).tolist(),
        "diagonal": diagonal.mean((0, 2)).tolist(),
    }


def unigram_loss(corpus: EncodedSplits) -> float:
    """Cross-entropy of predicting every validation token by the training split's character frequencies:
    the loss a model reaches by learning no context at all."""
    counts = torch.bincount(corpus.train.long(), minlength=corpus.vocab_size).double() + 1.0
    log_probs = (counts / counts.sum()).log()
    return float(-log_probs[corpus.val.long()].mean())


# the sizes of the quick runs that the test suite makes: a few seconds per training run on one core
QUICK_LM = dict(
    d_model=32,
    n_heads=2,
    n_layers=1,
    d_ff=64,
    context=32,
    batch_size=16,
    steps=100,
    warmup_steps=10,
    eval_every=50,
    eval_batches=4,
    seeds=1,
)
