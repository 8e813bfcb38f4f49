"""What a language-modelling run trains on, as two objects: a `Corpus`, the kind of data the run's `DataConfig` makes
(made once by `kqv.jobs.lm_kinds.corpus_of`), and the `LoadedCorpus` it loads, one frozen type per kind.

The `Corpus` owns what the LM job would otherwise ask the settings again at every use:

- `takes`: the `Settings` (groups of [data] options that only some kinds read) this kind reads; every kind's
  groups are refused by the kinds that do not take them, by `corpus_of`, so a new kind's options live with it;
- `check`: what else this kind refuses of its settings; `check_as_source`: what it refuses as a mixture's source;
- `load`: how the data is read, encoded and stored in the run (or read back on a resume), with a tokenizer made
  for it (`make_tokenizer`, with the `mask` symbol it needs, if any), and `trained`: a trained run's, read back.

The `LoadedCorpus` holds the tokenizer and the splits, and does what the job needs of them: `check` (what must
hold before anything is written), `trainer_options` (the Trainer's batches and loss), `describe`, `score` and
`samples` (the run's score after training, and what it shows), `held_out` (`kqv eval`'s score) and `conclusion`; a
corpus of examples, its `answers` too (the baselines' reference answers of `evaluate(pairs=...)`). What differs
between kinds is a method of its type: no code learns a corpus's kind from which fields, keys or settings it has.

`TextBlocks` (a text, cut into blocks of data.context + 1 tokens; loaded: `LoadedText`) is the default kind; the
others are `kqv.jobs.lm_completions.Pairs`, `kqv.jobs.lm_documents.Documents` and `kqv.jobs.lm_prepared.PreparedCorpus`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Protocol

from torch import Tensor, nn

from ..data.batches import batch_generator, sample_batch
from ..data.tokenizers import Tokenizer, load_tokenizer, make_tokenizer
from ..errors import EVAL_CORPUS, ConfigError, DataError, option
from ..nn.config import ModelConfig
from ..train.config import TrainConfig
from ..train.layout import RunFiles
from ..train.options import TrainerOptions
from ..train.perplexity import perplexity
from ..train.preflight import check_prompt, check_splits
from ..train.rundir import RunDirectory
from ..train.topology import Topology
from .lm_data import DataConfig
from .run_tokens import Tensors, TextSplits, TokenizerSource, build_text, load_tokens, prepare_corpus
from .sampling import SampleConfig, default_prompt, sample_texts

SCORED_TOKENS = 200_000  # the validation tokens the job's final perplexity scores


class LMTokenizerSource(TokenizerSource, Protocol):
    """Where an LM corpus's tokenizer comes from (`TokenizerSource`: the corpus kind itself, or a fine-tune's
    source), and whether it takes a prepared corpus's, which comes with the corpus (`check_prepared`)."""

    def check_prepared(self, tokenizer: Tokenizer, path: str | Path) -> None: ...


class LoadedCorpus(ABC):
    """What an LM run trains on, loaded (`Corpus.load`, the module docstring): its `tokenizer` and splits, with
    the run's [data] settings `data`. Each kind's type is a frozen dataclass."""

    tokenizer: Tokenizer
    data: DataConfig

    @property
    @abstractmethod
    def train_tokens(self) -> int:
        """The tokens of the training split (the line before training counts them)."""

    @property
    @abstractmethod
    def val_tokens(self) -> int:
        """The tokens of the validation split (a budget's plan counts the work of scoring them)."""

    def sample_prompt(self) -> str | None:
        """The prompt samples start from when [sample] gives none (None: the corpus samples its own prompts)."""
        return None

    @abstractmethod
    def check(self, model: ModelConfig, prompt: str) -> None:
        """What must hold before anything is written, for `model` and the sample `prompt` (empty: the corpus's)."""

    @abstractmethod
    def trainer_options(self, train: TrainConfig, topology: Topology, model: ModelConfig) -> TrainerOptions:
        """The Trainer's batches and loss, for the process of `topology` (a kind that reads only this process's
        rows takes them from it; the others draw the whole batch and the Trainer keeps its rows) and the `model`
        it trains (examples are packed only for a model that takes packed rows)."""

    def describe(self) -> str:
        """What the line before training adds about this corpus (empty: nothing)."""
        return ""

    @abstractmethod
    def score(self, model: nn.Module, train: TrainConfig) -> dict[str, float]:
        """The run's score of its validation split after training (summary.json's `val`)."""

    @abstractmethod
    def samples(self, model: nn.Module, sample: SampleConfig) -> list[str]:
        """The samples the run shows after training, as [sample] says (the LM job writes them to samples.txt)."""

    @abstractmethod
    def held_out(self, model: nn.Module, max_tokens: int | None) -> dict[str, Any]:
        """The fields of `LMRun.evaluate()`'s `LMEvaluation`: the score of what the run held out (up to
        `max_tokens`, where the kind scores a prefix)."""

    @abstractmethod
    def conclusion(self, val: dict[str, float], after: str) -> str:
        """The line after training that reads out `val`, the figures `score` gave, and `after` (steps, time)."""


