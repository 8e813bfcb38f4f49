"""Token-by-token decoding: an in-place KV cache, left-padded batches of prompts, the bf16 path, and Hugging Face
GPT-2's greedy tokens on the same weights."""

import warnings

import pytest
import torch

from kqv import DecoderLM, KVCache
from kqv.interop import to_hf
from kqv.nn.decoding import DecodeStep, fused_linear, linear, one_row_product
from kqv.nn.generation import PromptLayout, in_dtype

from conftest import POSITIONS, tiny_config


def test_the_cache_writes_each_step_in_place_into_the_buffer_it_reserved():
    model = DecoderLM(tiny_config(position="rope")).eval()
    ids = torch.randint(0, 37, (2, 10))
    cache = model.new_cache(capacity=10)
    with torch.no_grad():
        model(ids[:, :4], cache=cache)
        buffers = [(layer._keys.data_ptr(), layer._values.data_ptr()) for layer, _ in cache]
        for t in range(4, 10):
            model(ids[:, t:t + 1], cache=cache)
    assert [(layer._keys.data_ptr(), layer._values.data_ptr()) for layer, _ in cache] == buffers
    assert all(layer.length == 10 and layer._keys.shape[2] == 10 for layer, _ in cache)


def test_a_cache_that_outgrows_its_buffer_doubles_it_and_keeps_every_key():
    cache = KVCache()
    steps = [torch.randn(2, 3, n, 4) for n in (3, 1, 1, 5, 1)]
    for keys in steps:
        all_keys, all_values = cache.append(keys, -keys)
    expected = torch.cat(steps, dim=2)
    assert torch.equal(all_keys, expected) and torch.equal(all_values, -expected)
    # reserved: 3, then 6 (twice the 3 filled), then 10 (what 5 new keys need), then 20 (twice the 10 filled)
    assert cache.length == 11 and cache._keys.shape[2] == 20


@pytest.mark.parametrize("position", POSITIONS)
def test_a_left_padded_batch_generates_what_each_prompt_generates_alone(position):
    model = DecoderLM(tiny_config(position=position)).eval()
    prompts = [torch.randint(0, 37, (n,)) for n in (5, 2, 4)]
    ids = torch.zeros(3, 5, dtype=torch.long)
    mask = torch.zeros(3, 5, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, 5 - len(prompt):], mask[row, 5 - len(prompt):] = prompt, 1
    for use_cache in (True, False):
        batched = model.generate(ids, 8, temperature=0, attention_mask=mask, use_cache=use_cache)
        for row, prompt in enumerate(prompts):
            alone = model.generate(prompt[None], 8, temperature=0)
            assert torch.equal(batched[row, 5:], alone[0, len(prompt):]), (row, use_cache)


@pytest.mark.parametrize("mask,message", [
    (torch.tensor([[1, 1, 0]]), "padded on the left"),
    (torch.tensor([[0, 2, 1]]), "only 1 .token. and 0"),
    (torch.ones(1, 2, dtype=torch.long), "shape of the prompts"),
])
def test_a_bad_prompt_mask_is_a_clear_error(mask, message):
    model = DecoderLM(tiny_config()).eval()
    with pytest.raises(ValueError, match=message):
        model.generate(torch.ones(1, 3, dtype=torch.long), 2, attention_mask=mask)


def test_the_bf16_path_runs_a_bf16_copy_and_leaves_the_model_as_it_was():
    model = DecoderLM(tiny_config()).eval()
    before = {name: p.clone() for name, p in model.state_dict().items()}
    lowered = in_dtype(model, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in lowered.parameters())
    ids = torch.randint(0, 37, (2, 6))
    with torch.no_grad():
        expected = model(ids)
        actual = lowered(ids).float()
    assert (actual - expected).abs().max() < 0.05 * expected.abs().max()
    out = model.generate(ids, 5, temperature=0, dtype=torch.bfloat16)
    assert out.shape == (2, 11) and torch.equal(out[:, :6], ids)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.equal(before[name], p) for name, p in model.state_dict().items())
    with pytest.raises(ValueError, match="floating-point torch.dtype"):
        model.generate(ids, 2, dtype=torch.int8)


def hf_greedy(hf, ids, mask, new):
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        return hf.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           pad_token_id=0)


def test_greedy_tokens_equal_hugging_face_gpt2_on_the_same_weights_with_left_padding():
    model = DecoderLM(tiny_config(position="learned", activation="gelu_tanh", vocab_size=97, max_len=48)).eval()
    hf = to_hf(model)
    ids = torch.randint(1, 97, (3, 6))
    mask = torch.ones_like(ids)
    mask[1, :3] = mask[2, :1] = 0
    ids = ids.masked_fill(mask == 0, 0)
    for prompts, prompt_mask in ((ids[:1], mask[:1]), (ids, mask)):
        expected = hf_greedy(hf, prompts, prompt_mask, 30)
        actual = model.generate(prompts, 30, temperature=0, attention_mask=prompt_mask)
        assert torch.equal(actual, expected)


LEAN_VARIANTS = {
    **{position: dict(position=position) for position in ("sinusoidal", "learned", "rope", "none")},
    "post-LN rmsnorm": dict(norm="rmsnorm", norm_first=False),
    "swiglu": dict(activation="swiglu", position="rope"),
    "scaled embeddings": dict(scale_embeddings=True, position="learned"),
    "embedding norm": dict(embed_norm=True, position="sinusoidal"),  # the Embeddings module's own forward
}


@pytest.mark.parametrize("changes", LEAN_VARIANTS.values(), ids=LEAN_VARIANTS.keys())
def test_the_lean_decoding_step_gives_the_general_paths_logits_bit_for_bit(changes):
    assert_lean_step_is_the_general_path(DecoderLM(tiny_config(**changes)).eval())


