"""Look closer and intervene: the numbers behind one attention score, and what changes when the input or the
model is edited.

* `neuron_view`: for one layer, head and query token, the query vector q, every key vector k_j and their
  elementwise products q * k_j, whose sum is the score q . k_j; then the scaled score (/ sqrt(head_dim), plus the
  position scheme's bias where it adds one: ALiBi, Shaw's relative positions) and the softmax weight (bertviz's
  neuron view). The vectors are the layer's own projections (`to_queries`, `to_keys_values`, after rotary
  positions), recorded by forward hooks while the model runs on the text.
* `replace_token`: one token replaced (by [MASK] in an encoder, or by any one token typed), and the attention and
  the predictions before and after (exBERT's question): the next token after the text (a language model), the
  guess at the replaced position (a masked LM) or the class probabilities (a classifier).
* `ablate_heads`: heads switched off, by zero or mean ablation (the head's output replaced by 0, or by its mean
  over the text's positions) through a forward pre-hook on the layer's output projection, and the effect on the
  loss of the text and on the next-token probabilities: every head alone, and a chosen set together.

Each takes a subject (kqv.explore.subjects) and the page's JSON request and returns a plain dict; a bad field is
a DataError (a 400) saying what to send. The tests check every number against an independent computation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import DataError
from ..nn.attention import MultiHeadAttention
from ..nn.cores import FullAttention
from .analysis import check_int, check_text, readable_piece, rounded, top_tokens
from .guard import Number
from .pretrained import PretrainedEncoderSubject
from .subjects import MASK, ClassifierSubject, EmbeddingSubject, LMSubject, MLMSubject, NotApplicable, Subject

MODES = ("zero", "mean")
LOSS_DECIMALS = 9  # losses are compared to 1e-6 with a forward pass of the ablated model: sent with room to spare
# the numbers the endpoints read, checked at the front door (kqv.explore.guard) before a model runs; each is then
# checked against the model (its layers, heads and the text's length)
INTERVENE_NUMBERS = {
    "layer": Number(True, 0, 10_000),
    "head": Number(True, 0, 10_000),
    "token": Number(True, 0, 1_000_000),
    "position": Number(True, 0, 1_000_000),
    "top_k": Number(True, 1, 50),
}


@dataclass
class Reader:
    """How the interventions read a subject: the module holding its self-attention layers (`root`, whose
    `attention_weights(ids)` gives their weights), how to encode a text and label its tokens, and its predictions."""

    subject: Subject
    root: nn.Module
    causal: bool
    encode: Callable[[str], list[int]]  # a checked text -> its ids, as the subject's analysis reads it
    predict: Callable[[Tensor], Tensor] | None  # ids (1, time) -> logits: (1, time, vocab) or (1, classes)
    label: Callable[[int], str]  # a token id, readable
    mask_id: int | None
    pieces: Callable[[str], list[int]]  # a typed replacement -> its token ids (without special tokens)

    @property
    def layers(self) -> list[MultiHeadAttention]:
        return self_attention_layers(self.root)

    def tokens(self, ids: list[int]) -> list[str]:
        return [self.label(i) for i in ids]


def self_attention_layers(root: nn.Module) -> list[MultiHeadAttention]:
    """The self-attention layers of `root`, first to last (cross-attention left out)."""
    return [m for m in root.modules() if isinstance(m, MultiHeadAttention) and not m.cross_attention]


def reader_of(subject: Subject) -> Reader:
    """The Reader of a subject, or NotApplicable for the kinds of model the interventions do not cover."""
    if isinstance(subject, LMSubject):
        model, tokenizer = subject.model, subject.tokenizer
        return Reader(subject, model, True, subject.encode, model, subject.label, None, tokenizer.encode)
    if isinstance(subject, (MLMSubject, ClassifierSubject)):
        vocabulary = subject.vocabulary
        label = lambda i: subject.specials.get(i) or vocabulary.tokenizer.decode([i])
        return encoder_reader(subject, subject.model, label, vocabulary.mask_id, vocabulary.encode)
    if isinstance(subject, PretrainedEncoderSubject):
        hf = subject.tokenizer.tokenizer
        piece = lambda i: MASK if i == subject.mask_id else readable_piece(subject.tokenizer.decode, hf.id_to_token, i)
        plain = lambda s: hf.encode(s, add_special_tokens=False).ids
        return encoder_reader(subject, subject.head, piece, hf.token_to_id(MASK), plain)
    if isinstance(subject, EmbeddingSubject):
        hf = subject.sentence_encoder.tokenizer
        plain = lambda s: hf.encode(s, add_special_tokens=False).ids
        return encoder_reader(subject, None, hf.id_to_token, hf.token_to_id(MASK), plain)
    raise NotApplicable(
        f"the neuron view, replacing a token and switching heads off apply to language models and encoders; "
        f"this is a {subject.task} run"
    )


def encoder_reader(subject: Any, predict: Any, label: Any, mask_id: int | None, pieces: Any) -> Reader:
    def encode(text: str) -> list[int]:
        ids, _ = subject.tokenize(text)
        subject.check_length(len(ids))
        return ids

    return Reader(subject, subject.encoder, False, encode, predict, label, mask_id, pieces)


def target_of(subject: Subject, text: Any) -> tuple[Reader, list[int]]:
    """The subject's reader and the ids of the request's text (checked: a string, not empty, not too long)."""
    reader = reader_of(subject)
    return reader, reader.encode(check_text(text))


def available(subject: Subject) -> dict[str, Any]:
    """Which interventions the subject has (the page shows only those), and why not where it has none."""
    try:
        reader = reader_of(subject)
    except NotApplicable as error:
        return {"neuron": False, "replace": False, "ablate": False, "mask_token": None, "note": str(error)}
    full = all(isinstance(layer.core, FullAttention) for layer in reader.layers)
    return {
        "neuron": full,
        "replace": True,
        "ablate": isinstance(subject, LMSubject),
        "mask_token": MASK if reader.mask_id is not None else None,
        "note": None if full else "the neuron view needs full attention (this model's cores form no scores)",
    }


def check_layer_head(reader: Reader, request: dict[str, Any]) -> tuple[int, int]:
    layers = reader.layers
    layer = check_int(request.get("layer", 0), "layer", 0, len(layers) - 1)
    head = check_int(request.get("head", 0), "head", 0, layers[layer].n_heads - 1)
    return layer, head


# ---------------------------------------------------------------------------------------------------------------
# The neuron view


class Recorded(Exception):
    """Raised by the hook that records a layer's keys, to stop the forward pass there."""


