"""Translating text with a trained encoder-decoder and scoring the translations (BLEU and chrF).

The MT job uses these during training (dev BLEU at every evaluation, test BLEU at the end) and for `kqv translate`
and `kqv eval` on its runs. The special tokens are the MT tokenizer's: `<pad>`, `<bos>`, `<eos>` first.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..data.padding import lengths_mask, pad_sequences
from ..data.pairs import Encoded, TokenBatches
from ..data.tokenizers import Tokenizer
from ..errors import BEAM_SIZE, LENGTH_PENALTY, ConfigError, DataError, option
from ..nn.config import ModelConfig
from ..nn.devices import model_device, on_device_of
from ..train.layout import RunFiles
from .base import check_text

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
MAX_LENGTH_PENALTY = 10.0  # scores are divided by length**penalty: beyond this a float overflows for long outputs
MAX_BEAM = 64  # beams x sentences x vocabulary scores at every step: wider is slow and no better


def check_decoding(beam_size: int, length_penalty: float) -> None:
    """Refuse a beam size that is not an integer from 1 to `MAX_BEAM`, and a length penalty that is not a number
    from 0 (none) to `MAX_LENGTH_PENALTY` (GNMT used 0.6 to 1)."""
    beam = option(BEAM_SIZE)
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or not 1 <= beam_size <= MAX_BEAM:
        raise ConfigError(f"{beam} must be an integer from 1 to {MAX_BEAM}, got {beam_size!r}")
    name = option(LENGTH_PENALTY)
    finite = not isinstance(length_penalty, bool) and isinstance(length_penalty, (int, float))
    if not (finite and math.isfinite(length_penalty) and 0 <= length_penalty <= MAX_LENGTH_PENALTY):
        raise ConfigError(
            f"{name} must be a number from 0 (no penalty) to {MAX_LENGTH_PENALTY:g}, got {length_penalty!r}"
        )


@dataclass(frozen=True)
class MTEvaluation:
    """What `MTRun.evaluate` measured on `source`: corpus BLEU and chrF of `sentences` translations decoded with
    beam size `beam_size`, which took `seconds`."""

    source: str
    bleu: float
    chrf: float
    sentences: int
    beam_size: int
    seconds: float

    @property
    def sentences_per_second(self) -> float:
        return self.sentences / self.seconds

    def to_dict(self) -> dict[str, float]:
        """The figures as `kqv eval --json` prints them (seconds to one decimal)."""
        return {
            "bleu": self.bleu,
            "chrf": self.chrf,
            "sentences": self.sentences,
            "beam_size": self.beam_size,
            "seconds": round(self.seconds, 1),
        }


@torch.no_grad()
def translate_sentences(
    model: nn.Module,
    tokenizer: Tokenizer,
    sentences: list[str],
    *,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    batch_sentences: int = 64,
) -> list[str]:
    """Translate sentences, text in and text out (batched by length, output in input order): each is encoded as
    `ids + <eos>`, decoded by the model's beam search, and cut at its first <eos>. Empty sentences and, for learned
    positions, sources longer than the model's max_len raise DataError."""
    check_decoding(beam_size, length_penalty)
    pad, bos, eos = (tokenizer.token_to_id(t) for t in SPECIAL_TOKENS)
    sources = []
    for number, sentence in enumerate(sentences, 1):
        check_text(f"source sentence {number}", sentence)
        if not sentence.strip():
            raise DataError(f"source sentence {number} is empty; give text to translate")
        sources.append(torch.tensor(tokenizer.encode(" ".join(sentence.split())) + [eos]))
    limit = _position_limit(model)
    for number, ids in enumerate(sources, 1):
        if limit is not None and len(ids) > limit:
            raise DataError(
                f"source sentence {number} has {len(ids)} tokens but this model's learned positions "
                f"cover max_len={limit}; shorten or split the sentence"
            )
    was_training = model.training
    model.eval()
    order = sorted(range(len(sources)), key=lambda j: len(sources[j]))
    results: list[str] = [""] * len(sources)
    try:
        for start in range(0, len(order), batch_sentences):
            chunk = order[start : start + batch_sentences]
            src = pad_sequences([sources[j] for j in chunk], pad).to(model_device(model))
            src_mask = lengths_mask([len(sources[j]) for j in chunk], src.shape[1]).to(src.device)
            max_new = int(max_len_a * src.shape[1] + max_len_b)
            if limit is not None:
                max_new = min(max_new, limit)
            out = model.generate(
                src,
                max_new,
                beam_size=beam_size,
                length_penalty=length_penalty,
                bos_id=bos,
                eos_id=eos,
                src_mask=src_mask,
            )
            for j, row in zip(chunk, out.tolist()):
                row = row[1:]
                results[j] = tokenizer.decode(row[: row.index(eos)] if eos in row else row).strip()
    finally:
        model.train(was_training)
    return results


