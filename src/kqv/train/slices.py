"""A model built for FSDP with each process holding only its rows of every parameter, never the whole model: the
same weights as one process builds with the same seed, bit for bit, and weights loaded from safetensors files
one slice at a time.

`build_sliced(build, rank, world_size)` calls `build()` (a job's model constructor, after the job seeded the
generator) with every `torch.empty` of it redirected to the meta device, so its parameters take no memory. Each
initialisation drawn into such a tensor (`uniform_`, `normal_`, ... as `nn.init` and the modules' own
`reset_parameters` call them) is drawn, in the same order, into a scratch tensor of the whole shape on the CPU,
exactly as one process draws it, and only this process's rows are kept; the scratch is freed at once. The
elementwise steps after a draw (`fill_`, `zero_`, `mul_`, `clamp_`, `copy_` from a whole tensor, ...) are applied
to those rows alone. Tensors the constructor makes otherwise (`torch.randn(...) * 0.02`, `torch.arange` for
RoPE's frequencies) are made as one process makes them; a parameter among them is cut to its rows once the
model is built. So a process holds at most its rows of the model, plus one whole tensor for as long as it is
drawn (or, for a parameter made by `torch.randn` and the like, until the model is built).

The rows of a parameter are FSDP2's shard: dimension 0 cut into `world_size` chunks as `torch.chunk` cuts it
(`rows`). The rows wait, in this module's table, for `kqv.train.sharding.shard` to make them the sharded
model's shards and forget them (`take_slices`). Meanwhile a fine-tune sets its source's weights into them
(`load_slices`, reading only those rows of a safetensors file with `RowReader`; `set_slices` from tensors in
memory). `RowReader` also reads a resumed FSDP run's rows of its checkpoint (`kqv.train.saving.load_shards`).

An operation that would need the whole value of such a tensor (a product of two of them, a view written into)
is refused with a ConfigError naming it: the model must then be built whole (`train.parallel = "ddp"`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from ..errors import ConfigError, RunError
from .topology import Topology

aten = torch.ops.aten
EMPTY = (aten.empty.memory_format, aten.empty_strided.default)
DRAWS = frozenset({"uniform_", "normal_", "bernoulli_", "exponential_", "random_", "cauchy_", "log_normal_"})
ELEMENTWISE = frozenset(
    {"fill_", "zero_", "mul_", "div_", "add_", "sub_", "clamp_", "clamp_min_", "clamp_max_", "erfinv_", "copy_"}
)

_PENDING: weakref.WeakKeyDictionary[nn.Module, Pending] = weakref.WeakKeyDictionary()


class Pending(NamedTuple):
    """What a model built in slices waits with: this rank's rows of each parameter (by every name), and the
    rank and number of processes they were cut for."""

    rows: dict[str, Tensor]
    rank: int
    world_size: int


def rows(length: int, rank: int, world_size: int) -> slice:
    """The rows of dimension 0 (of `length`) that `rank` keeps: its chunk as `torch.chunk` (and FSDP2) cuts them,
    empty for a rank past the last chunk."""
    size = -(-length // world_size)
    start = min(length, rank * size)
    return slice(start, min(length, start + size))


def own_rows(tensor: Tensor, rank: int, world_size: int) -> Tensor:
    """A copy of this rank's rows of `tensor` (the whole of a 0-dimensional one)."""
    return tensor.clone() if tensor.dim() == 0 else tensor[rows(tensor.shape[0], rank, world_size)].clone()


def _key(tensor: Tensor) -> int:
    return tensor.untyped_storage()._cdata


def _whole(tensor: Tensor) -> bool:
    """Whether `tensor` is all of its storage (not a view of part of it)."""
    nbytes = tensor.numel() * tensor.element_size()
    return tensor.storage_offset() == 0 and tensor.is_contiguous() and nbytes == tensor.untyped_storage().nbytes()


