"""Greedy and beam-search decoding of the encoder-decoder."""

import itertools

import pytest
import torch

from conftest import POSITIONS, tiny_config
from kqv import EncoderDecoder

BOS, EOS = 1, 2


def _greedy_reference(model, src, steps):
    """The obvious greedy loop: re-run the whole decoder, take the argmax, no cache, no beams."""
    tgt = torch.full((src.shape[0], 1), BOS)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(steps):
        token = model(src, tgt)[:, -1].argmax(-1)
        token[done] = EOS
        done |= token == EOS
        tgt = torch.cat([tgt, token[:, None]], 1)
        if done.all():
            break
    return tgt


@pytest.mark.parametrize("position", POSITIONS)
def test_beam_size_one_equals_greedy(position):
    model = EncoderDecoder(tiny_config(position=position)).eval()
    src = torch.randint(3, 37, (3, 7))
    out = model.generate(src, 10, bos_id=BOS, eos_id=EOS, beam_size=1)
    assert torch.equal(out, _greedy_reference(model, src, 10))


@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("position", POSITIONS)
def test_cached_decoding_equals_uncached(position, beam_size):
    model = EncoderDecoder(tiny_config(position=position)).eval()
    src = torch.randint(3, 37, (2, 6))
    options = dict(bos_id=BOS, eos_id=EOS, beam_size=beam_size)
    assert torch.equal(
        model.generate(src, 9, use_cache=True, **options), model.generate(src, 9, use_cache=False, **options)
    )


def test_exhaustive_beam_finds_the_most_likely_sequence():
    model = EncoderDecoder(tiny_config(vocab_size=4, position="rope")).eval()
    src = torch.randint(0, 4, (1, 5))
    out = model.generate(src, 3, bos_id=BOS, eos_id=EOS, beam_size=16, length_penalty=0.0)

    @torch.no_grad()
    def log_prob(sequence):
        tgt = torch.tensor([[BOS, *sequence]])
        logp = model(src, tgt[:, :-1]).log_softmax(-1)[0]
        return sum(float(logp[i, t]) for i, t in enumerate(sequence))

    candidates = [
        s
        for n in (1, 2, 3)
        for s in itertools.product(range(4), repeat=n)
        if EOS not in s[:-1] and (len(s) == 3 or s[-1] == EOS)
    ]
    best = max(candidates, key=log_prob)
    found = [t for t in out[0, 1:].tolist()]
    found = found[: found.index(EOS) + 1] if EOS in found else found
    assert tuple(found) == best


def test_beam_search_never_scores_below_greedy():
    model = EncoderDecoder(tiny_config(position="alibi")).eval()
    src = torch.randint(3, 37, (4, 6))

    @torch.no_grad()
    def total_log_prob(tgt):
        logp = model(src, tgt[:, :-1]).log_softmax(-1)
        per_token = logp.gather(-1, tgt[:, 1:, None]).squeeze(-1)
        after_eos = torch.cumsum(tgt[:, 1:] == EOS, 1) - (tgt[:, 1:] == EOS).long() > 0
        return per_token.masked_fill(after_eos, 0).sum(-1)

    greedy = model.generate(src, 8, bos_id=BOS, eos_id=EOS, beam_size=1)
    beam = model.generate(src, 8, bos_id=BOS, eos_id=EOS, beam_size=5, length_penalty=0.0)
    assert torch.all(total_log_prob(beam) >= total_log_prob(greedy) - 1e-5)


def test_output_starts_with_bos_and_is_padded_with_eos_after_the_end():
    model = EncoderDecoder(tiny_config()).eval()
    out = model.generate(torch.randint(3, 37, (5, 6)), 12, bos_id=BOS, eos_id=EOS, beam_size=3)
    assert torch.all(out[:, 0] == BOS)
    for row in out[:, 1:].tolist():
        if EOS in row:
            assert all(t == EOS for t in row[row.index(EOS) :])


@pytest.mark.parametrize("beam_size", [1, 3])
def test_source_padding_does_not_change_the_translation(beam_size):
    model = EncoderDecoder(tiny_config(position="relative")).eval()
    src = torch.randint(3, 37, (2, 5))
    padded = torch.cat([src, torch.zeros(2, 4, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones(2, 5), torch.zeros(2, 4)], 1).long()
    options = dict(bos_id=BOS, eos_id=EOS, beam_size=beam_size)
    assert torch.equal(model.generate(padded, 8, src_mask=mask, **options), model.generate(src, 8, **options))


def test_a_batch_translates_each_source_as_if_alone():
    model = EncoderDecoder(tiny_config()).eval()
    src = torch.randint(3, 37, (3, 6))
    together = model.generate(src, 7, bos_id=BOS, eos_id=EOS, beam_size=4)
    for i in range(3):
        alone = model.generate(src[i : i + 1], 7, bos_id=BOS, eos_id=EOS, beam_size=4)
        assert torch.equal(together[i, : alone.shape[1]], alone[0])


def test_bad_beam_size_is_named():
    model = EncoderDecoder(tiny_config())
    with pytest.raises(ValueError, match="beam_size must be a positive integer"):
        model.generate(torch.ones(1, 3, dtype=torch.long), 5, bos_id=BOS, eos_id=EOS, beam_size=0)


def test_learned_positions_refuse_to_decode_past_max_len():
    model = EncoderDecoder(tiny_config(position="learned", max_len=8))
    with pytest.raises(ValueError, match="exceeds max_len=8"):
        model.generate(torch.ones(1, 3, dtype=torch.long), 9, bos_id=BOS, eos_id=EOS)


def test_empty_source_is_rejected():
    model = EncoderDecoder(tiny_config())
    with pytest.raises(ValueError, match="empty"):
        model.generate(torch.ones(1, 0, dtype=torch.long), 5, bos_id=BOS, eos_id=EOS)
