"""Translating text with a trained encoder-decoder and scoring the translations (BLEU and chrF).

The MT job (`kqv.jobs.mt`) uses these during training (dev BLEU at every evaluation, test BLEU at the end) and for
`kqv translate` and `kqv eval` on its runs. The special tokens are the MT tokenizer's: `<pad>`, `<bos>`, `<eos>`
first.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..data.padding import lengths_mask, pad_sequences
from ..data.tokenizers import Tokenizer
from ..errors import BEAM_SIZE, LENGTH_PENALTY, ConfigError, DataError, option
from ..nn.config import ModelConfig
from ..nn.devices import model_device
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
