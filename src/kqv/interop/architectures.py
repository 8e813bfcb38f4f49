"""The supported architectures, one `Architecture` entry each in `ARCHITECTURES`: config translations both ways
and weight rules for GPT-2, BERT (base and masked-LM), Marian and BART."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..errors import ConversionError
from ..nn.config import ModelConfig
from ..nn.heads import MaskedLM
from ..nn.models import DecoderLM, Encoder, EncoderDecoder
from ..nn.positions import SinusoidalPositions
from .rules import (
    Architecture,
    Mapping,
    Rule,
    activation_to_hf,
    affine,
    attention,
    conv1d,
    copy,
    dropouts,
    hf_activation,
    require,
    require_kqv,
)

# ---------------------------------------------------------------------------------------------------------------
# GPT-2 (Radford et al. 2019): pre-LN decoder, learned positions, tied output embedding


def gpt2_config(c: Any) -> ModelConfig:
    require(c, "GPT-2", scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, add_cross_attention=False)
    return ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.n_embd,
        n_heads=c.n_head,
        n_layers=c.n_layer,
        d_ff=c.n_inner or 4 * c.n_embd,
        max_len=c.n_positions,
        dropout=0.0,
        position="learned",
        norm="layernorm",
        norm_first=True,
        norm_eps=float(c.layer_norm_epsilon),
        activation=hf_activation(c.activation_function, "activation_function"),
        bias=True,
        tie_embeddings=bool(getattr(c, "tie_word_embeddings", True)),
    )


def gpt2_config_to_hf(c: ModelConfig, base: dict[str, Any]) -> dict[str, Any]:
    target = "GPT2LMHeadModel"
    require_kqv(
        c,
        target,
        position="learned",
        norm="layernorm",
        norm_first=True,
        bias=True,
        output_bias=False,
        scale_embeddings=False,
        embed_norm=False,
    )
    return {
        **dropouts(base, c, "resid_pdrop", "embd_pdrop", "attn_pdrop"),
        "vocab_size": c.vocab_size,
        "n_embd": c.d_model,
        "n_head": c.n_heads,
        "n_layer": c.n_layers,
        "n_inner": c.d_ff,
        "n_positions": c.max_len,
        "layer_norm_epsilon": c.norm_eps,
        "activation_function": activation_to_hf(c.activation, base.get("activation_function"), target),
        "tie_word_embeddings": c.tie_embeddings,
    }


def gpt2_mapping(config: ModelConfig, hf_config: Any) -> Mapping:
    """c_attn is one Conv1D whose output is [q | k | v]: kqv's to_queries and to_keys_values, transposed."""
    d = config.d_model
    rules = [
        copy("decoder.embeddings.tokens.weight", "wte.weight"),
        copy("decoder.embeddings.positions.embedding.weight", "wpe.weight"),
    ]
    for i in range(config.n_layers):
        hf, kqv = f"h.{i}.", f"decoder.blocks.{i}."
        q, kv = kqv + "self_attention.to_queries", kqv + "self_attention.to_keys_values"
        rules += [
            Rule(
                (f"{q}.weight", f"{kv}.weight"),
                (hf + "attn.c_attn.weight",),
                lambda w: (w.T[:d], w.T[d:]),
                lambda q, kv: (torch.cat((q, kv)).T,),
            ),
            Rule(
                (f"{q}.bias", f"{kv}.bias"),
                (hf + "attn.c_attn.bias",),
                lambda b: (b[:d], b[d:]),
                lambda q, kv: (torch.cat((q, kv)),),
            ),
            *conv1d(kqv + "self_attention.to_output", hf + "attn.c_proj"),
            *affine(kqv + "self_attention_residual.norm", hf + "ln_1"),
            *conv1d(kqv + "feed_forward.up", hf + "mlp.c_fc"),
            *conv1d(kqv + "feed_forward.down", hf + "mlp.c_proj"),
            *affine(kqv + "feed_forward_residual.norm", hf + "ln_2"),
        ]
    rules += affine("decoder.final_norm", "ln_f")
    if hf_config.tie_word_embeddings:
        return Mapping(rules, aliases=["lm_head.weight"])
    return Mapping(rules + [copy("lm_head.weight", "lm_head.weight")])


