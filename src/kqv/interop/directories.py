"""A Hugging Face model directory on disk: what makes one (a config.json, no kqv run.toml), and the tokenizer saved
beside its model (`tokenizer.json`, read as kqv's tokenizer interface). Below the jobs, so that every job, the API
and the explorer tell such a directory from a kqv run the same way."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from ..data.tokenizers import BPETokenizer
from ..errors import ConversionError

HF_TOKENIZER_FILE = "tokenizer.json"


def is_hf_directory(path: str | Path) -> bool:
    """Whether `path` is a Hugging Face model directory (a config.json) rather than a kqv run (a run.toml)."""
    path = Path(path)
    return (path / "config.json").is_file() and not (path / "run.toml").exists()


def read_hf_tokenizer(path: Path) -> BPETokenizer:
    """The tokenizer saved beside a Hugging Face model (`tokenizer.json`), as kqv's tokenizer interface."""
    if not (path / HF_TOKENIZER_FILE).is_file():
        raise ConversionError(
            f"{path} has no {HF_TOKENIZER_FILE}: save the tokenizer beside the model "
            f"(tokenizer.save_pretrained('{path}') with a fast tokenizer) so that kqv can read text"
        )
    try:  # the tokenizers library raises a bare Exception on a file it cannot read
        return BPETokenizer(HFTokenizer.from_file(str(path / HF_TOKENIZER_FILE)))
    except Exception as error:  # noqa: BLE001
        raise ConversionError(f"kqv cannot read {path}'s {HF_TOKENIZER_FILE}: {error}") from None