class _Slicer(TorchDispatchMode):
    """While building: `torch.empty` on the meta device; draws into such tensors done whole on the CPU, keeping
    this rank's rows; elementwise steps done on the rows."""

    def __init__(self, rank: int, world_size: int):
        super().__init__()
        self.rank, self.world_size = rank, world_size
        self.meta: dict[int, Tensor] = {}  # storage -> a tensor made empty here (kept, so no storage is reused)
        self.rows: dict[int, Tensor] = {}  # storage -> this rank's rows of its value

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if func in EMPTY and (device is None or torch.device(device).type == "cpu"):
            made = func(*args, **{**kwargs, "device": torch.device("meta")})
            self.meta[_key(made)] = made
            return made
        tracked = [t for t in tree_leaves((args, kwargs)) if self._tracked(t)]
        if not tracked or func.is_view:
            return func(*args, **kwargs)
        name = func.overloadpacket.__name__
        target = args[0] if args else None
        if self._tracked(target) and _whole(target) and name in DRAWS | ELEMENTWISE:
            self._apply(func, name, target, args[1:], kwargs)
            return target
        raise ConfigError(
            f"building this model with each process holding only its slices cannot do {func} on a parameter "
            f'(it needs the whole value); train it with train.parallel = "ddp"'
        )

    def _tracked(self, tensor: object) -> bool:
        return isinstance(tensor, Tensor) and tensor.is_meta and _key(tensor) in self.meta

    def _apply(self, func, name: str, target: Tensor, args: tuple, kwargs: dict) -> None:
        key = _key(target)
        if name in DRAWS:  # drawn whole, as one process draws it, then cut: the generator advances the same
            whole = torch.empty(target.shape, dtype=target.dtype)
            func(whole, *args, **kwargs)
            self.rows[key] = own_rows(whole, self.rank, self.world_size)
            return
        mine = self.rows.get(key)
        if mine is None:
            mine = own_rows(torch.empty(target.shape, dtype=target.dtype), self.rank, self.world_size)
            self.rows[key] = mine
        func(mine, *tree_map(lambda a: self._rows_of(a, target), args), **kwargs)

    def _rows_of(self, value: object, target: Tensor) -> object:
        """An operand of an elementwise step on `target`'s rows: a scalar as it is, a whole tensor cut to rows."""
        if not isinstance(value, Tensor) or value.dim() == 0:
            return value
        if self._tracked(value) and value.shape == target.shape and _key(value) in self.rows:
            return self.rows[_key(value)]
        if not value.is_meta and value.shape == target.shape:
            return own_rows(value, self.rank, self.world_size)
        raise ConfigError(
            f"building this model with each process holding only its slices cannot combine a parameter of shape "
            f'{tuple(target.shape)} with a tensor of shape {tuple(value.shape)}; train it with train.parallel = "ddp"'
        )


def build_for(parallel: str, build: Callable[[], nn.Module], topology: Topology) -> nn.Module:
    """The model `build()` makes: in slices (`build_sliced`) for this process of `topology` with
    `train.parallel = "fsdp"` and several processes, whole otherwise. A job calls it before the process group
    exists, with the topology it made when it started."""
    if parallel != "fsdp" or not topology.several:
        return build()
    return build_sliced(build, topology.rank, topology.world_size)


def build_sliced(build: Callable[[], nn.Module], rank: int, world_size: int) -> nn.Module:
    """The model `build()` makes, on the meta device, with this rank's rows of each of its parameters kept aside
    for `kqv.train.sharding.shard` (`take_slices`); buffers are made whole, as one process makes them."""
    slicer = _Slicer(rank, world_size)
    with slicer:
        model = build()
    pending: dict[str, Tensor] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if not param.is_meta:  # made by torch.randn or the like: whole until now
            pending[name] = own_rows(param.detach(), rank, world_size)
        elif _key(param) in slicer.rows:
            pending[name] = slicer.rows[_key(param)]
        else:
            raise ConfigError(f"the model's parameter {name} is never initialised, so it has no value to shard")
    for name, buffer in model.named_buffers():
        if buffer.is_meta:
            raise ConfigError(
                f"the model's buffer {name} is made with torch.empty, which a process holding only its slices cannot "
                'fill whole; train it with train.parallel = "ddp"'
            )
    with torch.no_grad():
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                if not param.is_meta:
                    setattr(module, name, nn.Parameter(torch.empty_like(param, device="meta"), param.requires_grad))
    _PENDING[model] = Pending(pending, rank, world_size)
    return model


