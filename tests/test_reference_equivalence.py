"""kqv's architecture equals independent implementations, weight for weight.

The references are torch's own `nn.MultiheadAttention` and `nn.TransformerEncoderLayer`, and Hugging Face's GPT-2
and BERT; kqv's plain matmul-softmax-matmul path is also checked against its own fused SDPA path. Every parameter
is drawn at random first (biases, norm gains, position tables included), so a weight copied to the wrong place or
left at its initial value shows up as a difference. Everything runs in float32, in eval mode, within 1e-5.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kqv
from conftest import POSITIONS
from kqv.interop import from_hf
from kqv.nn.attention import padding_mask
from kqv.nn.cores import FullAttention

ATOL = 1e-5


def small_config(**changes) -> kqv.ModelConfig:
    base = dict(
        vocab_size=61, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=32, dropout=0.0, relative={"max_distance": 4}
    )
    return kqv.ModelConfig(**base).replace(**changes)


def randomize_(module: nn.Module) -> nn.Module:
    """Every parameter random: gains near 1, everything else N(0, 0.1), so no weight is a neutral 0 or 1."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            is_gain = p.dim() == 1 and name.endswith("weight")
            p.copy_(1 + 0.1 * torch.randn_like(p) if is_gain else 0.1 * torch.randn_like(p))
    return module.eval()


def copy_attention(ref: nn.MultiheadAttention, ours: kqv.MultiHeadAttention) -> None:
    """torch stacks [q; k; v] in in_proj_weight; kqv has q alone and [k; v] together."""
    d = ref.embed_dim
    with torch.no_grad():
        ours.to_queries.weight.copy_(ref.in_proj_weight[:d])
        ours.to_queries.bias.copy_(ref.in_proj_bias[:d])
        ours.to_keys_values.weight.copy_(ref.in_proj_weight[d:])
        ours.to_keys_values.bias.copy_(ref.in_proj_bias[d:])
        ours.to_output.load_state_dict(ref.out_proj.state_dict())


def attention_pair(cross_attention: bool = False) -> tuple[nn.MultiheadAttention, kqv.MultiHeadAttention]:
    config = small_config(position="none")
    ref = randomize_(nn.MultiheadAttention(config.d_model, config.n_heads, batch_first=True))
    ours = kqv.MultiHeadAttention(config, cross_attention=cross_attention).eval()
    copy_attention(ref, ours)
    return ref, ours


def real_tokens(batch: int, time: int) -> torch.Tensor:
    """(batch, time) 1 = token, 0 = padding: row 0 full, row 1 right-padded, row 2 left-padded (when present)."""
    mask = torch.ones(batch, time, dtype=torch.long)
    if batch > 1:
        mask[1, time - 3 :] = 0
    if batch > 2:
        mask[2, :2] = 0
    return mask


def assert_close(ours: torch.Tensor, ref: torch.Tensor, atol: float = ATOL) -> None:
    torch.testing.assert_close(ours, ref, atol=atol, rtol=0)


def both_paths(ours: kqv.MultiHeadAttention, *args, **kwargs) -> list[torch.Tensor]:
    """Outputs of the fused path (need_weights=False) and the plain path (need_weights=True)."""
    return [ours(*args, need_weights=False, **kwargs)[0], ours(*args, need_weights=True, **kwargs)[0]]


# ---------------------------------------------------------------------------------------------------------------
# Multi-head attention vs torch.nn.MultiheadAttention


@torch.no_grad()
def test_self_attention_equals_torch_multihead_attention():
    torch.manual_seed(0)
    ref, ours = attention_pair()
    x = torch.randn(2, 7, 32)
    expected, per_head = ref(x, x, x, average_attn_weights=False)
    _, averaged = ref(x, x, x)
    for output in both_paths(ours, x):
        assert_close(output, expected)
    _, weights = ours(x, need_weights=True)
    assert weights.shape == (2, 4, 7, 7)
    assert_close(weights, per_head)
    assert_close(weights.mean(dim=1), averaged)


@torch.no_grad()
def test_padding_mask_equals_torch_key_padding_mask():
    torch.manual_seed(0)
    ref, ours = attention_pair()
    x, tokens = torch.randn(3, 7, 32), real_tokens(3, 7)
    expected, per_head = ref(x, x, x, key_padding_mask=~tokens.bool(), average_attn_weights=False)  # True = ignore
    for output in both_paths(ours, x, mask=padding_mask(tokens)):  # True = may attend
        assert_close(output, expected)
    _, weights = ours(x, mask=padding_mask(tokens), need_weights=True)
    assert_close(weights, per_head)
    assert (weights[1, ..., -3:] == 0).all() and (weights[2, ..., :2] == 0).all()


