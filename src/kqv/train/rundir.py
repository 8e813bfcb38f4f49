"""The one owner of a run directory during a training: its writer's lock, what it already holds, and its files.

`RunDirectory.open(path, if_exists, topology=...)` is entered once per training, by the job (`Job.open_run`) or, for
a `Trainer` given a plain path, by the Trainer itself. Entering it

1. takes the writer's lock (`hold_run_lock`, below) on rank 0, the only process that writes; other torchrun ranks read
   (first putting back a run an interrupted overwrite left between its two renames, and then removing what such
   an overwrite left beside the run: `recover_swap`, `remove_leftovers`);
2. looks once at the files of an earlier run (`RunFiles.trainer_files`) and decides: refuse (`if_exists="error"`),
   resume (read and verify the checkpoint once: `checkpoint`, `step`) or overwrite. A job's overwrite (`stage=True`) is
   built in `RUN.kqv-new/` beside the run and swapped in by renames (`commit`) once its preparation is done, so
   an interrupt or refusal at any moment before leaves the previous run whole; a Trainer's own overwrite deletes
   the files in `prepare`, when training starts, so a run refused or failing before that leaves them in place;

and leaving it closes the checkpoint and releases the lock (removing the directory it created when nothing was
written into it). The Trainer neither locks nor decides: it loads `checkpoint` when there is one and calls
`prepare(step, loggers)` on rank 0 before its first write, which also opens the run's loggers (`train.loggers`:
`kqv.train.loggers`); every metrics record then goes through `log` (metrics.jsonl, and the loggers), and the
loggers are closed when the run directory is left.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Literal

from ..errors import IF_EXISTS_OVERWRITE, RESUME, RUN_DIRECTORY, ConfigError, KqvError, option
from ..signals import completed
from .checkpoints import Checkpoint, has_checkpoint, read_checkpoint
from .files import TEMPORARY, is_temporary
from .layout import RUN_FORMAT, RunFiles
from .loggers import Loggers
from .metrics import append_metrics, keep_records
from .topology import Topology

logger = logging.getLogger(__name__)

IfExists = Literal["error", "resume", "overwrite"]


class RunDirectory(RunFiles):
    """A run directory opened for one training; build it with `RunDirectory.open`, not directly. What it holds,
    and writing it, are its `RunFiles`' (`tokenizer_dir`, `write_tokens`, `copy_data_from`...), at `path`.

    `checkpoint` is the verified checkpoint to resume from (None for a fresh run, or a resumed run that stopped
    before its first checkpoint), `step` the update it was taken after (0 without one). `topology` is this process
    among the run's (`kqv.train.topology`), handed on to the Trainer; `writes` is whether it writes files (rank 0).
    """

    def __init__(
        self, path: Path, if_exists: IfExists, topology: Topology, existing: list[Path], checkpoint: Checkpoint | None
    ):
        self.path, self.if_exists, self.topology = path, if_exists, topology
        self.existing = existing  # the earlier run's files found when opening
        self.checkpoint = checkpoint
        self._overwrite_pending = bool(existing) and if_exists == "overwrite"
        self.final: Path | None = None  # where a staged overwrite goes when committed (`path` is its stage until)
        self.started = False  # whether training started (`prepare`): the directory then holds a run
        self.loggers = Loggers()  # where its metrics go besides metrics.jsonl (`train.loggers`), from `prepare` on

    @classmethod
    @contextmanager
    def open(
        cls, path: str | Path, if_exists: IfExists = "error", *, topology: Topology, stage: bool = False
    ) -> Iterator[RunDirectory]:
        """The run directory at `path`, locked (by rank 0 of `topology`, this process among the run's) and
        inspected, for the block; see the module docstring.
        Raises RunDirectoryBusy when another process writes into it and FileExistsError when it holds a run
        and `if_exists` is "error". With `stage`, an overwrite of a run is built beside it and swapped in by
        `commit` (see `stage_overwrite`)."""
        if if_exists not in IfExists.__args__:
            raise ConfigError(f"if_exists must be one of {list(IfExists.__args__)}, got {if_exists!r}")
        path = named_run_path(path)
        with ExitStack() as stack:
            if topology.writes:
                recover_swap(path)
                created = not path.exists()
                stack.enter_context(hold_run_lock(path))
                stack.callback(remove_if_unused, path, created)  # while the lock is held
                remove_leftovers(path)
            existing = RunFiles(path).trainer_files()
            _refuse(path, existing, if_exists)
            checkpoint = None
            if existing and if_exists == "resume":
                checkpoint = read_checkpoint(path) if has_checkpoint(path) else None
                if checkpoint is None:  # its metrics records are dropped by prepare()
                    logger.warning(
                        "nothing to resume in %s: the run stopped before its first checkpoint; training from step 0",
                        path,
                    )
                else:
                    stack.callback(checkpoint.close)
            run = cls(path, if_exists, topology, existing, checkpoint)
            stack.callback(run.close_loggers)
            if stage and run._overwrite_pending and run.writes:
                run.stage_overwrite(stack)
            stack.push(run._abandon)  # before the lock is released and an unused directory removed
            yield run

    # -- what the opening found ------------------------------------------------------------------------------

    @property
    def resuming(self) -> bool:
        """Whether training continues a checkpoint (then the run's tokenizer and data are complete: they are
        written before the first checkpoint)."""
        return self.checkpoint is not None

    @property
    def step(self) -> int:
        """The update the resumed checkpoint was taken after; 0 for a fresh run."""
        return self.checkpoint.step if self.checkpoint is not None else 0

    @property
    def destination(self) -> Path:
        """Where the run is: `path`, or for a staged overwrite not yet committed the run it will replace (what
        messages name)."""
        return self.final if self.final is not None else self.path

    @property
    def writes(self) -> bool:
        """Whether this process writes the run's files: rank 0 only, under torchrun."""
        return self.topology.writes

    # -- an overwrite, built beside the run it replaces ------------------------------------------------------

    def stage_overwrite(self, stack: ExitStack) -> None:
        """Write this overwrite into `RUN.kqv-new/` beside the run (removed when the block ends uncommitted): until
        `commit`, an interrupt or a refusal at any moment leaves the previous run whole. The stage's lock file is
        a hard link to the run's, whose lock this process holds: once swapped in, the new run is locked too."""
        staged = sibling(self.path, STAGED)
        shutil.rmtree(staged, ignore_errors=True)
        stack.callback(shutil.rmtree, staged, ignore_errors=True)  # a no-op once committed: it was renamed
        staged.mkdir()
        os.link(self.lock_file, RunFiles(staged).lock_file)
        self.final, self.path = self.path, staged

    def commit(self) -> None:
        """Swap a staged overwrite in, by renames (the run moves to `RUN.kqv-old/`, the stage to `RUN`, then the
        old run is deleted): called when the new run's preparation is done (`Job.make_trainer`: tokenizer, data
        and run.toml written, model built), before training writes anything. A no-op for any other opening."""
        if self.final is None:
            return
        old = sibling(self.final, REPLACED)
        os.rename(self.final, old)
        os.rename(self.path, self.final)
        self.path, self.final, self._overwrite_pending = self.final, None, False
        carry_foreign_files(old, self.path)
        shutil.rmtree(old, ignore_errors=True)

    def _abandon(self, error_type: type | None, *_: object) -> bool:
        """When the block ends with an error (a full disk, Ctrl-C, a bad option) before training started in a
        fresh run's directory, remove what its preparation wrote (run.toml, SHA256SUMS, tokenizer/, the encoded
        data, their temporary files): nothing half-written stays. A staged overwrite's stage is removed whole,
        and a resumed run keeps its files."""
        if error_type is None or not self.writes or self.started or self.existing or self.final is not None:
            return False
        for path in self.job_files():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            elif path.exists() or path.is_symlink():
                path.unlink(missing_ok=True)
        remove_temporaries(self.path)
        return False

    def complete(self) -> None:
        """Every file of the run is written (summary.json last): a Ctrl-C or SIGTERM from now on no longer
        interrupts the `kqv` command, which ends with status 0 and says that the run is complete
        (`kqv.signals.completed`)."""
        if self.writes:
            completed(f"{self.destination} is complete")

    # -- training starts -------------------------------------------------------------------------------------

    def prepare(self, step: int, loggers: tuple[str, ...] = ()) -> None:
        """Make the directory ready for training from `step` (rank 0, when training starts): swap a staged
        overwrite in, else delete the earlier run's files when overwriting, and drop metrics records of steps
        after `step`: they are about to be redone; then open the `loggers` (`train.loggers`), which drop theirs."""
        self.commit()
        self.started = True
        if self._overwrite_pending:
            for path in self.trainer_files():
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            self._overwrite_pending = False
        self.path.mkdir(parents=True, exist_ok=True)
        keep_records(self.metrics_file, step)
        self.close_loggers()
        if self.writes:
            self.loggers = Loggers.open(loggers, self, step)

    def log(self, record: dict[str, Any]) -> None:
        """One record of the run's metrics (rank 0's): a line of metrics.jsonl, and its figures to every logger."""
        append_metrics(self.metrics_file, record)
        self.loggers.log(record)

    def close_loggers(self) -> None:
        """Close the loggers (their files flushed): when the run directory is left, or opened again."""
        self.loggers.close()


STAGED, REPLACED = ".kqv-new", ".kqv-old"  # suffixes of an overwrite's stage and of the run it replaces


def sibling(path: Path, suffix: str) -> Path:
    """`RUN.kqv-new` beside `RUN`: in the same parent directory, so that renames between them are atomic."""
    return path.with_name(path.name + suffix)


def named_run_path(path: str | Path) -> Path:
    """`path` as a Path, if its last part names the run (`runs/lm`); `/`, `.`, `..` or an empty path is a
    ConfigError: a run directory has a name, which an overwrite's stage beside it (`RUN.kqv-new`) extends. A path
    through `..` or a symbolic link to the run is resolved (the others keep their spelling, which messages show)."""
    named = Path(path)
    if named.name in ("", ".", ".."):
        given = repr(str(path)) if str(path) else "an empty path"
        raise ConfigError(
            f"{option(RUN_DIRECTORY)} must name a directory of its own for the run, such as runs/lm, not {given}"
        )
    if ".." in named.parts or named.is_symlink():
        # Renames move RUN away and back (`commit`): a spelling that goes through RUN itself (`runs/x/../x`) or a
        # link to it would then name nothing, or the link rather than the run. Resolved once, here, it names the
        # directory itself whatever happens to it.
        return Path(os.path.realpath(named))
    return named


def recover_swap(path: Path) -> None:
    """Undo an overwrite interrupted between its two renames (`RUN` missing, `RUN.kqv-old` there): the previous
    run goes back in place. Runs before the lock is taken, which would create `RUN`."""
    old = sibling(path, REPLACED)
    if old.is_dir() and not path.exists():
        try:
            os.rename(old, path)
            logger.warning("restored %s from an overwrite interrupted while swapping runs", path)
        except OSError:  # another process restored it first
            pass


def remove_leftovers(path: Path) -> None:
    """Delete what an interrupted overwrite of `path` left beside it (its stage, or the replaced run a swap had
    not yet deleted); under the run's lock, so no overwrite of it is under way."""
    if sibling(path, REPLACED).is_dir() and path.is_dir():
        carry_foreign_files(sibling(path, REPLACED), path)
    for leftover in (sibling(path, STAGED), sibling(path, REPLACED)):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
            logger.info("removed %s, left by an interrupted overwrite of %s", leftover, path)
    remove_temporaries(path)


def remove_temporaries(path: Path) -> None:
    """Delete the temporary files (`kqv.train.files.temporary_names`) that a killed writer left in the run directory
    `path`: those of its own files (`.run.toml.3f9c0d1e.tmp`), and any in the directories it writes whole
    (tokenizer/, data/). A file of the user's beside the run is never one of them."""
    if not path.is_dir():
        return
    found = [entry for name in RUN_FORMAT for entry in path.glob(f".{name}.*{TEMPORARY}") if is_temporary(entry, name)]
    for directory in RunFiles(path).data_directories():
        if directory.is_dir() and not directory.is_symlink():
            found += [entry for entry in directory.iterdir() if is_temporary(entry)]
    for entry in found:
        if entry.is_file() and not entry.is_symlink():
            entry.unlink(missing_ok=True)


def remove_if_unused(path: Path, created: bool) -> None:
    """Remove the directory this opening created when nothing but its lock file was written into it (the
    training was refused or interrupted before its first file): a refusal leaves no trace."""
    lock = RunFiles(path).lock_file
    if created and path.is_dir() and list(path.iterdir()) == [lock]:
        lock.unlink(missing_ok=True)
        try:
            path.rmdir()
        except OSError:  # another process wrote into it meanwhile
            pass


def carry_foreign_files(old: Path, new: Path) -> None:
    """Move what the user put into a replaced run directory (anything kqv does not write: `RUN_FORMAT`) into the
    run that replaced it: an overwrite replaces the run, not the user's notes beside it."""
    for entry in old.iterdir():
        if entry.name not in RUN_FORMAT and not (new / entry.name).exists():
            os.rename(entry, new / entry.name)


def _refuse(path: Path, existing: list[Path], if_exists: IfExists) -> None:
    """FileExistsError when `path` holds a run and neither resuming nor overwriting was asked for."""
    if existing and if_exists == "error":
        resume = option(RESUME)
        overwrite = option(IF_EXISTS_OVERWRITE)
        raise FileExistsError(
            f"{path} already holds a run ({', '.join(p.name for p in existing)}); continue it with "
            f"{resume}, start over with {overwrite} (deletes those files), or choose another directory"
        )


# ---------------------------------------------------------------------------------------------------------------
# The writer's lock
#
# One writer per run directory: an exclusive `flock` on `run_dir/.lock`, held for the whole run.
#
# Training, resuming and overwriting all write into a run directory; two of them at once interleave their metrics
# and delete each other's checkpoints. `hold_run_lock(run_dir)` takes an exclusive advisory lock (`fcntl.flock`)
# on the lock file before anything in the directory is written or deleted, and keeps it until the block ends. The
# kernel releases it when the process exits in any way, `kill -9` included, so a crash never leaves a stale lock;
# the pid written into the file is only there to name the holder in the error a second writer gets.
#
# Readers (`kqv generate`, `kqv eval`, the explorer) never take the lock: checkpoints are swapped in atomically
# (see `write_checkpoint`), so they read a complete one while a run trains.
#
# It is taken once per training, by `RunDirectory.open` (kqv.train.rundir) on rank 0. It is not re-entrant: two
# `flock`s on separate opens of one file conflict even inside one process, so a second writer in the same process
# is refused like one in another process.


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
        yield RunFiles(run_dir).lock_file
    finally:
        _put_back(fd, *before)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def check_run_lock(run_dir: str | Path) -> None:
    """Raise RunDirectoryBusy now if another process holds `run_dir`'s lock (a probe: nothing is created)."""
    run_dir = Path(run_dir)
    path = RunFiles(run_dir).lock_file
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
    path = RunFiles(run_dir).lock_file
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
