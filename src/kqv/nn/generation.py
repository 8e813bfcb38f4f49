"""Autoregressive generation: feed the model its own predictions, one token at a time.

With a KV cache each step runs the model on the newest token only and reuses the keys and values of all earlier
tokens, so a step costs O(time) instead of re-running the whole prefix.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from ..errors import BFLOAT16, GENERATION_OPTIONS, MODEL_ON_CPU, ConfigError, DataError
from ..errors import option as worded
from ..validation import Config, check_seed
from .checks import check_ids
from .decoding import DecodeStep
from .devices import model_device
from .experts import with_auxiliary_loss
from .losses import linear_cross_entropy
from .search import search


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick the next token from logits (batch, vocab): greedy at temperature 0, else sample from the softmax of
    logits / temperature restricted to the k most likely tokens and/or the smallest set with probability >= p."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth_best = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    if top_p is not None:
        sorted_probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p  # the tokens before this one already hold probability p
        logits = logits.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
    probs = logits.softmax(dim=-1)
    try:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    except RuntimeError:  # checked only on failure: a check before every token would cost a sync on a GPU
        if torch.isfinite(probs).all():
            raise
        raise DataError(
            "the model's next-token probabilities are not finite (nan or inf): its weights have diverged or "
            "overflow on this input; train it again with a lower train.lr, resume from an earlier checkpoint, or "
            "generate greedily (temperature 0) to see what it does"
        ) from None


# -- the options of a generation: one config, checked once, for the API, the command line and the explorer -----

GENERATION_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "int8": torch.qint8}  # --dtype: the weights' precision


@dataclass(frozen=True)
class GenerationLimits:
    """The most one generation may ask for. The defaults bound what `kqv generate` and `LMRun.generate` take; a
    server (the explorer) sets tighter ones on the same `GenerationConfig` (`kqv.explore.subjects.ServedGeneration`)."""

    max_new_tokens: int = 100_000  # the tokens (and the attention cache) are allocated for the whole length up front
    count: int = 10_000  # continuations are sampled one after another: more would run for days


@dataclass(frozen=True)
class GenerationConfig(Config):
    """How to continue a prompt: `count` continuations of up to `max_new_tokens` tokens each, sampled one after
    another from one generator seeded with `seed`, at `temperature` (0 = greedy) among the `top_k` most likely
    tokens and/or the smallest set of probability `top_p`; `use_cache` reuses the keys and values of earlier
    tokens (the KV cache), `dtype` "bf16" or "int8" runs lower-precision weights. Made, it is valid: every option
    is checked against its type and its range (`generation_ranges`) within the class's `limits`, and a bad one is
    a one-line ConfigError that names it as the caller wrote it (`--max-new-tokens` on the command line,
    `max_new_tokens` in Python and in the explorer's requests)."""

    max_new_tokens: int = 300
    temperature: float = 0.8
    top_k: int | None = None
    top_p: float | None = None
    count: int = 1
    seed: int = 0
    use_cache: bool = True
    dtype: Literal["bf16", "fp32", "int8"] = "fp32"

    limits: ClassVar[GenerationLimits] = GenerationLimits()

    def qualified(self, name: str) -> str:
        return option_name(name)

    def check(self) -> None:
        check_generation(self.__dict__, self.qualified, self.limits)

    @classmethod
    def ranges(cls) -> dict[str, str]:
        """How messages state each option's valid values, within this class's limits."""
        return generation_ranges(cls.limits)

    @property
    def sampling(self) -> dict[str, Any]:
        """The options `sample_next` takes."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The dtype `generate` runs the weights in (None: as they are)."""
        return GENERATION_DTYPES[self.dtype]


def option_name(name: str) -> str:
    """A generation option as the caller spells it: `--max-new-tokens` on the command line, else `max_new_tokens`."""
    return worded(GENERATION_OPTIONS[name])


def generation_ranges(limits: GenerationLimits) -> dict[str, str]:
    """The valid values of each checked generation option, as messages state them."""
    return {
        "max_new_tokens": f"an integer from 1 to {limits.max_new_tokens:,}",
        "temperature": "0 (greedy) or a number from 0.001 to 100",  # logits / temperature stays finite in float32
        "top_k": "an integer of at least 1",
        "top_p": "a number greater than 0 and at most 1",
        "count": f"an integer from 1 to {limits.count:,}",
        "seed": "an integer from 0 to 2**63 - 1",
    }


def check_generation(
    values: Mapping[str, Any], name: Callable[[str], str] = option_name, limits: GenerationLimits = GenerationLimits()
) -> None:
    """Refuse (ConfigError) a generation option in `values` outside its range (`generation_ranges`); the types are
    checked already (by `GenerationConfig`'s annotations, or a [sample] section's). `name(option)` is how the
    message names it. The one check of generation options: `GenerationConfig` and the LM job's [sample] use it."""
    ranges = generation_ranges(limits)
    valid = {
        "max_new_tokens": lambda n: 1 <= n <= limits.max_new_tokens,
        "temperature": lambda t: t == 0 or 0.001 <= t <= 100,
        "top_k": lambda k: k is None or k >= 1,
        "top_p": lambda p: p is None or 0 < p <= 1,
        "count": lambda n: 1 <= n <= limits.count,
    }
    for option, fits in valid.items():
        if option in values and not fits(values[option]):
            hint = ""
            if option == "max_new_tokens" and values[option] > limits.max_new_tokens:
                hint = "; to go on, generate again with the output as the prompt"
            raise ConfigError(f"{name(option)} must be {ranges[option]}, got {values[option]!r}{hint}")
    if "seed" in values:
        check_seed(name("seed"), values["seed"])


class PromptLayout:
    """Where the tokens of a batch of prompts sit in one (batch, prompt + max_new_tokens) buffer, made once.

    Prompts of different lengths are left-padded: `attention_mask` (batch, prompt) is 0 on each row's leading
    padding. Every row then ends at the same column, so each step writes one new column for all rows. `positions`
    (total,) are buffer columns; `left_padding` (batch,) shifts each row's absolute positions back to 0 at its first
    real token. Masks are views of one precomputed (batch, total) "is a token" table, never rebuilt per step.
    """

    def __init__(self, attention_mask: Tensor | None, ids: Tensor, total: int):
        self.positions = torch.arange(total, device=ids.device)
        self.left_padding = self.keep = None
        if attention_mask is None:
            return
        check_left_padding(attention_mask, ids)
        keep = torch.ones(ids.shape[0], total, dtype=torch.bool, device=ids.device)
        keep[:, : ids.shape[1]] = attention_mask.bool()
        self.keep, self.left_padding = keep, ids.shape[1] - attention_mask.sum(dim=1)

    def mask(self, start: int, end: int) -> Tensor | None:
        """The bool mask (batch, 1, end - start, end) of queries start..end-1 over keys 0..end-1: causal, padding
        keys hidden, and a padding query sees itself (so no row of the softmax is empty). None without padding."""
        if self.keep is None:
            return None
        if end - start == 1:
            return self.keep[:, None, None, :end]  # the newest token: every real key, no causal mask needed
        queries = self.positions[start:end, None]
        keys = self.positions[None, :end]
        visible = (keys <= queries) & (self.keep[:, None, :end] | (keys == queries))  # (batch, q, k)
        return visible[:, None]


def check_left_padding(attention_mask: Tensor, ids: Tensor) -> None:
    if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != tuple(ids.shape):
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
        raise DataError(f"attention_mask must have the shape of the prompts {tuple(ids.shape)}, got {shape}")
    keep = attention_mask.long()
    if not ((keep == 0) | (keep == 1)).all():
        raise DataError("attention_mask must contain only 1 (token) and 0 (padding)")
    if (keep.diff(dim=1) < 0).any() or (keep[:, -1] == 0).any():
        raise DataError(
            "generation takes prompts padded on the left (0 0 1 1 1): every row must end with its "
            "prompt's last token, where the new tokens follow"
        )


def in_dtype(model: nn.Module, dtype: torch.dtype | None) -> nn.Module:
    """The model itself, or a copy for inference with lower-precision weights (the model is untouched):
    a floating-point dtype such as torch.bfloat16 casts every weight; torch.qint8 quantises the weights of every
    `nn.Linear` to int8 (torch's dynamic quantisation: int8 matmuls, activations quantised per call; embeddings,
    norms and attention stay fp32), which reads a quarter of the bytes of fp32 per token. torch's dynamic
    quantisation runs on the CPU only: int8 for a model on another device is a ConfigError saying what to use."""
    if dtype == torch.qint8:
        device = model_device(model)
        if device.type != "cpu":
            raise ConfigError(
                f"int8 generation runs on the CPU only (torch's dynamic quantisation has no {device.type} kernels), "
                f"and this model is on {device}: use {worded(MODEL_ON_CPU)} for int8, or "
                f"{worded(BFLOAT16)} on the GPU"
            )
        with warnings.catch_warnings():  # torch.ao's quantisation is deprecated upstream, and pinned here
            warnings.simplefilter("ignore")
            return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    if dtype is None or all(p.dtype == dtype for p in model.parameters()):
        return model
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConfigError(
            f"dtype must be a floating-point torch.dtype such as torch.bfloat16, or torch.qint8, got {dtype!r}"
        )
    return copy.deepcopy(model).to(dtype)


@torch.no_grad()
def generate(
    model: nn.Module,
    ids: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    attention_mask: Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Continue each prompt in ids (batch, time) by up to max_new_tokens tokens; returns (batch, time + new).

    Prompts of different lengths are left-padded, with `attention_mask` (batch, time) 0 on the padding. A sequence
    that emits `eos_id` is padded with it from then on, and generation stops early once every sequence has.
    `dtype` (torch.bfloat16, or torch.qint8 for int8 weights) runs a copy of the model with lower-precision
    weights (`in_dtype`). The new tokens are
    written into one preallocated buffer, and the cache reserves every position up front.
    """
    GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p)  # checked
    check_ids(ids, model.config.vocab_size)
    config = model.config
    if config.position == "learned" and ids.shape[-1] + max_new_tokens - 1 > config.max_len:
        raise DataError(
            f"prompt of {ids.shape[-1]} tokens + {max_new_tokens} new tokens exceeds max_len={config.max_len} of "
            f"learned positions; ask for at most {config.max_len - ids.shape[-1] + 1} new tokens or shorten the prompt"
        )
    batch, prompt = ids.shape
    total = prompt + max_new_tokens
    layout = PromptLayout(attention_mask, ids, total)
    model = in_dtype(model, dtype)
    with torch.inference_mode():  # no autograd bookkeeping at all: ~10% of a small model's decoding step
        tokens = ids.new_empty(batch, total)  # (batch, total): the prompts, then one new column per step
        tokens[:, :prompt] = ids
        cache = model.new_cache(total) if use_cache else None
        lean = use_cache and max_new_tokens > 1 and DecodeStep.supports(model)  # the prompt's step is the general one
        fast_step = DecodeStep(model, cache, batch) if lean else None
        finished = torch.zeros(batch, dtype=torch.bool, device=ids.device)
        end = prompt
        for step in range(max_new_tokens):
            start = end - 1 if use_cache and step else 0
            if fast_step is not None and step:
                logits = fast_step(
                    tokens.narrow(1, start, 1),
                    layout.positions.narrow(0, start, 1),
                    layout.mask(start, end),
                    layout.left_padding,
                )
            else:
                logits = model.next_token_logits(
                    tokens[:, start:end],
                    cache,
                    positions=layout.positions[start:end],
                    attention_mask=layout.mask(start, end),
                    left_padding=layout.left_padding,
                )
            next_ids = sample_next(
                logits.float(), temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
            )
            if eos_id is not None:
                next_ids = next_ids.masked_fill(finished, eos_id)
                finished |= next_ids == eos_id
            tokens.select(1, end).copy_(next_ids)  # tokens[:, end] = next_ids, without Python indexing
            end += 1
            if eos_id is not None and finished.all():
                break
    return tokens[:, :end].clone()  # a normal tensor again, which callers may change in place


# ---------------------------------------------------------------------------------------------------------------
# Encoder-decoder: greedy and beam search (kqv.nn.search)


def reorder_cache(cache: list, index: Tensor) -> None:
    """Keep the cached keys and values of the rows `index` (batch * beams,), in that order, in every layer."""
    for layer in cache:
        for part in layer:
            part.select(index)


class EncoderDecoderStepper:
    """The `kqv.nn.search.Stepper` of an `EncoderDecoder`: the encoder runs once; each step runs the decoder on the
    newest tokens with the KV cache (or, with use_cache=False, on the whole prefix; slower, the same result)."""

    def __init__(self, model: nn.Module, src_ids: Tensor, src_mask: Tensor | None, use_cache: bool, capacity: int = 0):
        self.model, self.src_mask = model, src_mask
        self.memory = model.encode(src_ids, src_mask)  # (batch, src_time, d_model)
        self.cache = model.new_cache(capacity) if use_cache else None
        self.prefixes: Tensor | None = None  # every token so far, kept only without a cache

    def step(self, last_ids: Tensor) -> Tensor:
        ids = last_ids[:, None]
        if self.cache is None:
            ids = self.prefixes = ids if self.prefixes is None else torch.cat((self.prefixes, ids), dim=1)
        hidden = self.model.decode_hidden(ids, self.memory, self.src_mask, cache=self.cache)
        logits = self.model.lm_head(hidden)[:, -1]  # (rows, vocab)
        return logits.float().log_softmax(dim=-1)

    def reorder(self, rows: Tensor) -> None:
        self.memory = self.memory.index_select(0, rows)
        self.src_mask = None if self.src_mask is None else self.src_mask.index_select(0, rows)
        self.prefixes = None if self.prefixes is None else self.prefixes.index_select(0, rows)
        if self.cache is not None:
            reorder_cache(self.cache, rows)


@torch.no_grad()
def translate(
    model: nn.Module,
    src_ids: Tensor,
    max_new_tokens: int,
    *,
    bos_id: int,
    eos_id: int,
    beam_size: int = 1,
    length_penalty: float = 1.0,
    src_mask: Tensor | None = None,
    use_cache: bool = True,
) -> Tensor:
    """Decode a target for each source in src_ids (batch, src_time): (batch, 1 + up to max_new_tokens) ids that
    start with bos_id and are padded with eos_id after the end. Beam size 1 is greedy decoding; a larger beam is
    `kqv.nn.search.beam_search`, where finished hypotheses are ranked by their summed log-probability divided by
    length ** length_penalty (length counts the generated tokens, eos included). The model gives the search its
    `stepper`; `use_cache=False` re-runs the decoder over the whole prefix at every step instead of carrying a
    KV cache or an LSTM state (slower, the same result; for tests).
    """
    GenerationConfig(max_new_tokens=max_new_tokens)  # checked
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ConfigError(f"beam_size must be a positive integer, got {beam_size!r}")
    stepper = model.stepper(src_ids, src_mask, use_cache, max_new_tokens)
    return search(
        stepper,
        src_ids.shape[0],
        max_new_tokens,
        bos_id=bos_id,
        eos_id=eos_id,
        beam_size=beam_size,
        length_penalty=length_penalty,
        device=src_ids.device,
    )


class Translator(nn.Module):
    """What the translation models share (`kqv.EncoderDecoder` and the LSTM baseline `kqv.nn.rnn.RNNEncoderDecoder`):
    teacher-forced logits or loss from the decoder's last states (`decoder_states`) through `lm_head`, and
    `generate`, which is `translate` through the model's `stepper(src_ids, src_mask, use_cache, max_new_tokens)`."""

    lm_head: nn.Linear

    def decoder_states(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None):
        """The decoder's last states (batch, tgt_time, d_out) for tgt_ids given the sources, before `lm_head`."""
        raise NotImplementedError

    def forward(
        self,
        src_ids: Tensor,
        tgt_ids: Tensor,
        targets: Tensor | None = None,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> Tensor:
        """src_ids (batch, src_time), tgt_ids (batch, tgt_time) -> logits (batch, tgt_time, tgt_vocab), or the mean
        cross-entropy when targets are given (-100 = ignore; label-smoothed by `label_smoothing`, plus the experts'
        load-balancing loss in training). src_mask / tgt_mask: 1 = real token, 0 = padding."""
        hidden = self.decoder_states(src_ids, tgt_ids, src_mask, tgt_mask)
        if targets is None:
            return self.lm_head(hidden)
        loss = linear_cross_entropy(hidden, self.lm_head, targets, label_smoothing=label_smoothing)
        return with_auxiliary_loss(self, loss)

    generate = translate  # `translate` itself, the model its first argument
