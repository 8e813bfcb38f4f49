"""Specification of kqv.train.rng: every generator state a checkpoint needs survives the way it travels, from the
ranks to rank 0 (`rng_to_json(torch_as_bytes=True)`, through `all_gather_object`) and through the checkpoint's
files (`rng_tensors` into rng.safetensors, `rng_to_json` into state.json, `saved_rng_states` back), the CUDA
generator's included: without it a resumed multi-GPU run drew other dropout masks."""

import io
import json
import random

import numpy as np
import torch
from safetensors.torch import save

from kqv.train.checkpoints import Checkpoint
from kqv.train.config import TrainConfig
from kqv.train.layout import RNG_FILE
from kqv.train.rng import rng_from_json, rng_state, rng_tensors, rng_to_json, seed_everything, set_rng_state
from kqv.train.saving import saved_rng_states


def state_of_rank(rank: int) -> dict:
    """This process's generator state after seeding with `rank`, with a made-up CUDA generator state (any bytes:
    it is only carried), as a rank on a GPU would have."""
    seed_everything(rank)
    return {**rng_state(), "cuda": torch.randint(0, 256, (16,), dtype=torch.uint8)}


def same(a: dict, b: dict) -> bool:
    return (
        a.keys() == b.keys()
        and all(torch.equal(a[k], b[k]) for k in ("torch", "cuda") if k in a)
        and a["python"] == b["python"]
        and all(np.array_equal(x, y) for x, y in zip(a["numpy"], b["numpy"]))
    )


def test_a_ranks_cpu_and_cuda_states_survive_the_gather_to_rank_0():
    state = state_of_rank(1)
    sent = json.loads(json.dumps(rng_to_json(state, torch_as_bytes=True), default=list))  # bytes as all_gather sees
    received = rng_from_json({k: bytes(v) if k in ("torch", "cuda") else v for k, v in sent.items()})
    assert same(received, state)


def test_every_ranks_cpu_and_cuda_states_survive_the_checkpoint_files():
    states = [state_of_rank(0), state_of_rank(1)]
    files = {RNG_FILE: io.BytesIO(save(rng_tensors(states)))}
    saved = {"world_size": 2, "rng": json.loads(json.dumps([rng_to_json(s) for s in states]))}
    checkpoint = Checkpoint(None, 3, TrainConfig(steps=3, batch_size=2), {}, saved, files)
    restored = saved_rng_states(checkpoint, world_size=2)
    assert [same(r, s) for r, s in zip(restored, states)] == [True, True]
    assert saved_rng_states(checkpoint, world_size=3) == []  # other ranks: none of them is this run's


def test_restoring_a_state_repeats_the_draws_of_every_generator():
    seed_everything(7)
    state = rng_state()
    first = (torch.rand(3).tolist(), random.random(), np.random.rand())
    torch.rand(5), random.random(), np.random.rand()  # the generators move on
    set_rng_state(state)
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == first
