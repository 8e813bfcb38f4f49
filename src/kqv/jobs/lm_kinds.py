"""The LM job's corpus kinds, and the one place that decides which a run's [data] settings make (`corpus_of`):
documents made into examples (an objective other than the next token, or several sources), a file of pairs, a
prepared token corpus, else a text made into blocks. Each kind is a `kqv.jobs.lm_corpus.Corpus`; a new kind is a
class in its own module (its groups of settings there, `Corpus.settings`) and a line here, before the kinds
whose data it also reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .lm_completions import Pairs
from .lm_corpus import Corpus, TextBlocks
from .lm_data import DataConfig
from .lm_documents import Documents
from .lm_prepared import PreparedCorpus

CORPORA: tuple[type[Corpus], ...] = (Documents, Pairs, PreparedCorpus, TextBlocks)  # the first that reads the data
SETTINGS = tuple(dict.fromkeys(group for kind in CORPORA for group in kind.settings))  # every kind's, once each


def kind_of(data: DataConfig) -> type[Corpus]:
    """The kind of corpus `data` makes: the first of `CORPORA` that reads it."""
    return next(kind for kind in CORPORA if kind.reads(data))


def corpus_of(data: DataConfig) -> Corpus:
    """The corpus `data` makes (`kind_of`), checked: a ConfigError names a setting of a group its kind does not take
    (`Corpus.takes`), a source its own kind refuses to be (`Corpus.check_as_source`), or what the kind's `check`
    refuses."""
    kind = kind_of(data)
    taken = kind.takes(data)
    for settings in SETTINGS:
        if settings not in taken:
            settings.refuse(data)
    for path in kind.sources(data):
        kind_of_path(path).check_as_source(path, data)
    return kind(data)


def kind_of_path(path: str | Path | None) -> type[Corpus]:
    """The kind of corpus the file or directory at `path` makes alone (a prepared corpus, a file of pairs, a text;
    None: Shakespeare)."""
    return kind_of(DataConfig(path=None if path is None else str(path)))


def data_may_move(saved: dict[str, Any]) -> bool:
    """Whether a run whose run.toml holds `saved` may be resumed with a new data.path (`Corpus.moves`)."""
    return any(kind.moves(saved) for kind in CORPORA)
