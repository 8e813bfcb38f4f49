"""Sampling text from a language model: the `[sample]` section of a run (what to generate at the end of
training), its default prompt (the start of the user's corpus), `samples.txt`, and the generation options and
continuations `kqv generate` and `run.generate` share."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from ..data.tokenizers import Tokenizer
from ..errors import PROMPT, PROMPT_EXAMPLE, DataError, option
from ..nn.devices import model_device
from ..nn.generation import GenerationConfig, check_generation
from ..nn.models import DecoderLM
from ..train.files import write_text
from ..validation import Config
from .base import check_text
from .scoring import BATCH_SIZE, complete


@dataclass
class SampleConfig(Config):
    """What to generate at the end of training, to see what the model learned: `count` samples after `prompt`
    (empty, the default: the start of the corpus, `default_prompt`)."""

    section: ClassVar[str] = "sample"
    prompt: str = ""
    count: int = 3
    max_new_tokens: int = 300
    temperature: float = 0.8
    top_k: int | None = 40

    def check(self) -> None:  # here, not after training: a bad [sample] would waste the whole run
        check_generation(self.__dict__, self.qualified)  # the ranges `kqv generate` takes (GenerationConfig)


SHAKESPEARE_PROMPT = "ROMEO:\n"  # the default corpus's sample prompt: a speaker's name on its line, as the plays
PROMPT_WORDS, PROMPT_CHARS = 3, 40  # another corpus's: its first words, at most this many


def default_prompt(path: str | Path | None, tokenizer: Tokenizer, train: torch.Tensor) -> str:
    """The sample prompt of a config that gives none, from its corpus at `path` (None: Shakespeare) and the ids
    of its training split `train`: "ROMEO:\\n" on Shakespeare (the default corpus), else the corpus's first words
    (up to `PROMPT_WORDS` of its first line with any, `PROMPT_CHARS` characters), as its text writes them: its own
    characters, which its tokenizer encodes."""
    if path is None:
        return SHAKESPEARE_PROMPT
    start = tokenizer.decode(train[:256].tolist()).rstrip("\ufffd")  # a byte-level BPE's cut character
    words = re.search(rf"\S+(?:[ \t]+\S+){{0,{PROMPT_WORDS - 1}}}", start)
    return words.group()[:PROMPT_CHARS] if words else start[:1]


def sample_texts(model: DecoderLM, tokenizer: Tokenizer, sample: SampleConfig) -> list[str]:
    """`sample.count` continuations of `sample.prompt`, sampled as [sample] says from one generator seeded with 0."""
    generator = torch.Generator(model_device(model)).manual_seed(0)
    texts = [
        generate_text(
            model,
            tokenizer,
            sample.prompt,
            sample.max_new_tokens,
            temperature=sample.temperature,
            top_k=sample.top_k,
            generator=generator,
        )
        for _ in range(sample.count)
    ]
    return texts


def save_samples(path: Path, texts: list[str]) -> None:
    """samples.txt: the samples one after another, each ended by a line of ===== before the next."""
    write_text(path, "\n\n=====\n\n".join(texts) + "\n")


def generation_config(model: DecoderLM, config: GenerationConfig | None, options: dict[str, Any]) -> GenerationConfig:
    """`config` (default: GenerationConfig's defaults) with `options` changed, checked. On learned positions a
    `max_new_tokens` past the limit is first lowered to it: `generate_text` caps it at the model's max_len anyway."""
    values = {**(config or GenerationConfig()).to_dict(), **options}
    new, limit = values.get("max_new_tokens"), GenerationConfig.limits.max_new_tokens
    if model.config.position == "learned" and type(new) is int and new > limit:
        values["max_new_tokens"] = limit
    return GenerationConfig.from_dict(values)


def continuations(model: DecoderLM, tokenizer: Tokenizer, prompt: str, config: GenerationConfig) -> list[str]:
    """`config.count` continuations of `prompt` (each with the prompt), sampled one after another from one
    generator seeded with `config.seed`: what `LMRun.generate` and a GPT-2 directory's `generate` return."""
    check_text(option(PROMPT), prompt)
    generator = torch.Generator(model_device(model)).manual_seed(config.seed)
    options = {**config.sampling, "use_cache": config.use_cache, "dtype": config.torch_dtype}
    return [
        generate_text(model, tokenizer, prompt, config.max_new_tokens, generator=generator, **options)
        for _ in range(config.count)
    ]


def generate_text(model: DecoderLM, tokenizer: Tokenizer, prompt: str, max_new_tokens: int, **options: Any) -> str:
    """The prompt and its continuation, as text."""
    if not prompt:
        example = option(PROMPT_EXAMPLE)
        raise DataError(f"the prompt is empty; give at least one character (e.g. {example})")
    ids = torch.tensor([tokenizer.encode(prompt)], device=model_device(model))
    config = model.config
    if config.position == "learned":
        max_new_tokens = min(max_new_tokens, config.max_len - ids.shape[1] + 1)
    model.eval()
    return tokenizer.decode(model.generate(ids, max_new_tokens, **options)[0].tolist())


class Continues:
    """`generate` and `complete` for a run that holds a `DecoderLM` (`model`) and its `tokenizer`: a trained
    run's (`LMRun`) and a Hugging Face GPT-2 directory's (`PretrainedLM`) alike."""

    model: DecoderLM
    tokenizer: Tokenizer

    def generate(self, prompt: str, config: GenerationConfig | None = None, **options: Any) -> list[str]:
        """`count` continuations of `prompt` (each with the prompt), sampled one after another from one generator
        seeded with `seed`: the options of `config` (a `GenerationConfig`; default its defaults) with `options`
        (max_new_tokens=300, temperature=0.8, top_k, top_p, count=1, seed=0, use_cache=True, dtype="fp32")
        changed. `temperature=0` is greedy; `dtype` "bf16" or "int8" generates in lower precision."""
        return continuations(self.model, self.tokenizer, prompt, generation_config(self.model, config, options))

    def complete(
        self,
        prompts: list[str],
        config: GenerationConfig | None = None,
        *,
        batch_size: int = BATCH_SIZE,
        **options: Any,
    ) -> list[str]:
        """The completion of each prompt, without the prompt and without the end of text it stopped at (the
        tokenizer's <|endoftext|> or <eos>, else a character tokenizer's newline: `kqv.data.completions`), or
        after `max_new_tokens`. The options are `generate`'s, with its defaults (`temperature=0` is greedy);
        prompts go `batch_size` at a time, left-padded (`kqv.jobs.scoring.complete`)."""
        return complete(self.model, self.tokenizer, prompts, generation_config(self.model, config, options), batch_size)
