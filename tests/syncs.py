"""Counting host syncs: the points where Python waits for a tensor's value (on a GPU, for the device to finish).

`.item()`, `.tolist()`, `int(t)`, `float(t)` and `bool(t)` all reach ATen as `aten._local_scalar_dense` (one
element to the host) or `aten.is_nonzero` (a tensor's truth value); `torch.nonzero` and boolean-mask indexing,
whose output size depends on the data, read that size back too (`aten.nonzero`, `aten.masked_select`, ...). A
`TorchDispatchMode` sees every one of them, whichever Python line asked: on the CPU it counts what would be a
sync on a GPU, so a CPU-only suite keeps the training step sync-free. A copy from a device to the host (`.cpu()`,
`.to("cpu")`, `copy_` into a CPU tensor: `aten._to_copy` or `aten.copy_` with a CPU destination and a source
elsewhere) waits for the device too, and so do `torch.cuda.synchronize()` and a CUDA stream's or event's
`synchronize()`, which dispatch nothing: the counter wraps them while it is open. On a CPU-only machine a device
is the meta device (whose copies to the host fail after they are counted) or a fake one.

    with SyncCounter() as syncs:
        loss = model(ids, targets); loss.backward()
    assert syncs.count == 0, syncs.report()
"""

from __future__ import annotations

import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# Ops whose result needs the device's data on the host: scalars to Python, truth values, data-dependent sizes.
SYNCING = {
    aten._local_scalar_dense.default: "_local_scalar_dense (.item(), .tolist(), int(t), float(t))",
    aten.is_nonzero.default: "is_nonzero (bool(t), `if t:`)",
    aten.nonzero.default: "nonzero (data-dependent size)",
    aten.masked_select.default: "masked_select (boolean-mask indexing)",
    aten._unique2.default: "unique (data-dependent size)",
    aten.repeat_interleave.Tensor: "repeat_interleave with tensor repeats (data-dependent size)",
}

# Copies whose destination is the host: (op, where the source is, where the destination goes)
COPIES = {
    aten._to_copy.default: lambda args, kwargs: (args[0], kwargs.get("device")),
    aten.copy_.default: lambda args, kwargs: (args[1], args[0].device),
}

# Indexing ops that read a boolean mask's count of True back first (`x[mask]`, `x[mask] = v`): each runs
# `nonzero` inside its kernel, where the mode does not see it.
MASK_INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


def _is_mask(index) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


class SyncCounter(TorchDispatchMode):
    """Counts the host syncs (`SYNCING`) inside a `with` block, and where in Python each was asked for.

    `.tolist()` and `.numpy()` read a tensor without dispatching an ATen op, so a `TorchFunctionMode` beside the
    dispatch mode counts those calls."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[tuple[str, str]] = []
        self._reads = _HostReads(self.syncs)

    def __enter__(self):
        self._waits = _wrap_synchronize(self.syncs)
        self._reads.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._reads.__exit__(*exc)
            for owner, name, original in self._waits:
                setattr(owner, name, original)

    @property
    def count(self) -> int:
        return len(self.syncs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNCING:
            self.syncs.append((SYNCING[func], _caller()))
        elif func in COPIES and _to_host(*COPIES[func](args, kwargs or {})):
            self.syncs.append(("a copy from the device to the host (.cpu(), .to('cpu'), copy_)", _caller()))
        elif func in MASK_INDEXING and any(_is_mask(i) for i in args[1]):
            self.syncs.append((f"{func.name()} with a boolean mask (data-dependent size)", _caller()))
        return func(*args, **(kwargs or {}))

    def report(self) -> str:
        """One line per sync: which op and the innermost kqv line that asked for it."""
        return "\n".join(f"{op} at {where}" for op, where in self.syncs) or "no syncs"


def _to_host(source, destination) -> bool:
    """Whether a copy of `source` to `destination` (a device; None: where it is) leaves a device for the host."""
    where = source.device if isinstance(source, torch.Tensor) else torch.device("cpu")
    return destination is not None and torch.device(destination).type == "cpu" and where.type != "cpu"


def _wrap_synchronize(syncs: list[tuple[str, str]]) -> list[tuple[object, str, object]]:
    """torch.cuda's synchronize functions, counting each call in `syncs`; returns what to restore."""
    replaced = []
    for owner, label in ((torch.cuda, "torch.cuda"), (torch.cuda.Stream, "Stream"), (torch.cuda.Event, "Event")):
        original = owner.synchronize

        def counted(*args, _original=original, _label=f"{label}.synchronize()", **kwargs):
            syncs.append((_label, _caller()))
            return _original(*args, **kwargs)

        owner.synchronize = counted
        replaced.append((owner, "synchronize", original))
    return replaced


class _HostReads(TorchFunctionMode):
    """The tensor methods that copy values to Python without an ATen op of their own."""

    READS = {torch.Tensor.tolist: ".tolist()", torch.Tensor.numpy: ".numpy()"}

    def __init__(self, syncs: list[tuple[str, str]]) -> None:
        super().__init__()
        self.syncs = syncs

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.syncs.append((self.READS[func], _caller()))
        return func(*args, **(kwargs or {}))


def _caller() -> str:
    """The innermost frame in kqv's source (or the test's), where the sync was asked for."""
    frames = [f for f in traceback.extract_stack() if "/kqv/" in f.filename or "/tests/" in f.filename]
    frames = [f for f in frames if not f.filename.endswith("syncs.py")]
    frame = frames[-1] if frames else traceback.extract_stack()[-3]
    return f"{frame.filename.rsplit('/src/', 1)[-1]}:{frame.lineno} in {frame.name} ({frame.line})"
