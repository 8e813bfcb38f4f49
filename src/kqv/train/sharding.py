"""Fully sharded data parallelism (FSDP2) for the trainer: a model sharded one block at a time, each process
materialising only its shard, each writing its own shards of a checkpoint (`kqv.train.shards`).

With `train.parallel = "fsdp"` under torchrun, each of N processes keeps 1/N of every parameter, gradient and
optimizer state (Zhao et al. 2023, "PyTorch FSDP"); a block's parameters are all-gathered just before its
forward and backward and freed after, so a model whose training state does not fit one device trains on several.
The gradient is the same mean over the processes' slices as DDP's, so the run equals one process up to rounding.

How the shards come to be (`shard`): the model's skeleton, on the meta device (no memory), is sharded
(`fully_shard`), and its weights come one of two ways, the same on every rank (rank 0's model decides):

1. a job's model (`kqv.jobs.base.Job.start`) is built in slices on every rank (`kqv.train.slices`): each rank
   kept only its rows of every parameter from the first draw on, the weights one process draws with the same seed,
   and those rows become its shards themselves (`load_state_dict(assign=True)`, no copy); the buffers, which
   FSDP does not shard, are every rank's own, made whole as one process makes them. No rank ever holds the
   whole model: its rows, plus one tensor while it is drawn whole;
2. otherwise (a model handed to the Trainer) `to_empty` gives each rank storage for its shard alone, and rank 0's
   weights are broadcast one tensor at a time, each rank keeping its slice
   (`set_model_state_dict(broadcast_from_rank0=True)`); buffers too. Ranks other than 0 may pass a model on the
   meta device, or a function the trainer then calls on the meta device there (`build_model`): only rank 0
   holds the whole model, before training starts. (A function is not built in slices: nothing says the ranks'
   generators agree when it is called.)

Either way the caller's model is then released to the meta device on every rank (tied weights kept tied).

The caller's model is plain again on rank 0 only, and only while it is needed (`gather_to_rank0`): for an
`eval_fn` (materialised on the training device, filled one parameter at a time from the shards, released after)
and after training (it then keeps the trained weights). On other ranks it stays on the meta device: during
those gathers they hold one whole parameter at a time besides their shards. The validation loss runs on the
sharded model, on every rank: one block's weights gathered at a time, and none kept after (`reshard`).

Checkpoints are sharded: each rank writes its own rows of the weights and the optimizer state
(`kqv.train.shards`, torch.distributed.checkpoint), and a run's final checkpoint adds the whole weights
(`gather_weights`, rank 0) in the one-process model.safetensors, for export and inference. A resume reads each
rank's rows back, on any number of processes, under FSDP, DDP or in one process. A one-process (single-file)
checkpoint resumes under FSDP too: `kqv.train.saving.load_checkpoint` reads each rank's rows of it into its shards
(the weights through safetensors' slices, optimizer.pt through a memory map whose other pages are never read).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from ..errors import ConfigError, ConfigTypeError
from ..nn.training import layer_blocks, may_skip_parameters
from .distributed import rank0_says
from .slices import is_sliced, take_slices, tied_names
from .topology import Topology

GATHERED = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0's CPU only
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


def precision_policy(resolved: str) -> MixedPrecisionPolicy:
    """FSDP2's precision for a run in `resolved` precision. bf16: each block's weights gathered in bf16 (half the
    bytes of fp32 to send and hold) and the gradients reduce-scattered in fp32 into the fp32 shards the optimizer
    updates, as torchtitan trains. Autocast stays on around the forward (`MixedPrecision.autocast`): the gathered
    weights are bf16 already, so it casts none of them; it keeps softmax, norms and the loss in fp32, lets fp32
    buffers (RoPE's, sinusoidal positions) meet bf16 activations, and gives rank 0's plain model its precision
    for an `eval_fn`. Otherwise FSDP's default: weights and gradients in their own dtype, autocast as in one
    process."""
    if resolved == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard(
    model: nn.Module, topology: Topology, device: torch.device, policy: MixedPrecisionPolicy | None = None
) -> nn.Module:
    """A copy of `model` sharded across the processes of `topology`, each holding its shard alone on `device`:
    `fully_shard` on every encoder and decoder block, then on the whole model (embeddings, final norm and output
    layer, tied weights included). Its weights are the rows every rank kept when it built `model`
    (`kqv.train.slices.build_sliced`), or else rank 0's model's, broadcast, gathered and reduced in the precision
    of `policy` (`precision_policy`). `model` is released to the meta device on every rank; `gather_to_rank0` fills
    it again. Every rank must call this."""
    if may_skip_parameters(model):
        raise ConfigError(
            'train.parallel = "fsdp" cannot shard mixture-of-experts layers yet: an expert that gets no tokens on '
            'one process has no gradient to reduce there; use train.parallel = "ddp" for this model'
        )
    from_rank0 = rank0_says(not on_meta(model), topology.world_size)  # every rank takes the same way
    if not from_rank0 and not every_rank(is_sliced(model)):  # every rank stops, not one alone
        raise ConfigError(
            "under train.parallel = \"fsdp\" the weights come from rank 0's model, or from every rank's slices "
            "(kqv.train.slices.build_sliced), so rank 0's model cannot be on the meta device unless every rank "
            "built its model in slices"
        )
    slices = take_slices(model) if is_sliced(model) else None  # rank 0's weights win over slices
    rank0 = topology.rank == 0
    weights = model.state_dict() if from_rank0 and rank0 else {}  # alive until broadcast
    buffers = {name: b for name, b in model.named_buffers() if not b.is_meta}  # every rank's, or rank 0's
    persistent = set(model.state_dict()) & set(buffers)
    sharded = _skeleton(model, topology, device, policy or MixedPrecisionPolicy())
    if not from_rank0:
        _adopt(sharded, slices, device)
        for name, buffer in buffers.items():  # not sharded: every rank's whole, made as one process makes them
            owner, _, leaf = name.rpartition(".")
            sharded.get_submodule(owner).register_buffer(leaf, buffer.to(device), persistent=name in persistent)
        return sharded
    sharded.to_empty(device=device)  # storage for this rank's shard alone
    set_model_state_dict(sharded, weights, options=FROM_RANK0)
    with torch.no_grad():
        for name, buffer in sharded.named_buffers():
            if rank0:
                buffer.copy_(buffers[name])
            dist.broadcast(buffer, src=0)
    return sharded


def _adopt(sharded: nn.Module, slices: dict[str, Tensor], device: torch.device) -> None:
    """Make each rank's rows (`kqv.train.slices`) the shards of `sharded` themselves, not copies of them
    (`load_state_dict(assign=True)`, FSDP2's way to fill a model sharded on the meta device): a rank never holds
    its rows twice. A tied parameter's names all get the one shard."""
    shards: dict[str, Tensor] = {}
    for names in tied_names(sharded):
        param = sharded.get_parameter(names[0])
        mine = slices.pop(names[0]).to(device)
        if mine.shape != param.to_local().shape:  # FSDP2 cut dimension 0 otherwise than torch.chunk
            raise RuntimeError(f"{names[0]}: shard {tuple(param.to_local().shape)}, rows {tuple(mine.shape)}")
        placed = DTensor.from_local(mine, param.device_mesh, param.placements, shape=param.shape, stride=param.stride())
        shards.update(dict.fromkeys(names, nn.Parameter(placed, param.requires_grad)))
    slices.clear()
    sharded.load_state_dict(shards, strict=False, assign=True)  # every parameter is in `shards`, buffers are not


def every_rank(value: bool) -> bool:
    """Whether `value` holds on every rank (a collective)."""
    flag = torch.tensor(int(value))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag)


def _skeleton(model: nn.Module, topology: Topology, device: torch.device, policy: MixedPrecisionPolicy) -> nn.Module:
    """A sharded copy of `model`'s skeleton over the processes of `topology`, on the meta device, in `policy`'s
    precision; `model` is released to the meta device."""
    replace_tensors(model, lambda t: torch.empty_like(t, device="meta"))
    sharded = copy.deepcopy(model)  # the skeleton: nothing to copy
    mesh = init_device_mesh(device.type, (topology.world_size,))
    for block in layer_blocks(sharded):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(sharded, mesh=mesh, mp_policy=policy)
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


def gather_to_rank0(model: nn.Module, sharded: nn.Module, topology: Topology, device: torch.device) -> None:
    """Fill the plain `model` (released by `shard`) on rank 0 of `topology`, on `device`, with the weights of
    `sharded`, one parameter at a time (each all-gathered, then dropped), and give it the training or evaluation
    mode of `sharded`; other ranks take part in the gathers and keep theirs on the meta device. Every rank must
    call it."""
    rank0 = topology.rank == 0
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
def plain_on_rank0(
    model: nn.Module, sharded: nn.Module, topology: Topology, device: torch.device, needed: bool
) -> Iterator[None]:
    """Inside, when `needed`, rank 0's plain `model` holds the weights of `sharded` (`gather_to_rank0`); after, it
    is released again. Every rank must enter it."""
    if not needed:
        yield
        return
    gather_to_rank0(model, sharded, topology, device)
    try:
        yield
    finally:
        release(model)


def local_bytes(model: nn.Module) -> int:
    """The bytes of parameters this process holds: its shards of a sharded model, nothing on the meta device."""
    params = {id(p): p for p in model.parameters()}.values()
    local = (p.to_local() if isinstance(p, DTensor) else p for p in params)
    return sum(t.numel() * t.element_size() for t in local if not t.is_meta)


def gather_weights(sharded: nn.Module, topology: Topology) -> dict[str, Tensor]:
    """The whole weights of the sharded model on the CPU of rank 0 of `topology` (empty on other ranks), as one
    process names them: for the model.safetensors of a run's final checkpoint. Every rank must call it: the tensors
    are all-gathered."""
    weights = get_model_state_dict(sharded, options=GATHERED)
    return _retie(weights, sharded) if topology.rank == 0 else {}


def _retie(weights: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """`weights` with every name of a tied parameter mapped to one tensor: the file keeps one name of each (as
    `safetensors.torch.save_model` does for a plain model), torch's state-dict helpers want them all. That tensor
    must be all of its storage, or `save_model` cannot tell which name covers it."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    for names in groups.values():
        tensor = next((weights[n] for n in names if n in weights), None)
        if tensor is not None:  # a view of a padded gather (a shard cut unevenly) as a tensor of its own
            whole = tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
            weights.update(dict.fromkeys(names, tensor if whole else tensor.clone()))
    return weights
