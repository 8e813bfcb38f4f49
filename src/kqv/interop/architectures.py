"""The supported architectures, one `Architecture` entry each in `ARCHITECTURES`: config translations both ways
and weight rules for GPT-2 and BERT (base and masked-LM) here, Marian and BART in `kqv.interop.seq2seq`, GPT-NeoX
and the Llama family in `kqv.interop.decoders`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..errors import ConversionError
from ..nn.config import ModelConfig
from ..nn.heads import MaskedLM
from ..nn.models import DecoderLM, Encoder, EncoderDecoder
from .decoders import DECODERS
from .rules import HF_SIZES, Architecture, ConfigNames, Mapping, Rule, affine, attention, conv1d, copy, require
from .seq2seq import bart_config, bart_config_to_hf, marian_config, marian_config_to_hf, seq2seq_mapping

# ---------------------------------------------------------------------------------------------------------------
# GPT-2 (Radford et al. 2019): pre-LN decoder, learned positions, tied output embedding


GPT2_NAMES = ConfigNames(
    sizes=("vocab_size", "n_embd", "n_head", "n_layer", "n_inner", "n_positions"),
    norm_eps="layer_norm_epsilon",
    activation="activation_function",
    dropouts=("resid_pdrop", "embd_pdrop", "attn_pdrop"),
    fixed=dict(
        position="learned",
        norm="layernorm",
        norm_first=True,
        bias=True,
        output_bias=False,
        scale_embeddings=False,
        embed_norm=False,
    ),
)


def gpt2_config(c: Any) -> ModelConfig:
    require(c, "GPT-2", scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, add_cross_attention=False)
    return GPT2_NAMES.to_kqv(c, d_ff=c.n_inner or 4 * c.n_embd)


def gpt2_config_to_hf(c: ModelConfig, base: dict[str, Any]) -> dict[str, Any]:
    return GPT2_NAMES.to_hf(c, base, "GPT2LMHeadModel")


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


# What a GPT-2 config.json must hold, checked (`kqv.interop.convert.check_config`) before transformers reads it or
# any weight loads: each field's kind ("count": an integer of at least 1; "fraction": a number from 0 to 1), and
# the shape each weight's header must have for the values it gives.
GPT2_FIELDS = {
    "vocab_size": "count",
    "n_positions": "count",
    "n_embd": "count",
    "n_layer": "count",
    "n_head": "count",
    "n_inner": "count or null",
    "layer_norm_epsilon": "positive",
    "activation_function": "string",
    "tie_word_embeddings": "bool",
    "scale_attn_weights": "bool",
    "scale_attn_by_inverse_layer_idx": "bool",
    "add_cross_attention": "bool",
    "resid_pdrop": "fraction",
    "embd_pdrop": "fraction",
    "attn_pdrop": "fraction",
    "architectures": "names",
}
Side = tuple[int, str]  # a weight's size along one axis, and the config.json field it comes from


def gpt2_shapes(c: dict[str, Any], n_layer: int) -> dict[str, tuple[Side, ...]]:
    """Every weight of a GPT-2 (names without the "transformer." prefix) and its shape, as config.json's values `c`
    make it, for blocks h.0 to h.{n_layer - 1}; each side names its field."""
    d, vocab, positions = (c["n_embd"], "n_embd"), (c["vocab_size"], "vocab_size"), (c["n_positions"], "n_positions")
    inner, three = (c["n_inner"] or 4 * d[0], "n_inner"), (3 * d[0], "n_embd")
    shapes: dict[str, tuple[Side, ...]] = {"wte.weight": (vocab, d), "wpe.weight": (positions, d)}
    for i in range(n_layer):
        shapes |= {
            f"h.{i}.attn.c_attn.weight": (d, three),
            f"h.{i}.attn.c_attn.bias": (three,),
            f"h.{i}.attn.c_proj.weight": (d, d),
            f"h.{i}.mlp.c_fc.weight": (d, inner),
            f"h.{i}.mlp.c_fc.bias": (inner,),
            f"h.{i}.mlp.c_proj.weight": (inner, d),
        }
        shapes |= {f"h.{i}.{name}": (d,) for name in GPT2_WIDTH_VECTORS}
    return shapes | {"ln_f.weight": (d,), "ln_f.bias": (d,), "lm_head.weight": (vocab, d)}


GPT2_WIDTH_VECTORS = ("attn.c_proj.bias", "mlp.c_proj.bias", "ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias")


@dataclass(frozen=True)
class ConfigSchema:
    """What `kqv.interop.convert.check_config` checks in a config.json of one model_type: its `fields` (name ->
    kind), that `heads` (the field of the heads count, of the width) divide, that the checkpoint's blocks (named
    `block`, "{}" the index, once `prefix` is removed) are as many as the field `layers` says, and that every weight
    has the shape `shapes(values, layers)` gives."""

    fields: dict[str, str]
    heads: tuple[str, str]
    prefix: str
    block: str
    layers: str
    shapes: Callable[[dict[str, Any], int], dict[str, tuple[Side, ...]]]


CONFIG_SCHEMAS = {
    "gpt2": ConfigSchema(GPT2_FIELDS, ("n_head", "n_embd"), "transformer.", "h.{}", "n_layer", gpt2_shapes)
}


# ---------------------------------------------------------------------------------------------------------------
# BERT (Devlin et al. 2019): post-LN encoder, learned positions, a LayerNorm on the embeddings


BERT_NAMES = ConfigNames(
    sizes=HF_SIZES,
    norm_eps="layer_norm_eps",
    activation="hidden_act",
    dropouts=("hidden_dropout_prob", "attention_probs_dropout_prob"),
    fixed=dict(
        position="learned", norm="layernorm", norm_first=False, bias=True, scale_embeddings=False, embed_norm=True
    ),
)


def bert_config(c: Any) -> ModelConfig:
    require(c, "BERT", position_embedding_type="absolute", is_decoder=False, add_cross_attention=False)
    if c.type_vocab_size < 1:
        raise ConversionError(
            f"kqv folds BERT's token type 0 into its positions, so it needs type_vocab_size >= 1, "
            f"got {c.type_vocab_size}"
        )
    return BERT_NAMES.to_kqv(c)


def bert_config_to_hf(c: ModelConfig, base: dict[str, Any], target: str = "BertModel") -> dict[str, Any]:
    return BERT_NAMES.to_hf(c, base, target)


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
            family="GPT-2",
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
        *DECODERS,
    ]
}
