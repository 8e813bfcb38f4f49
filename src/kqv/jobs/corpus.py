"""A text corpus of the LM and MLM jobs as their run directory holds it: the tokenizer and the encoded splits
(tokens.safetensors), made once and read back on a resume, so a resumed run needs neither the text nor a new
tokenizer. The LM job's corpus kinds (`kqv.jobs.lm_corpus`) store theirs through `prepare_corpus` too, each with its
own `build`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from ..data.shakespeare import load_text, split_text
from ..data.tokenizers import Tokenizer, encode_text
from ..errors import IF_EXISTS_OVERWRITE, RunError, option
from ..nn.models import count_parameters
from ..train.layout import RunFiles
from ..train.rundir import RunDirectory
from .base import Training


def prepare_corpus(
    job: Any,
    data: Any,
    run: RunDirectory,
    check: Callable[[Any, dict[str, torch.Tensor]], None] | None = None,
    build: Callable[[Any, Any], tuple[Any, dict[str, torch.Tensor]]] | None = None,
) -> tuple[Any, dict[str, torch.Tensor]]:
    """The tokenizer and encoded splits of a corpus (`data`: a [data] section with path, tokenizer and
    val_fraction): loaded from the run when it resumes a checkpoint (they were written before it), else built by
    `build(job, data)` (default `build_text`, with the job's `make_tokenizer`) and saved (by rank 0 alone under
    torchrun). `check(tokenizer, tokens)` is called before anything is saved: a run it refuses leaves no file
    behind. The LM and MLM jobs share it."""
    if run.resuming:
        run.verify(run.tokenizer_dir, run.tokens_file)  # a recorded file that is missing is an error, not a rebuild
    if run.resuming and run.tokens_file.exists():
        tokenizer, tokens = job.load_tokenizer(run.path), load_tokens(run.path)
        if check is not None:
            check(tokenizer, tokens)
        return tokenizer, tokens
    tokenizer, tokens = (build or build_text)(job, data)
    if check is not None:
        check(tokenizer, tokens)
    if run.writes:
        run.path.mkdir(parents=True, exist_ok=True)
        run.write_tokenizer(tokenizer.files())
        run.write_tokens(save(tokens))  # present means complete, tokenizer too
    return tokenizer, tokens


def build_text(job: Any, data: Any) -> tuple[Tokenizer, dict[str, torch.Tensor]]:
    """The tokenizer and encoded splits of the text in `data.path`: `train`, `val` and `chars` (their lengths)."""
    text = load_text(data.path)
    train_text, val_text = split_text(text, data.val_fraction)
    whole = data.tokenizer == "char" or getattr(data, "init", None)  # a fine-tune's tokenizer checks all of it
    tokenizer = job.make_tokenizer(data, text if whole else train_text)
    tokens = {
        "train": encode_text(tokenizer, train_text),
        "val": encode_text(tokenizer, val_text),
        "chars": torch.tensor([len(train_text), len(val_text)]),
    }
    return tokenizer, tokens


def load_tokens(run_dir: Path) -> dict[str, torch.Tensor]:
    """The encoded splits of a run (tokens.safetensors), verified against its SHA256SUMS."""
    run = RunFiles(run_dir)
    path = run.tokens_file
    overwrite = option(IF_EXISTS_OVERWRITE)
    try:
        tokens = load(run.read_verified(path))
    except SafetensorError as error:
        raise RunError(
            f"{path} is corrupt ({error}); restore it from a backup, or train the run again with {overwrite}"
        ) from None
    if not {"train", "val"} <= set(tokens):
        raise RunError(
            f"{path} holds {sorted(tokens)}, not the train and val splits; train the run again with {overwrite}"
        )
    return tokens


def describe_corpus(training: Training, vocabulary: int) -> str:
    """The line before training a model on a text corpus (LM and MLM jobs), with its `vocabulary` size."""
    config, (tokenizer, tokens) = training.config, training.data
    kind = getattr(tokenizer, "kind", config.data.tokenizer)  # a prepared corpus's or a source's, not the config's
    return (
        f"{count_parameters(training.model):,} parameters, {len(tokens['train']):,} training tokens "
        f"({kind} tokenizer, vocabulary {vocabulary}), run directory {training.run.destination}"
    )
