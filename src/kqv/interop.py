"""Weight conversion between Hugging Face `transformers` models and kqv, offline.

`from_hf` turns a GPT-2 language model into a `kqv.DecoderLM` and a BERT encoder into a `kqv.Encoder` with the
same outputs, which is how kqv proves its blocks are the architectures of the lecture and not lookalikes. It reads
either a model object or a local directory holding `config.json` and `model.safetensors` (never a pickled
`pytorch_model.bin`: unpickling can run arbitrary code). Nothing is downloaded.

Each architecture is one `Architecture` entry in `ARCHITECTURES`: a config translation and a weight translation.
The weight translation takes names from the Hugging Face checkpoint one by one, so a weight kqv has no place for
is an error, not silently dropped; only the parts named in `ignored` (BERT's pooler, its MLM head) are left out.

`transformers` is imported inside functions only: it is an optional dependency, not one of kqv's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from .config import ModelConfig
from .models import DecoderLM, Encoder

__all__ = ["ARCHITECTURES", "Architecture", "config_from_hf", "from_hf", "read_hf_directory"]

# Hugging Face activation names (`ACT2FN` keys) that kqv computes exactly, up to float rounding.
HF_ACTIVATIONS = {
    "gelu": "gelu",  # erf form
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",  # GPT-2's tanh approximation, written out
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",  # the same tanh approximation with sqrt(2/pi) rounded to 10 digits
    "relu": "relu",
}


# ---------------------------------------------------------------------------------------------------------------
# Public interface


def from_hf(source: nn.Module | str | Path) -> nn.Module:
    """A kqv model with the weights of a Hugging Face model, in eval mode.

    `source` is a model object (`GPT2LMHeadModel`, `BertModel`, `BertForMaskedLM`) or a local directory written by
    `save_pretrained` (`config.json` + `model.safetensors`, or sharded safetensors with an index). The kqv model is
    built in torch's default dtype (float32); weights stored in another dtype are cast to it.

    GPT-2 becomes a `DecoderLM` with the same logits. BERT becomes an `Encoder` with the same last hidden states
    for token_type_ids = 0 (kqv has no token types: row 0 of the type table is folded into the position table);
    the pooler and `BertForMaskedLM`'s prediction head are not converted.
    """
    if isinstance(source, (str, Path)):
        hf_config, weights = read_hf_directory(source)
        class_names = list(getattr(hf_config, "architectures", None) or [])
    elif isinstance(source, nn.Module) and hasattr(source, "config"):
        hf_config, weights = source.config, source.state_dict()
        class_names = [type(source).__name__]
    else:
        raise TypeError(f"from_hf takes a Hugging Face model or a directory path, got {type(source).__name__}")
    arch = architecture(hf_config, class_names)
    config = arch.config_from_hf(hf_config)
    checkpoint = Checkpoint(weights, arch.prefix)
    state = arch.state_from_hf(checkpoint, config)
    checkpoint.check_all_used(arch.ignored)
    model = arch.kqv_model(config)
    model.load_state_dict(state, strict=True)
    return model.eval()


def config_from_hf(hf_config: Any) -> ModelConfig:
    """The `ModelConfig` of a Hugging Face config (`GPT2Config`, `BertConfig`); ValueError for anything else."""
    return architecture(hf_config).config_from_hf(hf_config)


def read_hf_directory(path: str | Path) -> tuple[Any, dict[str, Tensor]]:
    """(Hugging Face config, weights by name) from a local model directory; safetensors only, no network."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a Hugging Face model directory: it has no config.json")
    from safetensors.torch import load_file
    from transformers import AutoConfig

    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        weights = load_file(single)
    elif index.is_file():
        weights = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            weights.update(load_file(path / shard))
    else:
        pickles = sorted(p.name for p in path.glob("*.bin"))
        found = f"only {', '.join(pickles)}, which is a pickle" if pickles else "no weights"
        raise ValueError(
            f"{path} has {found}; kqv reads model.safetensors only, because unpickling a checkpoint can run "
            f"arbitrary code. Convert it where you trust the file: "
            f"AutoModel.from_pretrained(path).save_pretrained(path, safe_serialization=True)"
        )
    return AutoConfig.from_pretrained(path, local_files_only=True), weights


# ---------------------------------------------------------------------------------------------------------------
# The dispatch table


@dataclass(frozen=True)
class Architecture:
    """How one Hugging Face architecture maps onto kqv."""

    model_type: str  # `config.model_type`
    hf_classes: tuple[str, ...]  # Hugging Face classes whose weights are read
    kqv_class: str
    kqv_model: Callable[[ModelConfig], nn.Module]
    prefix: str  # the base model's prefix in head models' state dicts ("transformer.", "bert.")
    config_from_hf: Callable[[Any], ModelConfig]
    state_from_hf: Callable[[Checkpoint, ModelConfig], dict[str, Tensor]]
    ignored: tuple[str, ...] = ()  # regexes of checkpoint names deliberately left out


