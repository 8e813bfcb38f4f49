"""Autoregressive generation: feed the model its own predictions, one token at a time.

With a KV cache each step runs the model on the newest token only and reuses the keys and values of all earlier
tokens, so a step costs O(time) instead of re-running the whole prefix.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .search import search


def sample_next(logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                generator: torch.Generator | None = None) -> Tensor:
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
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def check_generation_options(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


@torch.no_grad()
def generate(model: nn.Module, ids: Tensor, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, eos_id: int | None = None,
             use_cache: bool = True, generator: torch.Generator | None = None) -> Tensor:
    """Continue each prompt in ids (batch, time) by up to max_new_tokens tokens; returns (batch, time + new).

    Prompts in a batch share one length. A sequence that emits `eos_id` is padded with it from then on, and
    generation stops early once every sequence has.
    """
    check_generation_options(max_new_tokens, temperature, top_k, top_p)
    config = model.config
    if config.position == "learned" and ids.shape[-1] + max_new_tokens - 1 > config.max_len:
        raise ValueError(
            f"prompt of {ids.shape[-1]} tokens + {max_new_tokens} new tokens exceeds max_len={config.max_len} of "
            f"learned positions; ask for at most {config.max_len - ids.shape[-1] + 1} new tokens or shorten the prompt"
        )
    cache = model.new_cache() if use_cache else None
    finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    logits = model(ids, cache=cache)[:, -1]
    for step in range(max_new_tokens):
        next_ids = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        if eos_id is not None:
            next_ids = next_ids.masked_fill(finished, eos_id)
            finished |= next_ids == eos_id
        ids = torch.cat((ids, next_ids[:, None]), dim=1)
        if step == max_new_tokens - 1 or finished.all():
            break
        logits = model(next_ids[:, None] if use_cache else ids, cache=cache)[:, -1]
    return ids


# ---------------------------------------------------------------------------------------------------------------
# Encoder-decoder: greedy and beam search (kqv.nn.search)


def reorder_cache(cache: list, index: Tensor) -> None:
    """Keep the cached keys and values of the rows `index` (batch * beams,), in that order, in every layer."""
    for layer in cache:
        for part in layer:
            if part.keys is not None:
                part.keys, part.values = part.keys.index_select(0, index), part.values.index_select(0, index)


class EncoderDecoderStepper:
    """The `kqv.nn.search.Stepper` of an `EncoderDecoder`: the encoder runs once; each step runs the decoder on the
    newest tokens with the KV cache (or, with use_cache=False, on the whole prefix; slower, the same result)."""

    def __init__(self, model: nn.Module, src_ids: Tensor, src_mask: Tensor | None, use_cache: bool):
        self.model, self.src_mask = model, src_mask
        self.memory = model.encode(src_ids, src_mask)  # (batch, src_time, d_model)
        self.cache = model.new_cache() if use_cache else None
        self.prefixes: Tensor | None = None  # every token so far, kept only without a cache

    def step(self, last_ids: Tensor) -> Tensor:
        ids = last_ids[:, None]
        if self.cache is None:
            ids = self.prefixes = ids if self.prefixes is None else torch.cat((self.prefixes, ids), dim=1)
        logits = self.model.decode(ids, self.memory, self.src_mask, cache=self.cache)[:, -1]  # (rows, vocab)
        return logits.float().log_softmax(dim=-1)

    def reorder(self, rows: Tensor) -> None:
        self.memory = self.memory.index_select(0, rows)
        self.src_mask = None if self.src_mask is None else self.src_mask.index_select(0, rows)
        self.prefixes = None if self.prefixes is None else self.prefixes.index_select(0, rows)
        if self.cache is not None:
            reorder_cache(self.cache, rows)


@torch.no_grad()
def translate(model: nn.Module, src_ids: Tensor, max_new_tokens: int, *, bos_id: int, eos_id: int,
              beam_size: int = 1, length_penalty: float = 1.0, src_mask: Tensor | None = None,
              use_cache: bool = True) -> Tensor:
    """Decode a target for each source in src_ids (batch, src_time): (batch, 1 + up to max_new_tokens) ids that
    start with bos_id and are padded with eos_id after the end. Beam size 1 is greedy decoding; the beam search
    and its length penalty are `kqv.nn.search`'s, shared with the LSTM baseline.
    """
    check_generation_options(max_new_tokens, 1.0, None, None)
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size!r}")
    config = model.config
    if config.position == "learned" and max_new_tokens > config.max_len:
        raise ValueError(f"max_new_tokens={max_new_tokens} exceeds max_len={config.max_len} of learned positions")
    stepper = EncoderDecoderStepper(model, src_ids, src_mask, use_cache)
    return search(stepper, src_ids.shape[0], max_new_tokens, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size,
                  length_penalty=length_penalty, device=src_ids.device)
