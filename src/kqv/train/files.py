"""The names of a run directory's files, and the one writer of them: atomically, fsynced, checked by SHA-256.

A leaf of `kqv.train`: it imports nothing else from it, so every module that reads or writes a run directory
(checkpoints, metrics, the manifest, the run directory itself, the jobs) takes its names from here, and none of
them needs another for a file name. What each file holds is described in `kqv.train.runs`.

Every file of a run is written by this module (`write_atomically`, `write_text`, `write_files`, `write_tensors`,
`write_through` for a library's own saver, `append_line` for the one log that grows): no other module opens a path
of a run directory for writing (`tests/test_run_writer.py` watches a language-model, translation and LoRA run for
it). Each write but the append goes through a temporary file of its own (a random name, created exclusively) and a
rename, and a full disk is a DiskFullError that leaves the old file as it was. The files a command writes where the
user says (predictions, completions, pages, figures) go through the same writer, after the one output guard
(`kqv.train.paths.refuse_writing_over`) has checked their path. Which file of a run holds what is the run
directory's to say (`kqv.train.layout.RunFiles`): the names below are train/'s own.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TypeVar

from safetensors.torch import save_file
from torch import Tensor

from ..errors import IF_EXISTS_OVERWRITE, DiskFullError, RunError, option

T = TypeVar("T")

# what a job writes
RUN_CONFIG, TOKENIZER_DIR, SUMMARY_FILE = "run.toml", "tokenizer", "summary.json"
TOKENS_FILE, PAIRS_FILE, TEXT_DIR = "tokens.safetensors", "pairs.safetensors", "data"
SAMPLES_FILE, TEST_HYPOTHESES_FILE = "samples.txt", "test.hyp"
MANIFEST_FILE = "SHA256SUMS"  # the data files' checksums (`record`)
# what the trainer writes
METRICS_FILE, PLOT_FILE = "metrics.jsonl", "loss.png"
CHECKPOINT_DIR = "checkpoint"
PREVIOUS_CHECKPOINT_DIR = "checkpoint.old"  # exists only between the two renames of a checkpoint swap
MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE = "model.safetensors", "optimizer.pt", "rng.safetensors", "state.json"
SHARDS_DIR = "shards"  # a sharded run's checkpoint: every rank's shards, torch.distributed.checkpoint's layout
LOCK_FILE = ".lock"  # the writer's lock (kqv.train.rundir.hold_run_lock)

JOB_FILES = {
    RUN_CONFIG,
    TOKENIZER_DIR,
    SUMMARY_FILE,
    TOKENS_FILE,
    PAIRS_FILE,
    TEXT_DIR,
    SAMPLES_FILE,
    TEST_HYPOTHESES_FILE,
}
TRAINER_FILES = (CHECKPOINT_DIR, PREVIOUS_CHECKPOINT_DIR, METRICS_FILE, PLOT_FILE)  # what marks an earlier run
RUN_FORMAT = {*JOB_FILES, MANIFEST_FILE, *TRAINER_FILES, LOCK_FILE}  # everything kqv writes into a run directory


def run_files(run_dir: Path) -> list[Path]:
    """The trainer's files of an earlier run in `run_dir` (checkpoint, metrics, plot): what refusing, resuming or
    overwriting decides about."""
    return [run_dir / name for name in TRAINER_FILES if (run_dir / name).exists()]


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename: a reader sees the old file or the new one.
    A write that fails (a full disk: DiskFullError) leaves no temporary file behind, and the old file as it was."""
    write_through(path, lambda tmp: tmp.write_bytes(data), len(data))


def write_through(path: Path, write: Callable[[Path], object], needed: int = 0) -> None:
    """Write `path` atomically with `write(tmp)`, a library's own saver (safetensors, torch.save, matplotlib) given
    the temporary file to write, then renamed over `path`. `needed`: about how many bytes it writes, for the
    full-disk diagnosis (`disk_full_reported`)."""
    tmp = None
    try:
        with disk_full_reported(path, needed):
            tmp = temporary_file(path)
            write(tmp)
            os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise


TEMPORARY = ".tmp"  # the end of every temporary file's name: `.NAME.RANDOM.tmp` beside NAME
TEMPORARY_NAME = re.compile(r"\.(.+)\.[0-9a-f]{8}" + re.escape(TEMPORARY))


