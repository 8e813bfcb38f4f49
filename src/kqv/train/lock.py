"""One writer per run directory: an exclusive `flock` on `run_dir/.lock`, held for the whole run.

Training, resuming and overwriting all write into a run directory; two of them at once interleave their metrics
and delete each other's checkpoints. `hold_run_lock(run_dir)` takes an exclusive advisory lock (`fcntl.flock`)
on the lock file before anything in the directory is written or deleted, and keeps it until the block ends. The
kernel releases it when the process exits in any way, `kill -9` included, so a crash never leaves a stale lock;
the pid written into the file is only there to name the holder in the error a second writer gets.

Readers (`kqv generate`, `kqv eval`, the explorer) never take the lock: checkpoints are swapped in atomically
(see `write_checkpoint`), so they read a complete one while a run trains.

It is taken once per training, by `RunDirectory.open` (kqv.train.rundir) on rank 0. It is not re-entrant: two
`flock`s on separate opens of one file conflict even inside one process, so a second writer in the same process
is refused like one in another process.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import KqvError
from .files import LOCK_FILE


class RunDirectoryBusy(KqvError, RuntimeError):
    """Another process is writing into the run directory (the command line prints it as `kqv: error: ...`)."""

    def __init__(self, run_dir: Path, holder: str):
        self.run_dir, self.holder = run_dir, holder
        super().__init__(
            f"{run_dir} is in use by another training process ({holder}); wait for it to finish or "
            f"stop it, or write this run to another directory"
        )


@contextmanager
def hold_run_lock(run_dir: str | Path) -> Iterator[Path]:
    """Hold the exclusive writer's lock of `run_dir` (created if missing) for the block; RunDirectoryBusy if
    another process, or another holder in this one, has it. Yields the lock file's path."""
    run_dir = Path(run_dir)
    fd, before = _acquire(run_dir)
    try:
        yield run_dir / LOCK_FILE
    finally:
        _put_back(fd, *before)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def check_run_lock(run_dir: str | Path) -> None:
    """Raise RunDirectoryBusy now if another process holds `run_dir`'s lock (a probe: nothing is created)."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_FILE
    if not path.exists():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirectoryBusy(run_dir, _holder(path)) from None
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(run_dir: Path) -> tuple[int, tuple[bytes, int, int]]:
    """Lock `run_dir`'s lock file and write this process into it; returns its descriptor and what the file held
    before (its bytes, access and modification times), which `_put_back` restores on release: the pid is there
    while the lock is held, and a command refused under the lock leaves the file as it was."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirectoryBusy(run_dir, _holder(path)) from None
    status = os.fstat(fd)
    before = (os.pread(fd, max(status.st_size, 0), 0), status.st_atime_ns, status.st_mtime_ns)
    holder = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode(), 0)
    except OSError:  # a full disk: the lock holds all the same, only its holder goes unnamed
        pass
    return fd, before


def _put_back(fd: int, content: bytes, atime_ns: int, mtime_ns: int) -> None:
    """Give the lock file back the bytes and times it had before this process took it (best effort)."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, content, 0)
        os.utime(fd, ns=(atime_ns, mtime_ns))
    except OSError:
        pass


def _holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    return text or "a process that has not yet written its pid"
