import pytest
import torch

from conftest import POSITIONS, VARIANTS, tiny_config
from kqv import DecoderLM
from kqv.nn.generation import sample_next


def _logits_one_token_at_a_time(model, ids):
    cache = model.new_cache()
    return torch.cat([model(ids[:, t : t + 1], cache=cache) for t in range(ids.shape[1])], dim=1)


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_logits_equal_uncached_logits(variant):
    model = DecoderLM(tiny_config(**VARIANTS[variant])).eval()
    ids = torch.randint(0, 37, (2, 12))
    torch.testing.assert_close(_logits_one_token_at_a_time(model, ids), model(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", [p for p in POSITIONS if p != "learned"])
def test_cache_keeps_matching_after_it_passes_max_len(position):
    model = DecoderLM(tiny_config(position=position, max_len=8)).eval()
    ids = torch.randint(0, 37, (1, 20))
    torch.testing.assert_close(_logits_one_token_at_a_time(model, ids), model(ids), atol=1e-5, rtol=1e-5)


def test_cache_can_be_filled_by_a_prompt_then_extended():
    model = DecoderLM(tiny_config(position="relative")).eval()
    ids = torch.randint(0, 37, (2, 9))
    cache = model.new_cache()
    prefix = model(ids[:, :6], cache=cache)
    rest = model(ids[:, 6:], cache=cache)
    torch.testing.assert_close(torch.cat([prefix, rest], 1), model(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_generation_is_the_same_with_and_without_cache(variant):
    model = DecoderLM(tiny_config(**VARIANTS[variant])).eval()
    prompt = torch.randint(0, 37, (3, 4))
    cached = model.generate(prompt, 12, temperature=0, use_cache=True)
    uncached = model.generate(prompt, 12, temperature=0, use_cache=False)
    assert cached.shape == (3, 16) and torch.equal(cached, uncached) and torch.equal(cached[:, :4], prompt)


def test_greedy_generation_picks_the_argmax_of_the_full_forward_pass():
    model = DecoderLM(tiny_config()).eval()
    out = model.generate(torch.randint(0, 37, (2, 3)), 6, temperature=0)
    torch.testing.assert_close(model(out)[:, 2:-1].argmax(-1), out[:, 3:])


def test_learned_positions_refuse_to_generate_past_max_len_with_a_clear_error():
    model = DecoderLM(tiny_config(position="learned", max_len=10)).eval()
    assert model.generate(torch.zeros(1, 4, dtype=torch.long), 7).shape == (1, 11)  # fills exactly 10 positions
    with pytest.raises(ValueError, match="exceeds max_len=10 of learned positions; ask for at most 7 new tokens"):
        model.generate(torch.zeros(1, 4, dtype=torch.long), 8)


def test_top_k_never_emits_a_token_outside_the_k_most_likely():
    logits = torch.randn(4, 50)
    allowed = logits.topk(3, -1).indices
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        picked = sample_next(logits, top_k=3, generator=generator)
        assert (allowed == picked[:, None]).any(-1).all()


def test_top_p_keeps_the_smallest_set_reaching_probability_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    seen = {int(sample_next(probs.log(), top_p=0.7)) for _ in range(300)}
    assert seen == {0, 1}  # 0.5 < 0.7 needs the second token; 0.8 >= 0.7 stops there


def test_temperature_zero_is_greedy():
    logits = torch.randn(5, 20)
    assert torch.equal(sample_next(logits, temperature=0), logits.argmax(-1))


def test_low_temperature_concentrates_samples_on_the_argmax():
    logits = torch.tensor([[1.0, 0.5, 0.0]])
    samples = [int(sample_next(logits, temperature=0.05)) for _ in range(100)]
    assert samples.count(0) >= 99


def test_generation_stops_and_pads_after_eos():
    model = DecoderLM(tiny_config()).eval()
    prompt = torch.randint(0, 37, (1, 3))
    eos = int(model.generate(prompt, 1, temperature=0)[0, -1])  # the first greedy token will be "eos"
    out = model.generate(prompt, 10, temperature=0, eos_id=eos)
    assert out.shape == (1, 4) and int(out[0, -1]) == eos


def test_sampling_is_reproducible_with_a_generator():
    model = DecoderLM(tiny_config()).eval()
    prompt = torch.randint(0, 37, (2, 3))
    first = model.generate(prompt, 8, generator=torch.Generator().manual_seed(7))
    second = model.generate(prompt, 8, generator=torch.Generator().manual_seed(7))
    assert torch.equal(first, second)


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(max_new_tokens=0), "max_new_tokens must be an integer from 1 to 100,000, got 0"),
        (dict(max_new_tokens=3, temperature=-1.0), r"temperature must be 0 \(greedy\) or a number from 0.001"),
        (dict(max_new_tokens=3, top_k=0), "top_k must be an integer of at least 1, got 0"),
        (dict(max_new_tokens=3, top_p=1.5), "top_p must be a number greater than 0 and at most 1, got 1.5"),
    ],
)
def test_bad_generation_options_are_named(options, message):
    model = DecoderLM(tiny_config())
    with pytest.raises(ValueError, match=message):
        model.generate(torch.zeros(1, 2, dtype=torch.long), **options)


def test_empty_prompt_is_rejected():
    with pytest.raises(ValueError, match="empty"):
        DecoderLM(tiny_config()).generate(torch.zeros(1, 0, dtype=torch.long), 3)