# ---------------------------------------------------------------------------------------------------------------
# BERT (Devlin et al. 2019): post-LN encoder, learned positions, a LayerNorm on the embeddings


def bert_config(c: Any) -> ModelConfig:
    require(c, "BERT", position_embedding_type="absolute", is_decoder=False, add_cross_attention=False)
    if c.type_vocab_size < 1:
        raise ConversionError(
            f"kqv folds BERT's token type 0 into its positions, so it needs type_vocab_size >= 1, "
            f"got {c.type_vocab_size}"
        )
    return ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_heads=c.num_attention_heads,
        n_layers=c.num_hidden_layers,
        d_ff=c.intermediate_size,
        max_len=c.max_position_embeddings,
        dropout=0.0,
        position="learned",
        norm="layernorm",
        norm_first=False,
        norm_eps=float(c.layer_norm_eps),
        activation=hf_activation(c.hidden_act, "hidden_act"),
        bias=True,
        embed_norm=True,
        tie_embeddings=bool(getattr(c, "tie_word_embeddings", True)),
    )


def bert_config_to_hf(c: ModelConfig, base: dict[str, Any], target: str = "BertModel") -> dict[str, Any]:
    require_kqv(
        c,
        target,
        position="learned",
        norm="layernorm",
        norm_first=False,
        bias=True,
        scale_embeddings=False,
        embed_norm=True,
    )
    return {
        **dropouts(base, c, "hidden_dropout_prob", "attention_probs_dropout_prob"),
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "num_attention_heads": c.n_heads,
        "num_hidden_layers": c.n_layers,
        "intermediate_size": c.d_ff,
        "max_position_embeddings": c.max_len,
        "layer_norm_eps": c.norm_eps,
        "hidden_act": activation_to_hf(c.activation, base.get("hidden_act"), target),
        "tie_word_embeddings": c.tie_embeddings,
    }


def bert_mlm_config_to_hf(c: ModelConfig, base: dict[str, Any]) -> dict[str, Any]:
    return bert_config_to_hf(c, base, "BertForMaskedLM")


def fold_token_type(positions: Tensor, token_types: Tensor) -> tuple[Tensor]:
    """kqv has no token types: row 0 of the table, added to every token of a single segment, joins the positions."""
    return (positions + token_types[0],)


def unfold_token_type(type_vocab_size: int) -> Callable[..., tuple[Tensor, Tensor]]:
    def unfold(folded: Tensor, originals: list[Tensor] | None = None) -> tuple[Tensor, Tensor]:
        positions, token_types = originals or (None, folded.new_zeros(type_vocab_size, folded.shape[1]))
        if positions is None or not torch.equal(positions + token_types[0], folded):  # changed since import
            positions = folded - token_types[0]
        return positions, token_types

    return unfold


def bert_rules(config: ModelConfig, hf_config: Any, kqv: str = "") -> list[Rule]:
    """The encoder of BertModel; `kqv` is where kqv keeps it ("" for an Encoder, "encoder." in a MaskedLM)."""
    rules = [
        copy(kqv + "embeddings.tokens.weight", "embeddings.word_embeddings.weight"),
        Rule(
            (kqv + "embeddings.positions.embedding.weight",),
            ("embeddings.position_embeddings.weight", "embeddings.token_type_embeddings.weight"),
            fold_token_type,
            unfold_token_type(hf_config.type_vocab_size),
            keep=True,
        ),
        *affine(kqv + "embeddings.norm", "embeddings.LayerNorm"),
    ]
    for i in range(config.n_layers):
        hf, block = f"encoder.layer.{i}.", f"{kqv}blocks.{i}."
        rules += [
            *attention(
                block + "self_attention",
                hf + "attention.self.query",
                hf + "attention.self.key",
                hf + "attention.self.value",
                hf + "attention.output.dense",
            ),
            *affine(block + "self_attention_residual.norm", hf + "attention.output.LayerNorm"),
            *affine(block + "feed_forward.up", hf + "intermediate.dense"),
            *affine(block + "feed_forward.down", hf + "output.dense"),
            *affine(block + "feed_forward_residual.norm", hf + "output.LayerNorm"),
        ]
    return rules


def bert_mapping(config: ModelConfig, hf_config: Any) -> Mapping:
    # the [CLS] pooler is no part of the hidden states: kept for export (a BertModel without one has none)
    return Mapping(bert_rules(config, hf_config), unused=[r"pooler\.dense\.(weight|bias)"])


def bert_mlm_mapping(config: ModelConfig, hf_config: Any) -> Mapping:
    """BertForMaskedLM: the encoder under "bert.", then cls.predictions: transform (dense, act, LayerNorm) and a
    decoder tied to the word embeddings whose bias is cls.predictions.bias (untied: its own, and that one unused)."""
    rules = bert_rules(config, hf_config, "encoder.") + [
        *affine("head.dense", "cls.predictions.transform.dense"),
        *affine("head.norm", "cls.predictions.transform.LayerNorm"),
    ]
    if hf_config.tie_word_embeddings:
        rules.append(copy("head.to_vocab.bias", "cls.predictions.bias"))
        return Mapping(rules, aliases=["cls.predictions.decoder.weight", "cls.predictions.decoder.bias"])
    rules += affine("head.to_vocab", "cls.predictions.decoder")
    return Mapping(rules, unused=[r"cls\.predictions\.bias"], fill={"cls.predictions.bias": "head.to_vocab.bias"})


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


ARCHITECTURES: dict[str, Architecture] = {
    a.hf_class: a
    for a in [
        Architecture(
            "GPT2LMHeadModel",
            "gpt2",
            DecoderLM,
            gpt2_config,
            gpt2_config_to_hf,
            gpt2_mapping,
            base_prefix="transformer.",
            heads=("lm_head.",),
            ignored=(r"h\.\d+\.attn\.(masked_)?bias",),
        ),  # causal-mask buffers of old checkpoints
        Architecture(
            "BertModel",
            "bert",
            Encoder,
            bert_config,
            bert_config_to_hf,
            bert_mapping,
            base_prefix="bert.",
            prefixed=False,
            # index buffers, and the heads of a BertForPreTraining checkpoint (BertModel ignores them too)
            ignored=(r"embeddings\.(position_ids|token_type_ids)", r"cls\..*"),
            hf_options=lambda state: {"add_pooling_layer": "pooler.dense.weight" in state},
        ),
        Architecture(
            "BertForMaskedLM",
            "bert",
            MaskedLM,
            bert_config,
            bert_mlm_config_to_hf,
            bert_mlm_mapping,
            base_prefix="bert.",
            heads=("cls.",),
            ignored=(r"embeddings\.(position_ids|token_type_ids)", r"pooler\..*", r"cls\.seq_relationship\..*"),
        ),
        Architecture(
            "MarianMTModel",
            "marian",
            EncoderDecoder,
            marian_config,
            marian_config_to_hf,
            seq2seq_mapping,
            base_prefix="model.",
            heads=("lm_head.", "final_logits_bias"),
        ),
        Architecture(
            "BartForConditionalGeneration",
            "bart",
            EncoderDecoder,
            bart_config,
            bart_config_to_hf,
            seq2seq_mapping,
            base_prefix="model.",
            heads=("lm_head.", "final_logits_bias"),
            ignored=(r"(encoder|decoder)\.version",),
        ),
    ]
}
