"""Autoregressive generation: feed the model its own predictions, one token at a time.

With a KV cache each step runs the model on the newest token only and reuses the keys and values of all earlier
tokens, so a step costs O(time) instead of re-running the whole prefix.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


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
