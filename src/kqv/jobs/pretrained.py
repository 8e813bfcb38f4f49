"""A Hugging Face checkpoint directory used like a run: `kqv.load(DIR)` converts the model offline
(`kqv.interop.from_hf`, safetensors only) and reads the tokenizer saved beside it (`tokenizer.json`).

A causal LM directory (GPT-2, GPT-NeoX, Llama, Mistral, Qwen2) continues prompts (`generate`), scores text
(`evaluate`) and shows its self-attention
(`attention`), with the options and checks of a kqv LM run (`LMRun`); a BERT directory shows its self-attention;
a Marian or BART directory translates (`translate`, kqv's beam search from its config's special ids).
`kqv generate|eval|attention DIR` reach these through `kqv.load`, as Python does. The numbers are kqv's own
model's, which equal the Hugging Face model's (`tests/test_interop.py`); nothing is downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from ..data.tokenizers import BPETokenizer
from ..errors import BEAM_SIZE, DATA_FILE, SENTENCES, ConfigError, ConversionError, option
from ..interop import from_hf
from ..interop.convert import read_config_json
from ..interop.directories import read_hf_tokenizer
from ..nn.devices import Accelerator, model_device
from ..nn.generation import translate
from ..nn.heads import MaskedLM
from ..nn.models import DecoderLM, Encoder, EncoderDecoder
from ..validation import check_at_least
from .base import AttentionMaps, check_text, is_hf_directory
from .lm import ATTENTION_MAX_TOKENS, LMEvaluation, evaluate_text, self_attention
from .mt import DecodeConfig
from .offers import Completes, Evaluates, ExportsHF, Generates, Offering, ShowsAttention, Translates
from .sampling import Continues
from .scoring import PairsEvaluation, check_pairs_alone, evaluate_pairs

__all__ = ["PretrainedEncoder", "PretrainedLM", "PretrainedRun", "PretrainedTranslator", "is_hf_directory"]


@dataclass
class PretrainedRun(Offering):
    """A converted Hugging Face model with its tokenizer; what it offers is its model's class's: a causal LM
    (`PretrainedLM`), a BERT (`PretrainedEncoder`) or a Marian or BART (`PretrainedTranslator`), by `load`."""

    names: ClassVar[str] = "other"  # whose directories these are, as a refusal names them

    model: nn.Module
    tokenizer: BPETokenizer
    path: Path
    hf_class: str

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu") -> PretrainedRun:
        """The Hugging Face directory `path`, converted, its model on `device` (`Accelerator.resolve`)."""
        path, device = Path(path), Accelerator.resolve(device).device
        tokenizer = read_hf_tokenizer(path)
        names = read_config_json(path / "config.json").get("architectures")  # a ConversionError naming what is wrong
        hf_class = str(names[0]) if isinstance(names, list) and names else "?"
        model = from_hf(path).eval().to(device)
        offering = next((kind for kind, models in OFFERINGS if isinstance(model, models)), PretrainedRun)
        return offering(model, tokenizer, path, hf_class)

    def __repr__(self) -> str:
        return f"PretrainedRun({str(self.path)!r}, {self.hf_class}, {type(self.model).__name__})"

    @property
    def run_dir(self) -> Path:
        """The directory, named as a run's is (what the commands print)."""
        return self.path

    @property
    def place(self) -> Path:
        return self.path

    @property
    def kind(self) -> str:
        return f"a Hugging Face {self.hf_class} directory"


@dataclass(repr=False)
class PretrainedLM(PretrainedRun, Continues, Generates, Completes, Evaluates, ShowsAttention, ExportsHF):
    """A causal LM directory (GPT-2, GPT-NeoX, Llama, Mistral, Qwen2): the operations of a kqv LM run, with its
    options and checks (`LMRun`)."""

    names: ClassVar[str] = "causal LM"  # whose directories these are, as a refusal names them

    def evaluate(
        self, data: str | Path | None = None, *, pairs: str | Path | None = None, max_tokens: int | None = None
    ) -> LMEvaluation | PairsEvaluation:
        """The model's loss, perplexity and bits per character on a text file or directory `data` (a directory has
        no held-out split of its own), in blocks of its context, as `LMRun.evaluate` scores text; or its completion
        loss and exact match on a file of `pairs`, as `LMRun.evaluate(pairs=...)` scores them."""
        if pairs is not None:
            check_pairs_alone(data, max_tokens)
            return evaluate_pairs(self.model, self.tokenizer, pairs)
        if data is None:
            raise ConfigError(
                f"{self.path} is a Hugging Face directory, with no held-out text of its own: give the text to score "
                f"({option(DATA_FILE)})"
            )
        return evaluate_text(self.model, self.tokenizer, data, self.model.config.max_len, max_tokens)

    def export_hf(self, directory: str | Path, *, merge: bool = False) -> Path:
        """Write the model again as a Hugging Face directory, as `LMRun.export_hf` writes a run (a Mistral or Qwen2
        as the Llama it computes; `merge`: nothing to merge, a Hugging Face directory has no adapters)."""
        from .export import export_hf

        return export_hf(self.model, self.tokenizer, directory, self.path)

    def attention(self, text: str, *, max_tokens: int = ATTENTION_MAX_TOKENS) -> AttentionMaps:
        """The self-attention weights of every layer and head over `text`, rows and columns labelled by token (a
        text of more than `max_tokens` tokens is refused, as `LMRun.attention` does)."""
        return self_attention(self.model, self.tokenizer, text, max_tokens)


