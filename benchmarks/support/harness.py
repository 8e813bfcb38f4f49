"""What every benchmark shares, so that a benchmark script is its measurement alone: the machine it ran on (CPU
model, the flags that decide its kernels, cores, threads, load, GPUs), the command that ran it, and its JSON
record written with both (the script says where it wrote). The scripts beside it import it:
`from support.harness import machine, write_record`.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch

try:
    from kqv.nn.environment import cpu
except ImportError:  # kqv before 2026-11-27, as benchmarks/ab_compare.py runs it: the same function, then here
    from kqv.experiments.provenance import cpu

BENCHMARKS = Path(__file__).resolve().parents[1]
RESULTS = BENCHMARKS / "results"


def machine() -> dict[str, Any]:
    """The machine a measurement ran on: `kqv.nn.environment.cpu` (model, kernel flags, cores), torch's threads,
    the platform and torch's version, the load average when asked (the 1-, 5- and 15-minute means: figures taken
    while other work ran are upper bounds of times), and each CUDA GPU's name."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not on this platform
        load = None
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    return {
        **cpu(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "load_average": load,
        "gpus": gpus,
    }


def command() -> str:
    """The command line that is running, as one would type it from the repository's root."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(BENCHMARKS.parent) if BENCHMARKS.parent in script.parents else script
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def write_record(path: str | Path, record: dict[str, Any]) -> Path:
    """`record` as JSON at `path` (its folder made), with the machine, the command and the date added where the
    record does not give them."""
    path = Path(path)
    full = {"machine": machine(), "command": command(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), **record}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(full, indent=1) + "\n", encoding="utf-8")
    return path