def neuron_numbers(
    attention: MultiHeadAttention, run: Callable[[], Any], head: int, query: int, causal: bool
) -> dict[str, Tensor]:
    """One query's numbers in one head of `attention`, recorded while `run()` runs the model on one input:
    query (head_dim,), keys and products (time, head_dim), scores, bias, scaled and weights (time,)."""
    seen: dict[str, Tensor] = {}

    def keys_seen(module: nn.Module, args: tuple, out: Tensor) -> None:
        seen["kv"] = out.detach()
        raise Recorded  # the layer's queries came first: the layers after it need not run

    hooks = [
        attention.to_queries.register_forward_hook(lambda m, args, out: seen.__setitem__("q", out.detach())),
        attention.to_keys_values.register_forward_hook(keys_seen),
    ]
    try:
        with torch.no_grad():
            run()
    except Recorded:
        pass
    finally:
        for hook in hooks:
            hook.remove()
    time = seen["q"].shape[1]
    positions = torch.arange(time)
    queries = attention.positions.rotate(attention.split_heads(seen["q"]), positions)  # (1, heads, time, hd)
    keys = attention.split_heads(seen["kv"].chunk(2, dim=-1)[0], attention.n_kv_heads)  # (1, kv_heads, time, hd)
    keys = attention.positions.rotate(keys, positions)
    kv_head = head // (attention.n_heads // attention.n_kv_heads)  # the key head this query head reads (GQA)
    q, k = queries[0, head, query].float(), keys[0, kv_head].float()  # (hd,), (time, hd)
    products = q[None, :] * k  # (time, hd): the terms of each score
    scores = products.sum(-1)  # (time,)
    bias = torch.zeros_like(scores)
    if attention.positions.has_score_bias:
        full = attention.positions.score_bias(queries, positions, positions)  # (heads | batch, heads, q, k)
        bias = torch.broadcast_to(full, (1, attention.n_heads, time, time))[0, head, query].float()
    scaled = scores / math.sqrt(q.shape[-1]) + bias
    allowed = positions <= query if causal else torch.ones(time, dtype=torch.bool)
    weights = scaled.masked_fill(~allowed, float("-inf")).softmax(-1)
    return {"query": q, "keys": k, "products": products, "scores": scores, "bias": bias, "scaled": scaled,
            "weights": weights, "allowed": allowed}  # fmt: skip


