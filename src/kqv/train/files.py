"""How kqv writes a file: the one writer (atomically, fsynced, a full disk said as such, checked by SHA-256), and
the output guard that decides where a command may write what the user names.

A leaf of `kqv.train`: it imports nothing else from it. Every file of a run is written by this module
(`write_atomically`, `write_text`, `write_files`, `write_tensors`, `write_through` for a library's own saver,
`write_directory` for a directory swapped in whole, `append_line` for the one log that grows): no other module
opens a path of a run directory for writing (`tests/test_run_writer.py` watches a language-model, translation and
LoRA run for it). Each write but the append goes through a temporary file of its own (a random name, created
exclusively) and a rename, and a full disk is a DiskFullError that leaves the old file as it was. Which file of a
run holds what, and where it is, is the run directory's to say (`kqv.train.layout`).

The files a command writes where the user says (predictions, completions, pages, figures, experiments' results,
exports) go through the same writer, after the output guard has checked their path: `where_in` says whether one
path is, or lies inside, another as the file system resolves them, and `refuse_writing_over` refuses an output
that is one of a command's inputs, lies inside one, or is not a regular file (or, for a directory output, not a
directory). Every command that writes a path the user names calls it before anything is computed.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from safetensors.torch import save_file
from torch import Tensor

from ..errors import ConfigError, DiskFullError

T = TypeVar("T")


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename: a reader sees the old file or the new one.
    A write that fails (a full disk: DiskFullError) leaves no temporary file behind, and the old file as it was."""
    write_through(path, lambda tmp: tmp.write_bytes(data), len(data))


def write_png(path: Path, figure: Any, **options: Any) -> None:
    """A matplotlib `figure` as a PNG at `path` (savefig's `options`), atomically: drawn into memory first, so that
    a full disk is said with the bytes the file needs."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", **options)
    write_atomically(path, buffer.getvalue())


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
    path: Path, writers: dict[str, Callable[[Path], object]], needed: int, previous: Path, staging: str
) -> None:
    """The directory `path` holding a file per writer (each called, in order, with the file to write), swapped in
    whole: written and fsynced in a staging directory beside it (named `staging` + a random part; leftovers of
    an interrupted write are removed first), then `path` renamed to `previous` (beside it), the staging directory
    to `path`, and `previous` removed. A reader sees the old directory or the new one; a failed write (a full disk:
    checked before anything is written, `needed` bytes, and diagnosed after) leaves the old one and no staging
    directory."""
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


def swap_in(tmp: Path, path: Path, old: Path) -> None:
    """Swap the complete staging directory `tmp` in for `path`: `path` renamed to `old` (beside it), `tmp` to
    `path`, `old` removed. A reader sees the old directory or the new one."""
    parent = path.parent
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
# The output guard


def where_in(path: str | Path, container: str | Path) -> str | None:
    """`"same"` when `path` is `container`, `"inside"` when it lies inside it (a directory), else None: as the file
    system resolves them, so that symbolic links, `..` and, on a case-insensitive file system, the case cannot
    disguise one as another (existing paths are compared by device and inode, `os.path.samestat`; a part of `path`
    that does not exist yet is compared by its resolved name)."""
    target, home = (Path(os.path.realpath(Path(p).expanduser())) for p in (path, container))
    try:
        home_status = os.stat(home)
    except OSError:
        home_status = None
    for depth, place in enumerate((target, *target.parents)):
        if home_status is None:
            same = os.path.normcase(place) == os.path.normcase(home)
        else:
            try:
                same = os.path.samestat(os.stat(place), home_status)
            except OSError:  # not there (yet): an ancestor may be
                continue
        if same:
            return "same" if depth == 0 else "inside"
    return None


def refuse_writing_over(
    output: str | Path, inputs: Iterable[tuple[str, str | Path | None]], option: str, *, directory: bool = False
) -> None:
    """The output guard: ConfigError, before anything is written, when writing the output `output` (what `option`
    names: "--out") would lose what exists. That is when it is one of `inputs` or lies inside one (`where_in`), so
    that no command writes over what it reads (`inputs` are (what it is, its path) pairs, such as ("the file of
    prompts, --prompts p.txt", "p.txt"), a path of None skipped: a command's own inputs, and every file a run or
    its source holds, `kqv.jobs.base.run_inputs`); and when it exists as something a write would replace or
    block on: anything but a regular file (a FIFO, a device node, a socket, a directory), or for a `directory`
    output anything but a directory; an empty path names nothing to write. Every command that writes a path the
    user names calls it."""
    if not str(output).strip():
        raise ConfigError(f"{option} is empty: give the path of the {'directory' if directory else 'file'} to write")
    for what, path in inputs:
        if path is None or str(path) == "":
            continue
        relation = where_in(output, path)
        if relation is not None:
            raise ConfigError(
                f"{option} {output} is {'' if relation == 'same' else 'inside '}{what}; a command never writes over "
                f"what it reads: choose another path"
            )
    try:
        mode = os.stat(output).st_mode  # through a symbolic link: what a write would reach
    except (FileNotFoundError, NotADirectoryError):
        return
    if directory and not stat.S_ISDIR(mode):
        raise ConfigError(f"{option} {output} is {file_kind(mode)}, not a directory; give the path of a directory")
    if not directory and not stat.S_ISREG(mode):
        raise ConfigError(
            f"{option} {output} is {file_kind(mode)}, not a regular file, which writing would replace: "
            f"give the path of a new or regular file"
        )


def file_kind(mode: int) -> str:
    """What a file of `mode` (os.stat's st_mode) is, in words."""
    kinds = {
        stat.S_ISDIR: "a directory",
        stat.S_ISFIFO: "a FIFO (named pipe)",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
        stat.S_ISREG: "a regular file",
    }
    return next((what for test, what in kinds.items() if test(mode)), "a special file")
