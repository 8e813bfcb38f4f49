"""Fully sharded data parallelism (FSDP2) for the trainer: a model sharded one block at a time, and its
checkpoints gathered into, and loaded from, the files one process writes.

With `train.parallel = "fsdp"` under torchrun, each of N processes keeps 1/N of every parameter, gradient and
optimizer state (Zhao et al. 2023, "PyTorch FSDP"); a block's parameters are all-gathered just before its
forward and backward and freed after, so a model whose training state does not fit one device trains on several.
The gradient is the same mean over the processes' slices as DDP's, so the run equals one process up to rounding.

Checkpoints stay single-file whatever the number of processes: `gather_state` collects the whole weights and
optimizer state on rank 0 (on the CPU), numbered as one process's `Optimizer.state_dict` numbers them, and the
usual atomic writer saves them; `load_checkpoint` sets such files back into the shards. So a run resumes under
FSDP, DDP or one process, on any number of processes.
"""

from __future__ import annotations

import copy
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
from torch.distributed.fsdp import fully_shard

from ..errors import ConfigError
from ..nn.experts import expert_layers
from ..nn.layers import DecoderBlock, EncoderBlock
from .checkpoints import Checkpoint, load_optimizer_state, load_weights
from .distributed import model_device

GATHERED = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0's CPU only
WHOLE = StateDictOptions(full_state_dict=True)  # whole tensors, on every rank


def shard(model: nn.Module) -> nn.Module:
    """A copy of `model` sharded across the processes: `fully_shard` on every encoder and decoder block, then on
    the whole model (embeddings, final norm and output layer, tied weights included). `model` itself keeps its
    plain tensors; `unshard_into` gives it the trained weights at the end."""
    if expert_layers(model):
        raise ConfigError(
            'train.parallel = "fsdp" cannot shard mixture-of-experts layers yet: an expert that gets no tokens on '
            'one process has no gradient to reduce there; use train.parallel = "ddp" for this model'
        )
    sharded = copy.deepcopy(model)
    mesh = init_device_mesh(model_device(model).type, (dist.get_world_size(),))
    blocks = [m for m in sharded.modules() if isinstance(m, (EncoderBlock, DecoderBlock))]
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    return sharded


def unshard_into(model: nn.Module, sharded: nn.Module) -> None:
    """Copy the weights of `sharded` (all-gathered, on every rank) into the plain `model` it was copied from, and
    its training or evaluation mode: after training, or for an evaluation that runs on rank 0 alone."""
    with torch.no_grad():
        model.load_state_dict(get_model_state_dict(sharded, options=WHOLE))
    model.train(sharded.training)


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