Check = Callable[[LoadedCorpus], None]


@dataclass(frozen=True, eq=False)
class LoadedText(TextSplits, LoadedCorpus):
    """A text's tokenizer and splits (`TextSplits`), trained on in random blocks of data.context + 1 tokens."""

    data: DataConfig

    @property
    def train_tokens(self) -> int:
        return len(self.train)

    @property
    def val_tokens(self) -> int:
        return len(self.val)

    def sample_prompt(self) -> str | None:
        return default_prompt(self.data.path, self.tokenizer, self.train)

    def check(self, model: ModelConfig, prompt: str) -> None:
        """A block of context + 1 tokens in each split, ids the model has (`vocab`), and a sample `prompt` (or the
        corpus's own, when it is empty) the tokenizer encodes."""
        check_splits({"train": self.train, "val": self.val}, self.data.context, self.vocab())
        check_prompt(self.tokenizer.encode, prompt or self.sample_prompt())

    def vocab(self) -> int | None:
        """The vocabulary `check` checks the ids against (None: not checked)."""
        return self.tokenizer.vocab_size

    def trainer_options(self, train: TrainConfig, topology: Topology, model: ModelConfig) -> TrainerOptions:
        """Random blocks of the train split for update i, and of the validation split for evaluation batch i,
        drawn from generators seeded by (seed, i) so a resume draws the same ones. Every process of `topology`
        draws the whole batch (the Trainer keeps its rows)."""
        train_ids, val_ids = self.train, self.val
        batch, context, seed = train.batch_size, self.data.context, train.seed

        def train_batches(i: int) -> tuple[Tensor, Tensor]:
            return sample_batch(train_ids, batch, context, batch_generator(seed, i))

        def val_batches(i: int) -> tuple[Tensor, Tensor]:
            return sample_batch(val_ids, batch, context, batch_generator(seed, -i - 1))

        return block_options(train_batches, val_batches, batch * context)

    def perplexity(self, model: nn.Module, max_tokens: int | None, precision: str = "fp32") -> dict[str, float]:
        """`kqv.train.perplexity.perplexity` of (up to `max_tokens` of) the validation split, per character too
        where the characters are known."""
        n_chars = None if self.chars is None else self.chars[1]
        return perplexity(
            model, self.val, context=self.data.context, n_chars=n_chars, precision=precision, max_tokens=max_tokens
        )

    def score(self, model: nn.Module, train: TrainConfig) -> dict[str, float]:
        """The perplexity of (up to `SCORED_TOKENS` of) the validation split."""
        return self.perplexity(model, SCORED_TOKENS, train.precision)

    def samples(self, model: nn.Module, sample: SampleConfig) -> list[str]:
        """Continuations of the sample prompt."""
        return sample_texts(model, self.tokenizer, sample)

    def held_out(self, model: nn.Module, max_tokens: int | None) -> dict[str, Any]:
        return {"source": "the held-out validation split", **self.perplexity(model, max_tokens)}

    def conclusion(self, val: dict[str, float], after: str) -> str:
        bits = "" if self.chars is None else f" ({val['bits_per_char']:.3f} bits/char)"
        return f"validation loss {val['loss']:.3f} nats/token{bits} {after}"


def block_options(
    train_batches: Callable[[int], Any], val_batches: Callable[[int], Any], tokens: int
) -> TrainerOptions:
    """The Trainer's options for batches of blocks (inputs, targets): the model's own next-token loss."""
    return TrainerOptions(
        train_batches=train_batches,
        loss_fn=lambda model, batch: model(*batch),
        val_batches=val_batches,
        tokens_per_batch=tokens,
    )


DEFAULTS = DataConfig()


def differs(data: DataConfig, name: str) -> bool:
    """Whether `data` sets `name` to other than its default."""
    return getattr(data, name) != getattr(DEFAULTS, name)


@dataclass(frozen=True)
class Settings:
    """A group of [data] settings that only some kinds of corpus read (`Corpus.takes`): the kinds that do not take
    it refuse those set (`given`: by default, to other than their default) with `advice`, instead of ignoring them."""

    names: tuple[str, ...]
    advice: Callable[[DataConfig, list[str]], str]  # the one-line error, given the data and the settings set
    given: Callable[[DataConfig, str], bool] = differs

    def refuse(self, data: DataConfig) -> None:
        """A ConfigError for the settings of this group that `data` sets, if any."""
        if given := [name for name in self.names if self.given(data, name)]:
            raise ConfigError(self.advice(data, given))


