"""Fully sharded data parallelism (FSDP2) for the trainer: a model sharded one block at a time, each process
materialising only its shard, and its checkpoints gathered into, and loaded from, the files one process writes.

With `train.parallel = "fsdp"` under torchrun, each of N processes keeps 1/N of every parameter, gradient and
optimizer state (Zhao et al. 2023, "PyTorch FSDP"); a block's parameters are all-gathered just before its
forward and backward and freed after, so a model whose training state does not fit one device trains on several.
The gradient is the same mean over the processes' slices as DDP's, so the run equals one process up to rounding.

How the shards come to be (`shard`), so that no process holds the whole model beyond its start-up:

1. the model's skeleton, on the meta device (no memory), is sharded (`fully_shard`), then `to_empty` gives each
   process storage for its shard alone, on its device;
2. the initial weights are rank 0's model's: rank 0 builds the model as one process would (the same seed, so the
   same weights and the same loss curve), and they are broadcast one tensor at a time, each process keeping its
   slice (`set_model_state_dict(broadcast_from_rank0=True)`); buffers too, as a non-persistent one (RoPE's
   frequencies, ALiBi's slopes) is in no state dict and is garbage after `to_empty`;
3. the caller's model is released to the meta device on every rank (its tensors freed, tied weights kept tied).

So a job may hand the trainer, on ranks other than 0, a model built on the meta device (`with
torch.device("meta"): build()`) or a function that builds the model, which the trainer calls on the meta device
there (`build_model`): only rank 0 then ever holds the whole model, in its host memory, before training starts.

The caller's model is plain again on rank 0 only, and only while it is needed (`gather_to_rank0`): for an
`eval_fn` (materialised on the training device, filled one parameter at a time from the shards, released after)
and after training (it then keeps the trained weights). On other ranks it stays on the meta device. The
validation loss runs on the sharded model, on every rank.

Checkpoints stay single-file whatever the number of processes: `gather_state` collects the whole weights and
optimizer state on rank 0 (on the CPU), numbered as one process's `Optimizer.state_dict` numbers them, and the
usual atomic writer saves them; `load_checkpoint` sets such files back into the shards. So a run resumes under
FSDP, DDP or one process, on any number of processes.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from ..errors import ConfigError, ConfigTypeError
from ..nn.experts import expert_layers
from ..nn.layers import DecoderBlock, EncoderBlock
from .checkpoints import Checkpoint, load_optimizer_state, load_weights
from .distributed import rank0_says

GATHERED = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0's CPU only
WHOLE = StateDictOptions(full_state_dict=True)  # whole tensors, on every rank
FROM_RANK0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)  # rank 0's whole tensors, sliced


def build_model(model: nn.Module | Callable[[], nn.Module], sharded: bool, rank: int) -> nn.Module:
    """The model the trainer was given, or built by the function it was given: under FSDP, on the meta device on
    every rank but 0 (their weights come from rank 0's). A model on the meta device can only be sharded."""
    if not isinstance(model, nn.Module):
        with torch.device("meta") if sharded and rank > 0 else contextlib.nullcontext():
            model = model()
        if not isinstance(model, nn.Module):
            raise ConfigTypeError(f"the model function must return an nn.Module, got {type(model).__name__}")
    if not sharded and on_meta(model):
        raise ConfigError(
            "the model is on the meta device, so it has no weights to train; only ranks other than 0 of a "
            'train.parallel = "fsdp" run may pass one (their weights come from rank 0)'
        )
    return model


def on_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in itertools.chain(model.parameters(), model.buffers()))