def supported() -> str:
    return "; ".join(f"{' / '.join(a.hf_classes)} (model_type {a.model_type!r}) -> kqv.{a.kqv_class}"
                     for a in ARCHITECTURES.values())


def architecture(hf_config: Any, class_names: list[str] | None = None) -> Architecture:
    """The `ARCHITECTURES` entry for a config (and, when known, the model classes); ValueError if there is none."""
    model_type = getattr(hf_config, "model_type", None)
    arch = ARCHITECTURES.get(model_type)
    unsupported = [name for name in class_names or [] if arch is None or name not in arch.hf_classes]
    if arch is None or unsupported:
        what = ", ".join(unsupported) if unsupported else f"model_type {model_type!r}"
        raise ValueError(f"kqv.interop cannot convert {what}; supported architectures: {supported()}")
    return arch


class Checkpoint:
    """Hugging Face weights by name, base-model prefix removed, handed out once each so none is lost unnoticed."""

    def __init__(self, weights: dict[str, Tensor], prefix: str):
        self.weights = {name.removeprefix(prefix): tensor for name, tensor in weights.items()}

    def __contains__(self, name: str) -> bool:
        return name in self.weights

    def take(self, name: str) -> Tensor:
        if name not in self.weights:
            raise ValueError(f"the checkpoint has no weight {name!r}; does it match its config?")
        return self.weights.pop(name)

    def check_all_used(self, ignored: tuple[str, ...]) -> None:
        left = sorted(n for n in self.weights if not any(re.fullmatch(p, n) for p in ignored))
        if left:
            raise ValueError(f"the checkpoint has weights kqv has no place for: {left[:8]}"
                             f"{' ...' if len(left) > 8 else ''}")


def hf_activation(name: str, option: str) -> str:
    if name not in HF_ACTIVATIONS:
        raise ValueError(f"{option}={name!r} is not an activation kqv has; supported: {sorted(HF_ACTIVATIONS)}")
    return HF_ACTIVATIONS[name]


def require(hf_config: Any, architecture_name: str, **expected: Any) -> None:
    """ValueError naming every option whose value kqv cannot represent (a missing option counts as expected)."""
    wrong = {k: getattr(hf_config, k) for k, v in expected.items() if getattr(hf_config, k, v) != v}
    if wrong:
        need = ", ".join(f"{k}={expected[k]!r}" for k in wrong)
        raise ValueError(f"kqv cannot represent {architecture_name} with {wrong}; it needs {need}")


# ---------------------------------------------------------------------------------------------------------------
# GPT-2 (Radford et al. 2019): pre-LN decoder, learned positions, tied output embedding


def gpt2_config(c: Any) -> ModelConfig:
    require(c, "GPT-2", scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, add_cross_attention=False)
    return ModelConfig(
        vocab_size=c.vocab_size, d_model=c.n_embd, n_heads=c.n_head, n_layers=c.n_layer,
        d_ff=c.n_inner or 4 * c.n_embd, max_len=c.n_positions, dropout=0.0, position="learned", norm="layernorm",
        norm_first=True, norm_eps=float(c.layer_norm_epsilon),
        activation=hf_activation(c.activation_function, "activation_function"), bias=True,
        tie_embeddings=bool(getattr(c, "tie_word_embeddings", True)),
    )


def gpt2_state(ckpt: Checkpoint, config: ModelConfig) -> dict[str, Tensor]:
    """GPT-2's Conv1D stores weights as (in, out), the transpose of nn.Linear; c_attn's output is [q | k | v]."""
    d = config.d_model
    state = {"decoder.embeddings.tokens.weight": ckpt.take("wte.weight"),
             "decoder.embeddings.positions.embedding.weight": ckpt.take("wpe.weight")}
    for i in range(config.n_layers):
        hf, kqv = f"h.{i}.", f"decoder.blocks.{i}."
        qkv_weight, qkv_bias = ckpt.take(hf + "attn.c_attn.weight").T, ckpt.take(hf + "attn.c_attn.bias")  # (3d, d)
        state |= {
            kqv + "self_attention.to_queries.weight": qkv_weight[:d],
            kqv + "self_attention.to_queries.bias": qkv_bias[:d],
            kqv + "self_attention.to_keys_values.weight": qkv_weight[d:],  # keys then values, (2d, d)
            kqv + "self_attention.to_keys_values.bias": qkv_bias[d:],
            **conv1d(ckpt, hf + "attn.c_proj", kqv + "self_attention.to_output"),
            **affine(ckpt, hf + "ln_1", kqv + "self_attention_residual.norm"),
            **conv1d(ckpt, hf + "mlp.c_fc", kqv + "feed_forward.up"),
            **conv1d(ckpt, hf + "mlp.c_proj", kqv + "feed_forward.down"),
            **affine(ckpt, hf + "ln_2", kqv + "feed_forward_residual.norm"),
        }
    state |= affine(ckpt, "ln_f", "decoder.final_norm")
    if config.tie_embeddings:
        if "lm_head.weight" in ckpt:  # a model object's state dict lists the tied weight twice
            ckpt.take("lm_head.weight")
        state["lm_head.weight"] = state["decoder.embeddings.tokens.weight"]
    else:
        state["lm_head.weight"] = ckpt.take("lm_head.weight")
    return state


