"""Batches of documents made into examples anew at every draw: span corruption (fill in the middle) and
sentence-order augmentation, on the padding and packing of `kqv.data.example_batches`.

A document of n tokens becomes, at each draw, one example like a prompt -> completion pair:

* **span corruption** (Raffel et al. 2020's objective with one span; Bavarian et al. 2022's fill-in-the-middle
  order): a span of L tokens at a random place is cut out, and the example is `prefix MASK suffix MASK` as the
  prompt and `span END` as the completion (END the end of text), n + 3 tokens. L is uniform in
  [1, min(span_max, n, round(2 * span_rate * n) - 1)] (at least 1), so its mean is about span_rate * n; the
  span's start is uniform over the places it fits. The loss is on the completion, the prompt weighted by
  `prompt_loss_weight` (0: the span only; 1: every token);
* **next token** (`corrupt=False`): the document and END, its first token as the prompt (so every later token
  is a target), n + 1 tokens;
* with `sentences` (sentence-order augmentation, after Allen-Zhu & Li 2023's knowledge augmentation), the
  document's sentences are first put in a random order, joined by `separator`: the same tokens, reordered;
* with `prefix_max` (a random prefix, as CS224N's span-corruption dataset cuts each document before masking),
  the document is then cut to its first P tokens, P uniform in [PREFIX_MIN, prefix_max] (the whole document when
  it is shorter), so its opening is seen in many lengths and the span falls on different parts of it; the span's
  length follows the cut document's n. P is the draw's first number, so `DocumentBatches.tokens` knows a draw's
  length without making it.

Draw d of a document is made from `random.Random(seed * 1_000_003 + d)` alone, and the draws of epoch e are
numbered e * documents + k, so batch i depends only on i and the seed, and a resume draws the same examples.
Rows are planned (and packed) by each draw's own length: without a random prefix it is the document's, with one the
draw's first number gives it, so an epoch's rows are planned before any of its examples is made, and packed rows hold
only what was drawn.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from torch import Tensor

from .example_batches import EncodedExamples, ExampleBatches

PREFIX_MIN = 4  # a random prefix's fewest tokens (CS224N's span-corruption dataset: 4 characters)
PREFIX_SHARE = 7 / 8  # a random prefix's most tokens as a share of the context (CS224N's: 7/8 of the block)


def prefix_max(context: int) -> int:
    """The longest random prefix a run of `context` tokens cuts: 7/8 of it, as CS224N's dataset cuts its block."""
    return int(context * PREFIX_SHARE)


def corrupt(doc: list[int], rng: random.Random, mask: int, end: int, rate: float, span_max: int) -> tuple[list, list]:
    """(prompt, completion) of one span-corrupted document: `prefix MASK suffix MASK` and `span END`."""
    n = len(doc)
    longest = max(1, min(span_max, n, round(2 * rate * n) - 1))
    length = rng.randint(1, longest)
    start = rng.randint(0, n - length)
    return doc[:start] + [mask] + doc[start + length :] + [mask], doc[start : start + length] + [end]


def shuffled(doc: list[int], lengths: list[int], separator: list[int], rng: random.Random) -> list[int]:
    """`doc`, whose sentences have `lengths` tokens and are joined by `separator`, with its sentences reordered."""
    sentences, start = [], 0
    for length in lengths:
        sentences.append(doc[start : start + length])
        start += length + len(separator)
    rng.shuffle(sentences)
    out: list[int] = []
    for number, sentence in enumerate(sentences):
        out += (separator if number else []) + sentence
    return out


