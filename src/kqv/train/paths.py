"""The output guard: what a command may write where the user says, decided from the paths alone.

A leaf of `kqv.train`, beside the writer (`kqv.train.files`) that every write then goes through: `where_in` says
whether one path is, or lies inside, another as the file system resolves them, and `refuse_writing_over` refuses an
output that is one of a command's inputs, lies inside one, or is not a regular file (or, for a directory output,
not a directory). Every command that writes a path the user names (predictions, completions, pages, figures,
experiments' results, exports) calls it before anything is computed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from ..errors import ConfigError


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
    its source holds, `kqv.jobs.held.run_inputs`); and when it exists as something a write would replace or
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