@torch.no_grad()
def test_causal_attention_equals_torch_with_a_causal_attn_mask():
    torch.manual_seed(0)
    ref, ours = attention_pair()
    x = torch.randn(2, 7, 32)
    future = nn.Transformer.generate_square_subsequent_mask(7) == float("-inf")  # True = not allowed
    expected, per_head = ref(x, x, x, attn_mask=future, average_attn_weights=False)
    for output in both_paths(ours, x, causal=True) + both_paths(ours, x, mask=kqv.causal_mask(7, 7)):
        assert_close(output, expected)
    _, weights = ours(x, causal=True, need_weights=True)
    assert_close(weights, per_head)


@torch.no_grad()
def test_causal_and_padding_masks_combine_like_torch():
    torch.manual_seed(0)
    ref, ours = attention_pair()
    x, tokens = torch.randn(2, 7, 32), real_tokens(2, 7)  # right padding: every query keeps one real key
    future = ~kqv.causal_mask(7, 7)
    expected, _ = ref(x, x, x, attn_mask=future, key_padding_mask=~tokens.bool())
    for output in both_paths(ours, x, mask=padding_mask(tokens), causal=True):
        assert_close(output, expected)


@torch.no_grad()
def test_cross_attention_equals_torch_with_memory_as_keys_and_values():
    torch.manual_seed(0)
    ref, ours = attention_pair(cross_attention=True)
    x, memory, memory_tokens = torch.randn(3, 5, 32), torch.randn(3, 9, 32), real_tokens(3, 9)
    expected, per_head = ref(x, memory, memory, key_padding_mask=~memory_tokens.bool(), average_attn_weights=False)
    for output in both_paths(ours, x, memory, mask=padding_mask(memory_tokens)):
        assert_close(output, expected)
    _, weights = ours(x, memory, mask=padding_mask(memory_tokens), need_weights=True)
    assert weights.shape == (3, 4, 5, 9)
    assert_close(weights, per_head)


# ---------------------------------------------------------------------------------------------------------------
# Encoder block vs torch.nn.TransformerEncoderLayer


def encoder_block_pair(norm_first: bool) -> tuple[nn.TransformerEncoderLayer, kqv.EncoderBlock]:
    config = small_config(position="none", activation="relu", norm="layernorm", norm_first=norm_first)
    ref = randomize_(
        nn.TransformerEncoderLayer(
            config.d_model,
            config.n_heads,
            config.d_ff,
            dropout=0.0,
            activation="relu",
            batch_first=True,
            norm_first=norm_first,
        )
    )
    ours = kqv.EncoderBlock(config).eval()
    copy_attention(ref.self_attn, ours.self_attention)
    with torch.no_grad():
        ours.feed_forward.up.load_state_dict(ref.linear1.state_dict())
        ours.feed_forward.down.load_state_dict(ref.linear2.state_dict())
        ours.self_attention_residual.norm.load_state_dict(ref.norm1.state_dict())
        ours.feed_forward_residual.norm.load_state_dict(ref.norm2.state_dict())
    return ref, ours


