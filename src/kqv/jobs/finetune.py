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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..errors import ConfigError, RunError
from ..nn.config import ModelConfig
from ..nn.lora import LoRAConfig, Projection, adapted_layers, adapters, add_lora, check_options, largest_rank
from ..nn.models import DecoderLM, count_parameters
from ..validation import Config, check_at_least
from .init import index_only_sha256, load_source_weights, read_source


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
        if self.lora_rank and self.freezes:
            raise ConfigError(
                "LoRA already freezes every weight of the source; drop finetune.freeze_embeddings and "
                "finetune.freeze_blocks, or set finetune.lora_rank=0 to freeze without LoRA"
            )

    @property
    def freezes(self) -> bool:
        return self.freeze_embeddings or self.freeze_blocks > 0

    @property
    def lora(self) -> LoRAConfig | None:
        """The LoRA adapters to add (None: no LoRA)."""
        if not self.lora_rank:
            return None
        return LoRAConfig(self.lora_rank, self.lora_alpha, self.lora_dropout, self.lora_targets)

    @property
    def active(self) -> bool:
        """Whether the fine-tune trains less than every weight."""
        return self.freezes or self.lora_rank > 0

    def describe(self) -> str:
        if self.lora_rank:
            return f"LoRA rank {self.lora_rank} on {', '.join(self.lora_targets)}"
        frozen = ["the embeddings"] * self.freeze_embeddings + [f"the first {self.freeze_blocks} blocks"] * (
            self.freeze_blocks > 0
        )
        return f"{' and '.join(frozen)} frozen"


def adapt(model: nn.Module, finetune: FinetuneConfig) -> None:
    """Freeze what `finetune` freezes in `model` (a `DecoderLM`), or add its LoRA adapters, in place."""
    lora = finetune.lora
    if lora is not None:
        add_lora(model, lora)
        return
    if finetune.freeze_embeddings:
        model.decoder.embeddings.requires_grad_(False)  # a tied output layer is the same tensor: frozen with it
    for block in model.decoder.blocks[: finetune.freeze_blocks]:
        block.requires_grad_(False)


def check_finetune(finetune: FinetuneConfig, config: ModelConfig) -> None:
    """ConfigError, before anything is written, for a fine-tune of a model of `config` that freezes more blocks than
    it has, adapts a projection with a LoRA rank above its smaller side (`kqv.nn.lora.largest_rank`), or would train
    no weight at all (tried on a model on the meta device: no memory, no computation)."""
    if finetune.freeze_blocks > config.n_layers:
        raise ConfigError(
            f"finetune.freeze_blocks ({finetune.freeze_blocks}) is more than the source's {config.n_layers} "
            f"blocks; freeze at most {config.n_layers}"
        )
    with torch.device("meta"):
        model = DecoderLM(config)
    if finetune.lora_rank:
        layers = adapted_layers(model, finetune.lora_targets)
        limit, where = largest_rank(layers) if layers else (finetune.lora_rank, "")
        if finetune.lora_rank > limit:
            raise ConfigError(
                f"finetune.lora_rank ({finetune.lora_rank}) is more than {limit}, the smaller side of {where}: a "
                f"rank above it is not low rank; set it to at most {limit} (4 to 64 is usual)"
            )
    adapt(model, finetune)
    if count_parameters(model) == 0:
        raise ConfigError(
            f"this fine-tune would train nothing: with {finetune.describe()} no weight of the source is left to "
            f"train; freeze less"
        )


def saved_weights(finetune: FinetuneConfig) -> Callable[[dict[str, Tensor]], dict[str, Tensor]] | None:
    """The part of the model's state dict a run's checkpoints hold: a LoRA run's adapters (None: all of it)."""
    return adapters if finetune.lora_rank else None


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
