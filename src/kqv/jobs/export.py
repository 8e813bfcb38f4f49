"""`kqv export RUN --hf DIR`: a kqv language-model run written as a Hugging Face GPT-2 directory, or a masked-LM run
as a BERT one (`BertForMaskedLM`, with its [PAD] [CLS] [SEP] [MASK] tokens).

The directory holds what `transformers.AutoModelForCausalLM.from_pretrained(DIR)` and
`AutoTokenizer.from_pretrained(DIR)` read: `config.json`, `model.safetensors` (`kqv.interop.to_hf`'s weights, never a
pickle), `tokenizer.json` and `tokenizer_config.json`. Its greedy tokens are the run's (`tests/test_finetune.py`).

GPT-2's format holds a pre-LN decoder with learned positions, LayerNorm, biases and an ungated GELU/ReLU feed-forward
network; a run with anything else (RoPE, ALiBi, relative or sinusoidal positions, RMSNorm, SwiGLU, experts, post-LN,
sparse attention, ...) is refused by `to_hf`, naming the option, before anything is written.

Tokenizers: a byte-level BPE tokenizer is already a `tokenizers` JSON and is saved as it is. A character tokenizer
becomes a `tokenizers` word-level model over its characters, with a pre-tokenizer that splits the text into single
characters and a decoder that joins them again: it encodes and decodes every text exactly as kqv's does, and a
character it never saw is an error (its unknown token, "<unk>", is no character, so it is in no vocabulary), not
a silent replacement.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from torch import nn

from ..data.tokenizers import BPETokenizer, CharTokenizer, Tokenizer
from ..errors import ConfigError, ConversionError

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


FORMATS = {"GPT2LMHeadModel": "GPT-2", "BertForMaskedLM": "BERT"}  # what `kqv export` writes, by model kind
BERT_ROLES = {"[PAD]": "pad_token", "[CLS]": "cls_token", "[SEP]": "sep_token", "[MASK]": "mask_token"}


def export_hf(
    model: nn.Module,
    tokenizer: Tokenizer,
    directory: str | Path,
    source: str | Path,
    architecture: str = "GPT2LMHeadModel",
    specials: dict[str, int] | None = None,
) -> Path:
    """Write `model` (a `DecoderLM`, or a `MaskedLM` as "BertForMaskedLM") and `tokenizer` (with an MLM vocabulary's
    `specials`) as the Hugging Face directory `directory`, which must not exist or be empty. The model is converted
    first: a configuration the format cannot hold is refused (`ConversionError` naming the option) with nothing
    written; the files are written beside `directory` and moved into place last."""
    from transformers import PreTrainedTokenizerFast

    from ..interop import to_hf

    directory = Path(directory)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ConfigError(f"{directory} already exists and is not an empty directory; choose a new one")
    try:
        hf_model = to_hf(model, architecture)
    except ConversionError as error:
        raise ConversionError(
            f"{source} cannot be written as a Hugging Face {FORMATS[architecture]}: {error}"
        ) from None
    roles = {BERT_ROLES[token]: token for token in specials or {}}
    fast = PreTrainedTokenizerFast(tokenizer_object=hf_tokenizer(tokenizer, specials), **roles)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        hf_model.save_pretrained(staging, safe_serialization=True)
        fast.save_pretrained(staging)
        if directory.exists():
            directory.rmdir()  # empty, checked above
        os.replace(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory
