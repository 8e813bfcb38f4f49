"""The random generators of a training run: seeding them, their state (torch's CPU and CUDA ones, `random`'s
and numpy's), gathered from every rank, and their form in a checkpoint (torch's states as tensors in
`rng.safetensors`, the others as JSON in `state.json`). Saving them is what makes a resumed run draw the same
dropout masks as an uninterrupted one."""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

TORCH_RNGS = (("torch", ""), ("cuda", ".cuda"))  # state key, suffix of its rng.safetensors name

logger = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def start_generators(seed: int, rank: int, saved: list[dict | None] | None, step: int) -> None:
    """A run's generators at its start: seeded with `seed + rank` when fresh (`saved` None); a resumed run's
    `saved` states, one per rank, restored; a rank that has none (a checkpoint saved by an interrupt, or by another
    number of processes) reseeded for `step`, with a warning, since its dropout then differs."""
    seed += rank
    if saved is None:
        seed_everything(seed)
    elif rank < len(saved) and saved[rank] is not None:
        set_rng_state(saved[rank])
    else:
        logger.warning(
            "rank %d has no saved generator state (the checkpoint came from an interrupt or another "
            "number of processes); reseeding, so dropout differs from an uninterrupted run",
            rank,
        )
        seed_everything(seed + 1_000_003 * step)


def rng_state() -> dict[str, Any]:
    """The generators' states: torch's CPU one, the current CUDA GPU's once CUDA is in use (dropout on a GPU draws
    from it), `random`'s and numpy's."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():  # a run resumed on the CPU has no use for it
        torch.cuda.set_rng_state(state["cuda"])


def rng_tensors(states: list[dict[str, Any]]) -> dict[str, Tensor]:
    """The torch generator states of every rank, as rng.safetensors holds them: `rank{r}`, and `rank{r}.cuda`."""
    tensors = {f"rank{r}": s["torch"] for r, s in enumerate(states)}
    tensors.update({f"rank{r}.cuda": s["cuda"] for r, s in enumerate(states) if "cuda" in s})
    return tensors


def rng_to_json(state: dict[str, Any], torch_as_bytes: bool = False) -> dict[str, Any]:
    """JSON form of the `random` and numpy states (torch's are tensors, saved in rng.safetensors); with
    `torch_as_bytes`, torch's CPU and CUDA states too, as bytes (to send them to rank 0)."""
    version, internal, gauss = state["python"]
    name, keys, position, has_gauss, cached = state["numpy"]
    out = {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(position), int(has_gauss), float(cached)],
    }
    if torch_as_bytes:
        out.update({key: state[key].numpy().tobytes() for key, _ in TORCH_RNGS if key in state})
    return out


def rng_from_json(state: dict[str, Any]) -> dict[str, Any]:
    version, internal, gauss = state["python"]
    name, keys, position, has_gauss, cached = state["numpy"]
    out = {
        "python": (version, tuple(internal), gauss),
        "numpy": (name, np.array(keys, dtype=np.uint32), position, has_gauss, cached),
    }
    for key, _ in TORCH_RNGS:
        if key in state:
            out[key] = torch.frombuffer(bytearray(state[key]), dtype=torch.uint8)
    return out


def all_rng_states(world_size: int) -> list[dict[str, Any]]:
    """The generator states of every rank, CPU and CUDA, on every rank (a collective under torchrun: every rank
    must call it)."""
    rng = rng_state()
    if world_size == 1:
        return [rng]
    states: list[Any] = [None] * world_size
    dist.all_gather_object(states, rng_to_json(rng, torch_as_bytes=True))
    return [rng_from_json(s) for s in states]
