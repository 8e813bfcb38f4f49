"""Where a model runs, chosen once: `Accelerator`, the device with its autocast precision and its kernels.

Every device-specific choice lives here, not as `if device == ...` ladders through the model:

* `Accelerator.resolve("auto" | "cpu" | "cuda" | "cuda:N" | "mps")` picks the device ("auto": a CUDA GPU, then
  Apple silicon, then the CPU), and refuses a device this machine lacks with a `ConfigError` saying what is
  there and what to do;
* `Accelerator.precision("auto" | "fp32" | "bf16" | "fp16")` is what a precision stands for on that device: on the
  CPU bf16 where it has bf16 instructions, else fp32 (unchanged: `native_bf16`); on a CUDA GPU bf16 where it
  computes bf16 natively (Ampere and later), else fp16, whose narrow range needs `torch.amp.GradScaler`
  (`Accelerator.grad_scaler`); on Apple silicon fp32 (fp16 only when asked: no measurement here showed it pays);
* `kernels(device)` is which kernels tensors on a device take. The CPU's own (dropout masks from 64-bit draws,
  plain-matmul bf16 attention for short inputs, torch's CPU flash kernel inside blockwise attention, the
  one-row decoding products, the loss a cache-sized block of rows at a time) exist because torch's defaults are
  slow on CPUs; elsewhere torch's own kernels are the fast ones (`F.scaled_dot_product_attention` picks flash or
  memory-efficient attention on a GPU, and on CUDA the score biases and masked cores SDPA cannot take go through
  flex_attention: `kqv.nn.flex`; the loss is the head and `F.cross_entropy` in one piece, which compile fuses);
* `Accelerator.peak_flops(precision, tf32)` is the device's peak arithmetic where it is known (`PEAK_FLOPS`), the
  denominator of a training's model FLOPs utilisation, and `Accelerator.peak_memory()` the most memory a run's
  tensors have taken on it.
"""

from __future__ import annotations

import os
import re
import resource
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ..errors import DEVICE_CPU, ConfigError, option

Precision = Literal["fp32", "bf16", "fp16", "auto"]
Resolved = Literal["fp32", "bf16", "fp16"]
DEVICE_NAMES = "auto, cpu, cuda, cuda:N or mps"
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
CUDA_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cu128, then pip install -e ."


@dataclass(frozen=True)
class Kernels:
    """Which kernels the tensors of one kind of device take (see the module docstring)."""

    cheap_dropout: bool  # dropout masks from 64-bit draws (`kqv.nn.dropout`), not torch's bernoulli_
    plain_bf16_attention: bool  # short bf16 attention as plain matmuls, not torch's fused kernel
    fused_cpu_blocks: bool  # blocks of blockwise attention through torch's CPU flash kernel
    one_row_products: bool  # batch-1 decoding's matrix-vector products split over threads
    flex_attention: bool = False  # score biases and masked cores through torch's flex_attention (kqv.nn.flex)
    free_host_reads: bool = (
        False  # a value read on the host waits for nothing (eager CPU ops): worth a skip in training
    )
    blocked_loss: bool = False  # the output layer's cross-entropy a cache-sized block of rows at a time, not whole
    sdpa_streams_padding: bool = False  # SDPA's fused kernel takes a padding mask in O(n) memory (CUDA's mem-efficient)
    compiled_training: bool = False  # `train.compile = "auto"` compiles forward and backward (pays on GPUs)
    # SDPA's fused kernels that take fewer key/value heads than query heads (`enable_gqa`): "always" (the CPU's
    # flash kernel), "flash" (CUDA's flash kernel: fp16/bf16 without a mask), "never" (repeat them first)
    sdpa_groups: Literal["always", "flash", "never"] = "never"


CPU_KERNELS = Kernels(
    cheap_dropout=True,
    plain_bf16_attention=True,
    fused_cpu_blocks=True,
    one_row_products=True,
    free_host_reads=True,
    blocked_loss=True,
    sdpa_groups="always",
)
TORCH_KERNELS = Kernels(False, False, False, False)
CUDA_KERNELS = Kernels(  # flex_attention compiles to Triton
    False,
    False,
    False,
    False,
    flex_attention=True,
    sdpa_streams_padding=True,
    compiled_training=True,
    sdpa_groups="flash",
)


def kernels(device: torch.device) -> Kernels:
    """The kernels of tensors on `device`: the CPU's own on the CPU, torch's own everywhere else, with
    flex_attention on CUDA GPUs (the one device where torch compiles it to a fused kernel)."""
    if device.type == "cpu":
        return CPU_KERNELS
    return CUDA_KERNELS if device.type == "cuda" else TORCH_KERNELS


# Dense (no sparsity) peak FLOP/s of known CUDA GPUs, from NVIDIA's data sheets: (a substring of the name torch
# gives, bf16 or fp16 tensor cores, TF32 tensor cores). The first match wins: the PCIe H100 before the SXM one.
PEAK_FLOPS = (
    ("H100 PCIe", 756e12, 378e12),
    ("H100", 989e12, 494.5e12),  # SXM
    ("H200", 989e12, 494.5e12),
    ("A100", 312e12, 156e12),
)


