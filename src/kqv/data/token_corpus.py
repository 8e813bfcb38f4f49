"""A token corpus on disk: the token ids of a text, encoded once into one flat array (`tokens.bin`, uint16 when the
vocabulary fits, else uint32), read back as a `numpy.memmap` so that a corpus bigger than memory trains as nanoGPT's
`train.bin` does. `kqv.jobs.lm_prepared.prepare` writes one; this module reads it and cuts the text it is made of.

A prepared corpus is a directory:

    manifest.json     format, dtype, token count, vocabulary size, SHA-256 of tokens.bin, the source files and sizes
    tokenizer/        the tokenizer that encoded it (`kqv.data.tokenizers.load_tokenizer`)
    tokens.bin        the ids, little-endian, every source file's text encoded on its own, one after another

The text is read in chunks cut only where a line starts with a printable ASCII character (or, in a chunk without
one, at a space before a letter): no token of a byte-level BPE (whose pre-tokenizer never joins a newline to a
following non-space, nor a space before a letter to what precedes it) nor of a character tokenizer spans such a
cut, so encoding the chunks one by one gives exactly the ids of encoding each file whole, whatever the chunk size,
and a prepare resumed at any chunk writes the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import PREPARE, DataError, option
from .tokenizers import Tokenizer, load_tokenizer

FORMAT = "kqv-token-corpus"
MANIFEST, ARRAY, TOKENIZER = "manifest.json", "tokens.bin", "tokenizer"
STATE = "prepare.json"  # an unfinished prepare's progress (`kqv.jobs.lm_prepared`)
CUT = re.compile(r"\n(?=[!-~])")  # a cut no token spans: a newline before a printable ASCII character
SPACE_CUT = re.compile(r"(?= [A-Za-z])")  # another, inside a line: before a space before a letter (`last_space_cut`)


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest array type that holds every id: uint16 for up to 65,536 tokens (GPT-2's 50,257), else uint32."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def text_files(path: Path) -> list[Path]:
    """The files a text path names, in `kqv.data.shakespeare.load_text`'s order: the file, or a directory's .txt
    files by relative path."""
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted((p for p in path.rglob("*.txt") if p.is_file()), key=lambda p: p.relative_to(path).as_posix())
        if not files:
            raise no_texts(path)
        return files
    raise DataError(f"no text file or directory at {path}")


def no_texts(directory: Path) -> DataError:
    """The error for a directory given as a text that holds no .txt files: named as a prepared corpus that lost its
    manifest where it holds a corpus's tokens or tokenizer (what else would hold them), else as an empty text."""
    if (directory / ARRAY).is_file() or (directory / TOKENIZER).is_dir():
        return DataError(
            f"{directory} holds a prepared corpus's {ARRAY if (directory / ARRAY).is_file() else TOKENIZER} but no "
            f"{MANIFEST}, which names its tokens (deleted, or a prepare that never finished); prepare it again with "
            f"{option(PREPARE, path=str(directory))}"
        )
    return DataError(f"the directory {directory} contains no .txt files; give a text file or a directory of them")


def last_cut(data: bytes) -> int:
    """The byte offset of the last `CUT` in `data` (just after its newline), 0 if none."""
    end = len(data) - 1
    while (k := data.rfind(b"\n", 0, end)) >= 0:
        if 0x21 <= data[k + 1] <= 0x7E:
            return k + 1
        end = k
    return 0


def last_space_cut(data: bytes) -> int:
    """The byte offset of the last space before an ASCII letter in `data` (the cut falls before the space), 0 if
    none: a cut inside a line no token spans either, for a line longer than a chunk. A byte-level BPE's
    pre-tokenizer starts a piece at such a space whatever precedes it (a letter, digit or punctuation run never
    takes a space; a run of spaces leaves its last to the word), and a character tokenizer has no pieces."""
    end = len(data) - 1
    while (k := data.rfind(b" ", 0, end)) > 0:
        if 0x41 <= data[k + 1] <= 0x5A or 0x61 <= data[k + 1] <= 0x7A:
            return k
        end = k
    return 0