def neuron_view(subject: Subject, request: dict[str, Any]) -> dict[str, Any]:
    """The neuron view of request's layer, head and query token (`token`, default the last) over its text."""
    reader, ids = target_of(subject, request.get("text"))
    layer, head = check_layer_head(reader, request)
    attention = reader.layers[layer]
    if not isinstance(attention.core, FullAttention):
        raise NotApplicable(f"layer {layer + 1}'s attention core forms no scores: the neuron view needs full attention")
    query = check_int(request.get("token", len(ids) - 1), "token", 0, len(ids) - 1)
    batch = torch.tensor([ids])
    with subject.lock:
        numbers = neuron_numbers(attention, lambda: reader.root(batch), head, query, reader.causal)
    return {
        "tokens": reader.tokens(ids),
        "layer": layer,
        "head": head,
        "token": query,
        "causal": reader.causal,
        "head_dim": attention.head_dim,
        "has_bias": bool(attention.positions.has_score_bias),
        **{name: rounded(numbers[name]) for name in ("query", "keys", "products", "scores", "bias", "scaled")},
        "weights": rounded(numbers["weights"]),
        "allowed": numbers["allowed"].tolist(),
    }


# ---------------------------------------------------------------------------------------------------------------
# Replacing a token


def replacement_id(reader: Reader, replacement: Any) -> int:
    """The id a request's `replacement` names: the mask token (None, or "[MASK]") in an encoder, else the one
    token the typed text is."""
    if replacement is None or replacement == MASK:
        if reader.mask_id is None:
            raise DataError(
                "this model has no mask token: type the token to put in its place as replacement (e.g. ' the')"
            )
        return reader.mask_id
    if not isinstance(replacement, str) or not replacement:
        raise DataError(f"replacement must be a non-empty string (one token), got {replacement!r}")
    ids = reader.pieces(replacement)
    if len(ids) != 1:
        pieces = [reader.label(i) for i in ids]
        raise DataError(
            f"replacement {replacement!r} is {len(ids)} tokens {pieces}, not one: type a single token (the view "
            f"compares the same positions before and after)"
        )
    return ids[0]


def attention_change(before: Tensor, after: Tensor) -> list[dict[str, Any]]:
    """Per head of (layers, heads, q, k) weights: how far each query's distribution moved (total variation,
    half the L1 distance, from 0 to 1), averaged over the queries, largest first."""
    moved = 0.5 * (after - before).abs().sum(-1).mean(-1)  # (layers, heads)
    rows = [
        {"layer": layer, "head": head, "change": round(float(moved[layer, head]), 6)}
        for layer in range(moved.shape[0])
        for head in range(moved.shape[1])
    ]
    return sorted(rows, key=lambda row: -row["change"])


def compared(before: Tensor, after: Tensor, label: Callable[[int], str], k: int) -> list[dict[str, Any]]:
    """Two distributions over the same outcomes (logits, (n,)): the union of each one's top k, with p before,
    p after and the change, by p before."""
    p, q = before.float().softmax(-1), after.float().softmax(-1)
    ids = dict.fromkeys([*p.topk(min(k, len(p))).indices.tolist(), *q.topk(min(k, len(q))).indices.tolist()])
    rows = [{"token": label(i), "id": i, "before": round(float(p[i]), 6), "after": round(float(q[i]), 6)} for i in ids]
    for row in rows:
        row["change"] = round(row["after"] - row["before"], 6)
    return sorted(rows, key=lambda row: -row["before"])


def predictions(reader: Reader, batch: Tensor, position: int) -> tuple[str, Tensor, Callable[[int], str]] | None:
    """What the subject predicts on batch (1, time): (what, logits (n,), label of each outcome), or None."""
    if reader.predict is None:
        return None
    logits = reader.predict(batch)[0]
    if isinstance(reader.subject, LMSubject):
        return "the next token after the text", logits[-1], reader.label
    if isinstance(reader.subject, ClassifierSubject):
        return "the class probabilities", logits, lambda i: reader.subject.labels[i]
    return f"the token at position {position + 1}", logits[position], reader.label


