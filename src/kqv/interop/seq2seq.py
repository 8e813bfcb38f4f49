"""The encoder-decoder architectures of `ARCHITECTURES` (`kqv.interop.architectures`): config translations both ways
and weight rules for Marian (Junczys-Dowmunt et al. 2018) and BART (Lewis et al. 2020)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..errors import ConversionError
from ..nn.config import ModelConfig
from ..nn.positions import SinusoidalPositions
from .rules import (
    Mapping,
    Rule,
    activation_to_hf,
    affine,
    attention,
    copy,
    dropouts,
    hf_activation,
    require,
    require_kqv,
)

# ---------------------------------------------------------------------------------------------------------------
# Marian (Junczys-Dowmunt et al. 2018) and BART (Lewis et al. 2020): the post-LN encoder-decoder of Vaswani et al.
# Marian adds sinusoids to token embeddings scaled by sqrt(d_model); BART adds learned positions (looked up at
# position + 2, so rows 0 and 1 of its tables are never used) and normalises the sum. Both have a bias on the logits.


def seq2seq_config(c: Any, name: str) -> ModelConfig:
    """MarianConfig or BartConfig -> ModelConfig. kqv has one n_heads and d_ff for both stacks."""
    marian = name == "Marian"
    require(
        c,
        name,
        is_decoder=False,
        add_cross_attention=False,
        normalize_before=False,
        add_final_layer_norm=False,
        normalize_embedding=True,
        add_bias_logits=False,
        static_position_embeddings=False,
    )
    for encoder_option, decoder_option in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if getattr(c, encoder_option) != getattr(c, decoder_option):
            raise ConversionError(
                f"kqv cannot represent {name} with {encoder_option}={getattr(c, encoder_option)} and "
                f"{decoder_option}={getattr(c, decoder_option)}: kqv's encoder and decoder share one "
                f"{'n_heads' if 'heads' in encoder_option else 'd_ff'}"
            )
    shared = c.share_encoder_decoder_embeddings if marian else True
    tied = bool(c.tie_word_embeddings)
    return ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.d_model,
        n_heads=c.encoder_attention_heads,
        n_layers=c.encoder_layers,
        n_decoder_layers=None if c.decoder_layers == c.encoder_layers else c.decoder_layers,
        d_ff=c.encoder_ffn_dim,
        max_len=c.max_position_embeddings,
        dropout=0.0,
        position="sinusoidal" if marian else "learned",
        norm="layernorm",
        norm_first=False,
        norm_eps=1e-5,
        activation=hf_activation(c.activation_function, "activation_function"),
        bias=True,
        tie_embeddings=tied,
        output_bias=True,
        scale_embeddings=bool(c.scale_embedding),
        embed_norm=not marian,
        # Hugging Face shares encoder, decoder and output embeddings only when both flags say so
        tgt_vocab_size=None if shared and tied else (c.decoder_vocab_size if marian else c.vocab_size),
    )


def marian_config(c: Any) -> ModelConfig:
    return seq2seq_config(c, "Marian")


def bart_config(c: Any) -> ModelConfig:
    return seq2seq_config(c, "BART")


def seq2seq_config_to_hf(c: ModelConfig, base: dict[str, Any], target: str) -> dict[str, Any]:
    marian = target == "MarianMTModel"
    require_kqv(
        c,
        target,
        position="sinusoidal" if marian else "learned",
        norm="layernorm",
        norm_first=False,
        norm_eps=1e-5,
        bias=True,
        output_bias=True,
        embed_norm=not marian,
    )
    values = {
        **dropouts(base, c, "dropout", "attention_dropout"),
        "activation_dropout": base.get("activation_dropout", 0.0),  # kqv has no dropout inside the FFN
        "vocab_size": c.vocab_size,
        "d_model": c.d_model,
        "encoder_layers": c.encoder_layers,
        "decoder_layers": c.decoder_layers,
        "encoder_attention_heads": c.n_heads,
        "decoder_attention_heads": c.n_heads,
        "encoder_ffn_dim": c.d_ff,
        "decoder_ffn_dim": c.d_ff,
        "max_position_embeddings": c.max_len,
        "scale_embedding": c.scale_embeddings,
        "activation_function": activation_to_hf(c.activation, base.get("activation_function"), target),
        "tie_word_embeddings": c.tie_embeddings,
    }
    separate = c.tgt_vocab_size is not None
    if marian:
        share = (
            not separate
            if c.tie_embeddings
            else c.target_vocab_size == c.vocab_size
            and (not separate or base.get("share_encoder_decoder_embeddings", False))
        )
        values |= {"decoder_vocab_size": c.target_vocab_size, "share_encoder_decoder_embeddings": share}
    elif separate and (c.tie_embeddings or c.tgt_vocab_size != c.vocab_size):
        raise ConversionError(
            f"a kqv model with tgt_vocab_size={c.tgt_vocab_size} and tie_embeddings="
            f"{c.tie_embeddings} cannot become a {target}, which has one vocabulary and ties encoder, "
            f"decoder and output embeddings all or none (tgt_vocab_size=None, or tie_embeddings=False)"
        )
    return values


def marian_config_to_hf(c: ModelConfig, base: dict[str, Any]) -> dict[str, Any]:
    return seq2seq_config_to_hf(c, base, "MarianMTModel")


def bart_config_to_hf(c: ModelConfig, base: dict[str, Any]) -> dict[str, Any]:
    return seq2seq_config_to_hf(c, base, "BartForConditionalGeneration")


def seq2seq_layer(kqv: str, hf: str, cross_attention: bool) -> list[Rule]:
    rules = [
        *attention(
            kqv + "self_attention",
            hf + "self_attn.q_proj",
            hf + "self_attn.k_proj",
            hf + "self_attn.v_proj",
            hf + "self_attn.out_proj",
        ),
        *affine(kqv + "self_attention_residual.norm", hf + "self_attn_layer_norm"),
    ]
    if cross_attention:
        rules += [
            *attention(
                kqv + "cross_attention",
                hf + "encoder_attn.q_proj",
                hf + "encoder_attn.k_proj",
                hf + "encoder_attn.v_proj",
                hf + "encoder_attn.out_proj",
            ),
            *affine(kqv + "cross_attention_residual.norm", hf + "encoder_attn_layer_norm"),
        ]
    return rules + [
        *affine(kqv + "feed_forward.up", hf + "fc1"),
        *affine(kqv + "feed_forward.down", hf + "fc2"),
        *affine(kqv + "feed_forward_residual.norm", hf + "final_layer_norm"),
    ]


def without_offset_rows(table: Tensor) -> tuple[Tensor]:
    return (table[2:],)


def with_offset_rows(table: Tensor, originals: list[Tensor] | None = None) -> tuple[Tensor]:
    rows = originals[0][:2] if originals else table.new_zeros(2, table.shape[1])
    return (torch.cat((rows, table)),)


def seq2seq_mapping(config: ModelConfig, hf_config: Any) -> Mapping:
    marian = hf_config.model_type == "marian"
    shared = hf_config.share_encoder_decoder_embeddings if marian else True
    tied = hf_config.tie_word_embeddings
    mapping = Mapping([])
    if shared and tied:  # one matrix: Hugging Face's `shared`, kqv's encoder tokens (the decoder's is the same)
        mapping.rules.append(copy("encoder.embeddings.tokens.weight", "shared.weight"))
        mapping.aliases += ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"]
    else:
        mapping.rules += [
            copy("encoder.embeddings.tokens.weight", "encoder.embed_tokens.weight"),
            copy("decoder.embeddings.tokens.weight", "decoder.embed_tokens.weight"),
        ]
        if tied:
            mapping.aliases.append("lm_head.weight")
        else:
            mapping.rules.append(copy("lm_head.weight", "lm_head.weight"))
        if shared:  # untied, Hugging Face still builds `shared`, but no forward pass reads it
            mapping.unused.append(r"shared\.weight")
            mapping.fill["shared.weight"] = "encoder.embeddings.tokens.weight"
    mapping.rules.append(Rule(("lm_head.bias",), ("final_logits_bias",), lambda b: (b[0],), lambda b: (b[None],)))
    for side in ("encoder", "decoder"):
        if marian:
            n_positions = hf_config.max_position_embeddings
            mapping.computed[f"{side}.embed_positions.weight"] = lambda n=n_positions: SinusoidalPositions(
                config.d_model
            )(torch.arange(n))
        else:
            positions = Rule(
                (f"{side}.embeddings.positions.embedding.weight",),
                (f"{side}.embed_positions.weight",),
                without_offset_rows,
                with_offset_rows,
                keep=True,
            )
            mapping.rules += [positions, *affine(f"{side}.embeddings.norm", f"{side}.layernorm_embedding")]
        n_layers = config.encoder_layers if side == "encoder" else config.decoder_layers
        for i in range(n_layers):
            mapping.rules += seq2seq_layer(f"{side}.blocks.{i}.", f"{side}.layers.{i}.", side == "decoder")
    return mapping
