"""The RoPE decoders: GPT-NeoX and the Llama family, one `Architecture` entry each in `DECODERS` (read into
`kqv.interop.architectures.ARCHITECTURES`), each a config translation and a table of weight rules.

    GPTNeoXForCausalLM  <->  kqv.DecoderLM  pre-LN, LayerNorm, GELU, RoPE over the whole head (rotary_pct 1.0),
                                            attention then feed-forward in sequence (use_parallel_residual false)
    LlamaForCausalLM    <->  kqv.DecoderLM  pre-LN, RMSNorm, SwiGLU (or GeGLU), RoPE, grouped-query attention
    MistralForCausalLM   ->  kqv.DecoderLM  Llama without biases; its sliding window must cover every position
    Qwen2ForCausalLM     ->  kqv.DecoderLM  Llama with biases on the queries, keys and values only

All four rotate with the half-split pairing (`rotate_half`: dimension i turns with i + head_dim / 2), which is kqv's
(`kqv.nn.positions.RotaryPositions`), at the model's base (`rope_base`, Hugging Face's `rope_theta`). kqv's `bias`
is one switch for every linear layer: a checkpoint with biases on some layers only (Qwen2's, a Llama with
attention_bias but not mlp_bias) gets zero biases on the others, which change no output; a kqv model becomes a
GPT-NeoX or a Llama (a Mistral or Qwen2 checkpoint is written back as the Llama it computes). What kqv's blocks cannot
compute is refused in one line naming the option: RoPE scaling, partial rotary, a parallel residual, a sliding
window shorter than the positions, a head_dim other than hidden_size / num_attention_heads.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..errors import ConversionError
from ..nn.config import ModelConfig
from ..nn.models import DecoderLM
from .rules import HF_SIZES, Architecture, ConfigNames, Mapping, Rule, affine, copy, stack, unstack

ROPE_BASE = 10000.0  # RoPE's own base, where a config names none: Hugging Face's rope_theta, kqv's rope_base
DECODER = dict(position="rope", norm_first=True, output_bias=False, scale_embeddings=False, embed_norm=False)
NEOX_NAMES = ConfigNames(
    HF_SIZES,
    "layer_norm_eps",
    "hidden_act",
    ("attention_dropout", "hidden_dropout"),
    DECODER | dict(norm="layernorm", bias=True),
)
LLAMA_NAMES = ConfigNames(
    HF_SIZES, "rms_norm_eps", "hidden_act", ("attention_dropout",), DECODER | dict(norm="rmsnorm"), gated=True
)
SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


# ---------------------------------------------------------------------------------------------------------------
# What kqv's RoPE blocks compute: checked on import


def check_rope(c: Any, name: str, option: str = "rope_parameters") -> None:
    """Refuse RoPE that is not kqv's: scaled (linear, dynamic, yarn, llama3, ...) or partial (any base maps to
    kqv's `rope_base`: `rope_base`)."""
    rope = dict(getattr(c, "rope_parameters", None) or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ConversionError(
            f"kqv cannot represent {name} with {option} rope_type={kind!r}: kqv's RoPE has no scaling, it reads "
            f"rope_type 'default' only"
        )
    if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ConversionError(
            f"kqv cannot represent {name} with partial rotary (rotary_pct / partial_rotary_factor="
            f"{rope['partial_rotary_factor']}): kqv's RoPE rotates the whole head, rotary_pct 1.0"
        )


def rope_base(c: Any) -> float:
    """A Hugging Face config's RoPE base (`rope_parameters["rope_theta"]`, or an older config's `rope_theta`)."""
    rope = dict(getattr(c, "rope_parameters", None) or {})
    return float(rope.get("rope_theta", getattr(c, "rope_theta", None) or ROPE_BASE))


def rope_parameters(c: ModelConfig) -> dict[str, Any]:
    """The rope_parameters of an exported model: unscaled RoPE at the model's base."""
    return {"rope_type": "default", "rope_theta": c.rope_base}


def check_window(c: Any, name: str) -> None:
    """Refuse a sliding window that some layer uses and that is shorter than the positions the model takes."""
    window, positions = getattr(c, "sliding_window", None), c.max_position_embeddings
    kinds = getattr(c, "layer_types", None) or ["sliding_attention"]  # Mistral's: every layer, when it has one
    if window is not None and "sliding_attention" in kinds and window < positions:
        raise ConversionError(
            f"kqv cannot represent {name} with sliding_window={window} below max_position_embeddings={positions}: "
            f"kqv attends to every earlier position; a window of at least {positions} (or none) is one it can"
        )


def check_heads(c: Any, name: str) -> None:
    head_dim = getattr(c, "head_dim", None)
    if head_dim is not None and head_dim * c.num_attention_heads != c.hidden_size:
        raise ConversionError(
            f"kqv cannot represent {name} with head_dim={head_dim}: kqv's heads are hidden_size / "
            f"num_attention_heads = {c.hidden_size // c.num_attention_heads} wide"
        )


def special_ids(base: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's bos/eos/pad ids, else none: a kqv tokenizer has no such tokens, and the class's defaults
    (0, 1, 2) are characters of a small vocabulary, at which `generate` would stop."""
    return {name: base.get(name) for name in SPECIAL_IDS}


def kv_heads_of(c: Any) -> dict[str, int]:
    """kqv's n_kv_heads for a config's num_key_value_heads (none when there are as many as query heads)."""
    kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    return {} if kv == c.num_attention_heads else {"n_kv_heads": kv}


# ---------------------------------------------------------------------------------------------------------------
# GPT-NeoX (Black et al. 2022): a fused query_key_value, interleaved per head


def neox_config(c: Any) -> ModelConfig:
    check_rope(c, "GPT-NeoX")
    if c.use_parallel_residual:
        raise ConversionError(
            "kqv cannot represent GPT-NeoX with use_parallel_residual=true (attention and feed-forward read the same "
            "input): kqv's blocks add attention, then the feed-forward network, in sequence (false)"
        )
    return NEOX_NAMES.to_kqv(c, rope_base=rope_base(c))


def neox_config_to_hf(c: ModelConfig, base: dict[str, Any]) -> dict[str, Any]:
    return NEOX_NAMES.to_hf(c, base, "GPTNeoXForCausalLM") | {
        "use_parallel_residual": False,
        "attention_bias": True,
        "rope_parameters": rope_parameters(c) | {"partial_rotary_factor": 1.0},
        **special_ids(base),
    }


def interleaved(heads: int):
    """NeoX's query_key_value output is, per head, that head's query, key and value (heads, 3, head_dim): the
    (to_queries, to_keys_values) of kqv, whose outputs are all queries, then all keys, then all values."""

    def to_kqv(fused: Tensor) -> tuple[Tensor, Tensor]:
        per_head = fused.reshape(heads, 3, -1, *fused.shape[1:])  # (heads, 3, head_dim, [d_model])
        q, k, v = (per_head[:, i].flatten(0, 1) for i in range(3))  # (d_model, [d_model]) each
        return q, torch.cat((k, v))

    def to_hf(queries: Tensor, keys_values: Tensor) -> tuple[Tensor]:
        parts = (queries, *keys_values.chunk(2))
        per_head = torch.stack([p.reshape(heads, -1, *p.shape[1:]) for p in parts], dim=1)  # (heads, 3, hd, ...)
        return (per_head.flatten(0, 2),)

    return to_kqv, to_hf


def zero(kqv: str, size: int) -> Rule:
    """A kqv bias the checkpoint has none of: zeros on import; on export the class has no place for it, so it
    must still be zero (a fine-tune that moved it is refused)."""

    def to_hf(bias: Tensor) -> tuple[()]:
        if bias.any():
            raise ConversionError(f"the kqv model's {kqv} is not zero, and the Hugging Face class has no such bias")
        return ()

    return Rule((kqv,), (), lambda: (torch.zeros(size),), to_hf)


def neox_attention(kqv: str, hf: str, heads: int, bias: bool, d: int) -> list[Rule]:
    """NeoX's attention (query_key_value, dense) as kqv's `to_queries`, `to_keys_values`, `to_output`; without
    attention_bias, zero biases for kqv's."""
    q, kv, out = (kqv + name for name in ("to_queries", "to_keys_values", "to_output"))
    names = ("weight", "bias") if bias else ("weight",)
    rules = [Rule((f"{q}.{p}", f"{kv}.{p}"), (f"{hf}query_key_value.{p}",), *interleaved(heads)) for p in names]
    rules += [copy(f"{out}.{p}", f"{hf}dense.{p}") for p in names]
    return rules if bias else rules + [zero(f"{q}.bias", d), zero(f"{kv}.bias", 2 * d), zero(f"{out}.bias", d)]


def neox_mapping(config: ModelConfig, hf_config: Any) -> Mapping:
    rules = [copy("decoder.embeddings.tokens.weight", "embed_in.weight")]
    for i in range(config.n_layers):
        hf, kqv = f"layers.{i}.", f"decoder.blocks.{i}."
        rules += [
            *affine(kqv + "self_attention_residual.norm", hf + "input_layernorm"),
            *neox_attention(
                kqv + "self_attention.", hf + "attention.", config.n_heads, hf_config.attention_bias, config.d_model
            ),
            *affine(kqv + "feed_forward_residual.norm", hf + "post_attention_layernorm"),
            *affine(kqv + "feed_forward.up", hf + "mlp.dense_h_to_4h"),
            *affine(kqv + "feed_forward.down", hf + "mlp.dense_4h_to_h"),
        ]
    rules += affine("decoder.final_norm", "final_layer_norm")
    return output_layer(rules, hf_config)


def output_layer(rules: list[Rule], hf_config: Any) -> Mapping:
    """The rules with the output projection: tied to the token embeddings (lm_head.weight an alias) or its own."""
    if hf_config.tie_word_embeddings:
        return Mapping(rules, aliases=["lm_head.weight"])
    return Mapping(rules + [copy("lm_head.weight", "lm_head.weight")])


# ---------------------------------------------------------------------------------------------------------------
# The Llama family (Touvron et al. 2023): separate projections, a gated feed-forward network, RMSNorm


def llama_config(c: Any, name: str = "Llama") -> ModelConfig:
    check_rope(c, name)
    check_heads(c, name)
    check_window(c, name)
    return LLAMA_NAMES.to_kqv(c, bias=bool(llama_biases(c)), rope_base=rope_base(c), **kv_heads_of(c))


def llama_biases(c: Any) -> set[str]:
    """Which of a Llama-family checkpoint's layers have biases: "qkv" (the query, key and value projections),
    "output" (the attention's output projection), "mlp" (the three of the feed-forward network)."""
    if c.model_type == "qwen2":
        return {"qkv"}
    return ({"qkv", "output"} if getattr(c, "attention_bias", False) else set()) | (
        {"mlp"} if getattr(c, "mlp_bias", False) else set()
    )


def llama_config_to_hf(c: ModelConfig, base: dict[str, Any]) -> dict[str, Any]:
    return LLAMA_NAMES.to_hf(c, base, "LlamaForCausalLM") | {
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim,
        "attention_bias": c.bias,
        "mlp_bias": c.bias,
        "rope_parameters": rope_parameters(c),
        **special_ids(base),
    }


def not_exported(c: ModelConfig, base: dict[str, Any]) -> dict[str, Any]:
    raise ConversionError("kqv writes a Llama-family model as a LlamaForCausalLM")


def biased(kqv: str, hf: str, present: bool, size: int, bias: bool) -> list[Rule]:
    """A linear layer's weight, and its bias: the checkpoint's where it has one, else zeros where kqv has one."""
    return [copy(f"{kqv}.weight", f"{hf}.weight")] + (
        [copy(f"{kqv}.bias", f"{hf}.bias")] if present else [zero(f"{kqv}.bias", size)] if bias else []
    )


def keys_values(kqv: str, hf: str, present: bool, size: int, bias: bool) -> list[Rule]:
    """Llama's k_proj and v_proj are kqv's `to_keys_values` (keys first), bias and all where the checkpoint has one."""
    names = ("weight", "bias") if present else ("weight",)
    rules = [Rule((f"{kqv}.{p}",), (f"{hf}k_proj.{p}", f"{hf}v_proj.{p}"), stack, unstack) for p in names]
    return rules + ([zero(f"{kqv}.bias", size)] if bias and not present else [])


def gate_up(kqv: str, hf: str, present: bool, size: int, bias: bool) -> list[Rule]:
    """Llama's gate_proj and up_proj are kqv's fused `up` (gate rows first, as `FeedForward` chunks them)."""
    names = ("weight", "bias") if present else ("weight",)
    rules = [Rule((f"{kqv}.{p}",), (f"{hf}.gate_proj.{p}", f"{hf}.up_proj.{p}"), stack, unstack) for p in names]
    return rules + ([zero(f"{kqv}.bias", 2 * size)] if bias and not present else [])


def llama_mapping(config: ModelConfig, hf_config: Any) -> Mapping:
    d, kv, has = (config.d_model, 2 * config.kv_heads * config.head_dim, llama_biases(hf_config))
    rules = [copy("decoder.embeddings.tokens.weight", "embed_tokens.weight")]
    for i in range(config.n_layers):
        hf, kqv = f"layers.{i}.", f"decoder.blocks.{i}."
        attention, qkv = kqv + "self_attention.", "qkv" in has
        rules += [
            copy(kqv + "self_attention_residual.norm.weight", hf + "input_layernorm.weight"),
            *biased(attention + "to_queries", hf + "self_attn.q_proj", qkv, d, config.bias),
            *keys_values(attention + "to_keys_values", hf + "self_attn.", qkv, kv, config.bias),
            *biased(attention + "to_output", hf + "self_attn.o_proj", "output" in has, d, config.bias),
            copy(kqv + "feed_forward_residual.norm.weight", hf + "post_attention_layernorm.weight"),
            *gate_up(kqv + "feed_forward.up", hf + "mlp", "mlp" in has, config.d_ff, config.bias),
            *biased(kqv + "feed_forward.down", hf + "mlp.down_proj", "mlp" in has, d, config.bias),
        ]
    rules.append(copy("decoder.final_norm.weight", "norm.weight"))
    return output_layer(rules, hf_config)


DECODERS = [
    Architecture(
        "GPTNeoXForCausalLM",
        "gpt_neox",
        DecoderLM,
        neox_config,
        neox_config_to_hf,
        neox_mapping,
        base_prefix="gpt_neox.",
        heads=("lm_head.",),
        ignored=(r"layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)",),  # old checkpoints' buffers
        renamed=((r"^embed_out\.", "lm_head."),),  # the output layer's name in checkpoints (transformers saves it so)
        family="GPT-NeoX",
    ),
    Architecture(
        "LlamaForCausalLM",
        "llama",
        DecoderLM,
        llama_config,
        llama_config_to_hf,
        llama_mapping,
        base_prefix="model.",
        heads=("lm_head.",),
        ignored=(r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
        family="Llama",
    ),
    *(
        Architecture(
            hf_class,
            model_type,
            DecoderLM,
            lambda c, name=name: llama_config(c, name),
            not_exported,
            llama_mapping,
            base_prefix="model.",
            heads=("lm_head.",),
            ignored=(r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
            exported=False,
            family=name,
        )
        for hf_class, model_type, name in [
            ("MistralForCausalLM", "mistral", "Mistral"),
            ("Qwen2ForCausalLM", "qwen2", "Qwen2"),
        ]
    ),
]
