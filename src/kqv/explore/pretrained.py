"""A Hugging Face model directory in the explorer: a GPT-2 shown like an LM run, a BERT like an encoder run, a
Marian or BART translation model like an MT run.

`PretrainedSubject.load(path, limit)` opens the directory with `kqv.jobs.pretrained.PretrainedRun` (the model
converted offline by `kqv.interop.from_hf`, the tokenizer read from its tokenizer.json) and returns the subject of
the kind of model it holds: `PretrainedLMSubject` (a `DecoderLM`: attention views, next-token probabilities and
continuing the text, sampled with kqv's default [sample] settings) or `PretrainedEncoderSubject` (a BERT encoder:
bidirectional self-attention, plus the guesses at each [MASK] when the directory holds a masked-LM head and its
tokenizer has a [MASK] token) or `PretrainedMTSubject` (an `EncoderDecoder` from Marian or BART: its translation
by kqv's own beam search, with the directory's decoder start and end-of-sentence ids, and the cross-, encoder and
decoder attention). A directory kqv cannot convert is a `ConversionError` that says why.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from torch import Tensor

from ..errors import ConversionError
from ..jobs.pretrained import special_ids
from .analysis import readable_piece, top_tokens
from .subjects import MASK, EncoderSubject, LMSubject, MTSubject, Subject

# the files that make a directory a sentence-transformers model (shown as MiniLM is) rather than a plain one
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


def is_sentence_transformers(path: Path) -> bool:
    """Whether the Hugging Face directory `path` was saved by sentence-transformers (an embedding model)."""
    return any((path / name).is_file() for name in SENTENCE_TRANSFORMERS_FILES)


class PretrainedSubject(Subject):
    """The explorer's entry for Hugging Face directories: `load` picks the subject of the model inside."""

    task = "hf"

    @classmethod
    def load(cls, path: Path, limit: int | None, device: str = "cpu") -> Subject:
        from ..jobs.pretrained import PretrainedRun

        return cls.from_run(PretrainedRun.load(path, device), limit)

    @classmethod
    def from_run(cls, run: Any, limit: int | None) -> Subject:
        """The subject of a loaded `kqv.jobs.pretrained.PretrainedRun`, by the kind of model it holds."""
        from ..nn.heads import MaskedLM
        from ..nn.models import DecoderLM, Encoder, EncoderDecoder

        if isinstance(run.model, DecoderLM):
            return PretrainedLMSubject(run, limit)
        if isinstance(run.model, (MaskedLM, Encoder)):
            return PretrainedEncoderSubject(run, limit)
        if isinstance(run.model, EncoderDecoder):
            return PretrainedMTSubject(run, limit)
        raise ConversionError(
            f"{run.path} holds a {run.hf_class} ({type(run.model).__name__} in kqv); the explorer shows GPT-2 "
            f"(decoder), BERT (encoder), Marian and BART (encoder-decoder) directories"
        )


class PretrainedLMSubject(LMSubject):
    """A GPT-2 directory, shown as an LM run is (its learned positions cap the input at n_positions)."""

    def __init__(self, run: Any, limit: int):
        from ..jobs.sampling import SampleConfig

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


# ---------------------------------------------------------------------------------------------------------------
# Marian and BART


class Seq2SeqTokenizer:
    """A Marian or BART directory's tokenizer.json as MTSubject reads a tokenizer: `encode` gives a text's ids as
    the tokenizer's post-processor makes them (BART's leading <s>) but without the end of sentence, which the
    subject adds to the source; `decode` drops the special tokens."""

    def __init__(self, tokenizer: Any, eos_id: int):
        self.tokenizer, self.eos_id = tokenizer, eos_id
        # the model's last translations, text -> its ids: decoding byte-level pieces and encoding the text again is
        # not always the identity (a lone byte decodes to U+FFFD), so a translation is aligned by its own ids
        self.produced: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        if text in self.produced:
            return self.produced[text]
        ids = self.tokenizer.encode(text).ids
        return ids[:-1] if ids and ids[-1] == self.eos_id else ids

    def decode(self, ids: list[int]) -> str:
        """The text of `ids` without special tokens; one id alone (a token's label) as itself, <s> included."""
        ids = list(ids)
        if len(ids) == 1:
            whole = lambda i: self.tokenizer.decode(i, skip_special_tokens=False)  # noqa: E731
            return readable_piece(whole, self.tokenizer.id_to_token, ids[0])
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_to_id(self, token: str) -> int:
        return self.tokenizer.token_to_id(token)


class Seq2SeqRun:
    """A converted Marian or BART model as an MT run for MTSubject: `translate` is the directory's own
    (`kqv.jobs.pretrained.PretrainedTranslator.translate_ids`: kqv's beam search from its decoder_start_token_id to its
    eos_token_id, at most max_len_a * source length + max_len_b new tokens, [decode] defaults of the MT job)."""

    def __init__(self, run: Any, ids: dict[str, int]):
        from ..jobs.mt import DecodeConfig

        self.run, self.model, self.path = run, run.model, run.path
        self.start_id, self.eos_id = ids["decoder_start_token_id"], ids["eos_token_id"]
        self.tokenizer = Seq2SeqTokenizer(run.tokenizer.tokenizer, self.eos_id)
        self.config = SimpleNamespace(kind="transformer", decode=DecodeConfig())

    def translate(self, sentences: list[str], beam_size: int = 1) -> list[str]:
        """`PretrainedTranslator.translate`'s ids, decoded by this tokenizer, which aligns the last one by its ids."""
        translations = []
        for out in self.run.translate_ids([" ".join(sentence.split()) for sentence in sentences], beam_size):
            translations.append(self.tokenizer.decode(out))
            self.tokenizer.produced = {" ".join(translations[-1].split()): out}  # MTSubject aligns this text next
        return translations


class PretrainedMTSubject(MTSubject):
    """A Marian or BART directory, shown as an MT run is: the translation (kqv's beam search over the converted
    model), the cross-attention alignment and the encoder's and decoder's self-attention."""

    def __init__(self, run: Any, limit: int):
        ids = special_ids(run.path)
        hf = run.tokenizer.tokenizer
        names = tuple(hf.id_to_token(ids[name]) for name in ("pad_token_id", "decoder_start_token_id", "eos_token_id"))
        if None in names:
            raise ConversionError(
                f"{run.path}/tokenizer.json has no token for the pad, decoder start or end ids of its config.json "
                f"({ids}); save the tokenizer that was trained with the model"
            )
        super().__init__(str(run.path), Seq2SeqRun(run, ids), limit, names)
        self.hf_class = run.hf_class

    def info(self) -> dict[str, Any]:
        return {**super().info(), "hf_class": self.hf_class}