def decode(data: bytes, path: Path, offset: int) -> str:
    """UTF-8 text with universal newlines, as `load_text` reads a file."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{path} is not UTF-8 text (byte {offset + error.start}); convert it to UTF-8") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_chunks(path: Path, offset: int, chunk_bytes: int) -> Iterator[tuple[str, int]]:
    """(text, the byte offset after it) of each chunk of the file from byte `offset`: about `chunk_bytes` each, cut
    at `CUT`s, or where a chunk holds none at a space before a letter (`last_space_cut`: a single line of many
    megabytes is read a chunk at a time), never the whole file at once (a run with no cut at all is carried into
    the next chunk)."""
    with open(path, "rb") as file:
        file.seek(offset)
        carry = b""
        while block := file.read(chunk_bytes):
            data = carry + block
            cut = last_cut(data) or last_space_cut(data)
            if cut:
                yield decode(data[:cut], path, offset), offset + cut
                offset, carry = offset + cut, data[cut:]
            else:
                carry = data
        if carry:
            yield decode(carry, path, offset), offset + len(carry)


def pieces(text: str, count: int) -> list[str]:
    """`text` cut at `CUT`s (or, in a long line, at `SPACE_CUT`s) into about `count` pieces of similar size: for a
    batched, parallel encoding."""
    out, start, step = [], 0, max(1, len(text) // count)
    while start < len(text):
        found = CUT.search(text, start + step, start + 2 * step) or SPACE_CUT.search(text, start + step)
        found = found or CUT.search(text, start + step)
        end = found.end() if found else len(text)
        out.append(text[start:end])
        start = end
    return out


def sample_text(files: list[Path], sample_bytes: int, block: int = 1 << 20) -> str:
    """About `sample_bytes` of the files' text, in blocks spread evenly over it (all of it when it is smaller),
    each block's partial first and last lines dropped: what a tokenizer is trained on."""
    sizes = [f.stat().st_size for f in files]
    total = sum(sizes)
    if total <= sample_bytes:
        return "".join(text for f in files for text, _ in read_chunks(f, 0, block))
    block = min(block, sample_bytes)
    count = max(1, sample_bytes // block)
    parts = []
    for k in range(count):
        at = k * total // count
        index = 0
        while at >= sizes[index]:
            at, index = at - sizes[index], index + 1
        with open(files[index], "rb") as file:
            file.seek(at)
            data = file.read(block)
        start = data.find(b"\n") + 1 if at else 0
        end = data.rfind(b"\n") + 1 or len(data)
        parts.append(data[start:end].decode("utf-8", errors="ignore"))
    return "".join(parts)


def digest(path: Path) -> str:
    """SHA-256 of a file, read in blocks (not mapped, so it adds nothing to the resident memory)."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def is_token_corpus(path: str | Path | None) -> bool:
    """Whether `path` is a directory with a token corpus's manifest (a prepared corpus, or a damaged one) or an
    unfinished prepare's progress."""
    return path is not None and any((Path(path).expanduser() / name).is_file() for name in (MANIFEST, STATE))


@dataclass
class TokenCorpus:
    """A prepared corpus opened for reading: its manifest, its tokenizer and its ids as a read-only memmap."""

    path: Path
    manifest: dict
    tokenizer: Tokenizer
    ids: np.memmap  # (tokens,) uint16 or uint32

    @classmethod
    def open(cls, path: str | Path, *, verify: bool = True) -> TokenCorpus:
        """Open and check the corpus at `path`: one-line DataErrors for a directory that is not one, a damaged
        manifest, an array of the wrong size (truncated), a checksum that differs (`verify`: reads the array once,
        in blocks) or a tokenizer whose vocabulary is not the manifest's."""
        path = Path(path).expanduser()
        remedy = f"prepare it again with {option(PREPARE, path=str(path))}"
        if not (path / MANIFEST).is_file() and (path / STATE).is_file():
            raise DataError(f"{path} is an unfinished prepare; {remedy} to finish it")
        if not (path / MANIFEST).is_file():
            raise DataError(f"{path} is not a prepared token corpus (no {MANIFEST}); {remedy}")
        try:
            manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
            dtype, count, vocab_size = np.dtype(manifest["dtype"]), int(manifest["tokens"]), int(manifest["vocab_size"])
            checksum = manifest["sha256"]
        except (ValueError, KeyError, TypeError) as error:
            raise DataError(f"{path / MANIFEST} is damaged ({error!r}); {remedy}") from None
        if manifest.get("format") != FORMAT:
            raise DataError(f"{path / MANIFEST} is not a {FORMAT} manifest; {remedy}")
        array = path / ARRAY
        size = array.stat().st_size if array.is_file() else None
        if size != count * dtype.itemsize:
            found = "missing" if size is None else f"{size:,} bytes"
            raise DataError(
                f"{array} is {found}, not the {count:,} {dtype.name} tokens ({count * dtype.itemsize:,} bytes) its "
                f"manifest records: it is truncated or replaced; {remedy}"
            )
        if verify and digest(array) != checksum:
            raise DataError(f"{array} does not match the SHA-256 its manifest records (it changed); {remedy}")
        tokenizer = load_tokenizer(path / TOKENIZER)
        if tokenizer.vocab_size != vocab_size:
            raise DataError(
                f"{path / TOKENIZER} has {tokenizer.vocab_size} tokens, its manifest {vocab_size}: they are not "
                f"the pair that prepared it; {remedy}"
            )
        ids = np.memmap(array, dtype=dtype, mode="r", shape=(count,)) if count else np.zeros(0, dtype)
        return cls(path, manifest, tokenizer, ids)

    def split(self, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
        """The training ids and the held-out tail of `val_fraction` of them (views of the memmap, nothing read)."""
        cut = len(self.ids) - round(len(self.ids) * val_fraction)
        return self.ids[:cut], self.ids[cut:]


def window_starts(length: int, batch_size: int, context: int, generator: torch.Generator) -> torch.Tensor:
    """`batch_size` uniform starts of blocks of context + 1 tokens in `length` ids: the draws
    `kqv.data.batches.sample_batch` makes, so a generator gives the same blocks from a memmap as from a tensor."""
    return torch.randint(0, length - context, (batch_size,), generator=generator)


def read_windows(ids: np.ndarray, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The blocks of `ids` at `starts` as (x, y) LongTensors of shape (len(starts), context), y shifted by one:
    each block read from the array alone (a memmap pages in only those tokens)."""
    blocks = np.stack([ids[s : s + context + 1] for s in starts.tolist()]).astype(np.int64)  # (B, T + 1)
    blocks = torch.from_numpy(blocks)
    return blocks[:, :-1], blocks[:, 1:]