def _position_limit(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    return config.max_len if isinstance(config, ModelConfig) and config.position == "learned" else None


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """Corpus BLEU (sacrebleu's default 13a tokenisation) and chrF of detokenised hypotheses."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise DataError(f"{len(hypotheses)} translations for {len(references)} references")
    return {
        "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
        "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
    }


def spread(items: list, count: int) -> list:
    """`count` items evenly spaced through the list (all of them if it is shorter)."""
    if count >= len(items):
        return list(items)
    return [items[int(j * len(items) / count)] for j in range(count)]


def translate_test_split(
    model: nn.Module, tokenizer: Tokenizer, sources: list[str], references: list[str], decode: dict, run: RunFiles
) -> dict[str, Any]:
    """Translate a test split with beam search (`decode`: the run's [decode] options), write the translations as
    the run's predictions, one a line, and score them."""
    started = time.perf_counter()
    hypotheses = translate_sentences(model, tokenizer, sources, **decode)
    run.write_predictions(hypotheses)
    scores = corpus_scores(hypotheses, references)
    return {
        "test_bleu": scores["bleu"],
        "test_chrf": scores["chrf"],
        "test_sentences": len(sources),
        "test_translate_seconds": round(time.perf_counter() - started, 1),
    }


# ---------------------------------------------------------------------------------------------------------------
# Training a translation model: its loss, and what it measures of the dev split while it trains


def mt_loss(model: nn.Module, batch: dict[str, Tensor], label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy of the next target token under teacher forcing (label-smoothed while training), plus the
    experts' load-balancing loss while training (`kqv.nn.experts`)."""
    smoothing = label_smoothing if model.training else 0.0
    return model(batch["src"], batch["tgt_in"], batch["targets"], src_mask=batch["src_mask"], label_smoothing=smoothing)


class DevEvaluation:
    """The evaluation during training: loss, greedy BLEU and chrF on `data.eval_sentences` dev sentences spread
    over the dev split, and the evaluation time so far, kept as `eval_seconds` in `extra_state`: the dict the
    Trainer saves with every checkpoint and restores a resumed run's entries into, so the time adds up across
    resumes."""

    def __init__(
        self,
        config: Any,
        tokenizer: Tokenizer,
        dev: Encoded,
        texts: tuple[list[str], list[str]],
        options: dict[str, int],
        extra_state: dict[str, Any],
    ):
        """`dev`: the encoded dev split, `texts` its (sources, references), `tokenizer` the joint one."""
        self.chosen = spread(list(range(len(dev))), config.data.eval_sentences)
        self.batches = TokenBatches(
            Encoded([dev.src[j] for j in self.chosen], [dev.tgt[j] for j in self.chosen]),
            seed=0,
            shuffle=False,
            **options,
        )
        self.sources, self.references = ([side[j] for j in self.chosen] for side in texts)
        self.tokenizer, self.decode, self.extra_state = tokenizer, config.decode, extra_state

    def __call__(self, model: nn.Module) -> dict[str, float]:
        started = time.perf_counter()
        val_loss = sum(
            mt_loss(model, on_device_of(model, self.batches(i))).item() * len(self.batches.indices(i))
            for i in range(len(self.batches))
        ) / len(self.chosen)
        hypotheses = translate_sentences(
            model,
            self.tokenizer,
            self.sources,
            beam_size=1,
            max_len_a=self.decode.max_len_a,
            max_len_b=self.decode.max_len_b,
            batch_sentences=self.decode.batch_sentences,
        )
        scores = corpus_scores(hypotheses, self.references)
        spent = self.extra_state.get("eval_seconds", 0.0) + time.perf_counter() - started
        self.extra_state["eval_seconds"] = spent
        return {"val_loss": val_loss, "dev_bleu": scores["bleu"], "dev_chrf": scores["chrf"], "eval_seconds": spent}


def test_cost(config: Any, test_sentences: int) -> float:
    """The test translation after training in dev evaluations, for a budget's plan: beam k costs about k / 2 greedy
    decodings a verse (a conservative estimate; docs/translation.md has the measured times)."""
    return test_sentences / config.data.eval_sentences * max(1.0, config.decode.beam_size / 2)


def real_tokens(batch: dict[str, Tensor]) -> int:
    """The real (non-padding) source and target tokens of a batch."""
    return int(batch["src_mask"].sum()) + int((batch["targets"] != -100).sum())
