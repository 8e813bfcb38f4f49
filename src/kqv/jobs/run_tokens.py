"""A text corpus of the LM and MLM jobs as their run directory holds it: the tokenizer and the encoded splits
(tokens.safetensors), made once and read back on a resume, so a resumed run needs neither the text nor a new
tokenizer. One codec writes and reads the splits: a loaded corpus's `tensors()` and its class's `from_tensors` (a
text's: `TextSplits`; the LM job's corpus kinds, `kqv.jobs.lm_corpus`, store theirs through `prepare_corpus` too,
each with its own)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from ..data.shakespeare import load_text, split_text
from ..data.tokenizers import Tokenizer, encode_text
from ..data.vocabulary import Vocabulary
from ..errors import IF_EXISTS_OVERWRITE, RunError, option
from ..nn.models import count_parameters
from ..train.layout import RunFiles
from ..train.rundir import RunDirectory
from .base import Training

Tensors = dict[str, torch.Tensor]  # tokens.safetensors as `safetensors.torch.load` reads it
TextTokenizer = Tokenizer | Vocabulary  # an LM run's BPE or characters, an MLM run's vocabulary over one


class TokenizerSource(Protocol):
    """Where a corpus's tokenizer comes from: a new one learned from its `text` (`make_tokenizer`), or the one a
    resumed run saved (`load_tokenizer`). A corpus kind of the LM job learns its own; a fine-tune keeps its
    source's (`kqv.jobs.init.SourceTokenizer`); the MLM job learns a vocabulary."""

    def make_tokenizer(self, text: str) -> TextTokenizer: ...

    def load_tokenizer(self, run_dir: Path) -> TextTokenizer: ...


class Stored(Protocol):
    """A loaded corpus that a run stores: its tokenizer, and its splits as the tensors of tokens.safetensors."""

    tokenizer: TextTokenizer

    def tensors(self) -> Tensors: ...


StoredT = TypeVar("StoredT", bound=Stored)


def prepare_corpus(
    tokenizers: TokenizerSource,
    run: RunDirectory,
    build: Callable[[TokenizerSource], StoredT],
    read: Callable[[TextTokenizer, Tensors], StoredT],
    check: Callable[[StoredT], None] | None = None,
) -> StoredT:
    """A run's corpus: read back (`read(tokenizer, tensors)`, the codec's other half) when it resumes a checkpoint
    (they were written before it), else `build(tokenizers)` and saved: the tokenizer, and its `tensors()` in
    tokens.safetensors (by rank 0 alone under torchrun). `check(corpus)` is called before anything is saved: a
    run it refuses leaves no file behind. The LM and MLM jobs share it."""
    if run.resuming:
        run.verify(run.tokenizer_dir, run.tokens_file)  # a recorded file that is missing is an error, not a rebuild
    resumed = run.resuming and run.tokens_file.exists()
    corpus = read(tokenizers.load_tokenizer(run.path), load_tokens(run.path)) if resumed else build(tokenizers)
    if check is not None:
        check(corpus)
    if run.writes and not resumed:
        run.path.mkdir(parents=True, exist_ok=True)
        run.write_tokenizer(corpus.tokenizer.files())
        run.write_tokens(save(corpus.tensors()))  # present means complete, tokenizer too
    return corpus


@dataclass(frozen=True, eq=False)  # one is itself alone: tensors have no one truth value
class TextSplits:
    """A text's tokenizer and its encoded train and validation splits, with their lengths in characters (`chars`,
    what bits per character divide by; None where they are not known). tokens.safetensors holds them as `train`,
    `val` and `chars`."""

    tokenizer: TextTokenizer
    train: torch.Tensor
    val: torch.Tensor
    chars: tuple[int, int] | None

    def tensors(self) -> Tensors:
        chars = {} if self.chars is None else {"chars": torch.tensor(self.chars)}
        return {"train": self.train, "val": self.val, **chars}

    @classmethod
    def from_tensors(cls, tokenizer: TextTokenizer, tensors: Tensors, **fields: Any) -> Self:
        """The splits `tensors()` stored (`fields`: a subclass's own; an MLM run of kqv 0.1 stored no `chars`)."""
        chars = tensors.get("chars")
        return cls(
            tokenizer, tensors["train"], tensors["val"], None if chars is None else tuple(chars.tolist()), **fields
        )


TextT = TypeVar("TextT")


def build_text(
    tokenizers: TokenizerSource,
    path: str | Path | None,
    val_fraction: float,
    whole: bool,
    make: Callable[[TextTokenizer, torch.Tensor, torch.Tensor, tuple[int, int]], TextT] = TextSplits,  # type: ignore[assignment]
) -> TextT:
    """The splits of the text at `path` (`make(tokenizer, train, val, chars)`, default `TextSplits`): a new
    tokenizer (`tokenizers.make_tokenizer`, learned from the whole text if `whole`, else from its training split),
    and the splits it encodes."""
    text = load_text(path)
    train_text, val_text = split_text(text, val_fraction)
    tokenizer = tokenizers.make_tokenizer(text if whole else train_text)
    train, val = encode_text(tokenizer, train_text), encode_text(tokenizer, val_text)
    return make(tokenizer, train, val, (len(train_text), len(val_text)))


def load_tokens(run_dir: Path) -> dict[str, torch.Tensor]:
    """The encoded splits of a run (tokens.safetensors), verified against its SHA256SUMS."""
    run = RunFiles(run_dir)
    path = run.tokens_file
    overwrite = option(IF_EXISTS_OVERWRITE)
    try:
        tokens = load(run.read_verified(path))
    except SafetensorError as error:
        raise RunError(
            f"{path} is corrupt ({error}); restore it from a backup, or train the run again with {overwrite}"
        ) from None
    if not {"train", "val"} <= set(tokens):
        raise RunError(
            f"{path} holds {sorted(tokens)}, not the train and val splits; train the run again with {overwrite}"
        )
    return tokens


def describe_corpus(training: Training, tokenizer: TextTokenizer, vocabulary: int, tokens: int) -> str:
    """The line before training a model on a text corpus (LM and MLM jobs): its `tokenizer`'s kind, `vocabulary`
    size, and the training `tokens`."""
    return (
        f"{count_parameters(training.model):,} parameters, {tokens:,} training tokens "
        f"({tokenizer.kind} tokenizer, vocabulary {vocabulary}), run directory {training.run.destination}"
    )
