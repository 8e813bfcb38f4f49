"""What a run holds: the files of a kqv run or a Hugging Face model directory that loading it reads, and its
fine-tune's sources' — what no command may write over (`kqv.train.files.refuse_writing_over`); and whether a run
that a resume opens is finished (`finished_summary`: its summary, said instead of training it again)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from ..errors import STEPS, option
from ..train.layout import RunFiles
from ..train.rundir import RunDirectory
from ..train.runs import RunConfig, comparable, read_run, read_summary

HF_CONFIG_FILE = "config.json"  # what makes a directory a Hugging Face model's
# The files of a Hugging Face model directory that kqv reads (besides its *.safetensors weights).
HF_MODEL_FILES = frozenset(
    {
        HF_CONFIG_FILE,
        "generation_config.json",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "vocab.json",
        "merges.txt",
        "modules.json",  # a sentence-transformers directory's (kqv.jobs.embeddings)
        "sentence_bert_config.json",
        "1_Pooling",
    }
)


def is_hf_directory(path: str | Path) -> bool:
    """Whether `path` is a Hugging Face model directory (a config.json) rather than a kqv run (a run.toml): every
    job, the API and the explorer tell the two apart here."""
    path = Path(path)
    return (path / HF_CONFIG_FILE).is_file() and not RunFiles(path).config_file.exists()


def model_files(directory: str | Path) -> list[Path]:
    """The files of a run directory or a Hugging Face model directory that loading it reads (a kqv run's:
    `RunFiles.held`; a Hugging Face directory's: `HF_MODEL_FILES` and its weights): what no command may write over.
    Other files in it (a user's notes, an earlier answers.txt) are not the model's."""
    directory = Path(directory)
    weights = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    held = {*RunFiles(directory).held(), *(directory / name for name in HF_MODEL_FILES)}
    return sorted(held) + weights


def run_inputs(run_dir: str | Path) -> list[tuple[str, Path]]:
    """What an operation on the run (or Hugging Face directory) `run_dir` reads, which no file it writes may be or
    lie inside (`refuse_writing_over`): the model's own files (`model_files`: SHA256SUMS and the lock file too)
    and, for a fine-tune, its source's (run.toml's `[source]`, and that source's source, if any), each as (what it
    is, its path)."""
    run_dir = Path(run_dir)
    found = [(f"{path.name} of the run {run_dir}", path) for path in model_files(run_dir)]
    seen = {os.path.realpath(run_dir)}
    while (source := recorded_source(run_dir)) is not None and os.path.realpath(source) not in seen:
        seen.add(os.path.realpath(source))
        found += [(f"{path.name} of the fine-tune's source {source}", path) for path in model_files(source)]
        run_dir = Path(source)
    return found


def recorded_source(run_dir: Path) -> str | None:
    """The path of the source a fine-tune `run_dir` started from (run.toml's `[source]`), else None."""
    try:
        source = tomllib.loads(RunFiles(run_dir).config_file.read_text()).get("source", {}).get("path")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
        return None  # no run.toml (a Hugging Face directory), or one that loading it will name
    return source if isinstance(source, str) and source else None


def finished_summary(run: RunDirectory, config: RunConfig) -> dict[str, Any] | None:
    """The summary of the run that `run` resumes when it is finished (its summary.json written after the update
    its checkpoint holds) and `config` asks for nothing more of it (every section as its run.toml's: more steps, a
    longer budget or another config resume as before), its data files verified; else None."""
    if not run.resuming or not run.summary_file.is_file():  # a RunDirectory is its RunFiles
        return None
    try:
        summary = read_summary(run.path)
    except (OSError, ValueError):  # damaged: the run is finished again, which writes it anew
        return None
    recorded = comparable(read_run(run.path))
    recorded.get("model", {}).pop("vocab_size", None)  # the tokenizer's, which a config leaves open
    asked = comparable(config.to_dict())
    planned = (run.checkpoint.state.get("plan") or {}).get("steps", config.train.steps)  # a budget's, or steps
    if summary.get("steps") != run.step or run.step < planned:  # a summary of an earlier end, before more was asked
        return None
    if any(recorded.get(name) != section for name, section in asked.items()):
        return None
    run.verify_data()  # a damaged run is said so, finished or not
    return summary


def finished_line(run: RunDirectory, summary: dict[str, Any]) -> str:
    """What a resume of a finished run says instead of training and evaluating it again."""
    return (
        f"{run.destination} is finished ({summary['steps']} steps; its figures are in summary.json): nothing to "
        f"resume; to train it further ask for more, {option(STEPS)} N above {summary['steps']} (or a longer "
        f"train.budget_minutes)"
    )
