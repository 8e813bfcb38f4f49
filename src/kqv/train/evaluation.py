"""How good is a language model on held-out text: cross-entropy, perplexity, bits per character."""

from __future__ import annotations

import math
from statistics import NormalDist

import torch
from torch import Tensor, nn

from ..data.batches import iter_eval_batches
from ..errors import DataError
from ..nn.devices import Accelerator, model_device
from .precision import autocast


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
    It runs on the model's device, in `precision` as it stands there.
    """
    if max_tokens is not None and len(ids) > max_tokens + 1:
        n_chars = None if n_chars is None else round(n_chars * max_tokens / (len(ids) - 1))
        ids = ids[: max_tokens + 1]
    was_training = model.training
    model.eval()
    total_nats, total_tokens = 0.0, 0
    device = Accelerator(model_device(model))
    ids = ids.to(device.device)  # the batches are cut where the ids are
    with autocast(precision, device):
        for inputs, targets in iter_eval_batches(ids, batch_size, context):
            mean_loss = model(inputs, targets)  # the model's own loss path, without the (tokens, vocab) logits
            total_nats += mean_loss.item() * targets.numel()
            total_tokens += targets.numel()
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


def wilson_interval(correct: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a proportion `correct` / `n` (Wilson 1927): the p whose normal test does not
    reject correct/n at `level`. Unlike p +- z sqrt(p(1-p)/n) it stays inside [0, 1] and is not empty at 0 or n right,
    which small exact-match counts hit often."""
    if not 0 <= correct <= n or n < 1:
        raise DataError(f"a proportion needs 0 <= correct <= n and n >= 1, got {correct}/{n}")
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p, z2 = correct / n, z * z / n
    centre = (p + z2 / 2) / (1 + z2)
    half = z / (1 + z2) * math.sqrt(p * (1 - p) / n + z2 / (4 * n))
    return max(0.0, centre - half), min(1.0, centre + half)