def replace_token(subject: Subject, request: dict[str, Any]) -> dict[str, Any]:
    """The request's text with the token at `position` replaced by `replacement` (default [MASK] in an encoder):
    both inputs' tokens, the chosen head's attention before, after and its change, every head's change, and the
    predictions before and after (top `top_k` of each)."""
    reader, ids = target_of(subject, request.get("text"))
    layer, head = check_layer_head(reader, request)
    position = check_int(request.get("position", len(ids) - 1), "position", 0, len(ids) - 1)
    k = check_int(request.get("top_k", 5), "top_k", 1, 50)
    edited = [*ids]
    edited[position] = replacement_id(reader, request.get("replacement"))
    before, after = torch.tensor([ids]), torch.tensor([edited])
    full = all(isinstance(layer.core, FullAttention) for layer in reader.layers)
    answer: dict[str, Any] = {
        "tokens": reader.tokens(ids),
        "edited_tokens": reader.tokens(edited),
        "position": position,
        "layer": layer,
        "head": head,
        "causal": reader.causal,
    }
    with subject.lock, torch.no_grad():
        if full:
            weights = [
                torch.stack([w[0] for w in reader.root.attention_weights(batch)]).float() for batch in (before, after)
            ]
            answer["before"], answer["after"] = (rounded(w[layer, head]) for w in weights)
            answer["difference"] = rounded(weights[1][layer, head] - weights[0][layer, head])
            answer["change"] = attention_change(*weights)
        else:
            answer["note"] = "this model's attention cores form no weights: only the predictions are compared"
        old, new = predictions(reader, before, position), predictions(reader, after, position)
    if old is not None:
        answer["predicts"] = old[0]
        answer["predictions"] = compared(old[1], new[1], old[2], k)
    return answer


# ---------------------------------------------------------------------------------------------------------------
# Switching heads off


def head_slice(attention: MultiHeadAttention, head: int) -> slice:
    """Where head `head`'s output sits in the input of the output projection (its merged heads)."""
    return slice(head * attention.head_dim, (head + 1) * attention.head_dim)


def head_means(layers: list[MultiHeadAttention], run: Callable[[], Any]) -> list[Tensor]:
    """Each layer's merged head outputs (the output projection's input) averaged over the input's positions,
    (d_model,) per layer: what mean ablation puts in place of a head."""
    means: list[Tensor | None] = [None] * len(layers)

    def recorder(number: int) -> Callable:
        return lambda module, args: means.__setitem__(number, args[0][0].mean(0).detach())

    hooks = [layer.to_output.register_forward_pre_hook(recorder(n)) for n, layer in enumerate(layers)]
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return means  # type: ignore[return-value]


@contextmanager
def heads_off(
    layers: list[MultiHeadAttention], heads: list[tuple[int, int]], means: list[Tensor] | None = None
) -> Iterator[None]:
    """Within the block, the (layer, head) pairs output 0 (zero ablation), or their mean over the positions
    `means` (mean ablation): a forward pre-hook on each layer's output projection rewrites its input."""

    def rewrite(number: int, chosen: list[int]) -> Callable:
        def hook(module: nn.Module, args: tuple) -> tuple:
            x = args[0].clone()  # (batch, time, d_model): the heads' outputs side by side
            for head in chosen:
                part = head_slice(layers[number], head)
                x[..., part] = 0.0 if means is None else means[number][part]
            return (x, *args[1:])

        return hook

    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    hooks = [layers[n].to_output.register_forward_pre_hook(rewrite(n, chosen)) for n, chosen in by_layer.items()]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def text_loss(logits: Tensor, ids: Tensor) -> float:
    """The mean cross-entropy (nats per token) of predicting each token of ids (time,) from the ones before it,
    from logits (time, vocab)."""
    return float(F.cross_entropy(logits[:-1].float(), ids[1:]))


