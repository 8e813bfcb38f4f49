"""Which process this is among those that train one run: `Topology` (rank, local rank, world size), read from
torchrun's environment here and nowhere else.

A job makes it once when it starts a training (`Topology.of_process`) and hands it down: to the run directory
(rank 0 alone writes), to the model's construction (each rank's slices under FSDP), to the data (a corpus on disk
reads only this rank's rows), to the memory check (one process's rows of the batch), and to the Trainer's placement,
which joins the process group, takes this process's device (`Topology.device`) and keeps the topology for every
part of the Trainer that asks which rank it is or how many there are (checkpoints, sharding, collectives). A
Trainer given a plain path, not a job's run directory, is the one other place that makes it (the library's public
entry, for a script run under torchrun). No other module reads `RANK`, `LOCAL_RANK` or `WORLD_SIZE`, nor asks
torch.distributed for the rank or the world size (`tests/test_topology.py` scans for them): the group joined is
checked once against the topology (`check_group`) and never asked again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import ConfigError


@dataclass(frozen=True)
class Topology:
    """This process's place among the run's processes: its `rank` (0 speaks and writes for all), its
    `local_rank` on its machine (which GPU it takes) and the `world_size`, the number of processes. One process
    (the default) is rank 0 of 1."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @classmethod
    def of_process(cls) -> Topology:
        """This process's topology as torchrun's environment says it (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`); rank 0
        of 1 outside torchrun, or when it starts a single process."""
        world_size = max(int(os.environ.get("WORLD_SIZE", "1")), 1)
        if world_size == 1:
            return cls()
        return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0")), world_size)

    @property
    def several(self) -> bool:
        """Whether several processes train the run together (under torchrun)."""
        return self.world_size > 1

    @property
    def writes(self) -> bool:
        """Whether this process writes the run's files and speaks for all: rank 0."""
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """The device this process trains on, for a run configured on `device`: under torchrun every process takes
        its own GPU (cuda:LOCAL_RANK); anything else as it is."""
        if device.type != "cuda" or not self.several:
            return device
        return torch.device("cuda", self.local_rank)

    def check_group(self) -> None:
        """ConfigError when the process group this process has joined puts it at another rank, or counts another
        number of processes, than this topology (a group its caller made before, otherwise than torchrun's
        environment says): the run's collectives would wait for processes that never come."""
        joined = dist.get_rank(), dist.get_world_size()
        if joined != (self.rank, self.world_size):
            raise ConfigError(
                f"this process is rank {joined[0]} of {joined[1]} in the process group it joined, but rank "
                f"{self.rank} of {self.world_size} as torchrun's environment (RANK, WORLD_SIZE) says; start the "
                f"processes with torchrun, or make the process group with the same rank and world size"
            )
