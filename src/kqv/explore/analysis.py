"""The numbers behind the explorer's views, computed from a model's attention weights and logits.

Everything here takes tensors and returns plain lists and dicts, ready to be sent as JSON: the page draws what it
is given and computes nothing of its own, so a test can check the page's numbers against the model's.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor

from ..errors import MAX_TOKENS, DataError, option
from ..jobs.base import check_text as check_unicode

DECIMALS = 6  # weights and probabilities are sent rounded to 1e-6
TAG_THRESHOLD = 0.5  # a head is tagged when it puts at least this much weight, on average, on one pattern
UNIFORM_THRESHOLD = 0.9  # ... or when its entropy is at least this fraction of the largest possible


def rounded(tensor: Tensor) -> list:
    """A tensor as nested lists of floats rounded to DECIMALS places (JSON stays small and exact enough)."""
    return torch.round(tensor.detach().double(), decimals=DECIMALS).tolist()


# How the weights travel: as nested lists of numbers ("lists", the API's default), or, when the page asks for it
# ("micros"), as the same numbers in millionths, little-endian uint32, base64: at 1,024 tokens the lists are 54 MB
# of JSON that take seconds to write and parse; the millionths are decoded by the page to the very same numbers
# (k / 1e6 is the double nearest the 6-decimal value, as JSON's parse of it). Set per request by the app
# (`weights_as`), read by attention_view: the subjects need not know.
WIRE: ContextVar[str] = ContextVar("kqv_explore_wire", default="lists")
WIRE_FORMATS = ("lists", "micros")
NOT_FINITE = 0xFFFFFFFF  # a NaN or infinite weight in millionths (the lists send null)


@contextmanager
def weights_as(wire: str) -> Iterator[None]:
    """Within the block, attention_view sends weights as `wire` ("lists" or "micros")."""
    if wire not in WIRE_FORMATS:
        raise DataError(f"weights must be one of {list(WIRE_FORMATS)}, got {wire!r}")
    token = WIRE.set(wire)
    try:
        yield
    finally:
        WIRE.reset(token)


def micros(tensor: Tensor) -> dict[str, Any]:
    """Weights (layers, heads, q_time, k_time) in [0, 1] as {"encoding": "micros", "shape", "data"}: the weights in
    millionths as little-endian uint32, base64 (non-finite ones as NOT_FINITE)."""
    scaled = torch.round(tensor.detach().double() * 10**DECIMALS)
    finite = torch.isfinite(scaled)
    values = torch.where(finite, scaled, torch.full_like(scaled, NOT_FINITE)).to(torch.int64).numpy().astype("<u4")
    return {"encoding": "micros", "shape": list(tensor.shape), "data": base64.b64encode(values.tobytes()).decode()}


def stack_layers(weights: Sequence[Tensor]) -> Tensor:
    """Per-layer weights, each (batch=1, heads, q_time, k_time) or (heads, q_time, k_time) -> (layers, heads, q, k)."""
    return torch.stack([w[0] if w.dim() == 4 else w for w in weights]).float()


def head_statistics(weights: Tensor, self_attention: bool = True) -> list[dict[str, Any]]:
    """Per head of weights (layers, heads, q_time, k_time), rows summing to 1: what the head tends to do.

    * entropy: -sum_j w_ij log w_ij in nats, averaged over the queries i (0 = each query looks at one token);
    * max_weight: the largest weight of a row, averaged over queries;
    and, for self-attention (queries and keys are the same tokens):
    * distance: sum_j w_ij |i - j|, the mean distance to the attended tokens, averaged over queries;
    * previous: w_{i,i-1}, the weight on the previous token, averaged over queries i >= 1;
    * first: w_{i,0}, the weight on the first token, averaged over queries i >= 1 (query 0 of a causal model
      can only look at token 0);
    * self: w_ii, the weight on the token itself.
    `tags` name the patterns a head follows (weight >= TAG_THRESHOLD on it), and "uniform" when its entropy is at
    least UNIFORM_THRESHOLD of the entropy of spreading evenly over the tokens it can see.
    """
    layers, heads, q_time, k_time = weights.shape
    plogp = torch.where(weights > 0, weights * weights.clamp_min(1e-30).log(), torch.zeros_like(weights))
    entropy = -plogp.sum(-1)  # (layers, heads, q_time)
    visible = (weights > 0).sum(-1).clamp_min(1).float()  # keys each query can see (causal: i + 1)
    spread = torch.where(visible > 1, entropy / visible.log().clamp_min(1e-12), torch.ones_like(entropy))
    rows = {"entropy": entropy.mean(-1), "max_weight": weights.amax(-1).mean(-1)}
    several = (visible > 1).float()  # rows where spreading is possible at all
    uniform = (spread * several).sum(-1) / several.sum(-1) if bool(several.any()) else None
    if self_attention:
        positions = torch.arange(q_time, dtype=torch.float32, device=weights.device)
        distance = (positions[:, None] - positions[None, :]).abs()  # (q_time, k_time)
        rows["distance"] = (weights * distance).sum(-1).mean(-1)
        diagonal = weights.diagonal(dim1=-2, dim2=-1)  # (layers, heads, time)
        rows["self"] = diagonal.mean(-1)
        if q_time > 1:
            rows["previous"] = weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)
            rows["first"] = weights[..., 1:, 0].mean(-1)
    stats = []
    for layer in range(layers):
        for head in range(heads):
            entry = {
                "layer": layer,
                "head": head,
                **{name: round(float(v[layer, head]), 4) for name, v in rows.items()},
            }
            tags = [name for name in ("previous", "first", "self") if entry.get(name, 0.0) >= TAG_THRESHOLD]
            if uniform is not None and float(uniform[layer, head]) >= UNIFORM_THRESHOLD:
                tags.append("uniform")
            stats.append({**entry, "tags": tags})
    return stats


def attention_view(
    label: str,
    queries: list[str],
    keys: list[str],
    weights: Sequence[Tensor] | None,
    *,
    causal: bool,
    self_attention: bool = True,
    note: str | None = None,
) -> dict[str, Any]:
    """One kind of attention (self, cross, encoder, decoder) as the page draws it: token labels of both sides, the
    weights per layer (heads, q_time, k_time), per-head statistics, or `note` saying why there are none."""
    if weights is None:
        return {
            "label": label,
            "queries": queries,
            "keys": keys,
            "causal": causal,
            "layers": None,
            "stats": [],
            "note": note,
        }
    stacked = stack_layers(weights)  # (layers, heads, q_time, k_time)
    return {
        "label": label,
        "queries": queries,
        "keys": keys,
        "causal": causal,
        "layers": micros(stacked) if WIRE.get() == "micros" else rounded(stacked),
        "stats": head_statistics(stacked, self_attention),
        "note": note,
    }


def top_tokens(logits: Tensor, decode: Callable[[int], str], k: int) -> list[list[dict[str, Any]]]:
    """For logits (positions, vocab): the k most probable tokens at every position, [{token, id, p}, ...]."""
    probs = logits.float().softmax(-1)
    values, ids = probs.topk(min(k, probs.shape[-1]), dim=-1)
    return [
        [{"token": decode(int(i)), "id": int(i), "p": round(float(p), DECIMALS)} for p, i in zip(row_p, row_i)]
        for row_p, row_i in zip(values, ids)
    ]


def check_text(text: Any, name: str = "text") -> str:
    """The request's text, or a DataError (a ValueError) that says what was wrong with it."""
    if not isinstance(text, str):
        raise DataError(f"{name} must be a string, got {type(text).__name__}")
    check_unicode(name, text)  # no lone surrogates: from non-UTF-8 bytes on a command line, or "\udcff" in JSON
    if not text.strip():
        raise DataError(f"{name} is empty; type some text to look at")
    return text


