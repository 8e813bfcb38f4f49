"""kqv's own exceptions: the errors a user can cause and fix (a bad config, unusable data, a broken run directory).

Every one derives from `KqvError`, and from the built-in exception a caller would expect (`ValueError`,
`TypeError`), so `except ValueError` keeps working. The command line prints these as `kqv: error: <message>`
and exits with status 2; any other exception is a bug in kqv and shows its traceback.
"""

from __future__ import annotations

import contextvars
import errno
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

_WORDS: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("kqv_words", default=None)


class KqvError(Exception):
    """An expected error whose message says what was wrong and what to do."""


class ConfigError(KqvError, ValueError):
    """A configuration value or option is invalid (unknown option, out of range, not one of the choices)."""


class ConfigTypeError(ConfigError, TypeError):
    """A configuration value has the wrong type (a float where an int is needed, a string for a bool, ...)."""


class DataError(KqvError, ValueError):
    """Input data cannot be used: a corpus, a TSV file, a prompt, a sentence, token ids."""


class DataTypeError(DataError, TypeError):
    """Input data of the wrong type: token ids that are not an integer tensor, images that are not floats, ..."""


class UnknownTokenError(DataError, KeyError):
    """A token that the tokenizer's vocabulary does not have (a KeyError too, as a dict lookup would raise)."""

    def __str__(self) -> str:  # KeyError's own str() would quote the message
        return str(self.args[0]) if self.args else ""


class RunError(KqvError, ValueError):
    """A run directory cannot be used: incomplete, corrupt, written by another job, or not a kqv run."""


class ConversionError(KqvError, ValueError):
    """A model that kqv.interop cannot convert: an architecture or option with no kqv (or Hugging Face) counterpart,
    or a checkpoint whose weights do not match its config."""


class ProcessLost(KqvError, RuntimeError):
    """Another process of a torchrun training stopped (killed, out of memory, its machine gone), so this one cannot
    go on: the message names the lost rank where it can tell."""


class MissingResourceError(KqvError, RuntimeError):
    """Something kqv needs is not installed and cannot be fetched (a corpus, pretrained weights); the message says
    how to get it."""


class DiskFullError(KqvError, OSError):
    """The disk filled up while kqv wrote `path` (`needed` bytes): what was half-written is removed, what was
    complete before stays. An OSError with errno ENOSPC, so `except OSError` keeps working."""

    def __init__(self, path: object, needed: int, free: int | None = None):
        super().__init__(errno.ENOSPC, "No space left on device", str(path))
        self.path, self.needed, self.free = path, needed, free
        if free is None:
            (wanted,), available = _sizes(needed), ""
        else:
            wanted, left = _sizes(needed, free)
            available = f" ({left} free)" if free < needed else f" ({left} free, short of what the write took)"
        self.message = (
            f"the disk is full: {wanted} needed at {path}{available}; free some space and run the command again"
        )

    def __str__(self) -> str:
        return self.message


def _sizes(*counts: int) -> list[str]:
    """Byte counts in one unit (MB = 10^6 bytes, or kB when the largest is under 0.1 MB) with as many decimals as
    it takes for different counts to read differently: "0.24 MB needed (0.20 MB free)", never "0.2 MB needed
    (0.2 MB free)"."""
    unit, scale, most = ("MB", 1e6, 6) if max(counts) >= 100_000 else ("kB", 1e3, 3)
    for decimals in range(1, most + 1):
        shown = [f"{n / scale:,.{decimals}f} {unit}" for n in counts]
        if len(set(shown)) == len(set(counts)):
            return shown
    return shown


# What to do about an operating-system error: the file system said no (full, read-only, not a directory, ...).
OS_REMEDIES = {
    errno.ENOSPC: "the disk is full: free some space and run the command again",
    errno.EDQUOT: "the disk quota is used up: free some space and run the command again",
    errno.EACCES: "check its permissions, or choose another path",
    errno.EPERM: "check its permissions, or choose another path",
    errno.EROFS: "the file system is read-only: choose another path",
    errno.ENOTDIR: "a part of the path is a file, not a directory: choose another path",
    errno.EISDIR: "it is a directory: give the path of a file (or remove the directory)",
    errno.ENAMETOOLONG: "choose a shorter path",
}


def describe_os_error(error: OSError) -> str:
    """One line for an OSError: kqv's own message (a FileNotFoundError that says what to train), or the file, what
    the system said, and what to do about it (`OS_REMEDIES`)."""
    if isinstance(error, KqvError) or error.errno is None or error.strerror is None:
        return str(error)
    path = error.filename2 if error.filename2 is not None else error.filename  # a rename's: its destination
    where = f"{path}: " if path is not None else ""
    remedy = OS_REMEDIES.get(error.errno)
    return f"{where}{error.strerror}" + (f"; {remedy}" if remedy else "")


# ---------------------------------------------------------------------------------------------------------------
# Messages in the words of the interface: a command-line user is told about flags, a Python user about arguments.
# Below the command line, messages name options and remedies in Python's words only (`option`); the command line
# gives its own words for them (`kqv.cli.wording.WORDS`) to `command_line`, so no layer below it knows a flag.


@contextmanager
def command_line(words: Mapping[str, str]) -> Iterator[None]:
    """Within the block, messages are for a command-line user: `words` maps each Python wording `option` is given
    to the command line's (`kqv.cli.main` runs every command inside it, with `kqv.cli.wording.WORDS`)."""
    token = _WORDS.set(words)
    try:
        yield
    finally:
        _WORDS.reset(token)


def option(words: str, **fields: object) -> str:
    """How a message names an option, or a remedy, to whoever called: `words` as a Python caller would write them
    ("beam_size", "if_exists='overwrite'", "kqv.export({path!r}, hf=DIR, merge=True)"), or inside `command_line`
    the command line's words for them ("--beam", "`--overwrite`", ...); `fields` fill either's placeholders."""
    table = _WORDS.get()
    said = table.get(words, words) if table is not None else words
    return said.format(**fields) if fields else said