@dataclass(frozen=True)
class DocumentOptions:
    """How a document becomes an example: its `mask` and `end` ids, whether it is `corrupt`ed (else next token),
    the span's mean fraction `span_rate` and longest length `span_max`, the sentence `separator` of
    sentence-order augmentation (None: off), and the longest random prefix `prefix_max` (0: the whole document)."""

    mask: int
    end: int
    corrupt: bool = True
    span_rate: float = 0.15
    span_max: int = 64
    separator: tuple[int, ...] | None = None
    prefix_max: int = 0

    def kept(self, n: int, rng: random.Random) -> int:
        """How many of a document's `n` tokens a draw keeps: its random prefix's length (the draw's first number),
        or all of them."""
        if not self.prefix_max:
            return n
        return min(n, rng.randint(min(PREFIX_MIN, self.prefix_max), self.prefix_max))

    def example(self, doc: list[int], sentences: list[int], rng: random.Random) -> tuple[list[int], list[int]]:
        """(prompt, completion) of one draw of `doc` (its sentences' token counts `sentences`)."""
        kept = self.kept(len(doc), rng)
        if self.separator is not None and len(sentences) > 1:
            doc = shuffled(doc, sentences, list(self.separator), rng)
        doc = doc[:kept]
        if self.corrupt:
            return corrupt(doc, rng, self.mask, self.end, self.span_rate, self.span_max)
        return doc[:1], doc[1:] + [self.end]

    def extra(self) -> int:
        """The tokens an example adds to its document: two masks and END, or END."""
        return 3 if self.corrupt else 1


@dataclass(frozen=True)
class EncodedDocuments(EncodedExamples):
    """Documents as a run stores them: `ids` (total,) one after another, `lengths` (documents, 2) each one's
    (tokens, 0), and `sentences`, the token counts of every document's sentences one after another, with
    `sentence_counts` (documents,) how many each has (empty: no sentence-order augmentation)."""

    options: DocumentOptions | None = None
    sentences: Tensor | None = None
    sentence_counts: Tensor | None = None

    def document(self, k: int) -> tuple[list[int], list[int]]:
        """The ids of document k (lengths hold (tokens, 0)) and its sentences' token counts (none: one sentence)."""
        start, n, _ = self.spans[k]
        return self.ids[start : start + n].tolist(), self.sentence_lengths[k] or [n]

    @property
    def sentence_lengths(self) -> list[list[int]]:
        cached = self.__dict__.get("_sentence_lengths")
        if cached is None:
            cached = [[] for _ in range(len(self))]
            if self.sentences is not None and self.sentence_counts is not None:
                flat, start = self.sentences.tolist(), 0
                for k, count in enumerate(self.sentence_counts.tolist()):
                    cached[k], start = flat[start : start + count], start + count
            self.__dict__["_sentence_lengths"] = cached
        return cached

    def inputs(self, g: int) -> int:
        """The most tokens the model reads of draw g (any draw of document g mod documents): all but the last of
        its whole document's example (a random prefix's draw reads fewer: `DocumentBatches.tokens`)."""
        return self.spans[g % len(self)][1] + self.options.extra() - 1


@dataclass(frozen=True)
class DocumentBatches(ExampleBatches):
    """`ExampleBatches` over `EncodedDocuments` whose every draw is a new example (`DocumentOptions.example`)."""

    def labels(self, epoch: int, order: list[int]) -> list[int]:
        offset = epoch * len(self.examples)
        return [offset + k for k in order]

    def inputs(self, g: int) -> int:
        """The tokens the model reads of draw g: all but the last of its example, a random prefix's cut counted
        (the draw's first number, so known without making the draw)."""
        documents: EncodedDocuments = self.examples  # type: ignore[assignment]
        options = documents.options
        if not options.prefix_max:
            return documents.inputs(g)
        return options.kept(documents.spans[g % len(documents)][1], draw_random(self.seed, g)) + options.extra() - 1

    def example_tokens(self, g: int) -> tuple[list[int], int]:
        documents: EncodedDocuments = self.examples  # type: ignore[assignment]
        doc, sentences = documents.document(g % len(documents))
        prompt, completion = documents.options.example(doc, sentences, draw_random(self.seed, g))
        return prompt + completion, len(prompt)


def draw_random(seed: int, draw: int) -> random.Random:
    """The generator of one draw of a document: the same example for the same (seed, draw)."""
    return random.Random(seed * 1_000_003 + draw)
