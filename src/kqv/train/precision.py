"""Which precision to train and evaluate in: bf16 autocast only where the CPU multiplies bf16 natively.

On CPUs with AVX512-BF16 or AMX instructions, oneDNN's bf16 matrix products are faster than fp32; on CPUs
without them (AVX-512 alone, AVX2) oneDNN emulates bf16 by converting to fp32, and the same products are slower
than MKL's fp32 ones (README "Speed" gives the measured figures on both kinds, from
`python benchmarks/train_throughput.py`). `precision = "auto"` picks bf16 where it pays and fp32 elsewhere (on
other devices `kqv.nn.devices.Accelerator` decides).

bf16 products go through oneDNN, which compiles a kernel for every matrix shape and keeps it in two caches of
1,024 entries each (oneDNN's primitive cache and PyTorch's ideep cache), several MB per entry with its scratch
buffers. Batches of translation pairs change shape at every step, so a bf16 MT run filled both and reached 4.3 GB
resident for a 7.6M-parameter model. `bound_kernel_caches` caps them before the first kernel is built.
"""

from __future__ import annotations

import os
from contextlib import ExitStack

import torch

from ..nn.devices import Accelerator, Precision, Resolved, native_bf16
from .distributed import clip_gradients

__all__ = [
    "KERNEL_CACHE_CAPACITY",
    "MixedPrecision",
    "Precision",
    "autocast",
    "bound_kernel_caches",
    "native_bf16",
    "resolve_precision",
]

KERNEL_CACHE_CAPACITY = 64  # a bf16 step of the quick MT Transformer builds 45 kernels (ONEDNN_VERBOSE=2)
CPU = Accelerator(torch.device("cpu"))


def resolve_precision(precision: Precision, device: Accelerator = CPU) -> Resolved:
    """The precision `precision` stands for on `device` (`Accelerator.precision`): on the CPU "auto" is bf16 with
    native bf16 support, else fp32."""
    return device.precision(precision)


def autocast(precision: Precision, device: Accelerator = CPU) -> torch.autocast:
    """Autocast to what `precision` resolves to on `device` (the CPU: bf16 autocast, or a disabled one for fp32)."""
    return device.autocast(precision)


def bound_kernel_caches(capacity: int = KERNEL_CACHE_CAPACITY) -> None:
    """Cap oneDNN's and ideep's kernel caches at `capacity` entries unless the user set them. Both read their
    environment variable when the first oneDNN kernel is built, so this must run before that (the Trainer calls
    it when it is created); afterwards it changes nothing."""
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(capacity))


class MixedPrecision:
    """The training precision on one device: TF32 products as asked (`Accelerator.tf32`: set around every forward
    and backward pass, torch's setting restored after each, so a run leaves the process as it found it), the
    autocast of every forward pass, and the gradient side of an update: fp16's loss scaler
    (`torch.amp.GradScaler`), or nothing at all in every other precision (the CPU's path is the plain one:
    backward, clip, step).

    With fp16 the loss is multiplied by a scale before backward so that small gradients survive fp16's range, and
    the gradients are divided by it before clipping. A scale too large overflows: the gradients come back
    infinite, the scaler halves the scale and the update is skipped. Such a skip is the scaler at work, not the
    run diverging (`overflowed`): the non-finite guard does not count it while the scale is above 1; at or below
    1 the gradients overflow unscaled, and the guard counts the skip as it counts any other.
    """

    def __init__(self, device: Accelerator = CPU, precision: Precision = "fp32", tf32: bool = True):
        self.device, self.precision, self.tf32 = device, precision, tf32
        self.scaler = device.grad_scaler(precision)

    def autocast(self) -> ExitStack:
        """The context of a forward pass: TF32 as asked and autocast to the precision."""
        context = ExitStack()
        context.enter_context(self.device.tf32(self.tf32))
        context.enter_context(self.device.autocast(self.precision))
        return context

    def backward(self, loss: torch.Tensor) -> None:
        with self.device.tf32(self.tf32):
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def clip(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, max_norm: float) -> torch.Tensor:
        """Unscale the gradients (fp16) and clip them to `max_norm`; returns their norm before clipping, on the
        device (of the whole gradient, also when the model is sharded: `distributed.clip_gradients`)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        return clip_gradients(model, max_norm)

    def overflowed(self, grad_norm: torch.Tensor) -> torch.Tensor:
        """Whether a non-finite `grad_norm` is the scaler at work (fp16 with a scale above 1), on the device."""
        if self.scaler is None:
            return torch.zeros((), dtype=torch.bool, device=grad_norm.device)
        return ~torch.isfinite(grad_norm) & (self.scaler._get_scale_async().to(grad_norm.device) > 1.0)

    def step(self, optimizer: torch.optim.Optimizer, skip: torch.Tensor) -> None:
        """Apply the update unless `skip` (a bool on the device), then let fp16's scaler adapt its scale (`clip`
        unscaled the gradients). A fused optimizer skips on the device, as for torch's own scaler (`found_inf`:
        the weights and the optimizer state, its step count included, stay exactly as they were), so nothing is
        read back to the host; any other optimizer reads `skip` (one sync)."""
        if optimizer.defaults.get("fused"):
            optimizer.found_inf = skip.float()
            try:
                optimizer.step()
            finally:
                del optimizer.found_inf
        elif not skip.item():
            optimizer.step()
        if self.scaler is not None:
            self.scaler.update()

    def state_dict(self) -> dict | None:
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
