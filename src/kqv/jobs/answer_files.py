"""The files of answering many prompts: prompts read one a line (`kqv generate --prompts`), and completions and
scored predictions written one a line, escaped so that each reads back exactly (`--out`, `kqv eval --predictions`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..data.lines import text_lines
from ..errors import DataError
from ..train.files import write_atomically
from .scoring import Prediction


def read_prompts(path: str | Path) -> list[str]:
    """The prompts of a text file, one a line (as written: not stripped). A blank line is refused, naming it: the
    completions are written one a line in the same order, and a skipped line would shift them."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no file of prompts at {path}; give a text file with one prompt per line")
    lines = text_lines(path.read_bytes(), path)  # split at newlines alone: a U+2028 stays inside its prompt
    if not lines:
        raise DataError(f"{path} is empty; write one prompt per line")
    blank = [number for number, line in enumerate(lines, 1) if not line.strip()]
    if blank:
        shown = ", ".join(map(str, blank[:5])) + (" ..." if len(blank) > 5 else "")
        raise DataError(
            f"{path} has {len(blank)} blank line(s) (line {shown}); write one prompt on every line, so that line i "
            f"of the output completes line i"
        )
    return lines


def escape_line(text: str) -> str:
    r"""`text` on one line: a backslash becomes `\\`, a newline `\n`, a carriage return `\r` and a tab `\t`, so
    that a file of completions has one a line and each can be read back exactly."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def write_lines(path: str | Path, lines: Sequence[str]) -> Path:
    """Write `lines` (each without a newline) to `path` atomically: a reader sees the old file or the whole new
    one. A missing directory is a DataError, before anything is written."""
    path = Path(path)
    if not path.parent.is_dir():
        raise DataError(f"cannot write {path}: the directory {path.parent} does not exist; create it first")
    if path.is_dir():
        raise DataError(f"cannot write {path}: it is a directory; give a file name")
    write_atomically(path, "".join(line + "\n" for line in lines).encode("utf-8"))
    return path


def write_completions(path: str | Path, completions: Sequence[str]) -> Path:
    """Write one completion a line, each escaped (`escape_line`), atomically."""
    return write_lines(path, [escape_line(text) for text in completions])


def write_predictions(path: str | Path, predictions: Sequence[Prediction]) -> Path:
    """Write each pair's prompt, expected and got completion and whether it was right (1 or 0) as a TSV with a
    header, each field escaped (`escape_line`), atomically."""
    rows = [("prompt", "expected", "got", "correct")]
    rows += [(p.prompt, p.expected, p.got, str(int(p.correct))) for p in predictions]
    return write_lines(path, ["\t".join(map(escape_line, row)) for row in rows])
