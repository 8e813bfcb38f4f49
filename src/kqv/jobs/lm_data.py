"""What a language-modelling run reads (`DataConfig`, the `[data]` section of run.toml): a text made into blocks, a
file of prompt -> completion pairs, documents made into examples by a pretraining objective or a mixture of sources,
or a token corpus on disk (`kqv prepare`).

`DataConfig` holds the settings and checks each on its own; which kind of corpus they make is decided once, by
`kqv.jobs.lm_kinds.corpus_of`, and that corpus checks the settings that only it takes (`kqv.jobs.lm_corpus`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..data.completions import END_OF_TEXT_TOKENS
from ..data.document_batches import PREFIX_MIN, prefix_max
from ..data.documents import check_template, refuse_end_of_text_mask
from ..data.tokenizers import check_vocab_size
from ..errors import ConfigError
from ..validation import Config


@dataclass
class DataSource(Config):
    """One source of a mixture (`[[data.sources]]`): a text or a file of pairs, and its share of the batches."""

    section: ClassVar[str] = "data.sources"
    path: str
    weight: float = 1.0

    def check(self) -> None:
        if not self.weight > 0:
            raise ConfigError(
                f"data.sources: the weight of {self.path} must be positive (its share of the batches), got "
                f"{self.weight}; drop the source instead"
            )


@dataclass
class DataConfig(Config):
    """Where the text comes from and how it becomes training blocks; or, when `path` is a .tsv or .jsonl file of
    prompt -> completion pairs, how its examples are batched and weighted (`kqv.jobs.lm_completions`)."""

    section: ClassVar[str] = "data"
    path: str | None = None  # None: Shakespeare's complete works, the embedded default corpus
    tokenizer: Literal["char", "bpe"] = "char"
    vocab_size: int = 4096  # bpe only
    context: int = 256
    val_fraction: float = 0.1
    init: str | None = None  # a kqv LM run or Hugging Face GPT-2 directory to start from (kqv.jobs.init)
    prompt_loss_weight: float = 0.0  # pairs only: the weight of the prompt's tokens in the loss (completion: 1)
    # examples (pairs, documents): several per row (block-diagonal attention) instead of padding; "auto": packed
    # where padding would leave rows mostly empty; decided for the model once (`kqv.jobs.lm_completions.decide_packing`)
    packing: bool | Literal["auto"] = "auto"
    # pretraining objectives and mixtures (kqv.jobs.lm_documents): a text's documents made into examples
    objective: Literal["next_token", "span_corruption"] = "next_token"
    sources: tuple[DataSource, ...] = ()  # several files with weights (data.path unset), each batch's drawn by weight
    delimiter: str | None = None  # documents: the text's lines, or its parts between this string
    mask: str | None = None  # the mask symbol; None: the tokenizer's own (char: U+2047, bpe: <mask>)
    span_rate: float = 0.15  # span corruption: a span's mean share of its document
    span_max: int = 64  # span corruption: a span's most tokens
    random_prefix: bool = False  # span corruption: each draw first cuts its document to a random prefix (CS224N's)
    span_loss: Literal["span", "all"] = "span"  # span corruption: the loss on the span, or on every token (FIM's)
    # a document longer than the context: cut into windows, or read from its opening only (CS224N's cut); "auto":
    # the opening with data.random_prefix (which cuts a document, not a window), else windows
    long_documents: Literal["auto", "windows", "opening"] = "auto"
    shuffle_sentences: bool = False  # a document's sentences in a new order at every draw
    template: str | None = None  # pairs: every prompt written into it, e.g. "{prompt}{mask}"
    # a prepared corpus (kqv prepare): the SHA-256 of its tokens, which a run records and then trains and scores on
    # that corpus alone, wherever it moves (data.path, absolute in run.toml); set by the run, not by hand
    tokens_sha256: str | None = None

    def check(self) -> None:
        if self.context < 2:
            raise ConfigError(f"data.context must be at least 2, got {self.context}")
        check_vocab_size(self.vocab_size, "data.vocab_size")
        if not 0 < self.val_fraction <= 0.5:
            raise ConfigError(f"data.val_fraction must be in (0, 0.5], got {self.val_fraction}")
        if not 0 <= self.prompt_loss_weight <= 1:
            raise ConfigError(
                f"data.prompt_loss_weight must be in [0, 1] (the prompt tokens' weight in the loss, the "
                f"completion's being 1; 0 = completion only), got {self.prompt_loss_weight}"
            )
        if self.sources and self.path is not None:
            raise ConfigError(f"give data.path ({self.path}) or data.sources, not both; put the path among the sources")
        if self.template is not None:
            check_template(self.template)
        self.check_mask()
        self.check_spans()
        if self.delimiter == "":
            raise ConfigError("data.delimiter is empty; give the string between documents, or drop it for lines")

    def check_mask(self) -> None:
        """The mask symbol: one character for a character tokenizer, and never an end of text."""
        if self.mask is not None and (not self.mask or (self.tokenizer == "char" and len(self.mask) != 1)):
            raise ConfigError(f"data.mask must be one character for a character tokenizer, got {self.mask!r}")
        if self.mask in END_OF_TEXT_TOKENS:
            refuse_end_of_text_mask(self.mask, "a BPE tokenizer", self.tokenizer)

    @property
    def openings_only(self) -> bool:
        """Whether a document longer than the context is read from its opening alone (`long_documents`)."""
        return self.long_documents == "opening" or (self.long_documents == "auto" and self.random_prefix)

    def check_spans(self) -> None:
        """A span's share and length, and a random prefix that the context can hold."""
        if not 0 < self.span_rate <= 1:
            raise ConfigError(
                f"data.span_rate (a span's mean share of its document) must be in (0, 1], got {self.span_rate}"
            )
        if self.span_max < 1:
            raise ConfigError(f"data.span_max must be at least 1 token, got {self.span_max}")
        if self.random_prefix and prefix_max(self.context) < PREFIX_MIN:
            raise ConfigError(
                f"data.random_prefix cuts each document to {PREFIX_MIN} to 7/8 of data.context tokens, and "
                f"data.context={self.context} leaves fewer than {PREFIX_MIN}; raise data.context or drop "
                f"data.random_prefix"
            )
