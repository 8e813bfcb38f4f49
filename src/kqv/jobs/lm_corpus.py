"""What a language-modelling run trains on, as one object: a `Corpus`, made once from the run's `DataConfig` by
`kqv.jobs.corpora.corpus_of`. It owns what the LM job would otherwise ask the settings again at every use:

- `check`: the settings only this kind takes (a text refuses the pairs' and the documents' options);
- `load`: how the data is read, encoded and stored in the run (or read back on a resume), with a tokenizer made
  for it (`make_tokenizer`, with the `mask` symbol it needs, if any);
- `check_data`: what must hold before anything is written (blocks fit in each split, the sample prompt encodes);
- `trainer_options`: the Trainer's batches and loss;
- `outcome` and `held_out`: how the run is scored after training and by `kqv eval`, and `trained_answers`, the
  baselines' reference answers of `evaluate(pairs=...)`.

`TextBlocks` (a text, cut into blocks of data.context + 1 tokens) is the default kind; the others are
`kqv.jobs.completions.Pairs`, `kqv.jobs.sources.Documents` and `kqv.jobs.token_corpus.PreparedCorpus`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from ..data.batches import batch_generator, sample_batch
from ..data.tokenizers import Tokenizer, load_tokenizer, make_tokenizer
from ..errors import ConfigError
from ..nn.config import ModelConfig
from ..train.config import TrainConfig
from ..train.evaluation import perplexity
from ..train.layout import RunFiles
from ..train.options import TrainerOptions
from ..train.preflight import check_prompt, check_splits
from ..train.rundir import RunDirectory
from ..train.topology import Topology
from .corpus import build_text, load_tokens, prepare_corpus
from .lm_data import DataConfig
from .sampling import SampleConfig, default_prompt, write_samples

SCORED_TOKENS = 200_000  # the validation tokens the job's final perplexity scores
Splits = dict[str, Tensor]
Check = Callable[[Tokenizer, Splits], None]


class Corpus:
    """What an LM run trains on (the module docstring): the run's [data] settings `data`, checked for this kind.
    A subclass says which settings it reads (`reads`) and overrides what it does differently from a text."""

    def __init__(self, data: DataConfig) -> None:
        self.data = data
        self.check()

    @staticmethod
    def reads(data: DataConfig) -> bool:
        """Whether `data` makes a corpus of this kind (`kqv.jobs.corpora.CORPORA` asks each kind in turn)."""
        return True

    def check(self) -> None:
        """Refuse the settings of other kinds, which this one would silently ignore."""

    def mask(self) -> str | None:
        """The mask symbol a new tokenizer must reserve for this corpus, or None (a text needs none)."""
        return None

    def make_tokenizer(self, data: DataConfig, text: str) -> Tokenizer:
        """A new tokenizer learned from `text` (what `prepare_corpus` asks its maker; `data` is this corpus's)."""
        return make_tokenizer(data.tokenizer, text, data.vocab_size)

    def load_tokenizer(self, run_dir: Path) -> Tokenizer:
        """The tokenizer a run saved (a resume's)."""
        return load_tokenizer(RunFiles(run_dir).tokenizer_dir)

    def build(self, maker: Any, data: DataConfig) -> tuple[Tokenizer, Splits]:
        """The tokenizer (`maker.make_tokenizer`: this corpus, or a fine-tune's source) and the encoded splits."""
        return build_text(maker, data)

    def load(self, maker: Any, run: RunDirectory, check: Check) -> tuple[Tokenizer, Splits]:
        """The tokenizer and splits, built and saved in the run (`prepare_corpus`), or read back from it."""
        return prepare_corpus(maker, self.data, run, check, build=self.build)

    def sample_prompt(self, tokenizer: Tokenizer, tokens: Splits) -> str | None:
        """The prompt samples start from when [sample] gives none (None: the corpus samples its own prompts)."""
        return default_prompt(self.data, tokenizer, tokens)

    def check_data(self, model: ModelConfig, tokenizer: Tokenizer, tokens: Splits, prompt: str) -> None:
        """What must hold before anything is written: a block of context + 1 tokens in each split, ids the model
        has (`vocab`), and a sample `prompt` (or the corpus's own, when it is empty) the tokenizer encodes."""
        check_splits({"train": tokens["train"], "val": tokens["val"]}, self.data.context, self.vocab(tokenizer))
        check_prompt(tokenizer.encode, prompt or self.sample_prompt(tokenizer, tokens))

    def vocab(self, tokenizer: Tokenizer) -> int | None:
        """The vocabulary `check_data` checks the ids against (None: not checked)."""
        return tokenizer.vocab_size

    def trainer_options(
        self, train: TrainConfig, tokenizer: Tokenizer, tokens: Splits, topology: Topology
    ) -> TrainerOptions:
        """The Trainer's batches: random blocks of the train split for update i, and of the validation split for
        evaluation batch i, drawn from generators seeded by (seed, i) so a resume draws the same ones. Every
        process of `topology` draws the whole batch (the Trainer keeps its rows); a kind that reads only its own
        rows takes them from it."""
        train_ids, val_ids = tokens["train"], tokens["val"]
        batch, context, seed = train.batch_size, self.data.context, train.seed

        def train_batches(i: int) -> tuple[Tensor, Tensor]:
            return sample_batch(train_ids, batch, context, batch_generator(seed, i))

        def val_batches(i: int) -> tuple[Tensor, Tensor]:
            return sample_batch(val_ids, batch, context, batch_generator(seed, -i - 1))

        return TrainerOptions(
            train_batches=train_batches,
            loss_fn=lambda model, batch: model(*batch),
            val_batches=val_batches,
            tokens_per_batch=batch * context,
        )

    def describe(self, tokens: Splits) -> str:
        """What the line before training adds about this corpus (empty: nothing)."""
        return ""

    def outcome(
        self, model: nn.Module, tokenizer: Tokenizer, tokens: Splits, train: TrainConfig, sample: SampleConfig,
        run_dir: Path,
    ) -> tuple[dict[str, float], list[str]]:  # fmt: skip
        """The perplexity of (up to `SCORED_TOKENS` of) the validation split, and the samples (samples.txt)."""
        val = perplexity(
            model,
            tokens["val"],
            context=self.data.context,
            n_chars=int(tokens["chars"][1]) if "chars" in tokens else None,  # a prepared corpus counts no chars
            precision=train.precision,
            max_tokens=SCORED_TOKENS,
        )
        return val, write_samples(model, tokenizer, sample, RunFiles(run_dir).samples_file)

    def held_out(self, model: nn.Module, run_dir: Path, max_tokens: int | None) -> dict[str, Any]:
        """The fields of `LMRun.evaluate()`'s `LMEvaluation`: the perplexity of the run's validation split (up to
        `max_tokens`), from its tokens.safetensors."""
        tokens = load_tokens(run_dir)
        ids, n_chars = tokens["val"], int(tokens["chars"][1])
        figures = perplexity(model, ids, context=self.data.context, n_chars=n_chars, max_tokens=max_tokens)
        return {"source": "the held-out validation split", **figures}

    def trained_answers(self, tokenizer: Tokenizer, run_dir: Path) -> tuple[list[str], list[str]] | None:
        """The completions of the pairs the run trained on and their kinds of question (None: it trained on none)."""
        return None


class TextBlocks(Corpus):
    """A text (data.path, or Shakespeare) cut into a train and a validation split, trained on in random blocks."""

    def check(self) -> None:
        refuse_span_options(self.data)
        refuse_document_options(self.data)
        refuse_pair_options(self.data)


def refuse_span_options(data: DataConfig) -> None:
    """The random prefix and the loss on every token shape span corruption's examples: refused without it."""
    given = [
        name for name, on in (("random_prefix", data.random_prefix), ("span_loss", data.span_loss != "span")) if on
    ]
    if given:
        raise ConfigError(
            f"data.{given[0]} shapes span corruption's examples; set data.objective='span_corruption' or drop it"
        )


def refuse_document_options(data: DataConfig) -> None:
    """Sentences, delimiters and the cut of long documents belong to a text read as documents."""
    if data.shuffle_sentences or data.delimiter is not None or data.long_documents != "auto":
        raise ConfigError(
            "data.shuffle_sentences, data.delimiter and data.long_documents read a text as documents: set "
            "data.objective or give several sources (data.sources)"
        )


def refuse_pair_options(data: DataConfig) -> None:
    """The prompt's weight and packing belong to examples."""
    if data.prompt_loss_weight or data.packing is True:
        raise ConfigError(
            "data.prompt_loss_weight and data.packing apply to a file of prompt -> completion pairs (data.path "
            f"a .tsv or .jsonl file), not to text ({data.path or 'Shakespeare'}); drop them"
        )