def peak_rss_bytes() -> int:
    """This process's peak resident set size in bytes: `getrusage`'s ru_maxrss, in bytes on macOS and in KiB on
    Linux (and the BSDs)."""
    unit = 1 if sys.platform == "darwin" else 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit)


# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA, or DNNL_MAX_CPU_ISA) below its first level with bf16 instructions
ONEDNN_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}


def native_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (AVX512-BF16 or AMX tiles) that torch's kernels may use: a
    kernel set capped below them (`ATEN_CPU_CAPABILITY=avx2`, `ONEDNN_MAX_CPU_ISA=AVX2`, as to run as an older CPU
    would) has none, and bf16 there would be emulated or fail inside oneDNN."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    if not any(getattr(torch.cpu, name, lambda: False)() for name in checks):
        return False
    onednn_cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    return torch.backends.cpu.get_cpu_capability() == "AVX512" and onednn_cap not in ONEDNN_WITHOUT_BF16


def cuda_native_bf16() -> bool:
    """Whether the current CUDA GPU computes bf16 natively (compute capability 8.0 and later), not emulated."""
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # an older torch without the argument
        return torch.cuda.is_bf16_supported()


def mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return backend is not None and backend.is_available()


def available_devices() -> list[str]:
    """The devices this machine offers, in words for messages: "cpu", "cuda:0", ..., "mps"."""
    gpus = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return ["cpu", *gpus, *(["mps"] if mps_available() else [])]


def auto_device() -> str:
    """What "auto" stands for here: a CUDA GPU, then Apple silicon, then the CPU."""
    return "cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu"


def check_device_name(name: Any) -> str:
    """`name` if it is a device kqv knows how to ask for (not whether this machine has it); ConfigError if not."""
    if not isinstance(name, str) or not _DEVICE.fullmatch(name):
        raise ConfigError(f"device must be {DEVICE_NAMES}, got {name!r}")
    return name


