"""Tokenizers: text to token ids and back, at character level or with byte-level BPE.

Both kinds share one small interface (``encode``, ``decode``, ``vocab_size``, ``token_to_id``, ``save``)
and are saved as JSON only, never pickled: ``tokenizer.json`` holds the vocabulary and
``kqv_tokenizer.json`` records which kind it is, so ``load_tokenizer`` can restore either.

The BPE tokenizer is byte-level (Radford et al. 2019, GPT-2; trained with Hugging Face ``tokenizers``):
its base vocabulary is all 256 bytes, so every string encodes and decodes back to itself.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from ..errors import ConfigError, DataError, KqvError, RunError, UnknownTokenError

TOKENIZER_FILE = "tokenizer.json"
METADATA_FILE = "kqv_tokenizer.json"
N_BYTES = 256


class Tokenizer(ABC):
    """The interface every kqv tokenizer offers; ``kind`` names it in ``kqv_tokenizer.json``."""

    kind: ClassVar[str]

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of distinct token ids; every id is in ``range(vocab_size)``."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``; ``decode(encode(text)) == text``."""

    @abstractmethod
    def token_to_id(self, token: str) -> int:
        """The id of one token (a character, or a special token such as ``"<eos>"``); KeyError if absent."""

    @abstractmethod
    def _vocabulary(self) -> tuple[str, dict[str, Any]]:
        """The text of ``tokenizer.json``, and extra metadata for ``kqv_tokenizer.json``."""

    @classmethod
    @abstractmethod
    def _load(cls, directory: Path, metadata: dict[str, Any]) -> Tokenizer:
        """Rebuild the tokenizer that ``save`` wrote into ``directory``."""

    def files(self) -> dict[str, str]:
        """The files that save the tokenizer, by name, as text (JSON): what a run's `tokenizer/` holds, written by
        the run's writer (`kqv.train.files`); `load_tokenizer` reads them back."""
        vocabulary, extra = self._vocabulary()
        return {TOKENIZER_FILE: vocabulary, METADATA_FILE: json.dumps({"kind": self.kind, **extra}, indent=2) + "\n"}

    def save(self, directory: str | Path) -> None:
        """Save as JSON into ``directory`` (created if needed); restore with ``load_tokenizer``."""
        save_files(Path(directory), self.files())

    def _check_ids(self, ids: Sequence[int]) -> None:
        """Raise ValueError for ids outside the vocabulary rather than silently dropping them."""
        bad = sorted({i for i in ids if not 0 <= i < self.vocab_size})
        if bad:
            raise DataError(f"Token ids {bad[:10]} are outside the vocabulary range [0, {self.vocab_size})")


class CharTokenizer(Tokenizer):
    """One token per character; the vocabulary is the sorted set of characters of the training text."""

    kind = "char"

    def __init__(self, chars: Sequence[str]) -> None:
        if not chars:
            raise DataError("A character tokenizer needs at least one character")
        if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise DataError("The vocabulary must be distinct single characters")
        self.chars = list(chars)
        self._ids = {char: i for i, char in enumerate(self.chars)}

    @classmethod
    def train(cls, text: str) -> CharTokenizer:
        """Build the vocabulary from the distinct characters of ``text``, sorted by code point."""
        if not text:
            raise DataError("Cannot train a character tokenizer on empty text")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """Ids of the characters; ValueError names any character missing from the vocabulary."""
        try:
            return [self._ids[char] for char in text]
        except KeyError:
            unknown = sorted(set(text) - self._ids.keys())
            raise DataError(
                f"Characters {', '.join(map(repr, unknown[:20]))} are not in the vocabulary: this character "
                "tokenizer was trained on different text. Train it on text that contains them (for example "
                "the whole corpus, before splitting), or use the byte-level 'bpe' tokenizer."
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]  # also accepts a tensor or numpy array
        self._check_ids(ids)
        return "".join(self.chars[i] for i in ids)

    def token_to_id(self, token: str) -> int:
        if token not in self._ids:
            raise UnknownTokenError(f"{token!r} is not in this character tokenizer's vocabulary")
        return self._ids[token]

    def _vocabulary(self) -> tuple[str, dict[str, Any]]:
        return json.dumps({"type": "char", "chars": self.chars}, ensure_ascii=False), {}

    @classmethod
    def _load(cls, directory: Path, metadata: dict[str, Any]) -> CharTokenizer:
        vocabulary = json.loads((directory / TOKENIZER_FILE).read_text(encoding="utf-8"))
        return cls(vocabulary["chars"])


