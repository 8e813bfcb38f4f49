"""A training's checkpoints: what is saved after an update (weights, optimizer, generators, the `TrainState`) and
how a resume loads it back, for one process, DDP or FSDP alike (`kqv.train.sharding` gathers and scatters)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError, ConfigTypeError, option
from ..signals import deferred
from .checkpoints import (
    FORMAT,
    Checkpoint,
    OptimizerState,
    Weights,
    load_optimizer_state,
    load_weights,
    partial_loader,
    write_checkpoint,
)
from .config import TrainConfig
from .files import STATE_FILE
from .nonfinite import check_finite_weights
from .precision import MixedPrecision
from .rng import all_rng_states, rng_tensors, rng_to_json, saved_rng_states
from .rundir import RunDirectory
from .sharding import gather_state, load_checkpoint
from .state import TrainState

logger = logging.getLogger("kqv.train.trainer")  # the trainer's voice


def check_extra_state(extra_state: dict[str, Any] | None) -> None:
    """ConfigTypeError unless `extra_state` can go into a checkpoint's state.json."""
    try:
        json.dumps(extra_state)
    except (TypeError, ValueError) as error:
        raise ConfigTypeError(f"extra_state must be JSON-serialisable (it goes into {STATE_FILE}): {error}") from None


def check_saved_weights(saved_weights: Callable | None, sharded: bool) -> None:
    """ConfigError for checkpoints of part of the weights (a LoRA run's adapters) under FSDP, whose shards are
    saved and loaded whole (`kqv.train.sharding`)."""
    if sharded and saved_weights is not None:
        raise ConfigError(
            'a run whose checkpoints hold part of its weights (LoRA) cannot be sharded; set train.parallel="ddp"'
        )


class Checkpointer:
    """Writes the checkpoints of one training into `run` and loads the one it resumes; `last_saved` is the step
    of the last checkpoint this session wrote or resumed from (None before one). `saved_weights` picks the part of
    the model's state dict a checkpoint holds (None: all of it; a LoRA fine-tune's adapters)."""

    def __init__(
        self,
        run: RunDirectory,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        precision: MixedPrecision,
        sharded: bool,
        rank: int,
        world_size: int,
        saved_weights: Callable[[dict[str, Tensor]], dict[str, Tensor]] | None = None,
    ):
        self.run, self.model, self.optimizer, self.precision = run, model, optimizer, precision
        self.sharded, self.rank, self.world_size = sharded, rank, world_size
        self.saved_weights = saved_weights
        self.last_saved: int | None = None

    def save(self, state: TrainState, config: TrainConfig, extra_state: dict[str, Any]) -> None:
        """Save `state` after its last completed update (every rank must call this under torchrun: the
        generators' states are gathered, and under FSDP the shards)."""
        states = all_rng_states(self.world_size)
        weights, optimizer = gather_state(self.model, self.optimizer) if self.sharded else (self.model, self.optimizer)
        if self.rank == 0:
            self.write(states, weights, optimizer, state, config, extra_state)

    def write(
        self,
        rng_states: list[dict],
        weights: Weights,
        optimizer: OptimizerState,
        state: TrainState,
        config: TrainConfig,
        extra_state: dict[str, Any],
    ) -> None:
        """Write the checkpoint of `state.step` (rank 0); Ctrl-C or SIGTERM meanwhile waits until it is complete.
        Non-finite weights are never saved (TrainingDiverged)."""
        with deferred():
            if self.saved_weights is not None:
                weights = self.saved_weights(weights if isinstance(weights, dict) else weights.state_dict())
            check_finite_weights(weights, config, state.step, self.last_saved)
            saved = {
                "format": FORMAT,
                **state.saved(),
                "config": config.to_dict(),
                "extra_state": extra_state,
                "world_size": self.world_size,
                "grad_scaler": self.precision.state_dict(),
                "rng": [rng_to_json(s) for s in rng_states],
                "torch_version": torch.__version__,
            }
            write_checkpoint(self.run.path, weights, optimizer, saved, rng_tensors(rng_states))
            self.last_saved = state.step

    def load(self, checkpoint: Checkpoint) -> tuple[TrainState, list[dict | None]]:
        """Load `checkpoint`'s weights, optimizer state and loss scale; returns its `TrainState` and every rank's
        saved generator states (`kqv.train.rng.saved_rng_states`)."""
        if self.sharded:
            load_checkpoint(self.model, self.optimizer, checkpoint, self.run.path)
        else:
            part = None if self.saved_weights is None else partial_loader(self.model, self.saved_weights)
            load_weights(self.model, checkpoint, part)
            load_optimizer_state(self.optimizer, checkpoint, self.run.path)
        self.precision.load_state_dict(checkpoint.state.get("grad_scaler"))
        return TrainState.restored(checkpoint.state), saved_rng_states(checkpoint, self.world_size)

    def after_interrupt(
        self, state: TrainState, config: TrainConfig, extra_state: dict[str, Any], rng: dict, skipping: bool
    ) -> bool:
        """Rank 0, on Ctrl-C or SIGTERM: write the checkpoint of the last completed update (`rng`: its generator
        state; other ranks are somewhere else, so no collective and no states of theirs), unless updates were being
        skipped or the run is sharded (whose shards every rank gathers together). Whether the run stands saved."""
        if skipping:
            logger.warning("interrupted while updates were being skipped; kept the last good checkpoint")
            return False
        if self.sharded and self.last_saved != state.step:
            logger.warning("interrupted: a sharded run saves with all ranks; step %s stands", self.last_saved)
            return False
        if self.last_saved != state.step:
            self.write([rng], self.model, self.optimizer, state, config, extra_state)
        logger.warning(
            "interrupted: saved the checkpoint of step %d in %s; continue with %s",
            state.step,
            self.run.checkpoint_dir,
            option("Trainer.resume(...)"),
        )
        return True