@dataclass(frozen=True)
class Accelerator:
    """One device and what runs on it: resolve it once (`Accelerator.resolve`), then ask it for the autocast of a
    precision, the gradient scaler fp16 needs, and the kernels (`kernels`)."""

    device: torch.device

    @classmethod
    def resolve(cls, name: str | torch.device | Accelerator | None = "auto") -> Accelerator:
        """The device `name` stands for on this machine ("auto": cuda, then mps, then cpu); ConfigError when it
        asks for a device this machine lacks."""
        if isinstance(name, Accelerator):
            return name
        if isinstance(name, torch.device):
            name = str(name)
        name = check_device_name("auto" if name is None else name)
        if name == "auto":
            name = auto_device()
        if name.startswith("cuda"):
            check_cuda(name)
        if name == "mps" and not mps_available():
            raise ConfigError(
                f"device 'mps' (Apple silicon) is not available here (available: {', '.join(available_devices())}); "
                f"it needs a Mac with Apple silicon and macOS 12.3 or later; use {_cpu_instead()}"
            )
        return cls(torch.device(name))

    @property
    def type(self) -> str:
        return self.device.type

    @property
    def kernels(self) -> Kernels:
        return kernels(self.device)

    def precision(self, asked: Precision) -> Resolved:
        """What `asked` stands for on this device (see the module docstring); ConfigError for fp16 on the CPU."""
        if asked not in ("fp32", "bf16", "fp16", "auto"):
            raise ConfigError(f"precision must be 'fp32', 'bf16', 'fp16' or 'auto', got {asked!r}")
        if asked == "fp16" and self.type == "cpu":
            raise ConfigError(
                "precision 'fp16' is for GPUs (autocast with a gradient scaler); on the CPU use 'bf16', 'fp32' "
                "or 'auto'"
            )
        if asked != "auto":
            return asked
        if self.type == "cuda":
            return "bf16" if cuda_native_bf16() else "fp16"
        if self.type == "cpu":
            return "bf16" if native_bf16() else "fp32"
        return "fp32"

    def autocast(self, asked: Precision) -> torch.autocast | nullcontext:
        """Autocast to the precision `asked` resolves to here; a disabled one (fp32) otherwise."""
        resolved = self.precision(asked)
        if self.type == "cpu":  # as before: a disabled CPU autocast for fp32
            return torch.autocast("cpu", dtype=torch.bfloat16, enabled=resolved == "bf16")
        if resolved == "fp32":
            return nullcontext()
        return torch.autocast(self.type, dtype=AUTOCAST_DTYPES[resolved])

    def grad_scaler(self, asked: Precision) -> torch.amp.GradScaler | None:
        """The loss scaler fp16 training needs (its 5-bit exponent underflows small gradients); None otherwise."""
        if self.precision(asked) != "fp16":
            return None
        return torch.amp.GradScaler(self.type)

    def tf32(self, enabled: bool) -> AbstractContextManager:
        """Inside the block, let fp32 matrix products and convolutions on a CUDA GPU use TF32 tensor cores (10-bit
        significand, on Ampere and later) or not; after it, the setting is what it was
        (torch's is process-wide, and a library that trains must not leave it changed). Nothing changes on other
        devices: the CPU's setting would switch oneDNN to reduced-precision products."""
        return tf32_products(enabled) if self.type == "cuda" else nullcontext()

    def peak_flops(self, precision: Resolved, tf32: bool = True) -> float | None:
        """The peak FLOP/s of this device computing in `precision` (fp32 products on TF32 tensor cores when `tf32`)
        where `PEAK_FLOPS` knows it; None elsewhere (the CPU, Apple silicon, an unknown GPU): no MFU then."""
        if self.device.type != "cuda" or (precision == "fp32" and not tf32):  # the GPU itself is asked its name
            return None
        name = torch.cuda.get_device_name(self.device)
        for known, half, tensor_float in PEAK_FLOPS:
            if known in name:
                return tensor_float if precision == "fp32" else half
        return None

    def peak_memory(self) -> int | None:
        """The most bytes this process's tensors have taken on the device: CUDA's `max_memory_allocated` (a counter
        on the host: no sync); on the CPU, where tensors live in the process's memory, its peak resident set; None
        on Apple silicon, which keeps no peak."""
        if self.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        return peak_rss_bytes() if self.type == "cpu" else None

    def batch(self, batch: Any) -> Any:
        """A training batch on this device; on the CPU the batch itself, untouched (no per-step cost there).
        Elsewhere the copy is queued behind the device's work without waiting for it (`put`): a training step
        reads nothing back (`kqv.train.update`), so the host makes and copies the next batch while the device
        still computes this one, with no loader thread."""
        return batch if self.type == "cpu" else self.put(batch)

    def staged(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor bound for a CUDA GPU in page-locked (pinned) memory, so that the `non_blocking` copy is
        asynchronous (from pageable memory CUDA copies through a staging buffer, synchronously); anything else as
        it is."""
        return tensor.pin_memory() if _pins(self, tensor) else tensor

    def put(self, batch: Any) -> Any:
        """`batch` (a tensor, or a tuple/list/dict of them, anything else kept) on this device. A host tensor is
        made contiguous first (a batch is often a view, `blocks[:, :-1]`): from a non-contiguous source, pinned or
        not, CUDA copies through a pageable temporary, synchronously."""
        if isinstance(batch, torch.Tensor):
            host = batch.contiguous() if batch.device.type == "cpu" and self.type != "cpu" else batch
            return self.staged(host).to(self.device, non_blocking=True)
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
            return type(batch)(*(self.put(x) for x in batch))
        if isinstance(batch, (tuple, list)):
            return type(batch)(self.put(x) for x in batch)
        if isinstance(batch, dict):
            return {k: self.put(v) for k, v in batch.items()}
        return batch


def tf32_switches() -> list[tuple[Any, str, Any, Any]]:
    """(object, attribute, TF32 value, exact-fp32 value) of torch's TF32 settings: `fp32_precision` of cuBLAS's
    products and cuDNN's convolutions where torch has it (2.9 and later; mixing it with the legacy `allow_tf32`
    flags is an error there), the legacy flags before."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        return [(torch.backends.cuda.matmul, "fp32_precision", "tf32", "ieee")] + [
            (torch.backends.cudnn.conv, "fp32_precision", "tf32", "ieee")
        ]
    return [(torch.backends.cuda.matmul, "allow_tf32", True, False), (torch.backends.cudnn, "allow_tf32", True, False)]


@contextmanager
def tf32_products(enabled: bool) -> Iterator[None]:
    """TF32 (`enabled`) or exact fp32 products inside the block, torch's previous settings restored after it."""
    switches = tf32_switches()
    before = [getattr(owner, name) for owner, name, _, _ in switches]
    for owner, name, on, off in switches:
        setattr(owner, name, on if enabled else off)
    try:
        yield
    finally:
        for (owner, name, _, _), value in zip(switches, before):
            setattr(owner, name, value)


def _pins(accelerator: Accelerator, tensor: torch.Tensor) -> bool:
    return accelerator.type == "cuda" and tensor.device.type == "cpu" and not tensor.is_pinned()


def check_cuda(name: str) -> None:
    """ConfigError unless the CUDA device `name` ("cuda" or "cuda:N") exists here."""
    if not torch.cuda.is_available():
        built = "was built without CUDA" if torch.version.cuda is None else "finds no usable CUDA GPU (driver?)"
        raise ConfigError(
            f"device {name!r} asked for, but this torch ({torch.__version__}) {built}; available: "
            f"{', '.join(available_devices())}. Install a CUDA build of torch ({CUDA_INSTALL}) on a machine with "
            f"an NVIDIA GPU, or use {_cpu_instead()}"
        )
    index = int(name.partition(":")[2] or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(
            f"device {name!r} asked for, but this machine has {count} CUDA GPU{'s' * (count != 1)} "
            f"(available: {', '.join(available_devices())})"
        )


def _cpu_instead() -> str:
    return option(DEVICE_CPU)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's parameters (the CPU for a model without any)."""
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def on_device_of(model: torch.nn.Module, batch: Any) -> Any:
    """`batch` (a tensor, or a tuple/list/dict of them) where `model` is; untouched when that is the CPU."""
    return Accelerator(model_device(model)).batch(batch)