class BPETokenizer(Tokenizer):
    """Byte-level byte-pair encoding: 256 byte tokens, then merges learned from the training text.

    Special tokens (``"<pad>"``, ``"<bos>"``, ``"<eos>"`` ...) get the first ids, in the order given, and
    are matched whole when they appear in the text.
    """

    kind = "bpe"

    def __init__(self, tokenizer: HFTokenizer, special_tokens: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.special_tokens = list(special_tokens)

    @classmethod
    def train(cls, text: str, vocab_size: int, special_tokens: Sequence[str] = ()) -> BPETokenizer:
        """Learn merges on ``text`` until the vocabulary holds ``vocab_size`` tokens (fewer if ``text`` runs out).

        ``vocab_size`` counts the 256 byte tokens and the special tokens, so it must exceed their sum.
        """
        special_tokens = _check_special_tokens(special_tokens)
        check_vocab_size(vocab_size)
        minimum = N_BYTES + len(special_tokens) + 1
        if vocab_size < minimum:
            raise ConfigError(
                f"vocab_size must exceed 256 byte tokens + {len(special_tokens)} special tokens, so be at least "
                f"{minimum}; got {vocab_size}"
            )
        if not text:
            raise DataError("Cannot train a BPE tokenizer on empty text")
        tokenizer = _byte_level_bpe()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(special_tokens),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator([text], trainer)
        return cls(tokenizer, special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Ids of `text`; a DataError naming the pieces a vocabulary without an unknown token cannot encode (a
        character-level run exported to Hugging Face is a word-level vocabulary of its characters)."""
        try:
            return self.tokenizer.encode(text).ids
        except Exception as error:  # noqa: BLE001 -- the tokenizers library raises a bare Exception
            raise DataError(self._unencodable(text, error)) from None

    def _unencodable(self, text: str, error: Exception) -> str:
        pieces = [text] if self.tokenizer.pre_tokenizer is None else self.tokenizer.pre_tokenizer.pre_tokenize_str(text)
        vocabulary = self.tokenizer.get_vocab()
        unknown = sorted({piece for piece, *_ in pieces if piece not in vocabulary})
        if not unknown:
            return f"this tokenizer cannot encode the text ({error})"
        listed = ", ".join(map(repr, unknown[:20])) + (f" and {len(unknown) - 20} more" if len(unknown) > 20 else "")
        return (
            f"{listed} {'is' if len(unknown) == 1 else 'are'} not in this tokenizer's vocabulary, which has no "
            f"unknown token to stand for {'it' if len(unknown) == 1 else 'them'} (a character-level run's vocabulary "
            "is the characters of its training text); remove or replace them"
        )

    def decode(self, ids: Iterable[int]) -> str:
        """Decode ids, special tokens included, so that ``decode(encode(text)) == text``."""
        ids = [int(i) for i in ids]  # also accepts a tensor or numpy array
        self._check_ids(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def token_to_id(self, token: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise UnknownTokenError(
                f"{token!r} is not a token of this BPE tokenizer (special tokens: {self.special_tokens})"
            )
        return token_id

    def _vocabulary(self) -> tuple[str, dict[str, Any]]:
        return self.tokenizer.to_str(pretty=True), {"special_tokens": self.special_tokens}

    @classmethod
    def _load(cls, directory: Path, metadata: dict[str, Any]) -> BPETokenizer:
        return cls(HFTokenizer.from_file(str(directory / TOKENIZER_FILE)), metadata.get("special_tokens", []))


def _byte_level_bpe() -> HFTokenizer:
    """An untrained BPE whose pre-tokenizer maps bytes to printable symbols and whose decoder maps them back.

    ``add_prefix_space=False`` keeps the round trip exact: no space is added before the first word.
    """
    tokenizer = HFTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _check_special_tokens(special_tokens: Sequence[str]) -> list[str]:
    """Require distinct, non-empty special tokens."""
    special_tokens = list(special_tokens)
    if any(not isinstance(token, str) or not token for token in special_tokens):
        raise ConfigError(f"Special tokens must be non-empty strings, got {special_tokens}")
    if len(set(special_tokens)) != len(special_tokens):
        raise ConfigError(f"Special tokens must be distinct, got {special_tokens}")
    return special_tokens


TOKENIZER_KINDS: dict[str, type[Tokenizer]] = {"char": CharTokenizer, "bpe": BPETokenizer}
MAX_VOCAB_SIZE = 1 << 20  # a BPE's largest vocabulary: 20 times GPT-2's (the trainer allocates for every token)


def check_vocab_size(vocab_size: Any, name: str = "vocab_size") -> None:
    """Refuse a BPE vocabulary size that is not a whole number up to `MAX_VOCAB_SIZE` (`name`: the option's
    name in the caller's words): a larger one fails deep in the tokenizers library, or aborts the process."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size > MAX_VOCAB_SIZE:
        shown = vocab_size if not isinstance(vocab_size, int) or vocab_size < 10**12 else f"{vocab_size:.3g}"
        raise ConfigError(
            f"{name} must be a whole number of tokens up to {MAX_VOCAB_SIZE:,} (GPT-2 has 50,257), got {shown}"
        )


def make_tokenizer(
    kind: str, text: str, vocab_size: int | None = None, special_tokens: Sequence[str] = ()
) -> Tokenizer:
    """Train a tokenizer of ``kind`` ("char" or "bpe") on ``text``.

    ``vocab_size`` is required for "bpe" and ignored for "char", whose vocabulary is the text's
    characters; special tokens are only supported by "bpe".
    """
    if kind == "char":
        if special_tokens:
            raise ConfigError("The 'char' tokenizer has no special tokens; use kind='bpe' for them")
        return CharTokenizer.train(text)
    if kind == "bpe":
        if vocab_size is None:
            raise ConfigError("The 'bpe' tokenizer needs a vocab_size (more than 256 + the special tokens)")
        return BPETokenizer.train(text, vocab_size, special_tokens)
    raise ConfigError(f"Unknown tokenizer kind {kind!r}; choose one of {sorted(TOKENIZER_KINDS)}")


def save_files(directory: Path, files: dict[str, str]) -> None:
    """Each text of `files` (by name) in `directory`, created if needed: a tokenizer saved outside a run (a run's
    are written by its own writer, `kqv.train.files`)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Restore the tokenizer that ``save`` wrote into ``directory``, whichever kind it is."""
    directory = Path(directory)
    metadata_path = directory / METADATA_FILE
    if not metadata_path.is_file():
        raise FileNotFoundError(f"No saved kqv tokenizer in {directory}: {METADATA_FILE} is missing")
    try:
        metadata = json.loads(metadata_path.read_text(encoding="utf-8"))
        kind = metadata.get("kind")
    except (ValueError, AttributeError) as error:  # not JSON, not UTF-8, not an object
        raise RunError(f"{metadata_path} is corrupt ({error}); {_remedy(directory)}") from None
    if kind not in TOKENIZER_KINDS:
        raise RunError(f"{metadata_path} names unknown tokenizer kind {kind!r}; known: {sorted(TOKENIZER_KINDS)}")
    try:
        return TOKENIZER_KINDS[kind]._load(directory, metadata)
    except (OSError, KqvError):
        raise
    except Exception as error:  # the Hugging Face tokenizers library raises plain Exceptions for a damaged file
        raise RunError(f"the tokenizer in {directory} is damaged ({error}); {_remedy(directory)}") from None


def _remedy(directory: Path) -> str:
    """What to do about a damaged saved tokenizer: it belongs to a run (kqv's) or was saved by hand."""
    return f"restore {directory} from a backup, or train the run again (its tokenizer is made from the data)"


def encode_text(tokenizer: Tokenizer, text: str, chunk: int = 1 << 20) -> torch.Tensor:
    """Encode a long text in chunks of lines (bounded memory), as int32 ids."""
    ids: list[int] = []
    start = 0
    while start < len(text):
        end = text.find("\n", start + chunk)
        end = len(text) if end < 0 else end + 1
        ids.extend(tokenizer.encode(text[start:end]))
        start = end
    return torch.tensor(ids, dtype=torch.int32)


def encode_texts(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of many texts; in one batched call when the tokenizer is Hugging Face's (much faster)."""
    backend = getattr(tokenizer, "tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        try:
            return [encoding.ids for encoding in backend.encode_batch(texts)]
        except Exception:  # noqa: BLE001 -- the library's bare Exception ("Missing [UNK] token"): one at a time,
            pass  # where `encode` names what it cannot encode
    return [tokenizer.encode(text) for text in texts]