@pytest.mark.parametrize("padded", [False, True], ids=["no_padding", "padding"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
@torch.no_grad()
def test_encoder_block_equals_torch_transformer_encoder_layer(norm_first, padded):
    torch.manual_seed(0)
    ref, ours = encoder_block_pair(norm_first)
    x, tokens = torch.randn(3, 7, 32), real_tokens(3, 7)
    expected = ref(x, src_key_padding_mask=~tokens.bool() if padded else None)
    mask = padding_mask(tokens) if padded else None
    for fused in (True, False):
        ours.self_attention.core = FullAttention(fused=fused)
        output, _ = ours(x, mask)
        assert_close(output, expected)  # padded queries too: in both they attend to the real keys


# ---------------------------------------------------------------------------------------------------------------
# Whole models vs Hugging Face GPT-2 and BERT, through kqv.interop.from_hf


def hf_gpt2(activation: str = "gelu_new", tie: bool = True):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=97,
        n_positions=32,
        activation_function=activation,
        tie_word_embeddings=tie,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    return randomize_(GPT2LMHeadModel(config))


def hf_bert(head: str = "BertModel"):
    import transformers

    config = transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=97,
        max_position_embeddings=32,
        pad_token_id=0,
        attn_implementation="eager",
    )
    return randomize_(getattr(transformers, head)(config))


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("activation", ["gelu_new", "gelu_pytorch_tanh", "gelu"])
@torch.no_grad()
def test_gpt2_logits_equal_hugging_face(activation, tie):
    torch.manual_seed(0)
    hf = hf_gpt2(activation, tie)
    ours = from_hf(hf)
    assert ours.config.activation == ("gelu" if activation == "gelu" else "gelu_tanh")
    ids = torch.randint(0, 97, (2, 12))
    assert_close(ours(ids), hf(ids).logits)


@torch.no_grad()
def test_gpt2_logits_equal_hugging_face_with_right_padding():
    torch.manual_seed(0)
    hf = hf_gpt2()
    ours = from_hf(hf)
    ids, tokens = torch.randint(0, 97, (2, 12)), real_tokens(2, 12)
    logits, expected = ours(ids, attention_mask=tokens), hf(ids, attention_mask=tokens).logits
    real = tokens.bool()
    assert_close(logits[real], expected[real])
    assert_close(logits[0], ours(ids[:1])[0])  # the unpadded row is unchanged by the mask


@pytest.mark.parametrize("padded", [False, True], ids=["no_padding", "padding"])
@torch.no_grad()
def test_bert_hidden_states_equal_hugging_face(padded):
    torch.manual_seed(0)
    hf = hf_bert()
    ours = from_hf(hf)
    ids, tokens = torch.randint(1, 97, (3, 12)), real_tokens(3, 12) if padded else torch.ones(3, 12, dtype=torch.long)
    hidden = ours(ids, tokens if padded else None)
    expected = hf(ids, attention_mask=tokens).last_hidden_state
    real = tokens.bool()
    assert_close(hidden[real], expected[real])


@torch.no_grad()
def test_bert_for_masked_lm_converts_to_an_encoder_with_its_prediction_head():
    torch.manual_seed(0)
    hf = hf_bert("BertForMaskedLM")
    ours = from_hf(hf)
    ids = torch.randint(1, 97, (2, 12))
    assert_close(ours.encoder(ids), hf.bert(ids).last_hidden_state)
    assert_close(ours(ids), hf(ids).logits)


# ---------------------------------------------------------------------------------------------------------------
# kqv's plain reference path vs its fused SDPA path


MODELS = {"DecoderLM": kqv.DecoderLM, "Encoder": kqv.Encoder, "EncoderDecoder": kqv.EncoderDecoder}


def build(kind: str, config: kqv.ModelConfig) -> nn.Module:
    return randomize_(MODELS[kind](config))


def run(model: nn.Module, kind: str, padded: bool) -> torch.Tensor:
    """Outputs for a batch with one full, one right-padded and one left-padded row (or no mask at all)."""
    gen = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(0, 61, (3, 11), generator=gen), torch.randint(0, 61, (3, 8), generator=gen)
    src_mask, tgt_mask = (real_tokens(3, 11), real_tokens(3, 8)) if padded else (None, None)
    if kind == "DecoderLM":
        return model(tgt, attention_mask=tgt_mask)
    if kind == "Encoder":
        return model(src, src_mask)
    return model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask)


def plain_copy(model: nn.Module) -> nn.Module:
    plain = copy.deepcopy(model)
    for module in plain.modules():
        if isinstance(module, kqv.MultiHeadAttention):
            module.core = FullAttention(module.core.blockwise, fused=False)
    return plain


class CountSDPA:
    """Counts calls to F.scaled_dot_product_attention while installed with monkeypatch."""

    def __init__(self, monkeypatch):
        self.calls, self.sdpa = 0, F.scaled_dot_product_attention
        monkeypatch.setattr(F, "scaled_dot_product_attention", self)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.sdpa(*args, **kwargs)


PATH_CASES = [(p, {}) for p in POSITIONS] + [("relative", {"relative": {"values": False}})]


@pytest.mark.parametrize("padded", [False, True], ids=["no_padding", "padding"])
@pytest.mark.parametrize("kind", ["DecoderLM", "Encoder", "EncoderDecoder"])
@pytest.mark.parametrize(
    "position,extra", PATH_CASES, ids=[p + ("_no_relative_values" if e else "") for p, e in PATH_CASES]
)
@torch.no_grad()
def test_plain_attention_path_equals_sdpa_path(position, extra, kind, padded, monkeypatch):
    torch.manual_seed(0)
    fused = build(kind, small_config(position=position, **extra))
    plain = plain_copy(fused)
    counter = CountSDPA(monkeypatch)
    expected = run(plain, kind, padded)
    assert counter.calls == 0
    output = run(fused, kind, padded)
    assert torch.isfinite(output).all()
    assert_close(output, expected)
    assert counter.calls == expected_sdpa_calls(kind, position, extra)


def expected_sdpa_calls(kind: str, position: str, extra: dict) -> int:
    """One per attention layer, except that self-attention with relative value embeddings needs the weights and
    falls back to the plain path; cross-attention has no positions and always fuses."""
    self_layers, cross_layers = {"DecoderLM": (2, 0), "Encoder": (2, 0), "EncoderDecoder": (4, 2)}[kind]
    self_fuses = not (position == "relative" and extra.get("relative", {}).get("values", True))
    return self_layers * self_fuses + cross_layers


@torch.no_grad()
def test_relative_value_embeddings_change_the_output():
    torch.manual_seed(0)
    with_values = build("Encoder", small_config(position="relative", relative={"values": True}))
    without_values = small_config(position="relative", relative={"values": False})
    stripped = kqv.Encoder(without_values)
    stripped.load_state_dict({k: v for k, v in with_values.state_dict().items() if not k.endswith("positions.values")})
    stripped.eval()
    assert not torch.allclose(run(with_values, "Encoder", False), run(stripped, "Encoder", False), atol=1e-3)
