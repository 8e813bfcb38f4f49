"""Token-by-token decoding: an in-place KV cache, left-padded batches of prompts, the bf16 path, and Hugging Face
GPT-2's greedy tokens on the same weights."""

import warnings

import pytest
import torch

from conftest import POSITIONS, tiny_config
from kqv import DecoderLM, KVCache
from kqv.interop import to_hf
from kqv.nn.cores import FullAttention
from kqv.nn.decoding import (
    LEAN_SUBLAYERS,
    SPLIT_MIN_WEIGHTS,
    DecodeStep,
    declared_sublayers,
    fused_linear,
    linear,
    one_row_blocks,
    one_row_product,
)
from kqv.nn.generation import PromptLayout, in_dtype
from kqv.nn.layers import DecoderBlock, Sublayer
from kqv.nn.positions import LearnedPositions


def test_the_cache_writes_each_step_in_place_into_the_buffer_it_reserved():
    model = DecoderLM(tiny_config(position="rope")).eval()
    ids = torch.randint(0, 37, (2, 10))
    cache = model.new_cache(capacity=10)
    with torch.no_grad():
        model(ids[:, :4], cache=cache)
        buffers = [(layer._keys.data_ptr(), layer._values.data_ptr()) for layer, _ in cache]
        for t in range(4, 10):
            model(ids[:, t : t + 1], cache=cache)
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
        ids[row, 5 - len(prompt) :], mask[row, 5 - len(prompt) :] = prompt, 1
    for use_cache in (True, False):
        batched = model.generate(ids, 8, temperature=0, attention_mask=mask, use_cache=use_cache)
        for row, prompt in enumerate(prompts):
            alone = model.generate(prompt[None], 8, temperature=0)
            assert torch.equal(batched[row, 5:], alone[0, len(prompt) :]), (row, use_cache)


@pytest.mark.parametrize(
    "mask,message",
    [
        (torch.tensor([[1, 1, 0]]), "padded on the left"),
        (torch.tensor([[0, 2, 1]]), "only 1 .token. and 0"),
        (torch.ones(1, 2, dtype=torch.long), "shape of the prompts"),
    ],
)
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
        return hf.generate(
            ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
        )


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
    assert torch.equal(model.generate(ids, 40, temperature=0), model.generate(ids, 40, temperature=0, use_cache=False))


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
    """Large weights are cut into one block per part (where the parts divide the rows), small ones never: a BLAS's
    small-matrix kernels may sum a narrower block in another order (a 96 x 32 weight's did on an AMX Xeon), so the
    product of a weight of either size is the same bits for every number of parts, on every CPU."""
    layer = torch.nn.Linear(width, out, bias=bias)
    x = torch.randn(1, width)
    with torch.no_grad():
        products = [one_row_product(layer.weight, layer.bias, parts)(x) for parts in (1, 2, 3, 4, 5)]
        reference = layer(x)
    assert all(torch.equal(product, products[0]) for product in products)  # 5 parts do not divide: one block
    torch.testing.assert_close(products[0], reference, rtol=1e-5, atol=1e-5)
    blocks = [one_row_blocks(out, width, parts) for parts in (1, 2, 3, 4, 5)]
    assert blocks == ([1, 2, 3, 4, 1] if out * width >= SPLIT_MIN_WEIGHTS else [1] * 5)


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
                model.next_token_logits(
                    ids[:, :5],
                    cache,
                    positions=layout.positions[:5],
                    attention_mask=layout.mask(0, 5),
                    left_padding=layout.left_padding,
                )
            for end in range(6, 12):
                general = model.next_token_logits(
                    ids[:, end - 1 : end],
                    caches[0],
                    positions=layout.positions[end - 1 : end],
                    attention_mask=layout.mask(end - 1, end),
                    left_padding=layout.left_padding,
                )
                lean = step(
                    ids[:, end - 1 : end],
                    layout.positions[end - 1 : end],
                    layout.mask(end - 1, end),
                    layout.left_padding,
                )
                if exact:
                    assert torch.equal(lean, general), (end, attention_mask is not None)
                else:
                    torch.testing.assert_close(lean, general, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "changes",
    [
        dict(position="alibi"),
        dict(position="relative"),
        dict(attention="linformer", linformer={"k": 16}),
        dict(ffn="switch", experts={"count": 2}),
        dict(blockwise="always"),
    ],
)
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


# ---------------------------------------------------------------------------------------------------------------
# Fast paths by capability: a subclass that overrides what the lean step computes in its stead is called as a
# module, or sends the model to the general path; one that keeps it keeps the fast path.


