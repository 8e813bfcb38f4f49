"""Completions and their score: what a language model answers to each of many prompts, and how often it is right.

`complete` continues a list of prompts in left-padded batches (`kqv.nn.generation.generate`), each stopping at the
tokenizer's end of text (`kqv.data.completions.end_of_text`) or after `max_new_tokens`, and returns the new text
alone. `evaluate_pairs` scores a file of prompt -> completion pairs two ways: the completion loss (the mean
cross-entropy of the completion's tokens and the end of text, given the prompt: what a pair fine-tune minimises)
and the exact match of greedy completions after whitespace normalisation, with a 95% Wilson interval, beside two
baselines that never read the question: the constant answer (the most frequent completion of the run's fine-tuning
pairs, else of the scored file) with the model's difference to it over questions
(`kqv.train.score_statistics.difference_over_questions`), and a uniform guess among the distinct answers. Where pairs
name their kind of question (a .jsonl pair's `"kind"`; `kqv.data.completions.DEFAULT_KIND` otherwise), the
strongest answer that never reads the question is each kind's constant (`kind_constants`, the same tie rule), and
the *reading score* is the exact match over the questions whose answer is not their kind's constant, beside its own
baseline: a guess among the kind's other seen answers, each drawn as often as it was seen (`reading_guess`).
`LMRun.complete` / `LMRun.evaluate(pairs=...)` and a GPT-2 directory's use them; `kqv generate --prompts` and
`kqv eval --data pairs.tsv` call those.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..data.completions import DEFAULT_KIND, check_examples, end_of_text, read_examples
from ..data.documents import templated
from ..data.example_batches import EncodedExamples
from ..data.tokenizers import Tokenizer
from ..errors import COUNT, MAX_TOKENS, ConfigError, DataError, option
from ..nn.devices import model_device
from ..nn.generation import GenerationConfig, in_dtype
from ..nn.models import DecoderLM
from ..train.perplexity import scoring_bar
from ..train.score_statistics import (
    QuestionDifference,
    difference_from_guess,
    difference_over_questions,
    wilson_interval,
)
from ..validation import check_at_least
from .base import check_text

BATCH_SIZE = 32  # prompts continued (or pairs scored) together
ANSWER_ROOM = 16  # tokens a greedy answer may run past the longest expected one (spaces that normalise away)


def normalise(text: str) -> str:
    """`text` as exact match compares it: stripped, every run of whitespace one space."""
    return " ".join(text.split())


def encode_prompts(tokenizer: Tokenizer, prompts: Sequence[str], name: str = "prompt") -> list[list[int]]:
    """The ids of each prompt; an empty prompt (nothing to continue) or text the tokenizer cannot encode is a
    DataError naming the prompt by its number (from 1): "{name} {number}"."""
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise DataError(f"prompts must be a list of strings, got {type(prompts).__name__}")
    if not prompts:
        raise DataError("there are no prompts to complete; give at least one")
    encoded = []
    for number, prompt in enumerate(prompts, 1):
        check_text(f"{name} {number}", prompt)
        ids = encode_named(tokenizer, prompt, f"{name} {number}")
        if not ids:
            raise DataError(f"{name} {number} is empty; every prompt needs at least one token to continue")
        encoded.append(ids)
    return encoded


def encode_named(tokenizer: Tokenizer, text: str, name: str) -> list[int]:
    """The ids of `text`; a text the tokenizer cannot encode (a character a character tokenizer never saw) is a
    DataError that starts with `name`."""
    try:
        return tokenizer.encode(text) if text else []
    except DataError as error:
        raise DataError(f"{name}: {error}") from None


def complete(
    model: DecoderLM,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    config: GenerationConfig,
    batch_size: int = BATCH_SIZE,
) -> list[str]:
    """The completion of each prompt (the new text only, without the end of text): `config`'s options (greedy at
    temperature 0, else sampled from one generator seeded with `config.seed`), in batches of `batch_size` prompts
    of similar length."""
    if config.count != 1:
        raise ConfigError(
            f"complete gives one completion per prompt, so {option(COUNT)} must be 1, got "
            f"{config.count}; repeat a prompt in the list for several"
        )
    eos_id, _ = end_of_text(tokenizer)
    ids = encode_prompts(tokenizer, prompts)
    new_ids = complete_ids(model, ids, eos_id, config, batch_size)
    return [tokenizer.decode(new) if new else "" for new in new_ids]


def complete_ids(
    model: DecoderLM, prompts: list[list[int]], eos_id: int, config: GenerationConfig, batch_size: int = BATCH_SIZE
) -> list[list[int]]:
    """The new ids of each prompt's completion, cut before its first `eos_id`. Prompts are sorted by length and
    continued `batch_size` at a time, left-padded (`generate`'s attention_mask), so a batch pads little."""
    check_at_least("batch_size", batch_size, 1)
    limit = learned_positions(model)
    check_prompt_lengths(prompts, limit)
    device = model_device(model)
    generator = torch.Generator(device).manual_seed(config.seed)
    options = {**config.sampling, "use_cache": config.use_cache}
    model = in_dtype(model.eval(), config.torch_dtype)  # one lower-precision copy (if any) for every batch
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    completions: list[list[int]] = [[] for _ in prompts]
    with scoring_bar(len(prompts), unit="prompt") as bar:  # shown by `kqv eval` and `kqv generate --prompts`
        for start in range(0, len(order), batch_size):
            chosen = order[start : start + batch_size]
            ids, mask = left_padded([prompts[i] for i in chosen], eos_id, device)
            new = config.max_new_tokens if limit is None else min(config.max_new_tokens, limit - ids.shape[1] + 1)
            out = model.generate(ids, new, eos_id=eos_id, generator=generator, attention_mask=mask, **options)
            for i, row in zip(chosen, out[:, ids.shape[1] :].tolist(), strict=True):
                completions[i] = row[: row.index(eos_id)] if eos_id in row else row
            bar.update(len(chosen))
    return completions


def learned_positions(model: DecoderLM) -> int | None:
    """How many positions the model learned (its max_len with learned positions; None: no such limit)."""
    return model.config.max_len if model.config.position == "learned" else None


def check_prompt_lengths(prompts: list[list[int]], limit: int | None) -> None:
    """Refuse a prompt longer than the positions the model learned, naming it."""
    for number, ids in enumerate(prompts, 1):
        if limit is not None and len(ids) > limit:
            raise DataError(
                f"prompt {number} is {len(ids):,} tokens, more than the {limit} positions this model learned; "
                f"shorten it"
            )


def left_padded(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The rows as one (batch, longest) tensor padded on the left with `pad_id`, and the mask that is 0 on the
    padding (None when every row has the longest length: nothing to hide)."""
    longest = max(map(len, rows))
    ids = torch.tensor([[pad_id] * (longest - len(row)) + row for row in rows], device=device)
    if all(len(row) == longest for row in rows):
        return ids, None
    mask = torch.tensor([[0] * (longest - len(row)) + [1] * len(row) for row in rows], device=device)
    return ids, mask


# -- scoring a file of pairs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """One pair and the model's greedy completion of its prompt."""

    prompt: str
    expected: str
    got: str
    kind: str = DEFAULT_KIND  # the kind of question the pair names (its .jsonl "kind")

    @property
    def correct(self) -> bool:
        """Whether the completion is the expected one, up to whitespace (`normalise`)."""
        return normalise(self.got) == normalise(self.expected)


@dataclass(frozen=True)
class PairsEvaluation:
    """What `LMRun.evaluate(pairs=...)` measured on `source`: the completion loss (mean nats per completion token,
    the end of text included, given the prompt) and its perplexity over `tokens` tokens; exact match: `correct` of
    `n` greedy completions equal the expected ones after whitespace normalisation, with the 95% Wilson interval
    [low, high] of that proportion. `predictions` holds every pair with what the model said.

    The baselines, which answer without reading the question: `constant`, the most frequent answer of `reference`
    (the run's fine-tuning pairs, or the scored file when the run has none: `constant_reference`), right on
    `constant_correct` pairs; `versus_constant`, the model's exact match minus the constant's with a 95% interval
    whose unit is the question (paired: both answer the same questions); `uniform`, the expected exact match of a
    guess drawn uniformly from the reference's `distinct_answers` answers (1 / distinct_answers when every expected
    answer is among them; an answer that is not scores 0).

    Per kind of question: `kind_constants`, each kind's most frequent reference answer (a kind the reference lacks
    takes the constant), right on `per_kind_correct` pairs, and `versus_per_kind`, the model minus it over
    questions. The reading score: of the `reading_n` pairs whose answer is not their kind's constant, the model
    gets `reading_correct` right (95% Wilson interval [reading_low, reading_high]); `reading_baseline` is the
    expected score there of a guess among the kind's other reference answers by frequency (`reading_guess`), and
    `versus_reading_baseline` the model minus that guess over those questions; `reading_runner_ups` are each kind's
    most frequent other reference answer (`runner_up`, the strongest answer there that never reads the question),
    right on `reading_runner_up_correct` of those pairs, and `versus_reading_runner_up` the model minus it."""

    source: str
    n: int
    correct: int
    low: float
    high: float
    loss: float
    perplexity: float
    tokens: int
    predictions: tuple[Prediction, ...] = field(default=(), repr=False)  # one per pair: too long to print
    constant: str = ""
    constant_reference: str = ""
    constant_correct: int = 0
    versus_constant: QuestionDifference | None = None
    distinct_answers: int = 0
    uniform: float = 0.0
    kind_constants: dict[str, str] = field(default_factory=dict)
    per_kind_correct: int = 0
    versus_per_kind: QuestionDifference | None = None
    reading_n: int = 0
    reading_correct: int = 0
    reading_low: float = 0.0
    reading_high: float = 1.0
    reading_baseline: float = 0.0
    versus_reading_baseline: QuestionDifference | None = None
    reading_runner_ups: dict[str, str] = field(default_factory=dict)
    reading_runner_up_correct: int = 0
    versus_reading_runner_up: QuestionDifference | None = None

    @property
    def exact_match(self) -> float:
        """The fraction of pairs answered right."""
        return self.correct / self.n

    @property
    def constant_exact_match(self) -> float:
        """The fraction of pairs the constant answer gets right."""
        return self.constant_correct / self.n

    @property
    def per_kind_exact_match(self) -> float:
        """The fraction of pairs each kind's constant answer gets right."""
        return self.per_kind_correct / self.n

    @property
    def reading_exact_match(self) -> float | None:
        """The reading score: the fraction right of the pairs whose answer is not their kind's constant (None:
        there are none)."""
        return self.reading_correct / self.reading_n if self.reading_n else None

    @property
    def constant_scores(self) -> list[int]:
        """Per pair, 1 where the constant answer is the expected one, else 0."""
        return [int(normalise(prediction.expected) == self.constant) for prediction in self.predictions]

    def to_dict(self) -> dict[str, Any]:
        """The figures (what `kqv eval --json` prints), without the predictions."""
        return {
            "n": self.n,
            "correct": self.correct,
            "exact_match": self.exact_match,
            "exact_match_95": [self.low, self.high],
            "loss": self.loss,
            "perplexity": self.perplexity,
            "tokens": self.tokens,
            "constant": self.constant,
            "constant_reference": self.constant_reference,
            "constant_correct": self.constant_correct,
            "constant_exact_match": self.constant_exact_match,
            **versus_figures(self.versus_constant),
            "distinct_answers": self.distinct_answers,
            "uniform_exact_match": self.uniform,
            "kind_constants": self.kind_constants,
            "per_kind_correct": self.per_kind_correct,
            "per_kind_exact_match": self.per_kind_exact_match,
            **versus_figures(self.versus_per_kind, "versus_per_kind"),
            "reading_questions": self.reading_n,
            "reading_correct": self.reading_correct,
            "reading_exact_match": self.reading_exact_match,
            "reading_95": [self.reading_low, self.reading_high],
            "reading_baseline": self.reading_baseline,
            **versus_figures(self.versus_reading_baseline, "versus_reading_baseline"),
            "reading_runner_ups": self.reading_runner_ups,
            "reading_runner_up_correct": self.reading_runner_up_correct,
            **versus_figures(self.versus_reading_runner_up, "versus_reading_runner_up"),
        }


def versus_figures(versus: QuestionDifference | None, name: str = "versus_constant") -> dict[str, Any]:
    """A difference's figures as flat keys of `PairsEvaluation.to_dict`, each starting with `name`."""
    return {} if versus is None else versus.to_dict(name)


def constant_answer(answers: Sequence[str]) -> str:
    """The most frequent of `answers` after normalisation (`normalise`); of several equally frequent, the first in
    sorted order."""
    if not answers:
        raise DataError("a constant answer needs at least one answer to count")
    return most_frequent(Counter(normalise(answer) for answer in answers))


def most_frequent(counts: Counter, other_than: str | None = None) -> str:
    """The answer `counts` counts most often (other than `other_than`); of several equally frequent, the first in
    sorted order: the one tie rule of every baseline. "" when there is no answer to choose."""
    answers = [answer for answer in counts if answer != other_than]
    return min(answers, key=lambda answer: (-counts[answer], answer), default="")


def kind_constants(answers: Sequence[str], kinds: Sequence[str]) -> dict[str, str]:
    """Each kind's constant answer: `constant_answer` of the answers of that kind (`kinds[i]` is answer i's)."""
    grouped: dict[str, list[str]] = defaultdict(list)
    for answer, kind in zip(answers, kinds, strict=True):
        grouped[kind].append(answer)
    return {kind: constant_answer(grouped[kind]) for kind in sorted(grouped)}


def reading_guess(expected: str, seen: Counter, constant: str) -> float:
    """The expected exact match, on a question whose answer `expected` is not its kind's `constant`, of a guess
    drawn from the kind's other seen answers (`seen`: each normalised answer's count), each as often as it was
    seen: seen[expected] / (seen answers - seen[constant]); 0 when the kind has no other seen answer."""
    others = sum(seen.values()) - seen[constant]
    return seen[expected] / others if others else 0.0


def runner_up(seen: Counter, constant: str) -> str:
    """The most frequent of the answers `seen` (each normalised answer's count) other than `constant`, ties broken
    as `constant_answer` breaks them; "" when there is no other."""
    return most_frequent(seen, other_than=constant)


def reading_baselines(
    result: PairsEvaluation, reference: Sequence[str], kinds: Sequence[str], constant: str
) -> dict[str, Any]:
    """The per-kind constant's and the reading score's figures of `result` (`PairsEvaluation`'s fields) from the
    `reference` answers of `kinds`; a scored kind the reference lacks takes `constant` and the whole reference."""
    constants = kind_constants(reference, kinds)
    seen: dict[str, Counter] = defaultdict(Counter)
    for answer, kind in zip(reference, kinds, strict=True):
        seen[kind][normalise(answer)] += 1
    everything = Counter(normalise(answer) for answer in reference)
    model, per_kind, reading, guesses, runner_ups, runner_up_scores = [], [], [], [], {}, []
    for prediction in result.predictions:
        expected, kind_constant = normalise(prediction.expected), constants.get(prediction.kind, constant)
        model.append(float(prediction.correct))
        per_kind.append(float(expected == kind_constant))
        if expected != kind_constant:
            counts = seen.get(prediction.kind, everything)
            reading.append(float(prediction.correct))
            guesses.append(reading_guess(expected, counts, kind_constant))
            second = runner_ups.setdefault(prediction.kind, runner_up(counts, kind_constant))
            runner_up_scores.append(float(expected == second))
    low, high = wilson_interval(int(sum(reading)), len(reading)) if reading else (0.0, 1.0)
    return {
        "kind_constants": constants,
        "per_kind_correct": int(sum(per_kind)),
        "versus_per_kind": difference_over_questions(model, per_kind),
        "reading_n": len(reading),
        "reading_correct": int(sum(reading)),
        "reading_low": low,
        "reading_high": high,
        "reading_baseline": sum(guesses) / len(guesses) if guesses else 0.0,
        "versus_reading_baseline": difference_from_guess(reading, guesses) if reading else None,
        "reading_runner_ups": dict(sorted(runner_ups.items())),
        "reading_runner_up_correct": int(sum(runner_up_scores)),
        "versus_reading_runner_up": difference_over_questions(reading, runner_up_scores) if reading else None,
    }


def with_baselines(
    result: PairsEvaluation, reference: Sequence[str], described: str, kinds: Sequence[str] | None = None
) -> PairsEvaluation:
    """`result` with its baselines computed from the answers of `reference` (`described` says what they are, and
    `kinds` their kinds of question; None: each of `DEFAULT_KIND`): the constant answer, its score and the model's
    difference to it per question, the uniform guess, and per kind the constant and the reading score
    (`reading_baselines`)."""
    constant = constant_answer(reference)
    expected = [normalise(prediction.expected) for prediction in result.predictions]
    model_scores = [float(prediction.correct) for prediction in result.predictions]
    constant_scores = [float(answer == constant) for answer in expected]
    distinct = {normalise(answer) for answer in reference}
    return replace(
        result,
        constant=constant,
        constant_reference=described,
        constant_correct=int(sum(constant_scores)),
        versus_constant=difference_over_questions(model_scores, constant_scores),
        distinct_answers=len(distinct),
        uniform=sum(answer in distinct for answer in expected) / len(distinct) / len(expected),
        **reading_baselines(result, reference, kinds or [DEFAULT_KIND] * len(reference), constant),
    )


def fine_tuning_answers(tokenizer: Tokenizer, examples: EncodedExamples) -> list[str]:
    """The completions of a pair run's training `examples`, decoded, each without its end of text."""
    return [tokenizer.decode(examples.parts(k)[1][:-1]) for k in range(len(examples))]


def evaluate_pairs(
    model: DecoderLM,
    tokenizer: Tokenizer,
    path: str | Path,
    *,
    max_new_tokens: int | None = None,
    batch_size: int = BATCH_SIZE,
    reference: Sequence[str] | None = None,
    template: str | None = None,
    mask: str | None = None,
    reference_kinds: Sequence[str] | None = None,
) -> PairsEvaluation:
    """Score `model` on the pairs of a .tsv or .jsonl file (`kqv.data.completions.read_examples`): completion loss
    and exact match of greedy completions of up to `max_new_tokens` tokens (default: the longest expected
    completion's tokens + 16, room for whitespace that normalises away; a longer answer cannot match), and the
    baselines (`with_baselines`) from the answers of `reference` (the run's fine-tuning pairs), else from the
    scored file's own (`reference_kinds`: the reference's kinds of question; the scored file's name their own).
    Each prompt is written into `template` (the run's `data.template`, `{mask}` the symbol
    `mask`) as the run saw its prompts in training; the predictions keep the file's own prompts."""
    examples = read_examples(path)
    check_examples(examples, tokenizer, str(path))
    shown, examples = examples, templated(examples, template, tokenizer, mask, str(path))
    eos_id, _ = end_of_text(tokenizer)
    prompts = encode_prompts(tokenizer, [example.prompt for example in examples], f"{path}: the prompt of pair")
    answers = [
        encode_named(tokenizer, example.completion, f"{path}: the completion of pair {number}") + [eos_id]
        for number, example in enumerate(examples, 1)
    ]
    nats, tokens = completion_nats(model, prompts, answers, batch_size, str(path))
    if max_new_tokens is None:
        max_new_tokens = min(max(map(len, answers)) + ANSWER_ROOM, GenerationConfig.limits.max_new_tokens)
    greedy = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0)
    got = [tokenizer.decode(ids) if ids else "" for ids in complete_ids(model, prompts, eos_id, greedy, batch_size)]
    predictions = tuple(Prediction(e.prompt, e.completion, text, e.kind) for e, text in zip(shown, got, strict=True))
    correct = sum(prediction.correct for prediction in predictions)
    low, high = wilson_interval(correct, len(examples))
    loss = nats / tokens
    result = PairsEvaluation(
        str(path),
        n=len(examples),
        correct=correct,
        low=low,
        high=high,
        loss=loss,
        perplexity=math.exp(loss) if loss < 709 else math.inf,
        tokens=tokens,
        predictions=predictions,
    )
    if reference:
        return with_baselines(result, reference, f"the {len(reference):,} pairs the run fine-tuned on", reference_kinds)
    answers, kinds = [example.completion for example in examples], [example.kind for example in examples]
    described = f"the {len(answers):,} scored pairs (the run has no fine-tuning pairs)"
    return with_baselines(result, answers, described, kinds)


def check_pairs_alone(data: str | Path | None, max_tokens: int | None) -> None:
    """Refuse text options beside `pairs` in one evaluation: pairs are scored as pairs, text as text."""
    if data is not None:
        raise ConfigError("evaluate scores either text (data=) or pairs (pairs=), not both in one call")
    if max_tokens is not None:
        raise ConfigError(f"{option(MAX_TOKENS)} limits the text scored; a file of pairs is scored whole")


@torch.no_grad()
def completion_nats(
    model: DecoderLM,
    prompts: list[list[int]],
    answers: list[list[int]],
    batch_size: int = BATCH_SIZE,
    where: str = "the pairs",
) -> tuple[float, int]:
    """The summed cross-entropy (nats) of every answer token given its prompt and the answer before it, and the
    number of answer tokens. Each prompt + answer is one row, padded on the right (a causal model's earlier
    positions never see the padding) with targets -100 on the prompt and the padding."""
    check_at_least("batch_size", batch_size, 1)
    limit = learned_positions(model)
    rows = []
    for number, (prompt, answer) in enumerate(zip(prompts, answers, strict=True), 1):
        if limit is not None and len(prompt) + len(answer) - 1 > limit:
            raise DataError(
                f"{where}: pair {number} is {len(prompt) + len(answer) - 1:,} tokens with its end of text, more "
                f"than the {limit} positions this model learned; shorten it"
            )
        rows.append((prompt + answer, len(prompt)))
    device, total, count = model_device(model), 0.0, 0
    model.eval()
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        width = max(len(ids) for ids, _ in batch) - 1
        inputs = torch.zeros(len(batch), width, dtype=torch.long)
        targets = torch.full((len(batch), width), -100, dtype=torch.long)
        for row, (ids, prompt_length) in enumerate(batch):
            inputs[row, : len(ids) - 1] = torch.tensor(ids[:-1])
            targets[row, prompt_length - 1 : len(ids) - 1] = torch.tensor(ids[prompt_length:])
        logits = model(inputs.to(device)).float()  # (batch, width, vocab)
        total += F.cross_entropy(logits.flatten(0, 1), targets.to(device).flatten(), reduction="sum").item()
        count += int((targets != -100).sum())
    return total, count
