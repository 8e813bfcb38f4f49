"""The lecture's claims about the three architectures, as properties that must hold for every variant."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import POSITIONS, VARIANTS, tiny_config
from kqv import DecoderLM, Encoder, EncoderDecoder, count_parameters
from kqv.nn.layers import FeedForward

few = settings(max_examples=8, deadline=None)


@pytest.mark.parametrize("variant", VARIANTS)
@few
@given(cut=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_future_tokens_never_change_past_logits(variant, cut, seed):
    torch.manual_seed(seed)
    model = DecoderLM(tiny_config(**VARIANTS[variant])).eval()
    ids = torch.randint(0, 37, (2, 10))
    changed = ids.clone()
    changed[:, cut:] = torch.randint(0, 37, (2, 10 - cut))
    torch.testing.assert_close(model(ids)[:, :cut], model(changed)[:, :cut])


@pytest.mark.parametrize("variant", VARIANTS)
@few
@given(cut=st.integers(1, 7), seed=st.integers(0, 2**16))
def test_future_target_tokens_never_change_past_logits_in_the_encoder_decoder(variant, cut, seed):
    torch.manual_seed(seed)
    model = EncoderDecoder(tiny_config(**VARIANTS[variant])).eval()
    src, tgt = torch.randint(0, 37, (2, 6)), torch.randint(0, 37, (2, 8))
    changed = tgt.clone()
    changed[:, cut:] = torch.randint(0, 37, (2, 8 - cut))
    torch.testing.assert_close(model(src, tgt)[:, :cut], model(src, changed)[:, :cut])


@pytest.mark.parametrize("variant", VARIANTS)
def test_encoder_sees_the_future_unlike_the_decoder(variant):
    model = Encoder(tiny_config(**VARIANTS[variant])).eval()
    ids = torch.randint(0, 37, (1, 8))
    changed = ids.clone()
    changed[0, 1] = (ids[0, 1] + 1) % 37  # a later token in the same local block as the first
    assert not torch.allclose(model(ids)[:, 0], model(changed)[:, 0])


def _pad(ids: torch.Tensor, extra: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad with random junk tokens and return (padded ids, attention mask)."""
    padded = torch.cat([ids, torch.randint(0, 37, (ids.shape[0], extra))], dim=1)
    mask = torch.cat([torch.ones_like(ids), torch.zeros(ids.shape[0], extra, dtype=torch.long)], dim=1)
    return padded, mask


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_never_changes_encoder_outputs(variant, norm_first):
    model = Encoder(tiny_config(**VARIANTS[variant], norm_first=norm_first)).eval()
    ids = torch.randint(0, 37, (2, 7))
    padded, mask = _pad(ids, 4)
    torch.testing.assert_close(model(padded, mask)[:, :7], model(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_never_changes_decoder_lm_logits(variant):
    model = DecoderLM(tiny_config(**VARIANTS[variant])).eval()
    ids = torch.randint(0, 37, (2, 7))
    padded, mask = _pad(ids, 3)
    torch.testing.assert_close(model(padded, attention_mask=mask)[:, :7], model(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_source_padding_never_changes_translation_logits(variant):
    model = EncoderDecoder(tiny_config(**VARIANTS[variant])).eval()
    src, tgt = torch.randint(0, 37, (2, 6)), torch.randint(0, 37, (2, 5))
    padded, mask = _pad(src, 5)
    torch.testing.assert_close(model(padded, tgt, src_mask=mask), model(src, tgt), atol=1e-5, rtol=1e-5)


def test_without_positions_the_encoder_is_permutation_equivariant():
    model = Encoder(tiny_config(position="none")).eval()
    ids = torch.randint(0, 37, (1, 9))
    order = torch.randperm(9)
    torch.testing.assert_close(model(ids[:, order]), model(ids)[:, order], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", [p for p in POSITIONS if p != "none"])
def test_with_positions_the_encoder_is_not_permutation_equivariant(position):
    model = Encoder(tiny_config(position=position)).eval()
    ids = torch.arange(9)[None]  # distinct tokens, so any difference comes from positions
    order = torch.tensor([8, 0, 1, 2, 3, 4, 5, 6, 7])
    assert not torch.allclose(model(ids[:, order]), model(ids)[:, order], atol=1e-4)


def _assert_every_parameter_gets_a_gradient(model: torch.nn.Module, loss: torch.Tensor) -> None:
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"no gradient reached {missing}"


@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu", "geglu"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_gradients_reach_every_parameter_of_the_decoder_lm(variant, activation):
    model = DecoderLM(tiny_config(**VARIANTS[variant], activation=activation, tie_embeddings=False))
    ids = torch.randint(0, 37, (4, 16))  # enough tokens that every expert of a mixture gets some
    _assert_every_parameter_gets_a_gradient(model, model(ids, ids))


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_gradients_reach_every_parameter_of_the_encoder_decoder(variant, norm):
    model = EncoderDecoder(tiny_config(**VARIANTS[variant], norm=norm, embed_norm=True, tgt_vocab_size=29))
    src, tgt = torch.randint(0, 37, (4, 12)), torch.randint(0, 29, (4, 12))
    _assert_every_parameter_gets_a_gradient(model, model(src, tgt, tgt))


def test_gradients_reach_every_parameter_of_the_encoder():
    model = Encoder(tiny_config(position="relative", norm_first=False))
    _assert_every_parameter_gets_a_gradient(model, model(torch.randint(0, 37, (2, 6))).pow(2).mean())


def test_pre_ln_models_end_with_a_norm_and_post_ln_models_do_not():
    assert isinstance(DecoderLM(tiny_config(norm_first=True)).decoder.final_norm, torch.nn.LayerNorm)
    assert isinstance(Encoder(tiny_config(norm_first=False)).final_norm, torch.nn.Identity)


def test_gated_feed_forward_has_two_input_projections_of_width_d_ff():
    config = tiny_config(activation="swiglu", d_ff=48)
    ff = FeedForward(config)
    assert ff.up.weight.shape == (2 * 48, config.d_model) and ff.down.weight.shape == (config.d_model, 48)
    x = torch.randn(1, 3, config.d_model)
    gate, value = ff.up(x).chunk(2, -1)
    torch.testing.assert_close(ff(x), ff.down(torch.nn.functional.silu(gate) * value))


def test_tied_embeddings_share_one_matrix_with_the_output_projection():
    tied, untied = DecoderLM(tiny_config()), DecoderLM(tiny_config(tie_embeddings=False))
    assert tied.lm_head.weight is tied.decoder.embeddings.tokens.weight
    assert count_parameters(untied) - count_parameters(tied) == 37 * 32


def test_parameter_count_matches_the_closed_form():
    d, ff, v, layers, n = 32, 64, 37, 2, 64
    config = tiny_config(position="learned", max_len=n)
    attention = 4 * d * d + 4 * d  # queries, keys, values, output with biases
    feed_forward = d * ff + ff + ff * d + d
    block = attention + feed_forward + 2 * 2 * d  # two LayerNorms
    expected = v * d + n * d + layers * block + 2 * d  # embeddings, positions, blocks, final norm (head tied)
    assert count_parameters(DecoderLM(config)) == expected
    assert count_parameters(DecoderLM(config), exclude_embeddings=True) == expected - v * d - n * d


def test_loss_is_cross_entropy_ignoring_minus_100():
    model = DecoderLM(tiny_config()).eval()
    ids = torch.randint(0, 37, (2, 6))
    targets = ids.clone()
    targets[:, 3:] = -100
    logits = model(ids)
    expected = torch.nn.functional.cross_entropy(logits[:, :3].reshape(-1, 37), ids[:, :3].reshape(-1))
    torch.testing.assert_close(model(ids, targets), expected)


def test_separate_target_vocabulary_sizes_the_output():
    model = EncoderDecoder(tiny_config(tgt_vocab_size=11))
    assert model(torch.randint(0, 37, (1, 4)), torch.randint(0, 11, (1, 3))).shape == (1, 3, 11)


def test_attention_weights_are_exposed_for_every_layer():
    model = EncoderDecoder(tiny_config()).eval()
    weights = model.attention_weights(torch.randint(0, 37, (1, 5)), torch.randint(0, 37, (1, 3)))
    assert [w.shape for w in weights["cross"]] == [(1, 4, 3, 5)] * 2
    assert [w.shape for w in weights["encoder"]] == [(1, 4, 5, 5)] * 2
    lm = DecoderLM(tiny_config()).eval()
    assert [w.shape for w in lm.attention_weights(torch.randint(0, 37, (1, 6)))] == [(1, 4, 6, 6)] * 2


# ---------------------------------------------------------------------------------------------------------------
# Bad input: a message naming the problem, never an IndexError from inside torch


@pytest.fixture(scope="module")
def lm():
    return DecoderLM(tiny_config(position="learned", max_len=16)).eval()


def test_token_id_outside_vocabulary_is_named(lm):
    with pytest.raises(ValueError, match=r"token id 37, outside the vocabulary \[0, 37\)"):
        lm(torch.tensor([[1, 37]]))
    with pytest.raises(ValueError, match=r"token id -1"):
        lm(torch.tensor([[-1, 3]]))


def test_float_ids_are_a_type_error(lm):
    with pytest.raises(TypeError, match="integer tensor"):
        lm(torch.tensor([[1.0, 2.0]]))


def test_non_tensor_ids_are_a_type_error(lm):
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        lm([[1, 2]])


def test_ids_without_batch_dimension_get_a_hint(lm):
    with pytest.raises(ValueError, match=r"shape \(batch, time\), got \(3,\); add a batch dimension"):
        lm(torch.tensor([1, 2, 3]))


def test_empty_sequence_is_rejected(lm):
    with pytest.raises(ValueError, match="empty"):
        lm(torch.zeros(1, 0, dtype=torch.long))


def test_mask_of_wrong_shape_is_rejected(lm):
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch, time\) = \(1, 3\)"):
        lm(torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 4))


def test_mask_with_values_other_than_zero_and_one_is_rejected(lm):
    with pytest.raises(ValueError, match="only 1 \\(token\\) and 0 \\(padding\\)"):
        lm(torch.tensor([[1, 2, 3]]), attention_mask=torch.tensor([[1, 2, 0]]))


def test_too_long_input_for_learned_positions_says_so(lm):
    with pytest.raises(ValueError, match="learned positions only cover max_len=16"):
        lm(torch.zeros(1, 17, dtype=torch.long))


def test_targets_of_wrong_shape_are_rejected(lm):
    with pytest.raises(ValueError, match="targets must have shape"):
        lm(torch.tensor([[1, 2, 3]]), torch.tensor([[1, 2]]))


def test_encoder_decoder_names_the_bad_target_input():
    model = EncoderDecoder(tiny_config(tgt_vocab_size=11))
    with pytest.raises(ValueError, match=r"tgt_ids contains token id 20, outside the vocabulary \[0, 11\)"):
        model(torch.tensor([[1, 2]]), torch.tensor([[20]]))


def test_positions_other_than_learned_run_past_max_len():
    model = DecoderLM(tiny_config(position="rope", max_len=8)).eval()
    assert model(torch.zeros(1, 20, dtype=torch.long)).shape == (1, 20, 37)
