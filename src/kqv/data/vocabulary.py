"""The encoder's vocabulary: a kqv tokenizer plus BERT's special tokens [PAD], [CLS], [SEP], [MASK]."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .tokenizers import Tokenizer, load_tokenizer, make_tokenizer, save_files

SPECIALS_FILE = "specials.json"
SPECIAL_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")


class Vocabulary:
    """A kqv tokenizer and the ids of [PAD], [CLS], [SEP], [MASK].

    The BPE tokenizer learns them as special tokens (ids 0-3); the character tokenizer has none, so they take the
    ids after its characters. `regular_ids` are all the others: what a random replacement is drawn from.
    """

    def __init__(self, tokenizer: Tokenizer, specials: dict[str, int]):
        self.tokenizer, self.specials = tokenizer, dict(specials)
        self.size = max(tokenizer.vocab_size, max(specials.values()) + 1)
        self.pad_id, self.cls_id, self.mask_id = specials["[PAD]"], specials["[CLS]"], specials["[MASK]"]
        self.special_ids = torch.tensor(sorted(specials.values()))
        self.regular_ids = torch.tensor([i for i in range(self.size) if i not in set(specials.values())])

    @property
    def kind(self) -> str:
        """Its tokenizer's kind ("char", "bpe")."""
        return self.tokenizer.kind

    @classmethod
    def train(cls, kind: str, text: str, vocab_size: int) -> Vocabulary:
        if kind == "char":
            tokenizer = make_tokenizer("char", text)
            return cls(tokenizer, {t: tokenizer.vocab_size + i for i, t in enumerate(SPECIAL_TOKENS)})
        tokenizer = make_tokenizer("bpe", text, vocab_size, SPECIAL_TOKENS)
        return cls(tokenizer, {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS})

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def files(self) -> dict[str, str]:
        """The files that save it, by name, as text: its tokenizer's and the special tokens' ids."""
        return {**self.tokenizer.files(), SPECIALS_FILE: json.dumps(self.specials, indent=1) + "\n"}

    def save(self, directory: Path) -> None:
        save_files(directory, self.files())

    @classmethod
    def load(cls, directory: Path) -> Vocabulary:
        return cls(load_tokenizer(directory), json.loads((directory / SPECIALS_FILE).read_text()))