@pytest.mark.parametrize("changes", LEAN_VARIANTS.values(), ids=LEAN_VARIANTS.keys())
def test_at_batch_one_the_transposed_weights_move_only_the_last_bits_and_no_greedy_token(changes):
    model = DecoderLM(tiny_config(**changes)).eval()
    step = DecodeStep(model, model.new_cache(4), batch=1)
    assert all(layer.to_queries_keys_values is not None for layer in step.layers)
    assert_lean_step_is_the_general_path(model, batch=1, exact=False)
    ids = torch.randint(1, 37, (1, 5))
    assert torch.equal(model.generate(ids, 40, temperature=0), model.generate(ids, 40, temperature=0,
                                                                              use_cache=False))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("width,out", [(384, (384, 768)), (64, (64, 128)), (384, (1536, 384))])
def test_stacked_one_row_projections_equal_the_separate_ones_bit_for_bit(width, out, threads):
    layers = [torch.nn.Linear(width, n) for n in out]
    x = torch.randn(1, width)  # one row, as DecodeStep feeds its projections
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            stacked = fused_linear(*layers)(x).split(out, dim=-1)
            separate = [linear(layer, one_row=True)(x) for layer in layers]
            reference = [layer(x) for layer in layers]
    finally:
        torch.set_num_threads(previous)
    assert all(torch.equal(a, b) for a, b in zip(stacked, separate))
    for a, b in zip(stacked, reference):  # the (in, out) copy sums in another order than F.linear
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert fused_linear(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4, bias=False)) is None
    assert fused_linear(torch.nn.Linear(4, 4).bfloat16(), torch.nn.Linear(4, 4).bfloat16()) is None  # fp32 only


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("out,width", [(1152, 384), (384, 384), (384, 1536), (96, 32)])  # wide, square, deep
def test_one_row_products_do_not_depend_on_how_many_blocks_the_threads_take(out, width, bias):
    layer = torch.nn.Linear(width, out, bias=bias)
    x = torch.randn(1, width)
    with torch.no_grad():
        products = [one_row_product(layer.weight, layer.bias, parts)(x) for parts in (1, 2, 3, 4, 5)]
        reference = layer(x)
    assert all(torch.equal(product, products[0]) for product in products)  # 5 parts do not divide: one block
    torch.testing.assert_close(products[0], reference, rtol=1e-5, atol=1e-5)


def assert_lean_step_is_the_general_path(model, batch=3, exact=True):
    assert DecodeStep.supports(model)
    ids = torch.randint(1, 37, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, :4] = mask[2, :1] = 0
    for attention_mask in (None, mask[:batch]) if batch > 1 else (None,):
        ids = ids[:batch]
        layout = PromptLayout(None if attention_mask is None else attention_mask[:, :5], ids[:, :5], 12)
        caches = [model.new_cache(12), model.new_cache(12)]
        step = DecodeStep(model, caches[1], batch=batch)
        with torch.no_grad():
            for cache in caches:
                model.next_token_logits(ids[:, :5], cache, positions=layout.positions[:5],
                                        attention_mask=layout.mask(0, 5), left_padding=layout.left_padding)
            for end in range(6, 12):
                general = model.next_token_logits(ids[:, end - 1:end], caches[0],
                                                  positions=layout.positions[end - 1:end],
                                                  attention_mask=layout.mask(end - 1, end),
                                                  left_padding=layout.left_padding)
                lean = step(ids[:, end - 1:end], layout.positions[end - 1:end], layout.mask(end - 1, end),
                            layout.left_padding)
                if exact:
                    assert torch.equal(lean, general), (end, attention_mask is not None)
                else:
                    torch.testing.assert_close(lean, general, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("changes", [dict(position="alibi"), dict(position="relative"),
                                     dict(attention="linformer", linformer={"k": 16}),
                                     dict(ffn="switch", experts={"count": 2}),
                                     dict(blockwise="always")])
def test_models_the_lean_step_does_not_cover_decode_on_the_general_path(changes):
    model = DecoderLM(tiny_config(**changes)).eval()
    assert not DecodeStep.supports(model)
    assert not DecodeStep.supports(model.train())
    ids = torch.randint(1, 37, (2, 4))
    model.eval()
    assert torch.equal(model.generate(ids, 6, temperature=0), model.generate(ids, 6, temperature=0, use_cache=False))


def test_generate_returns_an_ordinary_tensor_the_caller_may_change_in_place():
    model = DecoderLM(tiny_config()).eval()
    out = model.generate(torch.randint(0, 37, (2, 3)), 4, temperature=0)
    assert not out.is_inference()
    out[:, 0] = 1  # an inference-mode tensor would refuse this outside inference mode
    assert (out[:, 0] == 1).all()


def test_the_int8_path_quantises_a_copys_linear_layers_and_stays_close_to_fp32():
    model = DecoderLM(tiny_config(position="rope")).eval()
    before = {name: p.clone() for name, p in model.state_dict().items()}
    quantised = in_dtype(model, torch.qint8)
    assert not any(isinstance(m, torch.nn.Linear) for m in quantised.modules())  # every projection is int8
    ids = torch.randint(0, 37, (2, 6))
    with torch.no_grad():
        expected, actual = model(ids), quantised(ids)
    assert (actual - expected).abs().max() < 0.1 * expected.abs().max()
    assert DecodeStep.supports(quantised)
    out = model.generate(ids, 5, temperature=0, dtype=torch.qint8)
    assert out.shape == (2, 11) and torch.equal(out[:, :6], ids)
    assert_lean_step_is_the_general_path(quantised)
    assert all(torch.equal(before[name], p) for name, p in model.state_dict().items())
