"""A Hugging Face model directory in the explorer: a GPT-2 shown like an LM run, a BERT like an encoder run.

`PretrainedSubject.load(path, limit)` opens the directory with `kqv.jobs.pretrained.PretrainedRun` (the model
converted offline by `kqv.interop.from_hf`, the tokenizer read from its tokenizer.json) and returns the subject of
the kind of model it holds: `PretrainedLMSubject` (a `DecoderLM`: attention views, next-token probabilities and
continuing the text, sampled with kqv's default [sample] settings) or `PretrainedEncoderSubject` (a BERT encoder:
bidirectional self-attention, plus the guesses at each [MASK] when the directory holds a masked-LM head and its
tokenizer has a [MASK] token). A directory kqv cannot convert is a `ConversionError` that says why.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from torch import Tensor

from ..errors import ConversionError
from .analysis import readable_piece, top_tokens
from .subjects import MASK, EncoderSubject, LMSubject, Subject

# the files that make a directory a sentence-transformers model (shown as MiniLM is) rather than a plain one
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


def is_sentence_transformers(path: Path) -> bool:
    """Whether the Hugging Face directory `path` was saved by sentence-transformers (an embedding model)."""
    return any((path / name).is_file() for name in SENTENCE_TRANSFORMERS_FILES)


class PretrainedSubject(Subject):
    """The explorer's entry for Hugging Face directories: `load` picks the subject of the model inside."""

    task = "hf"

    @classmethod
    def load(cls, path: Path, limit: int, device: str = "cpu") -> Subject:
        from ..jobs.pretrained import PretrainedRun
        from ..nn.heads import MaskedLM
        from ..nn.models import DecoderLM, Encoder

        run = PretrainedRun.load(path, device)
        if isinstance(run.model, DecoderLM):
            return PretrainedLMSubject(run, limit)
        if isinstance(run.model, (MaskedLM, Encoder)):
            return PretrainedEncoderSubject(run, limit)
        raise ConversionError(
            f"{path} holds a {run.hf_class} ({type(run.model).__name__} in kqv); the explorer shows GPT-2 "
            f"(decoder) and BERT (encoder) directories"
        )


class PretrainedLMSubject(LMSubject):
    """A GPT-2 directory, shown as an LM run is (its learned positions cap the input at n_positions)."""

    def __init__(self, run: Any, limit: int):
        from ..jobs.lm import SampleConfig

        described = SimpleNamespace(model=run.model, tokenizer=run.tokenizer, config=SimpleNamespace())
        described.config.sample = SampleConfig()  # kqv's defaults: a directory has no [sample] section
        super().__init__(str(run.path), described, limit)
        self.hf_class = run.hf_class

    def info(self) -> dict[str, Any]:
        return {**super().info(), "hf_class": self.hf_class}


class PretrainedEncoderSubject(EncoderSubject):
    """A BERT directory: its tokenizer's tokens (no [CLS]/[SEP] added beyond what tokenizer.json adds) and
    bidirectional self-attention; with a masked-LM head, the top guesses at each [MASK]."""

    task = "encoder"

    def __init__(self, run: Any, limit: int):
        from ..nn.heads import MaskedLM

        head = run.model if isinstance(run.model, MaskedLM) else None
        encoder = run.model.encoder if head is not None else run.model
        super().__init__(str(run.path), run.model, encoder, limit)
        self.tokenizer, self.hf_class, self.head = run.tokenizer, run.hf_class, head
        self.mask_id = run.tokenizer.tokenizer.token_to_id(MASK) if head is not None else None  # None: no [MASK]

    def info(self) -> dict[str, Any]:
        extra = {"mask_token": MASK} if self.mask_id is not None else {}
        return {**super().info(), "hf_class": self.hf_class, **extra}

    def views(self) -> list[str]:
        return [*super().views(), *(["masked"] if self.mask_id is not None else [])]

    def tokenize(self, text: str) -> tuple[list[int], list[str]]:
        ids = self.tokenizer.encode(text)
        piece = self.tokenizer.tokenizer.id_to_token
        return ids, [MASK if i == self.mask_id else readable_piece(self.tokenizer.decode, piece, i) for i in ids]

    def predictions(self, batch: Tensor, ids: list[int]) -> dict[str, Any]:
        if self.mask_id is None:
            return {}
        masked = [i for i, token in enumerate(ids) if token == self.mask_id]
        if not masked:
            return {"masked": [], "notes": [f"write {MASK} where a token should be predicted"]}
        logits = self.head(batch)[0, masked]  # (masks, vocab)
        rows = top_tokens(logits, lambda i: self.tokenizer.decode([i]), 5)
        return {"masked": [{"position": p, "top": row} for p, row in zip(masked, rows)]}
