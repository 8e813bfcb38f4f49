"""The one place the explorer loads a model: a run directory of any kqv job, or the MiniLM embedding model.

`load_subject(run)` reads the run's task from its run.toml and builds the matching `Subject` with the job's own
loader (weights from safetensors, no code executed). `minilm` (or a sentence-transformers directory) is the
pretrained all-MiniLM-L6-v2 that `kqv embed` runs.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from ..errors import ConfigError, RunError
from .subjects import ClassifierSubject, EmbeddingSubject, LMSubject, MLMSubject, MTSubject, Subject

DEFAULT_MAX_TOKENS = 256
MINILM = "minilm"


def load_subject(run: str | Path, max_tokens: int = DEFAULT_MAX_TOKENS) -> Subject:
    """The model of `run` ready to explore; inputs longer than `max_tokens` tokens are refused with a message."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    path = Path(run)
    if str(run) == MINILM and not path.exists():
        return _embedding_subject(None, max_tokens)
    if not path.is_dir():
        raise FileNotFoundError(f"no run directory at {run}; train one (e.g. `kqv train lm --out {run}`), or give "
                                f"`{MINILM}` for the installed all-MiniLM-L6-v2")
    if not (path / "run.toml").is_file():
        if (path / "tokenizer.json").is_file() and (path / "config.json").is_file():
            return _embedding_subject(path, max_tokens)
        raise FileNotFoundError(f"{run} is not a kqv run (run.toml is missing) nor a sentence-transformers "
                                f"directory (tokenizer.json and config.json)")
    task = tomllib.loads((path / "run.toml").read_text()).get("task", "lm")
    loaders = {"lm": _lm_subject, "mt": _mt_subject, "mlm": _mlm_subject, "cls": _classifier_subject}
    if task not in loaders:
        raise RunError(f"{run} is a run of task {task!r}, which the explorer does not know; it reads "
                         f"{sorted(loaders)} runs")
    return loaders[task](path, max_tokens)


def _lm_subject(path: Path, max_tokens: int) -> Subject:
    from ..jobs.lm import load_run

    return LMSubject(str(path), load_run(path), max_tokens)


def _mt_subject(path: Path, max_tokens: int) -> Subject:
    from ..jobs.mt import SPECIAL_TOKENS, load_run

    return MTSubject(str(path), load_run(path), max_tokens, SPECIAL_TOKENS)


def _mlm_subject(path: Path, max_tokens: int) -> Subject:
    from ..jobs.mlm import load_mlm_run

    run = load_mlm_run(path)
    return MLMSubject(str(path), run.model, run.vocabulary, max_tokens)


def _classifier_subject(path: Path, max_tokens: int) -> Subject:
    from ..jobs.cls import JOB

    run = JOB.load(path)
    return ClassifierSubject(str(path), run.model, run.tokenizer, run.labels, max_tokens)


def _embedding_subject(path: Path | None, max_tokens: int) -> Subject:
    from ..jobs.embeddings import SentenceEncoder

    return EmbeddingSubject(str(path) if path else MINILM, SentenceEncoder.load(path), max_tokens)
