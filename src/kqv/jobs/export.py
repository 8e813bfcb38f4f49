"""`kqv export RUN --hf DIR`: a kqv language-model run written as a Hugging Face causal LM directory (GPT-2,
GPT-NeoX or Llama, whichever holds its configuration), or a masked-LM run as a BERT one (`BertForMaskedLM`, with its
[PAD] [CLS] [SEP] [MASK] tokens).

The directory holds what `transformers.AutoModelForCausalLM.from_pretrained(DIR)` and
`AutoTokenizer.from_pretrained(DIR)` read: `config.json`, `model.safetensors` (`kqv.interop.to_hf`'s weights, never a
pickle), `tokenizer.json` and `tokenizer_config.json`. Its greedy tokens are the run's (`tests/test_finetune.py`).

The format is chosen by the run's model (`kqv.interop.to_hf`): learned positions with LayerNorm become a
`GPT2LMHeadModel`; RoPE with LayerNorm and an ungated feed-forward network (the `quick` config) a
`GPTNeoXForCausalLM`; RoPE with RMSNorm and SwiGLU or GeGLU (and grouped-query attention) a `LlamaForCausalLM`. A run
no format holds (ALiBi, relative or sinusoidal positions, experts, post-LN, sparse attention, ...) is refused by
`to_hf`, naming the nearest format's options, before anything is written.

Tokenizers: a byte-level BPE tokenizer is already a `tokenizers` JSON and is saved as it is. A character tokenizer
becomes a `tokenizers` word-level model over its characters, with a pre-tokenizer that splits the text into single
characters and a decoder that joins them again: it encodes and decodes every text exactly as kqv's does, and a
character it never saw is an error (its unknown token, "<unk>", is no character, so it is in no vocabulary), not
a silent replacement: `kqv.load` of the directory names such characters in one line (`BPETokenizer.encode`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from torch import nn

from ..data.tokenizers import BPETokenizer, CharTokenizer, Tokenizer
from ..errors import HF, ConfigError, ConversionError, option
from ..train.files import disk_full_reported, refuse_writing_over
from .base import HF_MODEL_FILES, run_inputs

logger = logging.getLogger(__name__)

UNKNOWN = "<unk>"  # a word-level model needs an unknown token; no character tokenizer has this one


def hf_tokenizer(tokenizer: Tokenizer, specials: dict[str, int] | None = None) -> HFTokenizer:
    """The `tokenizers` object that encodes and decodes as `tokenizer` does (kqv's char or BPE tokenizer), with
    `specials` (token -> id: an MLM vocabulary's [PAD] [CLS] [SEP] [MASK]) as special tokens of theirs."""
    if isinstance(tokenizer, BPETokenizer):
        return tokenizer.tokenizer  # its special tokens are already its own
    if isinstance(tokenizer, CharTokenizer):
        vocabulary = {c: i for i, c in enumerate(tokenizer.chars)} | (specials or {})
        chars = HFTokenizer(models.WordLevel(vocabulary, unk_token=UNKNOWN))
        chars.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per char
        chars.decoder = decoders.Fuse()  # joined with nothing between them
        return chars
    raise ConversionError(f"kqv cannot write a {type(tokenizer).__name__} as a Hugging Face tokenizer")


FORMATS = {None: "model", "BertForMaskedLM": "BERT"}  # what a refusal calls the format: by the class asked for
BERT_ROLES = {"[PAD]": "pad_token", "[CLS]": "cls_token", "[SEP]": "sep_token", "[MASK]": "mask_token"}


def export_hf(
    model: nn.Module,
    tokenizer: Tokenizer,
    directory: str | Path,
    source: str | Path,
    architecture: str | None = None,
    specials: dict[str, int] | None = None,
) -> Path:
    """Write `model` (a `DecoderLM`, as whichever causal LM class holds it; a `MaskedLM` as "BertForMaskedLM") and
    `tokenizer` (with an MLM vocabulary's `specials`) as the Hugging Face directory `directory`, which must not
    exist or be empty, nor be or lie inside what the export reads (`run_inputs(source)`: the files of the run
    `source`, and a fine-tune's source's). The model is converted first: a configuration the format cannot hold is
    refused (`ConversionError` naming the option) with nothing written; the files are written into a staging
    directory beside `directory` and moved into place last. A staging directory an earlier export left (killed
    while writing) is removed first (`reclaim_staging`); a full disk is a `DiskFullError`, with nothing left
    behind."""
    from transformers import PreTrainedTokenizerFast

    from ..interop import to_hf

    if not str(directory).strip() or Path(directory).name in ("", ".", ".."):
        given = repr(str(directory)) if str(directory).strip() else "empty"
        raise ConfigError(f"{option(HF)} is {given}: give the name of a new directory to write, such as qa-gpt2")
    directory = Path(directory)
    refuse_writing_over(directory, run_inputs(source), option(HF), directory=True)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ConfigError(f"{directory} already exists and is not an empty directory; choose a new one")
    try:
        with quiet_transformers():
            hf_model = to_hf(model, architecture)
    except ConversionError as error:
        raise ConversionError(
            f"{source} cannot be written as a Hugging Face {FORMATS.get(architecture, architecture)}: {error}"
        ) from None
    drop_foreign_ids(hf_model)
    roles = {BERT_ROLES[token]: token for token in specials or {}}
    fast = PreTrainedTokenizerFast(tokenizer_object=hf_tokenizer(tokenizer, specials), **roles)
    directory.parent.mkdir(parents=True, exist_ok=True)
    reclaim_staging(directory)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}{STAGING}", dir=directory.parent))
    held = os.open(staging, os.O_RDONLY)  # locked while it is written: `reclaim_staging` leaves it alone
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's is private; the directory it becomes is an ordinary one
        needed = sum(t.numel() * t.element_size() for t in hf_model.state_dict().values())
        with disk_full_reported(directory, needed), quiet_transformers():
            hf_model.save_pretrained(staging, safe_serialization=True)
            fast.save_pretrained(staging)
        if directory.exists():
            directory.rmdir()  # empty, checked above
        os.replace(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(held)
    return directory


STAGING = ".kqv-export-"  # `.DIR.kqv-export-XXXXXXXX` beside DIR: an export being written
LEGACY_STAGING = re.compile(r"[a-z0-9_]{8}")  # mkdtemp's random part: all that followed `.DIR.` in earlier kqv


def reclaim_staging(directory: Path) -> None:
    """Remove the staging directories of earlier exports to `directory` that were killed while writing (`kill -9`
    leaves `.DIR.kqv-export-XXXXXXXX/` beside DIR): those whose lock no process holds. A live export holds its
    staging directory's lock to the end, so it is never touched. Nothing else is: only the names of staging
    directories are candidates, and under the name earlier kqv versions gave them (`.DIR.XXXXXXXX`) only one that
    holds nothing but an export's files."""
    prefix = f".{directory.name}."
    for entry in directory.parent.iterdir():
        if not entry.name.startswith(prefix) or entry.is_symlink() or not entry.is_dir():
            continue
        rest = entry.name[len(prefix) :]
        if rest.startswith(STAGING[1:]):
            ours = LEGACY_STAGING.fullmatch(rest[len(STAGING) - 1 :]) is not None
        else:
            ours = LEGACY_STAGING.fullmatch(rest) is not None and all(
                path.is_file() and (path.name in HF_MODEL_FILES or path.suffix == ".safetensors")
                for path in entry.iterdir()
            )
        if ours:
            remove_unless_held(entry)


def remove_unless_held(staging: Path) -> None:
    """Remove the staging directory `staging` unless a live export holds its lock."""
    try:
        held = os.open(staging, os.O_RDONLY)
    except OSError:  # gone meanwhile
        return
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # being written
        os.close(held)
        return
    try:
        shutil.rmtree(staging, ignore_errors=True)
        logger.info("removed %s, left by an export that was stopped while writing", staging)
    finally:
        os.close(held)


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Within the block, transformers prints neither its warnings nor its progress bars (an export says one line)."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def drop_foreign_ids(hf_model: nn.Module) -> None:
    """Clear the special token ids (bos, eos, pad) of the exported config and generation config that name no token
    of its vocabulary (GPT-2's defaults are 50256, whatever the vocabulary): transformers would warn about them on
    every load, and generate would wait for a token that cannot come."""
    size = hf_model.config.vocab_size
    for config in (hf_model.config, getattr(hf_model, "generation_config", None)):
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(config, name, None)
            if isinstance(value, int) and not 0 <= value < size:
                setattr(config, name, None)
