"""Search for the most likely output sequence, one token at a time: greedy decoding and beam search.

Written once for every model that predicts a next token: the search sees a `Stepper`, which turns the last token
of each row into next-token log-probabilities and keeps its own state (a KV cache, an LSTM state, the encoder
memory) in step with the rows the search keeps. The Transformer (`kqv.nn.generation.EncoderDecoderStepper`) and the
LSTM baseline (`kqv.nn.rnn.RNNStepper`) implement it, so the two are compared with the same decoder.

Beam search follows Hugging Face's `generate` (and the CS224N assignment): at every step each sentence keeps the
`beam_size` best live prefixes by summed log-probability; a prefix that emits EOS among the best `beam_size`
candidates becomes a finished hypothesis, scored by its log-probability / length ** length_penalty (length counts
the generated tokens, EOS included), and the sentence keeps its `beam_size` best. A sentence is done when it has
`beam_size` finished hypotheses and its best live prefix, scored as if it ended now, is no better than the worst
of them; at max_new_tokens its live prefixes compete too. With length_penalty 0 that stopping rule is exact: a
prefix's log-probability only falls as it grows. Every sentence is searched as if it were alone in the batch.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from ..errors import ConfigError


class Stepper(Protocol):
    """What a model gives the search. It starts with one row per sentence."""

    def step(self, last_ids: Tensor) -> Tensor:
        """last_ids (rows,), the newest token of every row -> next-token log-probabilities (rows, vocab), float."""
        ...

    def reorder(self, rows: Tensor) -> None:
        """Keep the rows `rows` (new_rows,) of the current ones, in that order (a row may be kept several times)."""
        ...


def search(
    stepper: Stepper,
    batch: int,
    max_new_tokens: int,
    *,
    bos_id: int,
    eos_id: int,
    beam_size: int = 1,
    length_penalty: float = 1.0,
    device: torch.device | None = None,
) -> Tensor:
    """Greedy decoding for beam_size 1, else beam search. Returns (batch, 1 + up to max_new_tokens) ids that start
    with bos_id and are padded with eos_id after each sequence's end."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ConfigError(f"beam_size must be a positive integer, got {beam_size!r}")
    if beam_size == 1:
        return greedy_search(stepper, batch, max_new_tokens, bos_id=bos_id, eos_id=eos_id, device=device)
    return beam_search(
        stepper,
        batch,
        max_new_tokens,
        beam_size=beam_size,
        length_penalty=length_penalty,
        bos_id=bos_id,
        eos_id=eos_id,
        device=device,
    )


def greedy_search(
    stepper: Stepper, batch: int, max_new_tokens: int, *, bos_id: int, eos_id: int, device: torch.device | None = None
) -> Tensor:
    """Take the most likely token at every step; a row that has emitted EOS repeats it; stop when all have."""
    ids = torch.full((batch, 1), bos_id, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    for _ in range(max_new_tokens):
        next_ids = stepper.step(ids[:, -1]).argmax(dim=-1).masked_fill(finished, eos_id)
        ids = torch.cat((ids, next_ids[:, None]), dim=1)
        finished |= next_ids == eos_id
        if finished.all():
            break
    return ids


class Hypotheses:
    """The `beam` best finished sequences of every sentence, best first: normalised scores (batch, beam), -inf for
    an empty slot, and their ids (batch, beam, 1 + max_new_tokens), padded with EOS."""

    def __init__(
        self,
        batch: int,
        beam: int,
        max_new_tokens: int,
        eos_id: int,
        length_penalty: float,
        device: torch.device | None,
    ):
        self.beam, self.eos_id, self.length_penalty = beam, eos_id, length_penalty
        self.scores = torch.full((batch, beam), float("-inf"), device=device)
        self.ids = torch.full((batch, beam, 1 + max_new_tokens), eos_id, dtype=torch.long, device=device)

    def normalise(self, scores: Tensor, length: int) -> Tensor:
        return scores / length**self.length_penalty

    def add(self, sequences: Tensor, scores: Tensor, keep: Tensor) -> None:
        """Offer sequences (batch, n, time) with summed log-probabilities (batch, n) where `keep` (batch, n)."""
        offered = self.normalise(scores, sequences.shape[-1] - 1).masked_fill(~keep, float("-inf"))
        padded = torch.full(
            (*sequences.shape[:2], self.ids.shape[-1]), self.eos_id, dtype=torch.long, device=sequences.device
        )
        padded[:, :, : sequences.shape[-1]] = sequences
        self.scores, best = torch.cat((self.scores, offered), dim=1).topk(self.beam, dim=1)  # (batch, beam)
        ids = torch.cat((self.ids, padded), dim=1)
        self.ids = ids.gather(1, best[:, :, None].expand(-1, -1, ids.shape[-1]))

    def full(self) -> Tensor:
        return self.scores[:, -1] > float("-inf")

    def best(self) -> Tensor:
        """(batch, time) the best sequence of every sentence, trimmed to the longest of them."""
        ids = self.ids[:, 0]
        lengths = ((ids != self.eos_id).cumsum(1) == torch.arange(1, ids.shape[1] + 1, device=ids.device)).sum(1)
        return ids[:, : int((lengths + 1).clamp(max=ids.shape[1]).max())]


def beam_search(
    stepper: Stepper,
    batch: int,
    max_new_tokens: int,
    *,
    beam_size: int,
    length_penalty: float,
    bos_id: int,
    eos_id: int,
    device: torch.device | None = None,
) -> Tensor:
    """Keep the `beam_size` best prefixes of every sentence (see the module docstring for the rules)."""
    k = beam_size
    stepper.reorder(torch.arange(batch, device=device).repeat_interleave(k))  # (batch * k) rows
    prefixes = torch.full((batch * k, 1), bos_id, dtype=torch.long, device=device)
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start equal: let only the first one expand at step 1
    finished = Hypotheses(batch, k, max_new_tokens, eos_id, length_penalty, device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    offsets = torch.arange(batch, device=device)[:, None] * k
    for step in range(1, max_new_tokens + 1):
        log_probs = stepper.step(prefixes[:, -1])  # (batch * k, vocab)
        vocab = log_probs.shape[-1]
        candidates = (scores[:, :, None] + log_probs.view(batch, k, vocab)).view(batch, k * vocab)
        top_scores, top_index = candidates.topk(min(2 * k, k * vocab), dim=-1)  # (batch, 2k): refills k live beams
        rows, tokens = top_index // vocab + offsets, top_index % vocab
        ends = tokens == eos_id
        ranked = torch.arange(top_index.shape[1], device=device) < k  # HF: only EOS among the best k finishes
        sequences = torch.cat((prefixes[rows], tokens[:, :, None]), dim=-1)  # (batch, 2k, step + 1)
        finished.add(sequences, top_scores, ends & ranked & (top_scores > float("-inf")) & ~done[:, None])
        live = (~ends).int().argsort(dim=-1, descending=True, stable=True)[:, :k]  # the first k non-EOS
        scores = top_scores.gather(1, live)
        kept = rows.gather(1, live).view(-1)
        prefixes = torch.cat((prefixes[kept], tokens.gather(1, live).view(-1, 1)), dim=1)
        stepper.reorder(kept)
        done |= finished.full() & (finished.normalise(scores[:, 0], step) <= finished.scores[:, -1])
        if done.all():
            break
    # sentences not done by the last step: their live prefixes compete too
    finished.add(prefixes.view(batch, k, -1), scores, ~done[:, None] & (scores > float("-inf")))
    return finished.best()