class DoubledLinear(torch.nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


class ShiftedEmbedding(torch.nn.Embedding):
    def forward(self, ids):
        return super().forward(ids) + 0.5


class ScaledLearnedPositions(LearnedPositions):
    def forward(self, positions):
        return 3 * super().forward(positions)


class HalvedLayerNorm(torch.nn.LayerNorm):
    def forward(self, x):
        return super().forward(x) / 2


class HotterAttention(FullAttention):
    """Full attention at twice the temperature: it overrides attend."""

    def attend(self, queries, keys, values, call):
        return super().attend(queries / 2, keys, values, call)


class ParallelBlock(DecoderBlock):
    """GPT-J's block: attention and the feed-forward network both read x, and both add to it. It declares so."""

    SUBLAYERS = (
        Sublayer("parallel causal self-attention and feed-forward", "self_attention", "self_attention_residual"),
    )

    def forward(self, x, memory=None, *, mask=None, memory_mask=None, positions=None, cache=None, need_weights=False):
        attended, weights = self.self_attention(
            self.self_attention_residual.sublayer_input(x),
            mask=mask,
            causal=True,
            positions=positions,
            cache=None if cache is None else cache[0],
            need_weights=need_weights,
        )
        return x + attended + self.feed_forward(self.feed_forward_residual.sublayer_input(x)), {"self": weights}


class UndeclaredParallelBlock(DecoderBlock):
    """The same forward in a class that forgot to declare it: it inherits DecoderBlock's declaration, which is
    about another forward."""

    forward = ParallelBlock.forward


class SwappedDeclarationBlock(DecoderBlock):
    """DecoderBlock's forward under a copy of its declaration in a subclass that also copies the forward."""

    forward = DecoderBlock.forward


def with_class(model, path, cls):
    """The model with the module at `path` (dotted) turned into an instance of cls, its weights kept."""
    model.get_submodule(path).__class__ = cls
    return model


SUBCLASSED = {  # (ModelConfig changes, module path, subclass)
    "lm_head": (dict(position="rope"), "lm_head", DoubledLinear),
    "attention projection": (dict(position="rope"), "decoder.blocks.0.self_attention.to_keys_values", DoubledLinear),
    "feed-forward projection": (dict(activation="swiglu"), "decoder.blocks.1.feed_forward.up", DoubledLinear),
    "token embedding": (dict(position="sinusoidal"), "decoder.embeddings.tokens", ShiftedEmbedding),
    "learned positions": (dict(position="learned"), "decoder.embeddings.positions", ScaledLearnedPositions),
    "residual norm": (dict(norm_first=False), "decoder.blocks.0.feed_forward_residual.norm", HalvedLayerNorm),
    "final norm": (dict(position="rope"), "decoder.final_norm", HalvedLayerNorm),
}


@pytest.mark.parametrize("changes,path,cls", SUBCLASSED.values(), ids=SUBCLASSED.keys())
def test_a_module_that_overrides_its_forward_is_called_as_a_module_by_the_lean_step(changes, path, cls):
    model = DecoderLM(tiny_config(**changes)).eval()
    ids = torch.randint(1, 37, (2, 6))
    with torch.no_grad():
        before = model(ids)
        assert not torch.equal(with_class(model, path, cls)(ids), before)  # the override changes the numbers
    assert_lean_step_is_the_general_path(model)  # batch 3, bit for bit: the step calls the subclass's forward
    assert_lean_step_is_the_general_path(model, batch=1, exact=False)


def test_subclasses_that_keep_the_forward_keep_the_fast_path():
    class TaggedLinear(torch.nn.Linear):
        pass

    layer = TaggedLinear(8, 8)
    assert linear(layer) is not layer and fused_linear(layer, TaggedLinear(8, 4)) is not None
    assert linear(DoubledLinear(8, 8)) is not None and isinstance(linear(DoubledLinear(8, 8)), DoubledLinear)
    assert fused_linear(DoubledLinear(8, 8), torch.nn.Linear(8, 8)) is None


BLOCK_VARIANTS = {  # (module path, subclass): what the lean step must not compute in the block's stead
    "full attention that overrides attend": ("decoder.blocks.1.self_attention.core", HotterAttention),
    "a block declaring other steps": ("decoder.blocks.0", ParallelBlock),
    "a block overriding forward without declaring": ("decoder.blocks.0", UndeclaredParallelBlock),
}


@pytest.mark.parametrize("path,cls", BLOCK_VARIANTS.values(), ids=BLOCK_VARIANTS.keys())
def test_a_block_the_lean_step_does_not_implement_decodes_on_the_general_path(path, cls):
    model = DecoderLM(tiny_config(position="rope")).eval()
    ids = torch.randint(1, 37, (3, 5))
    with torch.no_grad():
        before = model(ids)
        assert DecodeStep.supports(model)
        assert not torch.equal(with_class(model, path, cls)(ids), before)
    assert not DecodeStep.supports(model)
    for rows in (ids, ids[:1]):
        assert torch.equal(
            model.generate(rows, 8, temperature=0), model.generate(rows, 8, temperature=0, use_cache=False)
        )


def test_a_subclass_of_the_block_that_keeps_its_steps_keeps_the_lean_step():
    model = with_class(DecoderLM(tiny_config(position="rope")).eval(), "decoder.blocks.0", SwappedDeclarationBlock)
    assert declared_sublayers(model.decoder.blocks[0]) is None  # it overrides forward and declares nothing
    assert not DecodeStep.supports(model)
    SwappedDeclarationBlock.SUBLAYERS = DecoderBlock.SUBLAYERS  # now it declares its forward's steps
    try:
        assert declared_sublayers(model.decoder.blocks[0]) == LEAN_SUBLAYERS and DecodeStep.supports(model)
        assert_lean_step_is_the_general_path(model)
    finally:
        del SwappedDeclarationBlock.SUBLAYERS
    assert declared_sublayers(DecoderLM(tiny_config()).decoder.blocks[0]) == LEAN_SUBLAYERS
    assert [s.kind for s in declared_sublayers(DecoderBlock(tiny_config(), cross_attention=True))] == [
        "causal self-attention",
        "cross-attention",
        "feed-forward",
    ]
