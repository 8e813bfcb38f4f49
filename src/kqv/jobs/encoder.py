"""What the encoder's jobs (`kqv.jobs.mlm`, `kqv.jobs.cls`) share: their run configurations and run files.

A run config has [model] (ModelConfig options except vocab_size), [train] (TrainConfig) and the job's own
sections: [data] and [masking] for MLM, [data] and [head] for classification.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import torch

from ..nn.config import ModelConfig
from ..train.config import TrainConfig
from ..train.runs import read_config_values, toml_text
from ..train.trainer import Trainer

RUN_CONFIG, TOKENIZER_DIR, TOKENS_FILE = "run.toml", "tokenizer", "tokens.safetensors"


@dataclass
class MLMDataConfig:
    path: str | None = None  # None: Shakespeare's complete works, as for the LM job
    tokenizer: Literal["char", "bpe"] = "bpe"
    vocab_size: int = 2048  # bpe only, special tokens included
    context: int = 128  # tokens per training block
    val_fraction: float = 0.1

    def __post_init__(self) -> None:
        check_tokenizer(self.tokenizer)
        if self.context < 2:
            raise ValueError(f"data.context must be at least 2, got {self.context}")


@dataclass
class MaskingConfig:
    mask_prob: float = 0.15
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1

    def __post_init__(self) -> None:
        if not 0 < self.mask_prob < 1:
            raise ValueError(f"masking.mask_prob must be in (0, 1), got {self.mask_prob}")
        if self.mask_token_prob < 0 or self.random_token_prob < 0 or self.mask_token_prob + self.random_token_prob > 1:
            raise ValueError("masking.mask_token_prob and masking.random_token_prob must be non-negative and add up "
                             f"to at most 1, got {self.mask_token_prob} and {self.random_token_prob}")


@dataclass
class ClsDataConfig:
    path: str | None = None  # a TSV file of text<TAB>label lines (required)
    tokenizer: Literal["char", "bpe"] = "char"  # when not starting from an MLM run
    vocab_size: int = 1024
    max_tokens: int = 128  # [CLS] + text, longer texts are cut
    dev_fraction: float = 0.1
    init: str | None = None  # an MLM run directory whose encoder and tokenizer to start from

    def __post_init__(self) -> None:
        check_tokenizer(self.tokenizer)
        if not 0 < self.dev_fraction < 1:
            raise ValueError(f"data.dev_fraction must be in (0, 1), got {self.dev_fraction}")
        if self.max_tokens < 2:
            raise ValueError(f"data.max_tokens must be at least 2 ([CLS] and one token), got {self.max_tokens}")


@dataclass
class HeadConfig:
    pooling: Literal["first", "mean"] = "mean"


SECTIONS = {"mlm": {"data": MLMDataConfig, "masking": MaskingConfig},
            "cls": {"data": ClsDataConfig, "head": HeadConfig}}


@dataclass
class EncoderRunConfig:
    """A whole MLM or classification job: `model` holds ModelConfig options except vocab_size."""

    task: Literal["mlm", "cls"]
    model: dict[str, Any]
    train: TrainConfig
    sections: dict[str, Any] = field(default_factory=dict)  # the job's own sections, by name (SECTIONS[task])

    @property
    def data(self) -> MLMDataConfig | ClsDataConfig:
        return self.sections["data"]

    @property
    def masking(self) -> MaskingConfig:
        return self.sections["masking"]

    @property
    def head(self) -> HeadConfig:
        return self.sections["head"]

    @classmethod
    def from_dict(cls, task: str, values: dict[str, Any]) -> EncoderRunConfig:
        values = {k: v for k, v in values.items() if k not in ("task", "labels")}  # as written into run.toml
        known = {"model", "train", *SECTIONS[task]}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown section(s) {unknown} in the {task} run config; use {sorted(known)}")
        if "train" not in values:
            raise ValueError("the run config needs a [train] section with at least steps and batch_size")
        sections = {name: build_section(kind, values.get(name, {}), name) for name, kind in SECTIONS[task].items()}
        return cls(task, dict(values.get("model", {})), TrainConfig.from_dict(values["train"]), sections)

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "model": self.model, "train": self.train.to_dict(),
                **{name: asdict(section) for name, section in self.sections.items()}}


def check_tokenizer(kind: str) -> None:
    if kind not in ("char", "bpe"):
        raise ValueError(f"data.tokenizer must be 'char' or 'bpe', got {kind!r}")


def build_section(cls: type, values: dict[str, Any], section: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} in [{section}]; valid options are {sorted(known)}")
    return cls(**values)


def load_run_config(task: str, path: str | Path, overrides: list[str] = ()) -> EncoderRunConfig:
    """Read a TOML run config and apply `section.key=value` overrides (as `kqv train lm --set` does)."""
    return EncoderRunConfig.from_dict(task, read_config_values(path, overrides, f"configs/{task}-*.toml"))


def write_run_config(run_dir: Path, config: EncoderRunConfig, model_config: ModelConfig,
                     **extra: dict[str, Any]) -> None:
    values = {**config.to_dict(), "model": model_config.to_dict(), **extra}
    (run_dir / RUN_CONFIG).write_text(toml_text(values))


def read_run(run_dir: str | Path, task: str) -> tuple[dict[str, Any], ModelConfig]:
    """The run.toml of a run of `task` and the exact ModelConfig it trained."""
    path = Path(run_dir) / RUN_CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a kqv run: {path} is missing; train one with "
                                f"`kqv train {task} --out {run_dir}`")
    values = tomllib.loads(path.read_text())
    if values.get("task") != task:
        raise ValueError(f"{run_dir} is a run of task {values.get('task', 'lm')!r}, not {task!r}")
    return values, ModelConfig.from_dict(values["model"])


def make_trainer(model: torch.nn.Module, config: EncoderRunConfig, run_dir: Path, resume: bool, overwrite: bool,
                 quiet: bool, **functions: Any) -> Trainer:
    return Trainer(model, config.train, run_dir, quiet=quiet, **functions,
                   if_exists="resume" if resume else ("overwrite" if overwrite else "error"))
