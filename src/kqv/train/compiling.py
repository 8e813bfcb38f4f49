"""The module the trainer runs forward and backward through: the model, wrapped for several processes and, with
`train.compile`, compiled by `torch.compile`.

Order and place follow torch's guidance. DDP: compile the DDP-wrapped model (`torch.compile(DDP(model))`), so
Dynamo's DDP optimizer splits the graph at the gradient buckets and communication overlaps the backward. FSDP2:
compile each sharded block in place, as torchtitan does, so FSDP's all-gather and free hooks run eagerly between
compiled blocks; the embeddings and the output layer stay eager. One process: the whole model.

Checkpoints keep plain parameter names: the trainer saves and loads its own `model`, never the compiled wrapper
(whose state dict would prefix every name with `_orig_mod.`), and the blocks compiled in place keep their names.
"""

from __future__ import annotations

import torch
from torch import nn

from ..nn.layers import DecoderBlock, EncoderBlock
from . import distributed

BACKEND = "inductor"  # torch.compile's backend; tests set "aot_eager" (the same graphs, without inductor's codegen)


def training_module(model: nn.Module, world_size: int, sharded: bool, compile: bool) -> nn.Module:
    """What forward and backward go through: `model` itself, in DDP under several processes (FSDP's `model` is
    already sharded), and compiled when `compile`. `model` keeps its own `__call__` unless it is FSDP's copy."""
    wrapped = distributed.data_parallel(model) if world_size > 1 and not sharded else model
    if not compile:
        return wrapped
    if sharded:
        for block in (m for m in model.modules() if isinstance(m, (EncoderBlock, DecoderBlock))):
            block.compile(backend=BACKEND)
        return model
    return torch.compile(wrapped, backend=BACKEND)