def temporary_names(path: Path) -> Iterator[Path]:
    """Names for a temporary file of `path`, beside it (so that a rename onto `path` is atomic): hidden, random
    and ending in `.tmp` (`.a.txt.3f9c0d1e.tmp`; of a name too long to extend, its first 200 characters), so that
    no name a user or a second writer chose is taken."""
    while True:
        yield path.with_name(f".{path.name[:200]}.{secrets.token_hex(4)}{TEMPORARY}")


def temporary_file(path: Path) -> Path:
    """A new, empty temporary file of `path` of its own (`temporary_names`, created exclusively: never one that
    exists), with the mode a new file at `path` would have (the umask's)."""
    return claimed(path, lambda tmp: os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)))


def claimed(path: Path, make: Callable[[Path], object]) -> Path:
    """The first of `path`'s temporary names (`temporary_names`) that `make(name)` creates without finding it taken
    (FileExistsError): an exclusive creation, so no file a user or a second writer holds is ever taken."""
    for tmp in temporary_names(path):
        try:
            make(tmp)
            return tmp
        except FileExistsError:
            continue
    raise AssertionError("temporary_names never ends")


def is_temporary(path: Path, of: str | None = None) -> bool:
    """Whether `path` is named as a temporary file (`temporary_names`): of the file named `of` beside it, or of any."""
    match = TEMPORARY_NAME.fullmatch(path.name)
    return match is not None and (of is None or match.group(1) == of)


def write_text(path: Path, text: str) -> None:
    """`text` as UTF-8 at `path`, atomically."""
    write_atomically(path, text.encode("utf-8"))