@dataclass(repr=False)
class PretrainedEncoder(PretrainedRun, ShowsAttention):
    """A BERT directory (the bare encoder or its masked-LM head): its self-attention."""

    names: ClassVar[str] = "BERT"  # whose directories these are, as a refusal names them

    def attention(self, text: str, *, max_tokens: int = ATTENTION_MAX_TOKENS) -> AttentionMaps:
        """The self-attention weights of every layer and head over `text`, rows and columns labelled by token (a
        text of more than `max_tokens` tokens is refused, as `LMRun.attention` does)."""
        model = self.model.encoder if isinstance(self.model, MaskedLM) else self.model
        return self_attention(model, self.tokenizer, text, max_tokens)


@dataclass(repr=False)
class PretrainedTranslator(PretrainedRun, Translates):
    """A Marian or BART directory: kqv's beam search over the converted model."""

    names: ClassVar[str] = "Marian and BART"  # whose directories these are, as a refusal names them

    def translate(
        self, sentences: str | Sequence[str], *, beam_size: int | None = None, length_penalty: float | None = None
    ) -> list[str]:
        """A Marian or BART directory's translation of each sentence (one string is one sentence): kqv's beam search
        from the config's decoder start id to its end-of-sentence id, with the MT job's `[decode]` defaults (beam 4,
        at most 1.5 x source + 10 new tokens) unless `beam_size` or `length_penalty` replace them."""
        sentences = [sentences] if isinstance(sentences, str) else list(sentences)
        decode, chosen = self.tokenizer.tokenizer.decode, self.translate_ids(sentences, beam_size, length_penalty)
        return [decode(ids, skip_special_tokens=True) for ids in chosen]

    @torch.no_grad()
    def translate_ids(
        self, sentences: Sequence[str], beam_size: int | None = None, length_penalty: float | None = None
    ) -> list[list[int]]:
        """The target ids of each sentence's translation (`translate`), without the start and end tokens."""
        if beam_size is not None:
            check_at_least(option(BEAM_SIZE), beam_size, 1)
        ids, config = special_ids(self.path), self.model.config
        start_id, eos_id, decode = ids["decoder_start_token_id"], ids["eos_token_id"], DecodeConfig()
        options = {
            "beam_size": decode.beam_size if beam_size is None else beam_size,
            "length_penalty": decode.length_penalty if length_penalty is None else length_penalty,
        }
        translations = []
        for sentence in sentences:
            check_text(option(SENTENCES), sentence)
            src = self.tokenizer.tokenizer.encode(" ".join(sentence.split())).ids
            src = (src[:-1] if src and src[-1] == eos_id else src) + [eos_id]  # the source, then one </s>
            new = int(decode.max_len_a * len(src) + decode.max_len_b)
            if config.position == "learned":
                new = min(new, config.max_len - 1)
            src_ids = torch.tensor([src], device=model_device(self.model))
            out = translate(self.model, src_ids, new, bos_id=start_id, eos_id=eos_id, **options)[0, 1:].tolist()
            translations.append(out[: out.index(eos_id)] if eos_id in out else out)  # after the start token
        return translations


OFFERINGS = (  # the run class of each kind of converted model
    (PretrainedLM, DecoderLM),
    (PretrainedEncoder, (Encoder, MaskedLM)),
    (PretrainedTranslator, EncoderDecoder),
)


def special_ids(path: Path) -> dict[str, int]:
    """The pad, decoder start and end-of-sentence ids of a Marian or BART directory's config.json."""
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    names = ("pad_token_id", "decoder_start_token_id", "eos_token_id")
    missing = [name for name in names if not isinstance(config.get(name), int)]
    if missing:
        raise ConversionError(f"{path}/config.json has no {', '.join(missing)}: kqv needs them to translate")
    return {name: config[name] for name in names}
