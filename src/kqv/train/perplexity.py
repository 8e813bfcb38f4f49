"""How good is a language model on held-out text: cross-entropy, perplexity, bits per token and per character,
every token scored once (`perplexity`); and the progress bar a long scoring shows (`showing_progress`). The
statistics of exact-match scores (intervals, paired differences, tests) are `kqv.train.score_statistics`'."""

from __future__ import annotations

import contextvars
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from tqdm import tqdm

from ..data.batches import iter_eval_batches
from ..nn.devices import Accelerator, model_device
from .precision import autocast

_PROGRESS: contextvars.ContextVar[bool] = contextvars.ContextVar("kqv_evaluation_progress", default=False)
PROGRESS_DELAY_S = 2.0  # a scoring that ends sooner shows no bar


@contextmanager
def showing_progress() -> Iterator[None]:
    """Within the block, a long scoring (`perplexity`) shows a progress bar on standard error, as training does
    where that is a terminal (`kqv eval`): a function called from Python prints nothing otherwise."""
    token = _PROGRESS.set(True)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def scoring_bar(total: int, unit: str = "tok") -> tqdm:
    """The bar of a scoring of `total` tokens (or prompts, `unit`): shown inside `showing_progress`, on a terminal,
    once it has taken `PROGRESS_DELAY_S`; gone when it ends."""
    shown = _PROGRESS.get() and sys.stderr.isatty()
    return tqdm(
        total=total, unit=unit, unit_scale=True, desc="scoring", delay=PROGRESS_DELAY_S, leave=False, disable=not shown
    )


@torch.no_grad()
def perplexity(
    model: nn.Module,
    ids: Tensor,
    *,
    context: int,
    batch_size: int = 16,
    n_chars: int | None = None,
    precision: str = "fp32",
    max_tokens: int | None = None,
) -> dict[str, float]:
    """Score every next token of `ids` (1-D) once, in non-overlapping blocks of `context` tokens.

    Returns the mean loss in nats per token, the perplexity exp(loss), bits per token, and, given the number of
    characters the ids encode, bits per character (comparable across tokenizers). `max_tokens` scores a prefix.
    It runs on the model's device, in `precision` as it stands there; inside `showing_progress`, a long one shows
    a bar.
    """
    if max_tokens is not None and len(ids) > max_tokens + 1:
        n_chars = None if n_chars is None else round(n_chars * max_tokens / (len(ids) - 1))
        ids = ids[: max_tokens + 1]
    was_training = model.training
    model.eval()
    total_nats, total_tokens = 0.0, 0
    device = Accelerator(model_device(model))
    ids = ids.long().to(device.device)  # the batches are cut where the ids are (a memmap's uint16: widened here)
    with autocast(precision, device), scoring_bar(len(ids) - 1) as bar:
        for inputs, targets in iter_eval_batches(ids, batch_size, context):
            mean_loss = model(inputs, targets)  # the model's own loss path, without the (tokens, vocab) logits
            total_nats += mean_loss.item() * targets.numel()
            total_tokens += targets.numel()
            bar.update(targets.numel())
    model.train(was_training)
    loss = total_nats / total_tokens
    result = {
        "loss": loss,
        "perplexity": math.exp(loss) if loss < 709 else math.inf,  # exp overflows a float past 709.78
        "bits_per_token": loss / math.log(2),
        "tokens": total_tokens,
    }
    if n_chars:
        result["bits_per_char"] = total_nats / math.log(2) / n_chars
    return result
