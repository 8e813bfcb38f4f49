"""What a bug report needs to know about this machine: kqv, torch, CUDA, the CPU, and what `auto` chooses here.

`environment()` returns it as a dict (the `kqv env` command prints it, `--json` as JSON): the versions, the CPU's
model and the instructions torch dispatches to, every GPU, and for the device `auto` resolves to, the precision
`auto` trains in and the kernels its tensors take (`kqv.nn.devices`), with torch's fused-attention backends and
the TF32 settings as they are now.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from . import flex
from .devices import Accelerator, native_bf16, tf32_switches

TF32_LABELS = ("cuda_matmul", "cudnn_conv")  # what `tf32_switches` sets: cuBLAS's products, cuDNN's convolutions

# The torch features kqv uses that older torches lack: (what, first torch that has it, how kqv takes an older one).
# "required" raises pyproject's floor to that version (tests/test_torch_floor.py checks it is at least the highest);
# anything else names the fallback kqv takes below that version, so the floor may stay under it.
TORCH_FEATURES = (
    ("torch.nn.attention.flex_attention (kqv.nn.flex)", "2.5", "required"),
    ("torch.distributed.tensor.DTensor, public (kqv.train.distributed, sharding)", "2.5", "required"),
    ("torch.distributed.fsdp.fully_shard, public (kqv.train.sharding)", "2.6", "required"),
    (
        "DistributedDataParallel(forward_sync_buffers=...) (kqv.train.distributed.data_parallel)",
        "2.13",
        "broadcast_buffers=False: no buffer broadcast at wrapping or before each forward (kqv's are made from the "
        "config, the same on every rank)",
    ),
    ("torch.backends.cuda.matmul.fp32_precision (kqv.nn.devices.tf32_switches)", "2.9", "the allow_tf32 flags"),
    ("torch.cuda.is_bf16_supported(including_emulation=) (kqv.nn.devices)", "2.4", "the call without it"),
)


def environment(device: str = "auto") -> dict[str, Any]:
    """Versions, CPU, GPUs, and what `device` ("auto" by default) resolves to with its precision and kernels."""
    accelerator = Accelerator.resolve(device)
    return {
        "kqv": _version("kqv"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu": {
            **cpu(),
            "threads": torch.get_num_threads(),
            "capability": torch.backends.cpu.get_cpu_capability(),  # the widest instructions torch dispatches to
            "native_bf16": native_bf16(),
        },
        "cuda": cuda_summary(),
        "auto": {
            "device": str(accelerator.device),
            "precision": accelerator.precision("auto"),
            "kernels": asdict(accelerator.kernels),
            "flex_min_head_dim": flex.MIN_HEAD_DIM,
        },
        "sdpa_backends": {
            "flash": torch.backends.cuda.flash_sdp_enabled(),
            "memory_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled(),
        },
        "tf32": {label: getattr(owner, name) for label, (owner, name, *_) in zip(TF32_LABELS, tf32_switches())},
    }


CPU_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "sse4_2", "asimd", "sve")


def cpu() -> dict[str, Any]:
    """The CPU's model name (with its family and model numbers on x86, what two "AMD EPYC"s differ by), the flags
    that decide its kernels, and the number of cores: what names a machine beside a measurement."""
    model, flags, found = platform.processor() or platform.machine(), set(), {}
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() in ("cpu family", "model") and key.strip() not in found:
                found[key.strip()] = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags = set(value.split())
    except OSError:
        pass
    if "cpu family" in found:  # x86: family 25 is AMD's Zen 3/4, 26 Zen 5
        model += f" (family {found['cpu family']}, model {found.get('model', '?')})"
    return {"model": model, "flags": [f for f in CPU_FLAGS if f in flags], "cores": os.cpu_count()}


def cuda_summary() -> dict[str, Any]:
    """torch's CUDA and cuDNN versions, and every GPU it sees (name, compute capability, memory)."""
    available = torch.cuda.is_available()
    gpus = []
    for index in range(torch.cuda.device_count() if available else 0):
        properties = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "name": properties.name,
                "capability": f"{properties.major}.{properties.minor}",
                "memory_gib": round(properties.total_memory / 2**30, 1),
            }
        )
    return {
        "built_with": torch.version.cuda,
        "available": available,
        "cudnn": torch.backends.cudnn.version() if available else None,
        "gpus": gpus,
    }


def describe(values: dict[str, Any], indent: str = "") -> list[str]:
    """`environment()` as aligned `key: value` lines, nested sections indented."""
    lines = []
    for key, value in values.items():
        if isinstance(value, dict):
            lines += [f"{indent}{key}:", *describe(value, indent + "  ")]
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f"{indent}{key}:")
            for index, item in enumerate(value):
                lines += [f"{indent}  [{index}]", *describe(item, indent + "    ")]
        else:
            lines.append(f"{indent}{key}: {value if value not in (None, []) else '-'}")
    return lines


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed (run from a source tree)"
