"""How much of a fine-tune trains (`[finetune]` of an LM run config, with `--init SOURCE`): every weight (the
default), every weight but frozen ones (the embeddings, the first N blocks), or low-rank adapters alone (LoRA,
`kqv.nn.lora`).

Freezing sets requires_grad=False, so a frozen weight is in no optimizer group (`kqv.train.optimizer`) and stays
bit-identical; the checkpoint still holds the whole model. When the model ties its output layer to the token
embedding (`model.tie_embeddings`, GPT-2's way) the two are one tensor, so freezing the embeddings (token and
position) freezes that output layer too; an untied output layer trains.

A LoRA run freezes every weight of its source and trains adapters on the chosen projections. Its checkpoints hold
the adapters alone (`kqv.nn.lora.adapters`, handed to the Trainer as `saved_weights`: the optimizer state is the
adapters' too), beside run.toml's `[source]` (the source's path and the SHA-256 of its weights). Loading or resuming
it rebuilds the source's model from that path, checks the SHA-256 (`restore_source`: a RunError saying what changed
and what to do) and adds the adapters, into which the checkpoint is loaded.

The options' one decision is an `Adaptation` (`FinetuneConfig.adaptation`: `EveryWeight`, `Frozen` or `LoRA`),
which the LM job and loading ask; no other module reads the options to decide what trains.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..errors import ConfigError, RunError
from ..nn.config import ModelConfig
from ..nn.lora import LoRAConfig, Projection, adapted_layers, adapters, add_lora, check_options, largest_rank
from ..nn.models import DecoderLM, count_parameters
from ..validation import Config, check_at_least
from .base import total_parameters
from .init import Source, index_only_sha256, load_source_weights, read_source


@dataclass
class FinetuneConfig(Config):
    """What a fine-tune trains. `freeze_embeddings` freezes the token and position embeddings (and the output layer
    tied to them); `freeze_blocks` = N freezes the first N blocks. `lora_rank` r > 0 trains LoRA adapters of rank r
    alone, scaled by `lora_alpha` / r, with `lora_dropout` on their input, on the projections `lora_targets`
    (attention's to_queries, to_keys_values, to_output; the feed-forward network's up, down). Every option needs
    `data.init` (a source to fine-tune)."""

    section: ClassVar[str] = "finetune"
    freeze_embeddings: bool = False
    freeze_blocks: int = 0
    lora_rank: int = 0  # 0: no LoRA
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: tuple[Projection, ...] = ("to_queries", "to_keys_values", "to_output")

    def check(self) -> None:
        check_at_least("finetune.freeze_blocks", self.freeze_blocks, 0)
        check_at_least("finetune.lora_rank", self.lora_rank, 0)
        if not self.lora_targets:
            raise ConfigError('finetune.lora_targets is empty; name the projections to adapt, e.g. ["to_queries"]')
        check_options(
            self.lora_rank,
            self.lora_alpha,
            self.lora_dropout,
            self.lora_targets,
            lambda field: f"finetune.lora_{field}",
        )
        self.adaptation  # noqa: B018 - options that cannot go together are refused as it is built

    @property
    def adaptation(self) -> Adaptation:
        """What these options train: every weight, every weight but frozen ones, or LoRA adapters alone."""
        freezes = self.freeze_embeddings or self.freeze_blocks > 0
        if self.lora_rank:
            if freezes:
                raise ConfigError(
                    "LoRA already freezes every weight of the source; drop finetune.freeze_embeddings and "
                    "finetune.freeze_blocks, or set finetune.lora_rank=0 to freeze without LoRA"
                )
            return LoRA(LoRAConfig(self.lora_rank, self.lora_alpha, self.lora_dropout, self.lora_targets))
        return Frozen(self.freeze_embeddings, self.freeze_blocks) if freezes else EveryWeight()


class Adaptation:
    """What a fine-tune trains of its source, built once from `[finetune]` (`FinetuneConfig.adaptation`). It applies
    itself to a model, refuses a model it cannot adapt, says which part of the state dict a checkpoint saves,
    restores the source a partial checkpoint needs, and counts what trains. The jobs, the Trainer (through
    `saved_weights`) and loading ask it instead of reading the options."""

    active: ClassVar[bool] = True  # whether it trains less than every weight
    lora: LoRAConfig | None = None  # the adapters it adds (the memory estimate counts them)

    def apply(self, model: nn.Module) -> None:
        """Set up `model` (a `DecoderLM` holding its source's weights) to train what this adaptation trains."""

    @property
    def saved_weights(self) -> Callable[[dict[str, Tensor]], dict[str, Tensor]] | None:
        """The part of the model's state dict a checkpoint holds (None: all of it)."""
        return None

    def restore(self, model: nn.Module, source: dict[str, Any] | None, run_dir: Path) -> None:
        """Make a resumed or loaded run's fresh `model` ready for its checkpoint: adapted as in training, with its
        source's weights first where the checkpoint holds a part (`source`: run.toml's `[source]`)."""
        self.apply(model)

    def describe(self) -> str:
        return "every weight trains"

    def check(self, config: ModelConfig) -> None:
        """ConfigError, before anything is written, for a source of `config` this adaptation cannot adapt
        (`refuse`), or one of which it would train no weight (tried on a model on the meta device: no memory, no
        computation)."""
        with torch.device("meta"):
            model = DecoderLM(config)
        self.refuse(model, config)
        self.apply(model)
        if count_parameters(model) == 0:
            raise ConfigError(
                f"this fine-tune would train nothing: with {self.describe()} no weight of the source is left to "
                f"train; freeze less"
            )

    def refuse(self, model: nn.Module, config: ModelConfig) -> None:
        """ConfigError when the source `model` (on the meta device, of `config`) cannot take this adaptation."""

    @staticmethod
    def counts(model: nn.Module) -> dict[str, int]:
        """How many of `model`'s parameters train, of how many (summary.json's `finetune`)."""
        return {"trainable_parameters": count_parameters(model), "total_parameters": total_parameters(model)}


class EveryWeight(Adaptation):
    """A full fine-tune: every weight trains (the default), and a checkpoint holds the whole model."""

    active = False


@dataclass(frozen=True)
class Frozen(Adaptation):
    """Every weight trains but the token and position embeddings (and an output layer tied to them) when
    `embeddings`, and the first `blocks` blocks: frozen by requires_grad=False, so in no optimizer group and
    bit-identical; a checkpoint still holds the whole model."""

    embeddings: bool
    blocks: int

    def apply(self, model: nn.Module) -> None:
        if self.embeddings:
            model.decoder.embeddings.requires_grad_(False)  # a tied output layer is the same tensor: frozen with it
        for block in model.decoder.blocks[: self.blocks]:
            block.requires_grad_(False)

    def describe(self) -> str:
        frozen = ["the embeddings"] * self.embeddings + [f"the first {self.blocks} blocks"] * (self.blocks > 0)
        return f"{' and '.join(frozen)} frozen"

    def refuse(self, model: nn.Module, config: ModelConfig) -> None:
        if self.blocks > config.n_layers:
            raise ConfigError(
                f"finetune.freeze_blocks ({self.blocks}) is more than the source's {config.n_layers} blocks; "
                f"freeze at most {config.n_layers}"
            )


@dataclass(frozen=True)
class LoRA(Adaptation):
    """LoRA adapters alone train (`kqv.nn.lora`); a checkpoint holds them alone, beside run.toml's `[source]`, so
    restoring a run rebuilds its source's weights first (checked by their SHA-256: `restore_source`)."""

    lora: LoRAConfig

    def apply(self, model: nn.Module) -> None:
        add_lora(model, self.lora)

    @property
    def saved_weights(self) -> Callable[[dict[str, Tensor]], dict[str, Tensor]]:
        return adapters

    def restore(self, model: nn.Module, source: dict[str, Any] | None, run_dir: Path) -> None:
        restore_source(model, source or {}, run_dir)
        self.apply(model)

    def describe(self) -> str:
        return f"LoRA rank {self.lora.rank} on {', '.join(self.lora.targets)}"

    def refuse(self, model: nn.Module, config: ModelConfig) -> None:
        layers = adapted_layers(model, self.lora.targets)
        limit, where = largest_rank(layers) if layers else (self.lora.rank, "")
        if self.lora.rank > limit:
            raise ConfigError(
                f"finetune.lora_rank ({self.lora.rank}) is more than {limit}, the smaller side of {where}: a "
                f"rank above it is not low rank; set it to at most {limit} (4 to 64 is usual)"
            )


def restore_source(model: nn.Module, source: dict[str, Any], run_dir: Path) -> None:
    """Load the source weights of the LoRA run `run_dir` (run.toml's `[source]`) into `model`, once its weights file
    is checked to be the one the adapters were trained on: RunError if it is gone or changed."""
    path, recorded = Path(source["path"]), source["weights_sha256"]
    try:
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist")
        found = read_source(path)
    except (ConfigError, OSError) as error:
        where = (
            "" if path.is_absolute() else f", or load the run from the directory it was trained in ({path} is relative)"
        )
        raise RunError(
            f"{run_dir} is a LoRA fine-tune, which holds only its adapters, and its source {path} cannot be read: "
            f"{error}; put the source back at {path} (its weights' SHA-256 {recorded[:16]}...){where}"
        ) from None
    if recorded not in (found.weights_sha256, index_only_sha256(found)):
        raise RunError(
            f"the source of the LoRA fine-tune {run_dir}, {path}, has changed since the run trained: its weights' "
            f"SHA-256 is {found.weights_sha256[:16]}..., was {recorded[:16]}...; the adapters fit the old weights "
            f"only, so restore {path} as it was (or fine-tune the new one in a new run)"
        )
    load_source_weights(model, found)


# ---------------------------------------------------------------------------------------------------------------
# The source: the context a fine-tune takes from it, and what the LM job's hooks hand each other about it


FINETUNE_CONTEXT = 128  # a fine-tune's context when its config gives none (at most its source's positions)


def fit_context(config: Any, source: Source) -> Any:
    """A fine-tune's `config` with a context its `source` holds: when the config gives none, FINETUNE_CONTEXT or the
    source's positions (its max_len) if fewer; a context the config gives stays as it is."""
    positions = source.config.max_len
    if config.context_given or config.data.context <= positions:
        return config
    fitted = copy.copy(config)
    fitted.data = replace(config.data, context=positions)
    return fitted


@dataclass
class FineTuneStart:
    """What the LM job's hooks hand each other about a fine-tune's source: the source itself and the model config
    made from it (a fresh fine-tune: `make_corpus` reads them once), and run.toml's `[source]` record (what
    `make_model` writes, or reads back on a resume; None without a source), which the summary repeats."""

    source: Source | None = None
    model: ModelConfig | None = None
    record: dict[str, Any] | None = None
