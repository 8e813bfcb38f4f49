"""A Hugging Face checkpoint directory used like a run: `kqv.load(DIR)` converts the model offline
(`kqv.interop.from_hf`, safetensors only) and reads the tokenizer saved beside it (`tokenizer.json`).

A GPT-2 directory continues prompts (`generate`) and shows its self-attention (`attention`); a BERT directory
shows its self-attention. The numbers are kqv's own model's, which equal the Hugging Face model's
(`tests/test_interop.py`); nothing is downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer as HFTokenizer
from torch import nn

from ..data.tokenizers import BPETokenizer
from ..errors import ConversionError, RunError
from ..interop import from_hf
from ..nn.devices import Accelerator, model_device
from ..nn.heads import MaskedLM
from ..nn.models import DecoderLM, Encoder
from .base import AttentionMaps
from .lm import generate_text, self_attention

HF_TOKENIZER_FILE = "tokenizer.json"


def is_hf_directory(path: str | Path) -> bool:
    """Whether `path` is a Hugging Face model directory (a config.json) rather than a kqv run (a run.toml)."""
    path = Path(path)
    return (path / "config.json").is_file() and not (path / "run.toml").exists()


@dataclass
class PretrainedRun:
    """A converted Hugging Face model with its tokenizer: the operations of a kqv run that apply to it."""

    model: nn.Module
    tokenizer: BPETokenizer
    path: Path
    hf_class: str

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu") -> PretrainedRun:
        """The Hugging Face directory `path`, converted, its model on `device` (`Accelerator.resolve`)."""
        path, device = Path(path), Accelerator.resolve(device).device
        if not (path / HF_TOKENIZER_FILE).is_file():
            raise ConversionError(
                f"{path} has no {HF_TOKENIZER_FILE}: save the tokenizer beside the model "
                f"(tokenizer.save_pretrained('{path}') with a fast tokenizer) so that kqv can read text"
            )
        try:  # the tokenizers library raises a bare Exception on a file it cannot read
            hf_class = (json.loads((path / "config.json").read_text()).get("architectures") or ["?"])[0]
            tokenizer = BPETokenizer(HFTokenizer.from_file(str(path / HF_TOKENIZER_FILE)))
        except Exception as error:  # noqa: BLE001
            raise ConversionError(f"kqv cannot read {path}'s config.json and {HF_TOKENIZER_FILE}: {error}") from None
        return cls(from_hf(path).eval().to(device), tokenizer, path, hf_class)

    def __repr__(self) -> str:
        return f"PretrainedRun({str(self.path)!r}, {self.hf_class}, {type(self.model).__name__})"

    def generate(
        self,
        prompt: str,
        *,
        max_new_tokens: int = 50,
        temperature: float = 0.8,
        top_k: int | None = None,
        top_p: float | None = None,
        count: int = 1,
        seed: int = 0,
    ) -> list[str]:
        """`count` continuations of `prompt` (each with the prompt), as `LMRun.generate` makes them."""
        if not isinstance(self.model, DecoderLM):
            raise self.not_offered("generate", "GPT-2 directories")
        generator = torch.Generator(model_device(self.model)).manual_seed(seed)
        options = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "generator": generator}
        return [generate_text(self.model, self.tokenizer, prompt, max_new_tokens, **options) for _ in range(count)]

    def attention(self, text: str) -> AttentionMaps:
        """The self-attention weights of every layer and head over `text`, rows and columns labelled by token."""
        model = self.model.encoder if isinstance(self.model, MaskedLM) else self.model
        if not isinstance(model, (DecoderLM, Encoder)):
            raise self.not_offered("attention", "GPT-2 and BERT directories")
        return self_attention(model, self.tokenizer, text)

    def evaluate(self, *args: object, **options: object) -> None:
        raise self.not_offered("evaluate", "kqv runs")

    def translate(self, *args: object, **options: object) -> None:
        raise self.not_offered("translate", "kqv translation runs")

    def not_offered(self, operation: str, where: str) -> RunError:
        return RunError(f"{self.path} is a Hugging Face {self.hf_class} directory; {operation} works on {where}")