def conv1d(ckpt: Checkpoint, hf: str, kqv: str) -> dict[str, Tensor]:
    return {kqv + ".weight": ckpt.take(hf + ".weight").T, kqv + ".bias": ckpt.take(hf + ".bias")}


def affine(ckpt: Checkpoint, hf: str, kqv: str) -> dict[str, Tensor]:
    """nn.Linear and nn.LayerNorm alike: weight and bias under the same two names."""
    return {kqv + ".weight": ckpt.take(hf + ".weight"), kqv + ".bias": ckpt.take(hf + ".bias")}


# ---------------------------------------------------------------------------------------------------------------
# BERT (Devlin et al. 2019): post-LN encoder, learned positions, a LayerNorm on the embeddings


def bert_config(c: Any) -> ModelConfig:
    require(c, "BERT", position_embedding_type="absolute", is_decoder=False, add_cross_attention=False)
    return ModelConfig(
        vocab_size=c.vocab_size, d_model=c.hidden_size, n_heads=c.num_attention_heads,
        n_layers=c.num_hidden_layers, d_ff=c.intermediate_size, max_len=c.max_position_embeddings, dropout=0.0,
        position="learned", norm="layernorm", norm_first=False, norm_eps=float(c.layer_norm_eps),
        activation=hf_activation(c.hidden_act, "hidden_act"), bias=True, embed_norm=True,
    )


def bert_state(ckpt: Checkpoint, config: ModelConfig) -> dict[str, Tensor]:
    """kqv has no token types, so row 0 of BERT's token-type table is folded into every position embedding.

    That is exact for token_type_ids = 0 (a single segment, the default); a second segment (type 1) is lost.
    """
    positions = ckpt.take("embeddings.position_embeddings.weight")
    if "embeddings.token_type_embeddings.weight" in ckpt:
        positions = positions + ckpt.take("embeddings.token_type_embeddings.weight")[0]
    state = {"embeddings.tokens.weight": ckpt.take("embeddings.word_embeddings.weight"),
             "embeddings.positions.embedding.weight": positions,
             **affine(ckpt, "embeddings.LayerNorm", "embeddings.norm")}
    for i in range(config.n_layers):
        hf, kqv = f"encoder.layer.{i}.", f"blocks.{i}."
        attn = hf + "attention.self."
        state |= {
            **affine(ckpt, attn + "query", kqv + "self_attention.to_queries"),
            kqv + "self_attention.to_keys_values.weight": cat(ckpt.take(attn + "key.weight"),
                                                              ckpt.take(attn + "value.weight")),
            kqv + "self_attention.to_keys_values.bias": cat(ckpt.take(attn + "key.bias"),
                                                            ckpt.take(attn + "value.bias")),
            **affine(ckpt, hf + "attention.output.dense", kqv + "self_attention.to_output"),
            **affine(ckpt, hf + "attention.output.LayerNorm", kqv + "self_attention_residual.norm"),
            **affine(ckpt, hf + "intermediate.dense", kqv + "feed_forward.up"),
            **affine(ckpt, hf + "output.dense", kqv + "feed_forward.down"),
            **affine(ckpt, hf + "output.LayerNorm", kqv + "feed_forward_residual.norm"),
        }
    return state


def cat(keys: Tensor, values: Tensor) -> Tensor:
    return torch.cat((keys, values))  # keys then values along the output dimension, as to_keys_values has them


ARCHITECTURES: dict[str, Architecture] = {
    "gpt2": Architecture(
        model_type="gpt2", hf_classes=("GPT2LMHeadModel",), kqv_class="DecoderLM", kqv_model=DecoderLM,
        prefix="transformer.", config_from_hf=gpt2_config, state_from_hf=gpt2_state,
        ignored=(r"h\.\d+\.attn\.(masked_)?bias",),  # causal-mask buffers of old checkpoints
    ),
    "bert": Architecture(
        model_type="bert", hf_classes=("BertModel", "BertForMaskedLM"), kqv_class="Encoder", kqv_model=Encoder,
        prefix="bert.", config_from_hf=bert_config, state_from_hf=bert_state,
        # index buffers, the [CLS] pooler (not part of the hidden states) and the masked-LM head
        ignored=(r"embeddings\.(position_ids|token_type_ids)", r"pooler\..*", r"cls\..*"),
    ),
}