class Corpus:
    """The kind of data an LM run trains on (the module docstring): the run's [data] settings `data`, checked for
    this kind. A subclass says which settings it reads (`reads`) and overrides what it does differently from a
    text. It is the `TokenizerSource` of a run that learns its own tokenizer."""

    own_tokenizer: ClassVar[bool] = False  # a corpus encoded once with its own tokenizer (data.tokenizer: not read)
    settings: ClassVar[tuple[Settings, ...]] = ()  # the groups of settings only some kinds read, this kind's (`takes`)

    def __init__(self, data: DataConfig) -> None:
        self.data = data
        self.check()

    @staticmethod
    def reads(data: DataConfig) -> bool:
        """Whether `data` makes a corpus of this kind (`kqv.jobs.lm_kinds.CORPORA` asks each kind in turn)."""
        return True

    @classmethod
    def takes(cls, data: DataConfig) -> tuple[Settings, ...]:
        """The groups of settings only some kinds read that this kind reads for `data`; `corpus_of` refuses the
        others' (set, this kind would silently ignore them). A new group is a `settings` entry of its kind."""
        return cls.settings

    @staticmethod
    def sources(data: DataConfig) -> list[str | None]:
        """The paths this corpus reads as documents of a mixture (each checked by its own kind's
        `check_as_source`); none for a corpus read as one whole."""
        return []

    @staticmethod
    def moves(saved: dict[str, Any]) -> bool:
        """Whether a resume of a run of this kind, whose run.toml holds `saved`, may find its data at a new
        data.path (which the kind then checks is the same data)."""
        return False

    @classmethod
    def check_as_source(cls, path: str | None, data: DataConfig) -> None:
        """Refuse `path`, data of this kind, as a source of documents under `data` (a kind that cannot be mixed)."""

    def check(self) -> None:
        """Refuse what this kind cannot do with its settings, beyond the groups it does not take (`takes`)."""

    def mask(self) -> str | None:
        """The mask symbol a new tokenizer must reserve for this corpus, or None (a text needs none)."""
        return None

    def settled_data(self, run: RunDirectory) -> DataConfig:
        """The [data] settings run.toml records once the corpus is read (`run` opened): as given, by default."""
        return self.data

    def make_tokenizer(self, text: str) -> Tokenizer:
        """A new tokenizer learned from `text`."""
        return make_tokenizer(self.data.tokenizer, text, self.data.vocab_size)

    def load_tokenizer(self, run_dir: Path) -> Tokenizer:
        """The tokenizer a run saved (a resume's)."""
        return load_tokenizer(RunFiles(run_dir).tokenizer_dir)

    def check_prepared(self, tokenizer: Tokenizer, path: str | Path) -> None:
        """A run that learns its own tokenizer takes a prepared corpus's, whichever it is."""

    def build(self, tokenizers: TokenizerSource) -> LoadedCorpus:
        """The tokenizer (`tokenizers.make_tokenizer`: this corpus's, or a fine-tune's source's) and the encoded
        splits (a fine-tune's tokenizer checks the whole text)."""
        data = self.data
        whole = data.tokenizer == "char" or data.init is not None
        return build_text(tokenizers, data.path, data.val_fraction, whole, make=partial(LoadedText, data=data))

    def read(self, tokenizer: Tokenizer, tensors: Tensors) -> LoadedCorpus:
        """The corpus `build` made, as its `tensors()` stored it (the codec's reading half)."""
        return LoadedText.from_tensors(tokenizer, tensors, data=self.data)

    def load(self, tokenizers: LMTokenizerSource, run: RunDirectory, check: Check) -> LoadedCorpus:
        """The corpus, built and saved in the run (`prepare_corpus`), or read back from it, `check`ed before
        anything is written."""
        return prepare_corpus(tokenizers, run, self.build, self.read, check)

    def trained(self, tokenizer: Tokenizer, run_dir: Path) -> LoadedCorpus:
        """A trained run's corpus, as its tokens.safetensors holds it (what `kqv eval` scores)."""
        return self.read(tokenizer, load_tokens(run_dir))

    def trained_answers(self, trained: Callable[[], Any]) -> tuple[list[str], list[str]] | None:
        """The completions of the pairs a trained run trained on and their kinds of question, from its corpus
        (`trained()`, a `Corpus.trained`): a text holds none, and reads nothing."""
        return None


class TextBlocks(Corpus):
    """A text (data.path, or Shakespeare) cut into a train and a validation split, trained on in random blocks."""

    def trained(self, tokenizer: Tokenizer, run_dir: Path) -> LoadedCorpus:
        """`Corpus.trained`; a text's run without tokens.safetensors is a prepared corpus's recorded before its
        SHA-256 was, whose directory is no longer at data.path (else it would be a `PreparedCorpus`): said so."""
        if not RunFiles(run_dir).tokens_file.exists() and self.data.path:
            raise DataError(  # a run of a prepared corpus keeps no copy of it
                f"{run_dir} keeps no copy of the prepared corpus it trained on, and {self.data.path} holds none "
                f"(moved or removed); give its place with {option(EVAL_CORPUS, run=str(run_dir))}"
            )
        return super().trained(tokenizer, run_dir)
