"""The module the trainer runs forward and backward through: the model, wrapped for several processes and, with
`train.compile`, compiled by `torch.compile`.

Order and place follow torch's guidance. DDP: compile the DDP-wrapped model (`torch.compile(DDP(model))`), so
Dynamo's DDP optimizer splits the graph at the gradient buckets and communication overlaps the backward. FSDP2:
compile each sharded block in place, as torchtitan does, so FSDP's all-gather and free hooks run eagerly between
compiled blocks; the embeddings and the output layer stay eager. One process: the whole model.

Lengths. A job whose batches change length (translation's token-budget batches, prompt -> completion pairs,
classification) compiles a bounded number of times, not once per length: Dynamo compiles the first batch's shapes
as they are and, at the first batch whose shapes differ, one graph for every size of the dimensions that changed
(its automatic dynamic shapes; `kqv.nn` builds positions as tensors from the shapes, never as a Python range of
the length, which would fix it, and kernel flags from lengths are plain bools). So new shapes recompile at most
once per dimension that varies, before any other guard (a length that crosses a kernel's threshold, as blockwise
attention's, or a size of 1, which Dynamo compiles apart): 2 graphs for pairs of one batch size, at most 4 for
translation, whose batches vary in rows, source and target length (`tests/test_compile_lengths.py`). Each graph
compiled is said, numbered, with its dynamic sizes: a line of `kqv train`'s output (the trainer's `Message`
event, which the Python API's callback gets too) and the trainer's log (`logging`, INFO).

Time. A graph compiled during an update makes that update slow once (seconds on a CPU, a minute on a GPU);
`compilations()` counts every compilation in the process (Dynamo's, a backward compiled lazily, a CUDA graph
recorded), so that a budget's planner times what training costs, not what compiling did (`kqv.train.budget`).

Checkpoints keep plain parameter names: the trainer saves and loads its own `model`, never the compiled wrapper
(whose state dict would prefix every name with `_orig_mod.`), and the blocks compiled in place keep their names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..nn.devices import kernels, model_device
from ..nn.training import layer_blocks
from . import distributed

BACKEND = "inductor"  # torch.compile's backend; tests set "aot_eager" (the same graphs, without inductor's codegen)

logger = logging.getLogger("kqv.train.trainer")  # the trainer's voice

_compiled = [0]  # compilations ended in this process, counted by `_count` once `compilations` registered it


def _count(args: Any) -> None:
    _compiled[0] += 1


def compilations() -> int:
    """How many compilations (any torch.compile'd function's: a graph traced, a backward compiled lazily, a CUDA
    graph recorded) have ended in this process since the first call: two readings that differ bracket a
    compilation, whose time is not training's. The count is Dynamo's compile-end callback, registered again
    whenever `torch._dynamo.reset()` cleared it."""
    handler = torch._dynamo.callback.callback_handler
    if _count not in handler.end_callbacks:
        handler.register_end_callback(_count)
    return _compiled[0]


class Compiler:
    """torch.compile's backend `name` (or a backend function), counting the graphs it compiles (`graphs`) and
    saying each (to the log, and to `say` when given): its shapes static, or which sizes are dynamic (s0, s1,
    ...)."""

    def __init__(self, backend: str | Callable[..., Any], say: Callable[[str], Any] | None = None):
        self.backend = torch._dynamo.lookup_backend(backend)
        self.compiler_name = backend if isinstance(backend, str) else getattr(backend, "__name__", "backend")
        self.graphs, self.say = 0, say

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list[Any], **options: Any) -> Callable[..., Any]:
        self.graphs += 1
        sizes = [size for x in example_inputs for size in (x.shape if isinstance(x, torch.Tensor) else [x])]
        symbols = sorted({str(size) for size in sizes if isinstance(size, torch.SymInt)})
        shapes = (
            f"dynamic sizes {', '.join(symbols)}: one graph for their values from 2 on" if symbols else "static shapes"
        )
        text = f"train.compile: graph {self.graphs} compiled ({self.compiler_name}), {shapes}"
        logger.info("%s", text)
        if self.say is not None:
            self.say(text)
        return self.backend(graph, example_inputs, **options)


def compiles(compile: bool | str, model: nn.Module) -> bool:
    """Whether `train.compile` compiles `model`: as it says, or with "auto" as the kernels of the model's device
    choose (`Kernels.compiled_training`: on CUDA GPUs, where fused kernels pay for the compile time; not on the
    CPU, where the first steps would pay for little)."""
    return kernels(model_device(model)).compiled_training if compile == "auto" else bool(compile)


def training_module(
    model: nn.Module, world_size: int, sharded: bool, compile: bool | str, say: Callable[[str], Any] | None = None
) -> nn.Module:
    """What forward and backward go through: `model` itself, in DDP under several processes (FSDP's `model` is
    already sharded), and compiled when `compile` (`compiles`), each graph compiled said to `say`. `model` keeps
    its own `__call__` unless it is FSDP's copy."""
    wrapped = distributed.data_parallel(model) if world_size > 1 and not sharded else model
    if not compiles(compile, model):
        return wrapped
    compiler = Compiler(BACKEND, say)
    if sharded:
        for block in layer_blocks(model):
            block.compile(backend=compiler)
        return model
    return torch.compile(wrapped, backend=compiler)