def is_sliced(model: nn.Module) -> bool:
    """Whether `model` was built by `build_sliced` and its rows are not yet taken by the sharding."""
    return model in _PENDING


def take_slices(model: nn.Module) -> dict[str, Tensor]:
    """This rank's rows of every parameter of `model` (each name of a tied one), forgotten here: the caller (the
    sharding) now holds the only reference."""
    return _PENDING.pop(model).rows


def set_slices(model: nn.Module, weights: dict[str, Tensor]) -> None:
    """Replace the kept rows of the parameters `weights` names (whole tensors: a pretrained part, say) by this rank's
    rows of them; a tied parameter's other names follow."""
    pending, rank, world_size = _PENDING[model]
    for names in tied_names(model):
        given = next((weights[n] for n in names if n in weights), None)
        if given is None:
            continue
        if given.shape != _shape(model, names[0]):
            raise RunError(f"{names[0]} has shape {tuple(given.shape)}, the model's {tuple(_shape(model, names[0]))}")
        mine = own_rows(given.detach().to(pending[names[0]].dtype), rank, world_size)
        pending.update(dict.fromkeys(names, mine))


def load_slices(model: nn.Module, path: Path) -> None:
    """Replace the kept rows of every parameter by this rank's rows of them in the safetensors file `path`
    (`RowReader`: only those rows are read), as `kqv.train.checkpoints.load_weights` loads a whole model: the
    file may hold one name of each tied parameter. A RunError when the file does not fit the model."""
    pending, rank, world_size = _PENDING[model]
    try:
        with RowReader(path) as file:
            for names in tied_names(model):
                name = next((n for n in names if n in file.names), None)
                if name is None:
                    raise RunError(f"{names[0]} is missing")
                mine = file.rows(name, _shape(model, name), rank, world_size)
                pending.update(dict.fromkeys(names, mine.to(pending[names[0]].dtype)))
    except (SafetensorError, RunError) as error:
        raise RunError(
            f"{path} does not fit the model ({error}); build the model with the config the weights were trained with"
        ) from None


class RowReader:
    """A safetensors file read a slice at a time (`with RowReader(path) as file`): through numpy's view of the
    mapped file (`safe_open(framework="np")`), so `rows` reads only the rows asked for, copied into a torch tensor.
    A bfloat16 tensor, for which numpy has no type, is read whole through torch, then cut."""

    def __init__(self, path: Path):
        self.path = path
        self.numpy = safe_open(str(path), framework="np")
        self.names = set(self.numpy.keys())
        self._torch = None

    def __enter__(self) -> RowReader:
        return self

    def __exit__(self, *exc) -> None:
        self.numpy = self._torch = None  # their mappings go with them

    def rows(self, name: str, shape: torch.Size, rank: int, world_size: int) -> Tensor:
        """This rank's rows of tensor `name`, checked to have `shape` when whole."""
        part = self.numpy.get_slice(name)
        if tuple(part.get_shape()) != tuple(shape):
            raise RunError(f"{name} has shape {tuple(part.get_shape())}, the model's {tuple(shape)}")
        if part.get_dtype() == "BF16" or len(shape) == 0:
            return own_rows(self.whole(name), rank, world_size)
        span = rows(shape[0], rank, world_size)
        return torch.tensor(part[span.start : span.stop])

    def whole(self, name: str) -> Tensor:
        """Tensor `name`, whole."""
        if self.numpy.get_slice(name).get_dtype() != "BF16":
            return torch.tensor(self.numpy.get_tensor(name))
        if self._torch is None:
            self._torch = safe_open(str(self.path), framework="pt")
        return self._torch.get_tensor(name).clone()


def tied_names(model: nn.Module) -> list[list[str]]:
    """The names of each parameter of `model`, a tied one's all together."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return list(groups.values())


def _shape(model: nn.Module, name: str) -> torch.Size:
    return model.get_parameter(name).shape