def check_heads(value: Any, layers: list[MultiHeadAttention]) -> list[tuple[int, int]]:
    """The request's `heads`: a list of [layer, head] pairs, each in range, at least one and no more than the model
    has heads."""
    if not isinstance(value, list) or not value:
        raise DataError(f"heads must be a non-empty list of [layer, head] pairs (from 0), got {value!r:.200}")
    total = sum(layer.n_heads for layer in layers)
    if len(value) > total:  # refused before the pairs are read: a list of 100,000 is no longer work to check
        raise DataError(
            f"heads lists {len(value):,} [layer, head] pairs, but this model has {total} heads; give at most "
            f"{total}, each once"
        )
    pairs = []
    for pair in value:
        if not isinstance(pair, list) or len(pair) != 2:
            raise DataError(f"each of heads must be a [layer, head] pair, got {pair!r}")
        layer = check_int(pair[0], "a layer in heads", 0, len(layers) - 1)
        pairs.append((layer, check_int(pair[1], "a head in heads", 0, layers[layer].n_heads - 1)))
    return list(dict.fromkeys(pairs))


def ablated(model: nn.Module, batch: Tensor, layers: list, heads: list, means: list | None, clean: Tensor) -> dict:
    """The loss and next-token numbers of model on batch (1, time) with `heads` off, against the clean logits."""
    with heads_off(layers, heads, means):
        logits = model(batch)[0]  # (time, vocab)
    last, clean_last = logits[-1].float(), clean[-1].float()
    kl = F.kl_div(last.log_softmax(-1), clean_last.log_softmax(-1), log_target=True, reduction="sum")
    top = int(clean_last.argmax())
    return {
        "loss": text_loss(logits, batch[0]),
        "kl": max(0.0, float(kl)),  # KL(clean || ablated) of the next token, nats
        "p_top": float(last.softmax(-1)[top]),  # the probability of the clean top-1 next token
        "top": int(last.argmax()),
        "logits": last,
    }


def ablate_heads(subject: Subject, request: dict[str, Any]) -> dict[str, Any]:
    """Zero or mean ablation (`mode`) of every head alone, as a table; with `heads`, of those together too."""
    if not isinstance(subject, LMSubject):
        raise NotApplicable(f"switching heads off measures a language model's loss; this is a {subject.task} run")
    reader, ids = target_of(subject, request.get("text"))
    if len(ids) < 2:
        raise DataError("the text is one token long: the loss of a text needs at least two tokens")
    mode = request.get("mode", "zero")
    if mode not in MODES:
        raise DataError(f"mode must be one of {list(MODES)}, got {mode!r}")
    k = check_int(request.get("top_k", 5), "top_k", 1, 50)
    layers, model, batch = reader.layers, subject.model, torch.tensor([ids])
    chosen = check_heads(request["heads"], layers) if request.get("heads") is not None else None
    with subject.lock, torch.no_grad():
        clean = model(batch)[0]  # (time, vocab)
        means = head_means(layers, lambda: model(batch)) if mode == "mean" else None
        table = [
            ablated(model, batch, layers, [(n, h)], means, clean)
            for n, a in enumerate(layers)
            for h in range(a.n_heads)
        ]
        together = ablated(model, batch, layers, chosen, means, clean) if chosen else None
    loss = text_loss(clean, batch[0])
    pairs = [(n, h) for n, a in enumerate(layers) for h in range(a.n_heads)]
    answer = {
        "mode": mode,
        "tokens": reader.tokens(ids),
        "loss": round(loss, LOSS_DECIMALS),
        "next": top_tokens(clean[-1:], reader.label, k)[0],
        "heads": [summary(row, loss, reader.label, layer=n, head=h) for (n, h), row in zip(pairs, table)],
    }
    if together is not None:
        answer["chosen"] = {
            "heads": [list(pair) for pair in chosen],
            **summary(together, loss, reader.label),
            "next": compared(clean[-1], together["logits"], reader.label, k),
        }
    return answer


def summary(row: dict[str, Any], clean_loss: float, label: Callable[[int], str], **where: int) -> dict[str, Any]:
    return {
        **where,
        "loss": round(row["loss"], LOSS_DECIMALS),
        "delta": round(row["loss"] - clean_loss, LOSS_DECIMALS),
        "kl": round(row["kl"], 6),
        "p_top": round(row["p_top"], 6),
        "top": label(row["top"]),
    }
