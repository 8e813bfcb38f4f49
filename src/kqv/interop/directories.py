"""A Hugging Face model directory on disk: the tokenizer saved beside its model (`tokenizer.json`, read as kqv's
tokenizer interface). What tells such a directory from a kqv run is `kqv.jobs.base.is_hf_directory`, which knows
both."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from ..data.tokenizers import BPETokenizer
from ..errors import ConversionError

HF_TOKENIZER_FILE = "tokenizer.json"


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
