"""The language-modelling job: text -> tokenizer -> `DecoderLM` -> trainer -> samples and perplexity.

A run directory holds everything needed to use the model later, and nothing that needs code to be executed to
load: `run.toml` (the whole configuration), `tokenizer/`, `tokens.safetensors` (the encoded splits, so resuming
is exact and quick), `checkpoint/`, `metrics.jsonl`, `loss.png`, `samples.txt` and `summary.json`.
"""

from __future__ import annotations

import json
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file, save_file

from ..data.batches import batch_generator, sample_batch
from ..data.shakespeare import load_text, split_text
from ..data.tokenizers import Tokenizer, encode_text, load_tokenizer, make_tokenizer
from ..nn.config import ModelConfig, build_dataclass
from ..nn.models import DecoderLM, count_parameters
from ..train.checkpoints import load_weights, read_checkpoint
from ..train.config import TrainConfig
from ..train.evaluation import perplexity
from ..train.runs import read_config_values, toml_text
from ..train.trainer import Trainer

RUN_CONFIG, TOKENIZER_DIR, TOKENS_FILE = "run.toml", "tokenizer", "tokens.safetensors"


@dataclass
class DataConfig:
    """Where the text comes from and how it becomes training blocks."""

    path: str | None = None  # None: Shakespeare's complete works, the embedded default corpus
    tokenizer: Literal["char", "bpe"] = "char"
    vocab_size: int = 4096  # bpe only
    context: int = 256
    val_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.tokenizer not in ("char", "bpe"):
            raise ValueError(f"data.tokenizer must be 'char' or 'bpe', got {self.tokenizer!r}")
        if self.context < 2:
            raise ValueError(f"data.context must be at least 2, got {self.context}")
        if not 0 < self.val_fraction <= 0.5:
            raise ValueError(f"data.val_fraction must be in (0, 0.5], got {self.val_fraction}")


@dataclass
class SampleConfig:
    """What to generate at the end of training, to see what the model learned."""

    prompt: str = "\n"
    count: int = 3
    max_new_tokens: int = 300
    temperature: float = 0.8
    top_k: int | None = 40


@dataclass
class LMRunConfig:
    """The whole job: `model` holds ModelConfig options except vocab_size, which the tokenizer decides."""

    model: dict[str, Any]
    train: TrainConfig
    data: DataConfig = field(default_factory=DataConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> LMRunConfig:
        values = {k: v for k, v in values.items() if k != "task"}
        unknown = sorted(set(values) - {"model", "train", "data", "sample"})
        if unknown:
            raise ValueError(f"unknown section(s) {unknown} in the run config; use [model], [train], [data], [sample]")
        if "train" not in values:
            raise ValueError("the run config needs a [train] section with at least steps and batch_size")
        return cls(model=dict(values.get("model", {})), train=TrainConfig.from_dict(values["train"]),
                   data=build_dataclass(DataConfig, values.get("data", {}), "[data]"),
                   sample=build_dataclass(SampleConfig, values.get("sample", {}), "[sample]"))

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "train": self.train.to_dict(), "data": asdict(self.data),
                "sample": asdict(self.sample)}

    def model_config(self, vocab_size: int) -> ModelConfig:
        values = {"max_len": self.data.context, **self.model, "vocab_size": vocab_size}
        return ModelConfig.from_dict(values)


def load_run_config(path: str | Path, overrides: list[str] = ()) -> LMRunConfig:
    """Read a TOML run config and apply `section.key=value` overrides (values in TOML syntax, or bare strings)."""
    return LMRunConfig.from_dict(read_config_values(path, overrides))


# ---------------------------------------------------------------------------------------------------------------
# Training


def prepare_data(config: LMRunConfig, run_dir: Path, resume: bool) -> tuple[Tokenizer, dict[str, torch.Tensor]]:
    """The tokenizer and encoded splits: loaded from the run when resuming, else built and saved."""
    if resume and (run_dir / TOKENS_FILE).exists():
        return load_tokenizer(run_dir / TOKENIZER_DIR), load_file(run_dir / TOKENS_FILE)
    text = load_text(config.data.path)
    train_text, val_text = split_text(text, config.data.val_fraction)
    tokenizer = make_tokenizer(config.data.tokenizer, text if config.data.tokenizer == "char" else train_text,
                               config.data.vocab_size)
    tokens = {"train": encode_text(tokenizer, train_text), "val": encode_text(tokenizer, val_text),
              "chars": torch.tensor([len(train_text), len(val_text)])}
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(run_dir / TOKENIZER_DIR)
    save_file(tokens, run_dir / TOKENS_FILE)
    return tokenizer, tokens


