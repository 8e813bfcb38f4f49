"""The one place the explorer loads a model: a run directory of any kqv job, or the MiniLM embedding model.

`SUBJECTS` names the explorer's class for the runs of each job (`kqv.jobs.all_jobs()`), plus `minilm`;
`load_subject(run)` reads the run's task from its run.toml and opens its `Subject`, which loads the run with the
job's own loader (`kqv.jobs.load_run`: weights from safetensors, no code executed). `minilm` (or a
sentence-transformers directory) is the pretrained all-MiniLM-L6-v2 that `kqv embed` runs; `hf` is any other
Hugging Face directory (`kqv.jobs.base.is_hf_directory`: a causal LM shown like an LM run, a BERT like an encoder
run, a Marian or BART like an MT run, kqv.explore.pretrained). A job whose runs the
explorer does not show is listed in `NOT_EXPLORABLE`, with why (tests/test_explore_api.py checks that every job is
in one of the two).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import TRAIN, ConfigError, RunError, option
from ..jobs.base import is_hf_directory
from ..train.layout import RunFiles
from ..train.runs import read_run, run_task
from .pretrained import PretrainedSubject, is_sentence_transformers
from .subjects import ClassifierSubject, EmbeddingSubject, LMSubject, MLMSubject, MTSubject, Subject
from .vision import VitSubject

DEFAULT_MAX_TOKENS = None  # the model's context, at most analysis.DRAWN_MAX_TOKENS
MINILM = "minilm"
HF = "hf"

SUBJECTS: dict[str, type[Subject]] = {
    "lm": LMSubject,
    "mt": MTSubject,
    "mlm": MLMSubject,
    "cls": ClassifierSubject,
    "vit": VitSubject,
    MINILM: EmbeddingSubject,  # not a job: the installed sentence-transformers model
    HF: PretrainedSubject,  # not a job: a Hugging Face causal LM, BERT, Marian or BART directory
}
NOT_JOBS = (MINILM, HF)
NOT_EXPLORABLE: dict[str, str] = {}  # job name -> why the explorer does not show its runs


def load_subject(run: str | Path, max_tokens: int | None = DEFAULT_MAX_TOKENS, device: str = "cpu") -> Subject:
    """The model of `run` ready to explore, on `device`; inputs longer than `max_tokens` tokens (None: the model's
    context, at most 1,024) are refused with a message."""
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ConfigError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    path = Path(run)
    if str(run) == MINILM and not path.exists():
        return SUBJECTS[MINILM].load(None, max_tokens, device)
    if not path.is_dir():
        raise FileNotFoundError(
            f"no run directory at {run}; train one (e.g. {option(TRAIN, task='lm', run_dir=run)}), or give "
            f"`{MINILM}` for the installed all-MiniLM-L6-v2"
        )
    if is_hf_directory(path):
        if is_sentence_transformers(path):
            return SUBJECTS[MINILM].load(path, max_tokens, device)
        return SUBJECTS[HF].load(path, max_tokens, device)
    if not RunFiles(path).config_file.is_file():
        raise FileNotFoundError(
            f"{run} is not a kqv run (run.toml is missing) nor a Hugging Face model directory (config.json, "
            f"with its tokenizer.json)"
        )
    task = run_task(read_run(path))
    if task not in SUBJECTS or task in NOT_JOBS:
        why = f" ({NOT_EXPLORABLE[task]})" if task in NOT_EXPLORABLE else ""
        runs = sorted(name for name in SUBJECTS if name not in NOT_JOBS)
        raise RunError(f"{run} is a run of task {task!r}, which the explorer does not show{why}; it reads {runs} runs")
    return SUBJECTS[task].load(path, max_tokens, device)