def shard(model: nn.Module, device: torch.device) -> nn.Module:
    """A copy of `model` sharded across the processes, each holding its shard alone on `device`, with rank 0's
    weights and buffers: `fully_shard` on every encoder and decoder block, then on the whole model (embeddings,
    final norm and output layer, tied weights included). `model` is released to the meta device on every rank;
    `gather_to_rank0` fills it again. Every rank must call this."""
    if expert_layers(model):
        raise ConfigError(
            'train.parallel = "fsdp" cannot shard mixture-of-experts layers yet: an expert that gets no tokens on '
            'one process has no gradient to reduce there; use train.parallel = "ddp" for this model'
        )
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if not rank0_says(not on_meta(model), world_size):  # every rank stops, not rank 0 alone
        raise ConfigError(
            'under train.parallel = "fsdp" rank 0\'s model holds the initial weights, so it cannot be on the meta '
            "device; only other ranks may build theirs there"
        )
    weights = model.state_dict() if rank == 0 else {}  # rank 0's tensors stay alive until they are broadcast
    buffers = dict(model.named_buffers()) if rank == 0 else {}
    replace_tensors(model, lambda t: torch.empty_like(t, device="meta"))
    sharded = copy.deepcopy(model)  # the skeleton: nothing to copy
    mesh = init_device_mesh(device.type, (world_size,))
    for block in (m for m in sharded.modules() if isinstance(m, (EncoderBlock, DecoderBlock))):
        fully_shard(block, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    sharded.to_empty(device=device)
    set_model_state_dict(sharded, weights, options=FROM_RANK0)
    with torch.no_grad():
        for name, buffer in sharded.named_buffers():
            if rank == 0:
                buffer.copy_(buffers[name])
            dist.broadcast(buffer, src=0)
    return sharded


def replace_tensors(model: nn.Module, make: Callable[[Tensor], Tensor]) -> None:
    """Replace every parameter and buffer of `model` by `make(it)`, a tied one once (so it stays tied): moving a
    model to or from the meta device with `Module.to` or `to_empty` would untie tied weights."""
    made: dict[int, Tensor] = {}
    for module in model.modules():
        for tensors in (module._parameters, module._buffers):
            for name, tensor in tensors.items():
                if tensor is None:
                    continue
                if id(tensor) not in made:
                    new = make(tensor.detach())
                    made[id(tensor)] = (
                        nn.Parameter(new, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else new
                    )
                tensors[name] = made[id(tensor)]


def gather_to_rank0(model: nn.Module, sharded: nn.Module, device: torch.device) -> None:
    """Fill the plain `model` (released by `shard`) on rank 0, on `device`, with the weights of `sharded`, one
    parameter at a time (each all-gathered, then dropped), and give it the training or evaluation mode of
    `sharded`; other ranks take part in the gathers and keep theirs on the meta device. Every rank must call it."""
    rank0 = dist.get_rank() == 0
    if rank0:
        replace_tensors(model, lambda t: torch.empty_like(t, device=device))
        model.train(sharded.training)
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    with torch.no_grad():
        for name, param in sharded.named_parameters():
            whole = param.full_tensor() if isinstance(param, DTensor) else param
            if rank0:
                params[name].copy_(whole)
        for name, buffer in sharded.named_buffers():
            if rank0:
                buffers[name].copy_(buffer)


def reshard(model: nn.Module) -> None:
    """Free every all-gathered weight of a sharded `model` (a no-op for another): FSDP frees a block's after its
    forward, but keeps the root module's gathered for the backward, which an evaluation never runs."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def release(model: nn.Module) -> None:
    """Free the tensors of the plain `model` again (to the meta device), after `gather_to_rank0`."""
    replace_tensors(model, lambda t: torch.empty_like(t, device="meta"))


@contextlib.contextmanager
def plain_on_rank0(model: nn.Module, sharded: nn.Module, device: torch.device, needed: bool) -> Iterator[None]:
    """Inside, when `needed`, rank 0's plain `model` holds the weights of `sharded` (`gather_to_rank0`); after, it
    is released again. Every rank must enter it."""
    if not needed:
        yield
        return
    gather_to_rank0(model, sharded, device)
    try:
        yield
    finally:
        release(model)


def local_bytes(model: nn.Module) -> int:
    """The bytes of parameters this process holds: its shards of a sharded model, nothing on the meta device."""
    params = {id(p): p for p in model.parameters()}.values()
    local = (p.to_local() if isinstance(p, DTensor) else p for p in params)
    return sum(t.numel() * t.element_size() for t in local if not t.is_meta)


def gather_state(sharded: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """(weights, optimizer state) of the whole model on rank 0, in one process's format; empty on other ranks.
    Every rank must call it: the tensors are all-gathered."""
    weights = get_model_state_dict(sharded, options=GATHERED)
    state = get_optimizer_state_dict(sharded, optimizer, options=GATHERED)
    if dist.get_rank() != 0:
        return {}, {}
    return _retie(weights, sharded), _by_position(state, _names(sharded, optimizer))


def load_checkpoint(sharded: nn.Module, optimizer: torch.optim.Optimizer, checkpoint: Checkpoint, run_dir) -> None:
    """Set the weights and optimizer state of a (single-file) checkpoint into this process's shards."""

    def set_weights(weights: dict[str, Tensor]) -> None:
        weights = _retie(weights, sharded)
        names = [*sharded.state_dict(), *sorted(weights)]  # one order on every rank: each tensor is a scatter
        set_model_state_dict(sharded, {n: weights[n] for n in dict.fromkeys(names) if n in weights}, options=WHOLE)

    def set_state(state: dict[str, Any]) -> None:
        set_optimizer_state_dict(sharded, optimizer, _by_name(state, _names(sharded, optimizer)), options=WHOLE)

    load_weights(sharded, checkpoint, load=set_weights)
    load_optimizer_state(optimizer, checkpoint, run_dir, load=set_state)


def _retie(weights: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """`weights` with every name of a tied parameter mapped to one tensor: the file keeps one name of each (as
    `safetensors.torch.save_model` does for a plain model), torch's state-dict helpers want them all."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    for names in groups.values():
        tensor = next((weights[n] for n in names if n in weights), None)
        if tensor is not None:
            weights.update(dict.fromkeys(names, tensor))
    return weights


def _names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The parameter name of every optimizer position, in the order `Optimizer.state_dict` numbers them (a tied
    parameter by its first name, as torch's state-dict helpers name it)."""
    names: dict[int, str] = {}
    for name, param in model.named_parameters():
        names.setdefault(id(param), name)
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _by_position(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name, keyed by position instead (one process's format)."""
    position = {name: i for i, name in enumerate(names)}
    return {
        "state": {position[name]: value for name, value in state["state"].items()},
        "param_groups": [{**g, "params": [position[n] for n in g["params"]]} for g in state["param_groups"]],
    }


def _by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An optimizer state keyed by position (one process's format), keyed by parameter name instead."""
    return {
        "state": {names[i]: value for i, value in state["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]],
    }