def train_lm(config: LMRunConfig, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
             quiet: bool = False) -> dict[str, Any]:
    """Train a DecoderLM as configured, write samples and a summary into run_dir, and return the summary."""
    run_dir = Path(run_dir)
    if resume:
        read_checkpoint(run_dir)  # a clear error before any work if there is nothing to resume
    tokenizer, tokens = prepare_data(config, run_dir, resume and not overwrite)
    model_config = config.model_config(tokenizer.vocab_size)
    (run_dir / RUN_CONFIG).write_text(toml_text(({"task": "lm", **config.to_dict(),
                                                                "model": model_config.to_dict()})))
    torch.manual_seed(config.train.seed)
    model = DecoderLM(model_config)
    train_ids, val_ids = tokens["train"], tokens["val"]
    batch, context, seed = config.train.batch_size, config.data.context, config.train.seed

    def train_batches(i: int):
        return sample_batch(train_ids, batch, context, batch_generator(seed, i))

    def val_batches(i: int):
        return sample_batch(val_ids, batch, context, batch_generator(seed, -i - 1))

    def loss_fn(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, targets = batch
        return model(inputs, targets)

    if not quiet:
        print(f"kqv: {count_parameters(model):,} parameters, {len(train_ids):,} training tokens "
              f"({config.data.tokenizer} tokenizer, vocabulary {tokenizer.vocab_size}), run directory {run_dir}")
    trainer = Trainer(model, config.train, run_dir, train_batches=train_batches, loss_fn=loss_fn,
                      val_batches=val_batches, tokens_per_batch=batch * context, quiet=quiet,
                      if_exists="resume" if resume else ("overwrite" if overwrite else "error"))
    started = time.perf_counter()
    final = trainer.train()
    seconds = time.perf_counter() - started
    summary = {"steps": trainer.step, "train_seconds": round(seconds, 1), "parameters": count_parameters(model),
               "final_train_loss": final.get("train_loss"), "final_val_loss": final.get("val_loss")}
    summary["val"] = perplexity(model, val_ids, context=context, n_chars=int(tokens["chars"][1]),
                                precision=config.train.precision, max_tokens=200_000)
    samples = write_samples(model, tokenizer, config.sample, run_dir / "samples.txt")
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if not quiet:
        print(f"kqv: validation loss {summary['val']['loss']:.3f} nats/token "
              f"({summary['val'].get('bits_per_char', float('nan')):.3f} bits/char) after {trainer.step} steps "
              f"in {seconds / 60:.1f} min\n--- sample ---\n{samples[0]}\n--- end of sample ---")
    return summary


def write_samples(model: DecoderLM, tokenizer: Tokenizer, sample: SampleConfig, path: Path) -> list[str]:
    generator = torch.Generator().manual_seed(0)
    texts = [generate_text(model, tokenizer, sample.prompt, sample.max_new_tokens, temperature=sample.temperature,
                           top_k=sample.top_k, generator=generator) for _ in range(sample.count)]
    path.write_text("\n\n=====\n\n".join(texts) + "\n")
    return texts


def generate_text(model: DecoderLM, tokenizer: Tokenizer, prompt: str, max_new_tokens: int, **options: Any) -> str:
    """The prompt and its continuation, as text."""
    if not prompt:
        raise ValueError("the prompt is empty; give at least one character (e.g. --prompt 'ROMEO:')")
    ids = torch.tensor([tokenizer.encode(prompt)])
    config = model.config
    if config.position == "learned":
        max_new_tokens = min(max_new_tokens, config.max_len - ids.shape[1] + 1)
    model.eval()
    return tokenizer.decode(model.generate(ids, max_new_tokens, **options)[0].tolist())


# ---------------------------------------------------------------------------------------------------------------
# Using a trained run


def read_run_config(run_dir: str | Path) -> tuple[LMRunConfig, ModelConfig]:
    """The run's configuration and the exact ModelConfig it trained (vocab_size included)."""
    config_path = Path(run_dir) / RUN_CONFIG
    if not config_path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a kqv LM run: {config_path} is missing")
    values = tomllib.loads(config_path.read_text())
    values.pop("task", None)
    model_values = {k: v for k, v in values["model"].items() if k != "vocab_size"}
    return LMRunConfig.from_dict({**values, "model": model_values}), ModelConfig.from_dict(values["model"])


@dataclass
class LMRun:
    config: LMRunConfig
    model: DecoderLM
    tokenizer: Tokenizer
    run_dir: Path


def load_run(run_dir: str | Path) -> LMRun:
    """Load a trained run for generation or evaluation (weights from safetensors, no code executed)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run directory at {run_dir}; train one with `kqv train lm --out {run_dir}`")
    config, model_config = read_run_config(run_dir)
    model = DecoderLM(model_config)
    load_weights(model, run_dir)
    model.eval()
    return LMRun(config, model, load_tokenizer(run_dir / TOKENIZER_DIR), run_dir)
