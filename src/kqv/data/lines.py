"""Text files read as data: lines split at newlines alone (a form feed, U+2028 or lone carriage return stays in its
line, unlike `str.splitlines`), a byte-order mark at the start skipped, and bytes that are not UTF-8 named with
their line and offset: one clear error instead of a UnicodeDecodeError or a line broken in two."""

from __future__ import annotations

import codecs
from pathlib import Path

from ..errors import DataError

NEWLINE = "\n"
BOM = "\ufeff"  # the byte-order mark U+FEFF, written by some editors at the start of a UTF-8 file


def text_lines(data: bytes, path: str | Path) -> list[str]:
    """The lines of the UTF-8 file `path` holding `data`, split at `\n` alone (and without the `\r` of a `\r\n`):
    unlike `str.splitlines`, a form feed, lone carriage return, U+0085, U+2028 or any other character stays in its
    line. A byte-order mark at the start is skipped; DataError, naming the line, for one anywhere else and for bytes
    that are not UTF-8 (with their offset in the file)."""
    skipped = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        text = data[skipped:].decode("utf-8")
    except UnicodeDecodeError as error:
        at = skipped + error.start
        line = data.count(b"\n", 0, at) + 1
        raise DataError(
            f"{path}:{line}: not UTF-8 ({error.reason}: {data[at : at + 1]!r} at byte {at} of the file); "
            f"save the file as UTF-8"
        ) from None
    lines = text.split(NEWLINE)
    if lines[-1] == "":
        lines.pop()  # after the last newline
    lines = [line.removesuffix("\r") for line in lines]
    for number, line in enumerate(lines, 1):
        if BOM in line:
            raise DataError(
                f"{path}:{number}: a byte-order mark (BOM, U+FEFF) at character {line.index(BOM) + 1}; one belongs "
                f"only at the start of a file (where kqv skips it), so remove it (a file pasted into another?)"
            )
    return lines
