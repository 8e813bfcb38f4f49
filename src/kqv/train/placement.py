"""Where a run trains: its device (under torchrun, this process's own GPU), the precision it computes in, the
process group it joins, and the model placed on them: moved to the device, or under `parallel="fsdp"` sharded
across the processes (`kqv.train.sharding`).

The Trainer asks once, when it is made, and keeps the answer; its loop never decides any of it again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist
from torch import Tensor, nn

from ..errors import ConfigError
from ..nn.devices import Accelerator
from . import distributed
from .config import TrainConfig
from .precision import MixedPrecision, bound_kernel_caches
from .sharding import build_model, precision_policy, shard
from .topology import Topology


@dataclass
class Placement:
    """A run's device, precision and processes, and its model on them. The Trainer keeps it whole and hands it to
    the parts that need it (checkpoints, evaluation, updates), each reading the fields it uses."""

    device: Accelerator  # the one per-device choice: kernels, autocast, scaler
    precision: MixedPrecision
    topology: Topology  # this process among the run's: the one answer to which rank, and how many
    owns_process_group: bool  # whether joining created the group, which the run then leaves at its end
    sharded: bool  # FSDP over several processes
    callers_model: nn.Module  # the caller's model: under FSDP, released by `shard`
    model: nn.Module  # the one trained: `callers_model` on the device, or this process's shard of it

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def world_size(self) -> int:
        return self.topology.world_size

    def leave_process_group(self) -> None:
        """Leave the process group that joining created (once); a group that was there before stays."""
        if self.owns_process_group:
            dist.destroy_process_group()
            self.owns_process_group = False


def check_saved_weights(saved_weights: Callable | None, sharded: bool) -> None:
    """ConfigError for checkpoints of part of the weights (a LoRA run's adapters) under FSDP, whose shards are
    saved and loaded whole (`kqv.train.sharding`)."""
    if sharded and saved_weights is not None:
        raise ConfigError(
            'a run whose checkpoints hold part of its weights (LoRA) cannot be sharded; set train.parallel="ddp"'
        )


def place_model(
    model: nn.Module,
    config: TrainConfig,
    topology: Topology,
    saved_weights: Callable[[dict[str, Tensor]], dict[str, Tensor]] | None = None,
) -> Placement:
    """Resolve `config.device` (under torchrun, this process's GPU: `Topology.device`) and its precision, join the
    process group of `topology`, and put `model` (or the function that builds it) there. The global batch must
    split evenly between processes."""
    bound_kernel_caches()  # before the first bf16 kernel is built
    device = Accelerator.resolve(topology.device(Accelerator.resolve(config.device).device))
    precision = MixedPrecision(device, config.precision, config.tf32)
    owns_process_group = distributed.init_distributed(topology, device.device, config.collective_timeout_minutes)
    if config.batch_size % topology.world_size:
        raise ConfigError(
            f"batch_size ({config.batch_size}) must be divisible by the number of processes "
            f"({topology.world_size}): every process takes an equal slice of each batch"
        )
    sharded = config.parallel == "fsdp" and topology.several
    check_saved_weights(saved_weights, sharded)
    callers_model = build_model(model, sharded, topology.rank)
    if sharded:  # in FSDP's precision: bf16 gathers and fp32 reductions for bf16
        placed = shard(callers_model, topology, device.device, precision_policy(device.precision(config.precision)))
    else:
        placed = callers_model.to(device.device)
    return Placement(device, precision, topology, owns_process_group, sharded, callers_model, placed)
