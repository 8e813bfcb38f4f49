"""A training's checkpoints: what is saved after an update (weights, optimizer, generators, the `TrainState`) and
how a resume loads it back (`Checkpointer`), for one process, DDP or FSDP alike: under FSDP every rank writes its own
shards (`kqv.train.shards`), and a one-process checkpoint is read into them, each rank reading only its rows
(`load_checkpoint`). The checkpoint's files are `kqv.train.checkpoints`'."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as safetensors_load
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from ..errors import TRAINER_RESUME, RunError, option
from ..signals import deferred
from .checkpoints import (
    FORMAT,
    Checkpoint,
    OptimizerState,
    Weights,
    checkpoint_writers,
    load_optimizer_state,
    load_weights,
    partial_loader,
    write_checkpoint,
)
from .config import TrainConfig
from .files import write_into
from .layout import CHECKSUMS_KEPT, MODEL_FILE, RNG_FILE, RunFiles
from .nonfinite import check_finite_weights
from .placement import Placement
from .rng import TORCH_RNGS, all_rng_states, rng_from_json, rng_tensors, rng_to_json
from .sharding import every_rank, gather_weights
from .shards import is_sharded, load_sharded, write_sharded
from .slices import RowReader, rows, tied_names
from .state import TrainState
from .topology import Topology

logger = logging.getLogger("kqv.train.trainer")  # the trainer's voice
NOT_FINITE = {"(on another rank)": torch.tensor(float("nan"))}  # what a rank whose own shards are finite names


class Checkpointer:
    """Writes the checkpoints of one training into `run` and loads the one it resumes: the model `placement`
    trains (on its device and processes, sharded or not) and `optimizer`'s state. `last_saved` is the step of the
    last checkpoint this session wrote or resumed from (None before one). `saved_weights` picks the part of the
    model's state dict a checkpoint holds (None: all of it; a LoRA fine-tune's adapters)."""

    def __init__(
        self,
        run: RunFiles,
        placement: Placement,
        optimizer: torch.optim.Optimizer,
        saved_weights: Callable[[dict[str, Tensor]], dict[str, Tensor]] | None = None,
    ):
        self.run, self.placement, self.optimizer, self.saved_weights = run, placement, optimizer, saved_weights
        self.last_saved: int | None = None

    def save(self, state: TrainState, config: TrainConfig, extra_state: dict[str, Any], final: bool = False) -> None:
        """Save `state` after its last completed update (every rank must call this under torchrun: the
        generators' states are gathered, and under FSDP every rank writes its shards). The `final` checkpoint of a
        sharded run holds the whole weights too (model.safetensors, for export and inference)."""
        states = all_rng_states(self.placement.world_size)
        if self.placement.sharded:
            self.write_shards(states, state, config, extra_state, final)
        elif self.placement.rank == 0:
            self.write(states, self.placement.model, self.optimizer, state, config, extra_state)

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
            saved = self.saved_state(rng_states, state, config, extra_state)
            write_checkpoint(self.run, weights, optimizer, saved, rng_tensors(rng_states))
            self.last_saved = state.step

    def write_shards(
        self, rng_states: list[dict], state: TrainState, config: TrainConfig, extra_state: dict, final: bool
    ) -> None:
        """Every rank: write the sharded checkpoint of `state.step` (`kqv.train.shards`), with the whole weights
        when `final`; non-finite weights on any rank are never saved (TrainingDiverged on every rank)."""
        place = self.placement
        with deferred():
            shards = {name: p.to_local() if isinstance(p, DTensor) else p for name, p in place.model.named_parameters()}
            if not every_rank(all(t.isfinite().all() for t in shards.values() if t.is_floating_point())):
                check_finite_weights(shards, config, state.step, self.last_saved)  # names this rank's bad weights
                check_finite_weights(NOT_FINITE, config, state.step, self.last_saved)  # another rank's
            weights = gather_weights(place.model, place.topology) if final else None
            saved = self.saved_state(rng_states, state, config, extra_state)
            target = self.run.checkpoint_dir

            def finish(tmp, digests: dict[str, str]) -> None:  # rank 0: the files besides the shards
                write_into(tmp, checkpoint_writers(saved, rng_tensors(rng_states), weights, shards=digests), 0, target)

            write_sharded(self.run, place.model, self.optimizer, place.topology, finish)
            self.last_saved = state.step

    def saved_state(self, rng_states: list[dict], state: TrainState, config: TrainConfig, extra: dict) -> dict:
        """What state.json records of a checkpoint, its files' SHA-256 aside."""
        return {
            "format": FORMAT,
            **state.saved(),
            "config": config.to_dict(),
            "extra_state": extra,
            "world_size": self.placement.world_size,
            "grad_scaler": self.placement.precision.state_dict(),
            "rng": [rng_to_json(s) for s in rng_states],
            "torch_version": torch.__version__,
            CHECKSUMS_KEPT: self.run.manifest_file.is_file(),  # a manifest lost later is damage (`kept_checksums`)
        }

    def load(self, checkpoint: Checkpoint) -> tuple[TrainState, list[dict | None]]:
        """Load `checkpoint`'s weights, optimizer state and loss scale; returns its `TrainState` and every rank's
        saved generator states (`saved_rng_states`)."""
        place = self.placement
        if is_sharded(checkpoint):  # under FSDP, DDP or in one process, on any number of processes
            load_sharded(place.model, self.optimizer, checkpoint)
        elif place.sharded:  # a one-process checkpoint, read into the shards
            load_checkpoint(place.model, self.optimizer, checkpoint, self.run.path, place.topology)
        else:
            part = None if self.saved_weights is None else partial_loader(place.model, self.saved_weights)
            load_weights(place.model, checkpoint, part)
            load_optimizer_state(self.optimizer, checkpoint, self.run.path)
        place.precision.load_state_dict(checkpoint.state.get("grad_scaler"))
        return TrainState.restored(checkpoint.state), saved_rng_states(checkpoint, place.world_size)

    def after_interrupt(
        self, state: TrainState, config: TrainConfig, extra_state: dict[str, Any], rng: dict, skipping: bool
    ) -> bool:
        """Rank 0, on Ctrl-C or SIGTERM: write the checkpoint of the last completed update (`rng`: its generator
        state; other ranks are somewhere else, so no collective and no states of theirs), unless updates were being
        skipped or the run is sharded (whose shards every rank writes together). Whether the run stands saved."""
        if skipping:
            logger.warning("interrupted while updates were being skipped; kept the last good checkpoint")
            return False
        if self.placement.sharded and self.last_saved != state.step:
            logger.warning("interrupted: a sharded run saves with all ranks; step %s stands", self.last_saved)
            return False
        if self.last_saved != state.step:
            self.write([rng], self.placement.model, self.optimizer, state, config, extra_state)
        logger.warning(
            "interrupted: saved the checkpoint of step %d in %s; continue with %s",
            state.step,
            self.run.checkpoint_dir,
            option(TRAINER_RESUME),
        )
        return True


def saved_rng_states(checkpoint: Checkpoint, world_size: int) -> list[dict | None]:
    """The generator states of every rank saved in `checkpoint` (None for a rank whose state was not saved); none
    at all when the checkpoint came from another number of processes, whose ranks no longer exist."""
    if checkpoint.state.get("world_size") != world_size:
        return []
    torch_states = safetensors_load(checkpoint.open(RNG_FILE).read())
    return [
        {
            **rng_from_json(s),
            **{key: torch_states[f"rank{r}{name}"] for key, name in TORCH_RNGS if f"rank{r}{name}" in torch_states},
        }
        if s is not None
        else None
        for r, s in enumerate(checkpoint.state["rng"])
    ]


def load_checkpoint(
    sharded: nn.Module, optimizer: torch.optim.Optimizer, checkpoint: Checkpoint, run_dir, topology: Topology
) -> None:
    """Set the weights and optimizer state of a (single-file) checkpoint into the shards of this process of
    `topology`, reading only its rows of each tensor: the weights through safetensors' slices
    (`kqv.train.slices.RowReader`), the optimizer state through a memory map of optimizer.pt
    (`torch.load(mmap=True)`), whose other pages are never read."""
    load_shards(sharded, checkpoint, topology)
    positions = [p for group in optimizer.param_groups for p in group["params"]]

    def set_state(state: dict[str, Any]) -> None:
        own = {i: {k: _own_rows(v, positions[i], topology) for k, v in s.items()} for i, s in state["state"].items()}
        optimizer.load_state_dict({"state": own, "param_groups": state["param_groups"]})

    load_optimizer_state(optimizer, checkpoint, run_dir, load=set_state, mmap=True)


def load_shards(sharded: nn.Module, checkpoint: Checkpoint, topology: Topology) -> None:
    """Copy the rows of this process of `topology` of every weight of `checkpoint` (and whole buffers) into
    `sharded`: the file keeps one name of each tied parameter, as for one process. A RunError when the file does
    not fit the model."""
    path = checkpoint.path / MODEL_FILE
    rank, world_size = topology.rank, topology.world_size
    try:
        with RowReader(checkpoint.path_of(MODEL_FILE)) as file, torch.no_grad():
            unexpected = file.names - set(sharded.state_dict())
            if unexpected:
                raise RunError(f"unexpected {sorted(unexpected)}")
            for names in tied_names(sharded):
                name = next((n for n in names if n in file.names), None)
                if name is None:
                    raise RunError(f"missing {names[0]}")
                param = sharded.get_parameter(names[0])
                if isinstance(param, DTensor):
                    param.to_local().copy_(file.rows(name, param.shape, rank, world_size))
                else:
                    param.copy_(file.whole(name))
            for name, buffer in sharded.named_buffers():
                if name in file.names:
                    buffer.copy_(file.whole(name))
    except (RuntimeError, SafetensorError, RunError) as error:
        raise RunError(
            f"{path} does not fit the model ({error}); build the model with the config the run was "
            f"trained with (saved in extra_state if the training script put it there)"
        ) from None


def _own_rows(value: Any, param: Tensor, topology: Topology) -> Any:
    """An optimizer state entry of the whole parameter, as this process's shard of `param`: its rows, as a DTensor
    placed as `param` is; a scalar (the step) as it is."""
    if not isinstance(value, Tensor) or not isinstance(param, DTensor) or value.shape != param.shape:
        return value.clone() if isinstance(value, Tensor) else value
    span = rows(value.shape[0], topology.rank, topology.world_size)
    local = value[span].to(param.to_local().device, copy=True)
    return DTensor.from_local(local, param.device_mesh, param.placements, shape=param.shape, stride=param.stride())
