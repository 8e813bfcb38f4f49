"""The LM job's corpus kinds, and the one place that decides which a run's [data] settings make (`corpus_of`):
documents made into examples (an objective other than the next token, or several sources), a file of pairs, a
prepared token corpus, else a text made into blocks. Each kind is a `kqv.jobs.lm_corpus.Corpus`; a new kind is a
class here, before the kinds whose settings it shares."""

from __future__ import annotations

from .lm_completions import Pairs
from .lm_corpus import Corpus, TextBlocks
from .lm_data import DataConfig
from .lm_documents import Documents
from .lm_prepared import PreparedCorpus

CORPORA: tuple[type[Corpus], ...] = (Documents, Pairs, PreparedCorpus, TextBlocks)  # the first that reads the data


def corpus_of(data: DataConfig) -> Corpus:
    """The corpus `data` makes: the first kind of `CORPORA` that reads it, checked (a ConfigError names a setting
    that kind does not take)."""
    kind = next(kind for kind in CORPORA if kind.reads(data))
    return kind(data)
