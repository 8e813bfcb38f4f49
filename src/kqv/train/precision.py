"""Which precision to train and evaluate in: bf16 autocast only where the CPU multiplies bf16 natively.

On CPUs with AVX512-BF16 or AMX instructions, oneDNN's bf16 matrix products are faster than fp32; on CPUs
without them (AVX-512 alone, AVX2) oneDNN emulates bf16 by converting to fp32, and the same products are slower
than MKL's fp32 ones (README "Speed" gives the measured figures on both kinds, from
`python benchmarks/train_throughput.py`). `precision = "auto"` picks bf16 where it pays and fp32 elsewhere.

bf16 products go through oneDNN, which compiles a kernel for every matrix shape and keeps it in two caches of
1,024 entries each (oneDNN's primitive cache and PyTorch's ideep cache), several MB per entry with its scratch
buffers. Batches of translation pairs change shape at every step, so a bf16 MT run filled both and reached 4.3 GB
resident for a 7.6M-parameter model. `bound_kernel_caches` caps them before the first kernel is built.
"""

from __future__ import annotations

import os
from typing import Literal

import torch

from ..errors import ConfigError

Precision = Literal["fp32", "bf16", "auto"]
KERNEL_CACHE_CAPACITY = 64  # a bf16 step of the quick MT Transformer builds 45 kernels (ONEDNN_VERBOSE=2)


def native_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (AVX512-BF16 or AMX tiles)."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def resolve_precision(precision: Precision) -> Literal["fp32", "bf16"]:
    """The precision `precision` stands for on this machine: "auto" is bf16 with native bf16 support, else fp32."""
    if precision == "auto":
        return "bf16" if native_bf16() else "fp32"
    if precision not in ("fp32", "bf16"):
        raise ConfigError(f"precision must be 'fp32', 'bf16' or 'auto', got {precision!r}")
    return precision


def autocast(precision: Precision) -> torch.autocast:
    """bf16 autocast on the CPU when `precision` resolves to bf16; a disabled autocast (fp32) otherwise."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=resolve_precision(precision) == "bf16")


def bound_kernel_caches(capacity: int = KERNEL_CACHE_CAPACITY) -> None:
    """Cap oneDNN's and ideep's kernel caches at `capacity` entries unless the user set them. Both read their
    environment variable when the first oneDNN kernel is built, so this must run before that (the Trainer calls
    it when it is created); afterwards it changes nothing."""
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(capacity))