def write_files(directory: Path, files: dict[str, str]) -> None:
    """Each text of `files` (by name) in `directory`, created if needed, each file atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        write_text(directory / name, text)


def write_tensors(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str] | None = None) -> None:
    """A safetensors file of `tensors` at `path`, atomically."""
    needed = sum(t.numel() * t.element_size() for t in tensors.values())
    write_through(path, lambda tmp: save_file(tensors, str(tmp), metadata), needed)


def write_directory(
    path: Path, writers: dict[str, Callable[[Path], object]], needed: int, previous: str, staging: str
) -> None:
    """The directory `path` holding a file per writer (each called, in order, with the file to write), swapped in
    whole: written and fsynced in a staging directory beside it (named `staging` + a random part; leftovers of
    an interrupted write are removed first), then `path` renamed to `previous`, the staging directory to `path`,
    and `previous` removed. A reader sees the old directory or the new one; a failed write (a full disk: checked
    before anything is written, `needed` bytes, and diagnosed after) leaves the old one and no staging directory."""
    tmp = make_staging(path, needed, staging)
    try:
        write_into(tmp, writers, needed, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    swap_in(tmp, path, previous)


def make_staging(path: Path, needed: int, staging: str) -> Path:
    """A new, empty staging directory beside `path` (`staging` + a random part) for `write_into`, after removing
    the leftovers of an interrupted write; DiskFullError first when fewer than `needed` bytes are free. Under
    several processes rank 0 makes it and tells the others its name (`kqv.train.shards`)."""
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(staging + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    check_free_space(path, needed)
    return Path(tempfile.mkdtemp(prefix=staging, dir=parent))


def write_into(tmp: Path, writers: dict[str, Callable[[Path], object]], needed: int, path: Path) -> None:
    """Each writer called with its file in the staging directory `tmp` of `path` (a name may be a directory a
    writer fills: a rank's shards), then every file written there fsynced. A full disk is a DiskFullError naming
    `path`; the caller removes the staging directory after a failure."""
    with disk_full_reported(path, needed):  # torch.save's deep error on a full disk, said as such
        for name, write in writers.items():
            write(tmp / name)
        for name in writers:
            for written in (tmp / name).rglob("*") if (tmp / name).is_dir() else [tmp / name]:
                fsync(written)


def write_shared(directory: Path, save: Callable[[Path], T], needed: int, path: Path) -> T:
    """This process's part of a directory that several write together inside the staging directory of `path`
    (a sharded checkpoint's shards, each rank its own: `kqv.train.shards`), by a library's own saver that fsyncs
    what it writes; returns what `save(directory)` returns. A full disk is a DiskFullError naming `path`."""
    with disk_full_reported(path, needed):
        return save(directory)


def swap_in(tmp: Path, path: Path, previous: str) -> None:
    """Swap the complete staging directory `tmp` in for `path`: `path` renamed to `previous`, `tmp` to `path`,
    `previous` removed. A reader sees the old directory or the new one."""
    parent, old = path.parent, path.parent / previous
    try:
        if path.exists():
            if old.exists():  # a leftover from an earlier, completed swap
                shutil.rmtree(old)
            os.replace(path, old)
        os.replace(tmp, path)
        fsync(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def append_line(path: Path, line: str) -> None:
    """One line more at the end of `path` (created if needed): the log a run grows (metrics.jsonl), where a reader
    takes every complete line."""
    with disk_full_reported(path, len(line) + 1), open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")


@contextmanager
def restored_on_failure(path: Path) -> Iterator[None]:
    """Put `path` back as it was when the block fails: a resume rewrites run.toml and then SHA256SUMS, and a
    full disk between the two must not leave a run.toml its checksum no longer matches. The old file is kept
    as a hard link (no data to copy, so it works on a full disk) and renamed back."""
    kept = claimed(path, lambda tmp: os.link(path, tmp)) if path.exists() else None
    try:
        yield
    except BaseException:
        if kept is not None:
            os.replace(kept, path)  # a no-op when `path` is still the same file: the unlink below drops the link
        raise
    finally:
        if kept is not None:
            kept.unlink(missing_ok=True)


FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: Path) -> int | None:
    """The bytes free on the file system of `path` (of its nearest existing parent); None where it cannot tell."""
    for place in (path, *path.parents):
        if place.exists():
            try:
                return shutil.disk_usage(place).free
            except OSError:
                return None
    return None


def check_free_space(path: Path, needed: int) -> None:
    """DiskFullError now, before anything is written, when the file system of `path` has less than `needed` bytes
    free."""
    free = free_bytes(path)
    if free is not None and free < needed:
        raise DiskFullError(path, needed, free)


@contextmanager
def disk_full_reported(path: Path, needed: int) -> Iterator[None]:
    """Within the block (a write of about `needed` bytes at `path`), a full disk is a DiskFullError saying so,
    whatever the writer raised: an OSError with ENOSPC or EDQUOT, or the deep error of a library whose write
    failed (torch.save's `RuntimeError: [enforce fail at inline_container.cc] unexpected pos`), recognised by the
    file system having less than `needed` bytes free. Any other error passes unchanged. The caller removes what
    was half-written."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as error:
        free = free_bytes(path)
        if isinstance(error, OSError) and error.errno in FULL_DISK:
            raise DiskFullError(path, needed, free) from error
        if not isinstance(error, OSError) and free is not None and free < needed:
            raise DiskFullError(path, needed, free) from error
        raise


def sha256(source: Path | BinaryIO) -> str:
    """SHA-256 of a file, given by path or as an open binary file (read from its start)."""
    if isinstance(source, Path):
        with open(source, "rb") as file:
            return sha256(file)
    source.seek(0)
    digest = hashlib.sha256()
    for chunk in iter(lambda: source.read(1 << 20), b""):
        digest.update(chunk)
    return digest.hexdigest()


def fsync(path: Path) -> None:
    """Flush a file or a directory (after renames in it) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------------------------
# The checksums of a run's data files (SHA256SUMS)
#
# The checksums of a run's data files: `SHA256SUMS`, written when training starts and verified whenever a file
# is read back, so that a damaged tokenizer or encoded corpus is reported as such instead of failing deep inside
# a loader (or, worse, loading silently different data).
#
# The checkpoint's files carry their own SHA-256 in `checkpoint/state.json` (kqv.train.checkpoints). This manifest
# covers run.toml (a truncated one may still parse) and the rest of what is read back: `tokenizer/`,
# `tokens.safetensors`, `pairs.safetensors` and `data/`. It is in `sha256sum`'s format, so
# `cd RUN && sha256sum -c SHA256SUMS` checks a run by hand too. A run written before the manifest existed has none,
# and loads unchecked, as it always did.


DATA_FILES = (TOKENIZER_DIR, TOKENS_FILE, PAIRS_FILE, TEXT_DIR)  # what a run reads back besides its checkpoint


def recorded_files(run_dir: Path, names: tuple[str, ...]) -> list[str]:
    """The files among `names` (each a file or a directory of files) that `run_dir` holds, as relative paths."""
    found = []
    for name in names:
        path = run_dir / name
        if path.is_file():
            found.append(name)
        elif path.is_dir():
            found += sorted(p.relative_to(run_dir).as_posix() for p in path.rglob("*") if p.is_file())
    return [name for name in found if not name.endswith(TEMPORARY)]


def record(
    run_dir: Path, names: tuple[str, ...] = DATA_FILES, *, keep: bool = False, known: dict[str, str] | None = None
) -> None:
    """Write the SHA-256 of run.toml and the data files `names` of `run_dir` into its manifest (when training
    starts: run.toml just written, the data prepared). With `keep` (a resumed run, whose data were read back
    verified) a data file already recorded keeps its digest: a damaged file is never re-blessed. `known`: digests
    to record as given (copies of another run's files, recorded as it recorded them: `copy_files`)."""
    digests = read_manifest(run_dir) if keep else {}
    digests.update(known or {})
    digests.pop(RUN_CONFIG, None)  # rewritten by every start, a resumed one too
    names = (RUN_CONFIG, *names)
    for name in recorded_files(run_dir, names):
        digests.setdefault(name, sha256(run_dir / name))
    text = "".join(f"{digest}  {name}\n" for name, digest in sorted(digests.items()))
    write_atomically(run_dir / MANIFEST_FILE, text.encode())


def copy_files(source: Path, run_dir: Path, names: tuple[str, ...]) -> None:
    """Copy the data files `names` (files or directories of files) of the run `source` into `run_dir`: the source's
    verified against its manifest first, each copy written atomically, and `run_dir`'s manifest rewritten to record
    them with the digests the source recorded (computed for a file it does not list), so that reading the copies
    back verifies them against the source's record."""
    verify(source, *names)
    recorded = read_manifest(source)
    for name in recorded_files(source, names):
        target = run_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        write_through(
            target, lambda tmp, name=name: shutil.copyfile(source / name, tmp), (source / name).stat().st_size
        )
    record(run_dir, names, known={name: recorded[name] for name in recorded_files(source, names) if name in recorded})


def read_manifest(run_dir: Path) -> dict[str, str]:
    """The recorded digests by relative path; empty for a run without a manifest."""
    path = run_dir / MANIFEST_FILE
    if not path.exists():
        return {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        digests = {name: digest for digest, name in (line.split("  ", 1) for line in lines if line)}
    except (ValueError, IsADirectoryError) as error:
        raise RunError(f"{path} is corrupt ({error}); {_remedy(run_dir)}") from None
    if not all(len(d) == 64 and all(c in "0123456789abcdef" for c in d) for d in digests.values()):
        raise RunError(f"{path} is corrupt: a line is not a SHA-256 and a file name; {_remedy(run_dir)}")
    return digests


def verify(run_dir: Path, *names: str) -> None:
    """Check every recorded file under `names` (files or directories) against the manifest: RunError for a file
    that is missing, unreadable as a file, or whose SHA-256 differs. Files the manifest does not list pass."""
    digests = read_manifest(run_dir)
    for name, digest in digests.items():
        if not any(name == n or name.startswith(n.rstrip("/") + "/") for n in names):
            continue
        path = run_dir / name
        if not path.is_file():
            what = "is missing" if not path.exists() else "is not a file"
            raise RunError(f"{path} {what}, so the run is incomplete; {_remedy(run_dir)}")
        if sha256(path) != digest:
            raise RunError(
                f"{path} is corrupt: its SHA-256 differs from the one recorded in {run_dir / MANIFEST_FILE}; "
                f"{_remedy(run_dir)}"
            )


def read_verified(run_dir: Path, name: str) -> bytes:
    """The bytes of the run file `name`, verified against the manifest (RunError if it is damaged)."""
    verify(run_dir, name)
    path = run_dir / name
    if not path.is_file():
        what = "is missing" if not path.exists() else "is not a file"
        raise RunError(f"{path} {what}, so the run is incomplete; {_remedy(run_dir)}")
    return path.read_bytes()


def _remedy(run_dir: Path) -> str:
    overwrite = option(IF_EXISTS_OVERWRITE)
    return f"restore the file from a backup, or train the run again with {overwrite} (which deletes {run_dir}'s run)"