def check_length(n_tokens: int, limit: int, what: str = "the input", hint: str = "Shorten it") -> None:
    if n_tokens > limit:
        raise DataError(
            f"{what} is {n_tokens} tokens long; the explorer draws at most {limit} (every view holds "
            f"tokens x tokens numbers per head). {hint}"
        )


# the explorer's input limit when none is given: the model's context, but no more than this many tokens, since the
# reply holds tokens x tokens weights for every layer and head (1,024 tokens: a million per map)
DRAWN_MAX_TOKENS = 1024


def input_limit(limit: int | None, config: Any) -> tuple[int, bool]:
    """The longest input the explorer draws, and whether it is the model's own context (its max_len) that sets it.

    `limit` None: the model's context (its config's max_len), at most DRAWN_MAX_TOKENS. A given `limit` is kept,
    except past the max_len of learned positions, which have no embedding beyond it."""
    context = getattr(config, "max_len", None)
    if limit is None:
        if context is None:
            return DRAWN_MAX_TOKENS, False
        return min(context, DRAWN_MAX_TOKENS), context <= DRAWN_MAX_TOKENS
    if getattr(config, "position", None) == "learned" and context < limit:
        return context, True
    return limit, False


def limit_hint(limit: int, by_context: bool, config: Any) -> str:
    """What to do about an input over `limit` tokens: shorten it, or (when the explorer's own limit, not the
    model's context, refused it) restart with a larger --max-tokens."""
    if not by_context:
        return f"Shorten it, or restart with a larger {option(MAX_TOKENS)}"
    if getattr(config, "position", None) == "learned":
        return f"Shorten it: this run's learned positions stop at max_len = {limit}"
    return f"Shorten it: this model's context is max_len = {limit}"


def check_int(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise DataError(f"{name} must be an integer from {low} to {high}, got {value!r}")
    return value


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character -> byte: printable bytes stand for themselves, the others (space,
    control bytes, 127-160, 173) for 256 + n (so a space is 'Ġ'), as `tokenizers.pre_tokenizers.ByteLevel` maps them."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


BYTE_LEVEL = byte_level_alphabet()


def readable_piece(decode: Callable[[list[int]], str], piece: Callable[[int], str | None], i: int) -> str:
    """Token `i` as text; a byte-level piece that is not whole UTF-8 (a lone byte of a multi-byte character, which
    decodes to U+FFFD) is shown by its bytes instead, the undecodable ones as <0xE2>."""
    text = decode([i])
    name = piece(i) if "\ufffd" in text else None
    if not name or any(c not in BYTE_LEVEL for c in name):
        return text
    raw = bytes(BYTE_LEVEL[c] for c in name)
    out, start = [], 0
    while start < len(raw):
        for end in range(min(len(raw), start + 4), start, -1):  # the longest whole character from here
            try:
                out.append(raw[start:end].decode("utf-8"))
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append(f"<0x{raw[start]:02X}>")
            end = start + 1
        start = end
    return "".join(out)
