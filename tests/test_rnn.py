"""Specification of kqv.nn.rnn: the bidirectional-LSTM encoder, LSTM-with-attention decoder baseline."""

from __future__ import annotations

import pytest
import torch

from kqv.nn.rnn import RNNConfig, RNNEncoderDecoder

SCORES = ["dot", "multiplicative", "reduced_rank", "additive"]
BOS, EOS = 1, 2


def tiny_model(score: str = "multiplicative", **changes) -> RNNEncoderDecoder:
    values = {
        "vocab_size": 23,
        "d_embed": 12,
        "d_hidden": 16,
        "n_layers": 2,
        "score": score,
        "attention_hidden": 8,
        "dropout": 0.0,
    }
    return RNNEncoderDecoder(RNNConfig(**{**values, **changes})).eval()


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.randint(3, 23, (3, 7))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    return src.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("score", SCORES)
def test_step_by_step_decoding_with_the_lstm_state_equals_the_teacher_forced_forward(score):
    model = tiny_model(score)
    src, mask = padded_batch()
    tgt = torch.randint(3, 23, (3, 6))
    full = model(src, tgt, src_mask=mask).log_softmax(dim=-1)  # (batch, time, vocab)
    memory, state, memory_mask = model.encode(src, mask)
    for t in range(tgt.shape[1]):
        log_probs, state = model.step(tgt[:, t], state, memory, memory_mask)
        torch.testing.assert_close(log_probs, full[:, t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_generation_carrying_the_state_equals_rerunning_the_prefix(beam_size):
    model = tiny_model()
    src, mask = padded_batch()
    cached = model.generate(src, 8, beam_size=beam_size, bos_id=BOS, eos_id=EOS, src_mask=mask)
    uncached = model.generate(src, 8, beam_size=beam_size, bos_id=BOS, eos_id=EOS, src_mask=mask, use_cache=False)
    assert torch.equal(cached, uncached)


def sequence_log_prob(model: RNNEncoderDecoder, src: torch.Tensor, ids: list[int]) -> float:
    """Sum of log-probabilities of the tokens after <bos>, up to and including the first <eos>."""
    end = ids.index(EOS) + 1 if EOS in ids[1:] else len(ids)
    ids = torch.tensor([ids[:end]])
    log_probs = model(src, ids[:, :-1]).log_softmax(dim=-1)
    return log_probs[0].gather(-1, ids[0, 1:, None]).sum().item()


def test_beam_search_finds_a_translation_at_least_as_likely_as_greedy():
    torch.manual_seed(3)
    model = tiny_model(vocab_size=6)
    for _ in range(5):
        src = torch.randint(3, 6, (1, 5))
        greedy = model.generate(src, 6, bos_id=BOS, eos_id=EOS)[0].tolist()
        beam = model.generate(src, 6, beam_size=6, length_penalty=0.0, bos_id=BOS, eos_id=EOS)[0].tolist()
        assert sequence_log_prob(model, src, beam) >= sequence_log_prob(model, src, greedy) - 1e-5


def test_generated_translations_start_with_bos_and_are_padded_with_eos_after_they_end():
    model = tiny_model()
    src, mask = padded_batch()
    for beam_size in (1, 4):
        out = model.generate(src, 12, beam_size=beam_size, bos_id=BOS, eos_id=EOS, src_mask=mask)
        assert (out[:, 0] == BOS).all() and out.shape[1] <= 13
        for row in out.tolist():
            if EOS in row:
                assert set(row[row.index(EOS) :]) == {EOS}


@pytest.mark.parametrize("score", SCORES)
def test_source_padding_never_changes_the_logits_of_a_sentence(score):
    model = tiny_model(score)
    src, mask = padded_batch()
    tgt = torch.randint(3, 23, (3, 5))
    batched = model(src, tgt, src_mask=mask)
    for row, length in enumerate(mask.sum(dim=1).tolist()):
        alone = model(src[row : row + 1, :length], tgt[row : row + 1])
        torch.testing.assert_close(batched[row : row + 1], alone, atol=1e-5, rtol=1e-5)


def test_translation_of_a_padded_batch_equals_translating_each_sentence_alone():
    model = tiny_model()
    src, mask = padded_batch()
    batched = model.generate(src, 8, beam_size=3, bos_id=BOS, eos_id=EOS, src_mask=mask)
    for row, length in enumerate(mask.sum(dim=1).tolist()):
        alone = model.generate(src[row : row + 1, :length], 8, beam_size=3, bos_id=BOS, eos_id=EOS)[0]
        assert batched[row, : len(alone)].tolist() == alone.tolist()


def test_with_targets_the_model_returns_the_mean_cross_entropy_ignoring_minus_100():
    model = tiny_model()
    src, mask = padded_batch()
    tgt = torch.randint(3, 23, (3, 5))
    targets = tgt.clone()
    targets[0, 3:] = -100
    logits = model(src, tgt, src_mask=mask)
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    torch.testing.assert_close(model(src, tgt, targets, src_mask=mask), expected)


@pytest.mark.parametrize("score", SCORES)
def test_every_parameter_receives_a_gradient(score):
    model = tiny_model(score).train()
    src, mask = padded_batch()
    tgt = torch.randint(3, 23, (3, 5))
    model(src, tgt, tgt, src_mask=mask).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_cross_attention_weights_are_an_alignment_over_real_source_tokens():
    model = tiny_model()
    src, mask = padded_batch()
    weights = model.attention_weights(src, torch.randint(3, 23, (3, 4)), mask)["cross"]
    assert len(weights) == 1 and weights[0].shape == (3, 1, 4, 7)
    torch.testing.assert_close(weights[0].sum(dim=-1), torch.ones(3, 1, 4))
    assert (weights[0][2, :, :, 2:] == 0).all()


def test_bad_inputs_are_clear_errors():
    model = tiny_model()
    src, mask = padded_batch()
    with pytest.raises(ValueError, match="padding on the right"):
        model(src, src, src_mask=mask.flip(1))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(src + 100, src)
    with pytest.raises(ValueError, match="no tokens"):
        model(src, src, src_mask=torch.zeros_like(mask))
    with pytest.raises(ValueError, match="score must be one of"):
        RNNConfig(vocab_size=10, score="cosine")
    with pytest.raises(ValueError, match="unknown RNNConfig option"):
        RNNConfig.from_dict({"vocab_size": 10, "d_model": 8})
    with pytest.raises(ValueError, match="beam_size"):
        model.generate(src, 5, beam_size=0, bos_id=BOS, eos_id=EOS)
