"""Where a measurement came from, said one way for the experiments and the benchmarks: the machine it ran on (the
CPU's model, the flags that decide its kernels and its cores, torch's threads, the load, each GPU), the command
that ran it, the date, the commit of kqv's source and whether it was dirty, the seeds, and the record written as
JSON atomically (a reader sees the old file or the new one).

A benchmark script writes its record with `write_record(path, record, seeds=..., started=...)`; the experiments'
runner builds results.json's machine and provenance from `machine` and `git_state` and writes it with `write_json`.
Nothing here computes a measured number: only the experiments' presentation modules import it (the runner, the
records, the provenance: `kqv_lab.experiments.provenance.PRESENTATION`), so no experiment's code hash covers it.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kqv.errors import ConfigError
from kqv.nn import cpu
from kqv.train import write_atomically

SOURCE = Path(__file__).resolve().parent  # src/kqv
ROOT = SOURCE.parents[1]  # the repository's root, in a checkout: where commands are typed from
DATE_FORMAT = "%Y-%m-%d %H:%M:%S %Z"


def load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages (figures taken while other work ran are upper bounds of times), None
    on a platform without them."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine(threads: int | None = None) -> dict[str, Any]:
    """The machine a measurement runs on: `kqv.nn.environment.cpu` (model, kernel flags, cores), torch's threads
    (`threads` where the measurement ran with others than now), the platform, torch's version, the load average
    and each CUDA GPU's name."""
    gpus = range(torch.cuda.device_count()) if torch.cuda.is_available() else ()
    return {
        **cpu(),
        "torch_threads": threads or torch.get_num_threads(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "load_average": load_average(),
        "gpus": [torch.cuda.get_device_name(i) for i in gpus],
    }


def git_state() -> dict[str, Any]:
    """The commit of kqv's source tree and whether it had uncommitted changes (None where git cannot tell)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=SOURCE, capture_output=True, text=True, timeout=20, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", str(SOURCE))
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def command(argv: Sequence[str] | None = None) -> str:
    """The command line that is running (`sys.argv` unless `argv`), as one would type it from the repository's
    root: `python benchmarks/x.py --quick` for a script."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve()
    if script.suffix != ".py":
        return shlex.join(argv)
    shown = script.relative_to(ROOT) if ROOT in script.parents else script
    return shlex.join(["python", str(shown), *argv[1:]])


def _json_default(value: Any) -> Any:
    """JSON for what a record may hold beside JSON's own types: paths, tensors."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, torch.Tensor):
        return value.tolist()
    raise TypeError(f"a record must be JSON-serialisable, got {type(value).__name__}")


def write_json(path: str | Path, record: dict[str, Any]) -> Path:
    """`record` as indented JSON at `path`, written atomically (its folder made); refused (ConfigError) where
    `path` is anything but a regular file, which the rename would replace."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise ConfigError(f"{path} is not a regular file, which writing a record would replace: give a file's path")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, (json.dumps(record, indent=1, default=_json_default) + "\n").encode("utf-8"))
    return path


def write_record(
    path: str | Path, record: dict[str, Any], *, seeds: Sequence[int] | None = None, started: float | None = None
) -> Path:
    """A benchmark's `record` as JSON at `path` (`write_json`), with the machine, the command, the date and the
    git state added where the record does not give them; `seeds`, the seeds it ran; `started`, its
    `time.perf_counter()` at the start, for the seconds it took and the load average at the end."""
    header = {"machine": machine(), "command": command(), "date": time.strftime(DATE_FORMAT), "git": git_state()}
    if seeds is not None:
        header["seeds"] = list(seeds)
    if started is not None:
        header |= {"total_seconds": round(time.perf_counter() - started, 1), "load_average_end": load_average()}
    return write_json(path, {**header, **record})
