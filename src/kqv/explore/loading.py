"""The one place the explorer loads a model: a run directory of any kqv job, or the MiniLM embedding model.

`SUBJECTS` names the explorer's class for the runs of each job (`kqv.jobs.all_jobs()`), plus `minilm`;
`load_subject(run)` reads the run's task from its run.toml and opens its `Subject`, which loads the run with the
job's own loader (`kqv.jobs.load_run`: weights from safetensors, no code executed). `minilm` (or a
sentence-transformers directory) is the pretrained all-MiniLM-L6-v2 that `kqv embed` runs. A job whose runs the
explorer does not show is listed in `NOT_EXPLORABLE`, with why (tests/test_explore_api.py checks that every job is
in one of the two).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, RunError
from ..train.runs import read_run, run_task
from .subjects import ClassifierSubject, EmbeddingSubject, LMSubject, MLMSubject, MTSubject, Subject, VitSubject

DEFAULT_MAX_TOKENS = 256
MINILM = "minilm"

SUBJECTS: dict[str, type[Subject]] = {
    "lm": LMSubject,
    "mt": MTSubject,
    "mlm": MLMSubject,
    "cls": ClassifierSubject,
    "vit": VitSubject,
    MINILM: EmbeddingSubject,  # not a job: the installed sentence-transformers model
}
NOT_EXPLORABLE: dict[str, str] = {}  # job name -> why the explorer does not show its runs


def load_subject(run: str | Path, max_tokens: int = DEFAULT_MAX_TOKENS) -> Subject:
    """The model of `run` ready to explore; inputs longer than `max_tokens` tokens are refused with a message."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    path = Path(run)
    if str(run) == MINILM and not path.exists():
        return SUBJECTS[MINILM].load(None, max_tokens)
    if not path.is_dir():
        raise FileNotFoundError(
            f"no run directory at {run}; train one (e.g. `kqv train lm --out {run}`), or give "
            f"`{MINILM}` for the installed all-MiniLM-L6-v2"
        )
    if not (path / "run.toml").is_file():
        if (path / "tokenizer.json").is_file() and (path / "config.json").is_file():
            return SUBJECTS[MINILM].load(path, max_tokens)
        raise FileNotFoundError(
            f"{run} is not a kqv run (run.toml is missing) nor a sentence-transformers "
            f"directory (tokenizer.json and config.json)"
        )
    task = run_task(read_run(path))
    if task not in SUBJECTS or task == MINILM:
        why = f" ({NOT_EXPLORABLE[task]})" if task in NOT_EXPLORABLE else ""
        runs = sorted(name for name in SUBJECTS if name != MINILM)
        raise RunError(f"{run} is a run of task {task!r}, which the explorer does not show{why}; it reads {runs} runs")
    return SUBJECTS[task].load(path, max_tokens)
