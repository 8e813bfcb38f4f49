"""Weight conversion between Hugging Face `transformers` models and kqv, both ways, offline.

`from_hf` turns a Hugging Face model into the kqv model with the same outputs and `to_hf` turns it back:

    GPT2LMHeadModel               <->  kqv.DecoderLM       pre-LN decoder, learned positions
    BertModel                     <->  kqv.Encoder         post-LN encoder, learned positions, embedding norm
    BertForMaskedLM               <->  kqv.MaskedLM        the same encoder with BERT's prediction head
    MarianMTModel                 <->  kqv.EncoderDecoder  post-LN, sinusoidal positions, scaled embeddings
    BartForConditionalGeneration  <->  kqv.EncoderDecoder  post-LN, learned positions, embedding norms

That is how kqv proves its blocks are the architectures of the lecture and not lookalikes. `from_hf` reads a model
object or a local directory holding `config.json` and `model.safetensors` (never a pickled `pytorch_model.bin`:
unpickling can run arbitrary code). Nothing is downloaded.

Each architecture is one `Architecture` entry in `ARCHITECTURES`: a config translation each way and a list of
weight `Rule`s, each turning some checkpoint tensors into some kqv tensors and back. Every checkpoint tensor is
handed out once, so a weight kqv has no place for is an error, not silently dropped. What kqv does not compute
with (BERT's pooler and second token type, the two unused rows of BART's position tables) is kept beside the
converted model in `model.hf_origin`, with the Hugging Face config, so `to_hf(from_hf(m))` gives back `m`'s
state dict exactly.

`transformers` is imported inside functions only: it is an optional dependency, not one of kqv's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from .nn.config import ModelConfig
from .nn.heads import MaskedLM
from .nn.models import DecoderLM, Encoder, EncoderDecoder
from .nn.positions import SinusoidalPositions

__all__ = ["ARCHITECTURES", "Architecture", "HFOrigin", "Rule", "config_from_hf", "from_hf", "read_hf_directory",
           "to_hf"]

# Hugging Face activation names (`ACT2FN` keys) that kqv computes exactly, up to float rounding.
HF_ACTIVATIONS = {
    "gelu": "gelu",  # erf form
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",  # GPT-2's tanh approximation, written out
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",  # the same tanh approximation with sqrt(2/pi) rounded to 10 digits
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",  # Marian's name for it
}
# The name each kqv activation is exported under, unless the model came from a checkpoint that named it otherwise.
KQV_TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


# ---------------------------------------------------------------------------------------------------------------
# Public interface


def from_hf(source: nn.Module | str | Path) -> nn.Module:
    """A kqv model with the weights of a Hugging Face model, in eval mode.

    `source` is a model object of a class in `ARCHITECTURES` or a local directory written by `save_pretrained`
    (`config.json` + `model.safetensors`, or sharded safetensors with an index). The kqv model is built in torch's
    default dtype (float32); weights stored in another dtype are cast to it.

    Its outputs equal the Hugging Face model's: the logits of GPT-2, Marian, BART and BERT's masked-LM head, the
    last hidden states of `BertModel`. BERT's token types are folded into the position table, which is exact for
    token_type_ids = 0 (one segment, the default); kqv has no second segment. `model.hf_origin` keeps what kqv does
    not compute with, for `to_hf`.
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
    mapping = arch.mapping(config, hf_config)
    checkpoint = Checkpoint(weights, arch.base_prefix)
    state: dict[str, Tensor] = {}
    kept: dict[str, Tensor] = {}
    for rule in mapping.rules:
        originals = [checkpoint.take(name) for name in rule.hf]
        state |= dict(zip(rule.kqv, rule.to_kqv(*originals), strict=True))
        if rule.keep:
            kept |= dict(zip(rule.hf, originals))
    for name in mapping.aliases:  # the same tensor as one a rule took (a model object lists tied weights twice)
        checkpoint.discard(name)
    for name, expected in mapping.computed.items():
        if name in checkpoint:
            check_computed(name, checkpoint.take(name), expected())
    kept |= checkpoint.take_matching(mapping.unused)
    checkpoint.check_all_used(arch.ignored)
    model = arch.kqv_model(config)
    load_exactly(model, state)
    model.hf_origin = HFOrigin(arch.hf_class, hf_config.to_dict(), kept)
    return model.eval()


def to_hf(model: nn.Module, architecture_name: str | None = None, **config_options: Any) -> nn.Module:
    """The Hugging Face model with the weights of a kqv model, in eval mode: the inverse of `from_hf`.

    `architecture_name` picks the Hugging Face class when there is a choice (an `EncoderDecoder` becomes a
    `MarianMTModel` or a `BartForConditionalGeneration`); by default it is the class the model came from, else the
    first whose options the config fits. A model made by `from_hf` gets back its whole Hugging Face config and the
    tensors kqv kept aside, so `to_hf(from_hf(m))` has `m`'s state dict. `config_options` set Hugging Face config
    fields kqv knows nothing of (e.g. `pad_token_id=0, decoder_start_token_id=1` for a translation model).
    ValueError names every kqv option the chosen class cannot represent.
    """
    import transformers

    arch = export_architecture(model, architecture_name)
    require_kqv(model.config, arch.hf_class, attention="full")  # Hugging Face's classes have no Linformer/BigBird core
    origin = getattr(model, "hf_origin", None)
    from_same_class = isinstance(origin, HFOrigin) and origin.hf_class == arch.hf_class
    base = dict(origin.config) if from_same_class else {}
    kept = dict(origin.kept) if from_same_class else {}
    hf_config = build_hf_config(arch, model.config, base, config_options)
    mapping = arch.mapping(model.config, hf_config)
    kqv_state = model.state_dict()
    state: dict[str, Tensor] = {}
    for rule in mapping.rules:
        tensors = [kqv_state[name] for name in rule.kqv]
        if rule.keep:
            originals = [kept.get(name) for name in rule.hf]
            converted = rule.to_hf(*tensors, originals=None if any(t is None for t in originals) else originals)
        else:
            converted = rule.to_hf(*tensors)
        state |= dict(zip(rule.hf, converted, strict=True))
    check_all_exported(model, kqv_state, {name for rule in mapping.rules for name in rule.kqv}, arch.hf_class)
    for name, tensor in kept.items():
        state.setdefault(name, tensor)
    for name, kqv_name in mapping.fill.items():
        state.setdefault(name, kqv_state[kqv_name])
    hf_model = getattr(transformers, arch.hf_class)(hf_config, **arch.hf_options(state))
    missing, unexpected = hf_model.load_state_dict({arch.hf_name(n): t for n, t in state.items()}, strict=False)
    not_filled = set(missing) - {arch.hf_name(n) for n in [*mapping.aliases, *mapping.computed]}
    if unexpected or not_filled:
        raise RuntimeError(f"kqv.interop's {arch.hf_class} mapping is incomplete: missing {sorted(not_filled)}, "
                           f"unexpected {sorted(unexpected)}")
    return hf_model.eval()


def config_from_hf(hf_config: Any) -> ModelConfig:
    """The `ModelConfig` of a Hugging Face config (`GPT2Config`, `BertConfig`, `MarianConfig`, `BartConfig`);
    ValueError for anything else."""
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


@dataclass
class HFOrigin:
    """What a model made by `from_hf` remembers of its checkpoint, so that `to_hf` can give the checkpoint back.

    `config` is the Hugging Face config as a dict; `kept` holds, by checkpoint name (without the base-model
    prefix), the tensors kqv does not compute with and the originals of tensors it folded together.
    """

    hf_class: str
    config: dict[str, Any]
    kept: dict[str, Tensor] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------------
# The dispatch table


@dataclass(frozen=True)
class Rule:
    """`to_kqv` makes the kqv tensors named `kqv` from the checkpoint tensors named `hf`; `to_hf` does the reverse.

    A rule whose `to_kqv` loses information (folds two tensors into one, drops rows) `keep`s its checkpoint
    tensors in `HFOrigin.kept`, and its `to_hf` gets them back as `originals` (None when there are none).
    """

    kqv: tuple[str, ...]
    hf: tuple[str, ...]
    to_kqv: Callable[..., tuple[Tensor, ...]] = lambda *tensors: tensors
    to_hf: Callable[..., tuple[Tensor, ...]] = lambda *tensors: tensors
    keep: bool = False


@dataclass
class Mapping:
    """Every checkpoint tensor of one Hugging Face config, and what kqv makes of it.

    `aliases`: names tied to a tensor a rule reads (dropped on import, tied again by Hugging Face on export).
    `unused`: regexes of tensors that do not change the outputs (kept on import, restored on export); `fill` names
    the kqv tensor an unused one is exported as when none was kept. `computed`: tensors that are a function of the
    config (Marian's sinusoids), checked on import and left to Hugging Face on export.
    """

    rules: list[Rule]
    aliases: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    fill: dict[str, str] = field(default_factory=dict)
    computed: dict[str, Callable[[], Tensor]] = field(default_factory=dict)


@dataclass(frozen=True)
class Architecture:
    """How one Hugging Face model class maps onto one kqv model class."""

    hf_class: str
    model_type: str  # `config.model_type`
    kqv_class: type[nn.Module]
    config_from_hf: Callable[[Any], ModelConfig]
    config_to_hf: Callable[[ModelConfig, dict[str, Any]], dict[str, Any]]  # kqv config, base HF config -> fields
    mapping: Callable[[ModelConfig, Any], Mapping]  # kqv config, HF config -> weight mapping
    base_prefix: str  # the base model's prefix in head models' state dicts ("transformer.", "bert.", "model.")
    prefixed: bool = True  # whether this class stores its base model under base_prefix (BertModel does not)
    heads: tuple[str, ...] = ()  # checkpoint names outside the base model ("lm_head.", "cls.")
    ignored: tuple[str, ...] = ()  # regexes of checkpoint buffers that are no weights at all
    hf_options: Callable[[dict[str, Tensor]], dict[str, Any]] = lambda state: {}  # model class options

    def kqv_model(self, config: ModelConfig) -> nn.Module:
        return self.kqv_class(config)

    def hf_name(self, name: str) -> str:
        """The full state-dict name of a checkpoint name (which is without the base-model prefix)."""
        return self.base_prefix + name if self.prefixed and not name.startswith(self.heads) else name


def supported() -> str:
    return "; ".join(f"{a.hf_class} (model_type {a.model_type!r}) <-> kqv.{a.kqv_class.__name__}"
                     for a in ARCHITECTURES.values())


def architecture(hf_config: Any, class_names: list[str] | None = None) -> Architecture:
    """The `ARCHITECTURES` entry for a config (and, when known, the model classes); ValueError if there is none."""
    model_type = getattr(hf_config, "model_type", None)
    of_type = [a for a in ARCHITECTURES.values() if a.model_type == model_type]
    unsupported = [name for name in class_names or []
                   if name not in ARCHITECTURES or ARCHITECTURES[name].model_type != model_type]
    if not of_type or unsupported:
        what = ", ".join(unsupported) if unsupported else f"model_type {model_type!r}"
        raise ValueError(f"kqv.interop cannot convert {what}; supported architectures: {supported()}")
    return ARCHITECTURES[class_names[0]] if class_names else of_type[0]


def export_architecture(model: nn.Module, name: str | None) -> Architecture:
    """The Hugging Face class a kqv model becomes: `name`, else the one it came from, else the first that fits."""
    candidates = [a for a in ARCHITECTURES.values() if type(model) is a.kqv_class]
    if not candidates:
        kinds = sorted({a.kqv_class.__name__ for a in ARCHITECTURES.values()})
        raise ValueError(f"to_hf converts kqv models of the classes {kinds}, not {type(model).__name__}; "
                         f"supported architectures: {supported()}")
    if name is not None:
        if name not in [a.hf_class for a in candidates]:
            raise ValueError(f"a kqv.{type(model).__name__} cannot become a {name}; it can become "
                             f"{' or '.join(a.hf_class for a in candidates)}")
        return ARCHITECTURES[name]
    origin = getattr(model, "hf_origin", None)
    candidates.sort(key=lambda a: not (isinstance(origin, HFOrigin) and origin.hf_class == a.hf_class))
    reasons = []
    for arch in candidates:
        try:
            arch.config_to_hf(model.config, {})
            return arch
        except ValueError as error:
            reasons.append(str(error))
    raise ValueError("; ".join(reasons))


def build_hf_config(arch: Architecture, config: ModelConfig, base: dict[str, Any], options: dict[str, Any]) -> Any:
    """The Hugging Face config: `base` (the original one, if any), the fields from kqv's config, then `options`."""
    from transformers import AutoConfig

    values = {**base, **arch.config_to_hf(config, base), **options, "architectures": [arch.hf_class]}
    for name in ("model_type", "transformers_version"):
        values.pop(name, None)
    hf_config = AutoConfig.for_model(arch.model_type, **values)
    vocab = hf_config.vocab_size
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "forced_eos_token_id"):
        value = getattr(hf_config, name, None)
        if name not in base and name not in options and isinstance(value, int) and not 0 <= value < vocab:
            # a default of the Hugging Face class (GPT-2's 50256) that this vocabulary does not have
            setattr(hf_config, name, vocab - 1 if name in ("pad_token_id", "decoder_start_token_id") else None)
    return hf_config


class Checkpoint:
    """Hugging Face weights by name, base-model prefix removed, handed out once each so none is lost unnoticed."""

    def __init__(self, weights: dict[str, Tensor], prefix: str):
        self.weights = {name.removeprefix(prefix): tensor for name, tensor in weights.items()}

    def __contains__(self, name: str) -> bool:
        return name in self.weights

    def take(self, name: str) -> Tensor:
        if name not in self.weights:
            raise ValueError(f"the checkpoint has no weight {name!r}; does it match its config?")
        tensor = self.weights.pop(name)
        return tensor.to(torch.get_default_dtype()) if tensor.is_floating_point() else tensor

    def discard(self, name: str) -> None:
        self.weights.pop(name, None)

    def take_matching(self, patterns: list[str]) -> dict[str, Tensor]:
        return {name: self.take(name) for name in sorted(self.weights) if any(re.fullmatch(p, name) for p in patterns)}

    def check_all_used(self, ignored: tuple[str, ...]) -> None:
        left = sorted(n for n in self.weights if not any(re.fullmatch(p, n) for p in ignored))
        if left:
            raise ValueError(f"the checkpoint has weights kqv has no place for: {left[:8]}"
                             f"{' ...' if len(left) > 8 else ''}")


def check_computed(name: str, tensor: Tensor, expected: Tensor) -> None:
    if tensor.shape != expected.shape or not torch.allclose(tensor, expected, atol=1e-3):
        raise ValueError(f"the checkpoint's {name} is not the fixed table kqv computes (shape {tuple(tensor.shape)}, "
                         f"expected {tuple(expected.shape)}); kqv cannot represent a changed one")


def tied_groups(model: nn.Module) -> dict[str, set[str]]:
    """For each state-dict name, every name of the same tensor (tied weights appear under several names)."""
    by_tensor: dict[int, set[str]] = {}
    names = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        names[name] = by_tensor.setdefault(id(tensor), set())
        names[name].add(name)
    return names


def load_exactly(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Load `state` into `model`; every name must be filled, directly or through a weight tied to it."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    groups = tied_groups(model)
    unfilled = [name for name in missing if not groups[name] & state.keys()]
    if unfilled or unexpected:
        raise RuntimeError(f"kqv.interop's mapping for {type(model).__name__} is incomplete: unfilled {unfilled}, "
                           f"unexpected {sorted(unexpected)}")


def check_all_exported(model: nn.Module, kqv_state: dict[str, Tensor], exported: set[str], hf_class: str) -> None:
    groups = tied_groups(model)
    left = sorted(name for name in kqv_state if not groups[name] & exported)
    if left:
        raise ValueError(f"the kqv model has weights {left[:8]} that a {hf_class} has no place for")


def hf_activation(name: str, option: str) -> str:
    if name not in HF_ACTIVATIONS:
        raise ValueError(f"{option}={name!r} is not an activation kqv has; supported: {sorted(HF_ACTIVATIONS)}")
    return HF_ACTIVATIONS[name]


def activation_to_hf(activation: str, base_name: str | None, target: str) -> str:
    """The Hugging Face name of a kqv activation: the original checkpoint's name if it means the same."""
    if base_name is not None and HF_ACTIVATIONS.get(base_name) == activation:
        return base_name
    if activation not in KQV_TO_HF_ACTIVATION:
        raise ValueError(f"a kqv model with activation={activation!r} cannot become a {target}, whose feed-forward "
                         f"network is not gated; it needs one of {sorted(KQV_TO_HF_ACTIVATION)}")
    return KQV_TO_HF_ACTIVATION[activation]


def require(hf_config: Any, architecture_name: str, **expected: Any) -> None:
    """ValueError naming every option whose value kqv cannot represent (a missing option counts as expected)."""
    wrong = {k: getattr(hf_config, k) for k, v in expected.items() if getattr(hf_config, k, v) != v}
    if wrong:
        need = ", ".join(f"{k}={expected[k]!r}" for k in wrong)
        raise ValueError(f"kqv cannot represent {architecture_name} with {wrong}; it needs {need}")


def require_kqv(config: ModelConfig, target: str, **expected: Any) -> None:
    """ValueError naming every kqv option that the Hugging Face class `target` cannot represent."""
    wrong = {k: getattr(config, k) for k, v in expected.items() if getattr(config, k) != v}
    if wrong:
        have = ", ".join(f"{k}={v!r}" for k, v in wrong.items())
        need = ", ".join(f"{k}={expected[k]!r}" for k in wrong)
        raise ValueError(f"a kqv model with {have} cannot become a {target}, which needs {need}")


def dropouts(base: dict[str, Any], config: ModelConfig, *names: str) -> dict[str, float]:
    """The original checkpoint's dropout rates if there is one, else kqv's one rate for all of them."""
    return {name: base.get(name, config.dropout) for name in names}


# Rules that occur in every architecture


def copy(kqv: str, hf: str) -> Rule:
    return Rule((kqv,), (hf,))


def affine(kqv: str, hf: str) -> list[Rule]:
    """nn.Linear and nn.LayerNorm alike: weight and bias under the same two names."""
    return [copy(f"{kqv}.weight", f"{hf}.weight"), copy(f"{kqv}.bias", f"{hf}.bias")]


def transpose(weight: Tensor) -> tuple[Tensor]:
    return (weight.T,)


def conv1d(kqv: str, hf: str) -> list[Rule]:
    """GPT-2's Conv1D stores its weight as (in, out), the transpose of nn.Linear's."""
    return [Rule((f"{kqv}.weight",), (f"{hf}.weight",), transpose, transpose), copy(f"{kqv}.bias", f"{hf}.bias")]


def stack(keys: Tensor, values: Tensor) -> tuple[Tensor]:
    return (torch.cat((keys, values)),)  # keys then values along the output dimension, as to_keys_values has them


def unstack(keys_values: Tensor) -> tuple[Tensor, Tensor]:
    return tuple(keys_values.chunk(2))


def attention(kqv: str, queries: str, keys: str, values: str, output: str) -> list[Rule]:
    """Separate query, key, value and output projections (BERT, Marian, BART) into kqv's q, [k; v] and output."""
    return [*affine(f"{kqv}.to_queries", queries),
            *(Rule((f"{kqv}.to_keys_values.{p}",), (f"{keys}.{p}", f"{values}.{p}"), stack, unstack)
              for p in ("weight", "bias")),
            *affine(f"{kqv}.to_output", output)]


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


def gpt2_config_to_hf(c: ModelConfig, base: dict[str, Any]) -> dict[str, Any]:
    target = "GPT2LMHeadModel"
    require_kqv(c, target, position="learned", norm="layernorm", norm_first=True, bias=True, output_bias=False,
                scale_embeddings=False, embed_norm=False)
    return {**dropouts(base, c, "resid_pdrop", "embd_pdrop", "attn_pdrop"),
            "vocab_size": c.vocab_size, "n_embd": c.d_model, "n_head": c.n_heads, "n_layer": c.n_layers,
            "n_inner": c.d_ff, "n_positions": c.max_len, "layer_norm_epsilon": c.norm_eps,
            "activation_function": activation_to_hf(c.activation, base.get("activation_function"), target),
            "tie_word_embeddings": c.tie_embeddings}


def gpt2_mapping(config: ModelConfig, hf_config: Any) -> Mapping:
    """c_attn is one Conv1D whose output is [q | k | v]: kqv's to_queries and to_keys_values, transposed."""
    d = config.d_model
    rules = [copy("decoder.embeddings.tokens.weight", "wte.weight"),
             copy("decoder.embeddings.positions.embedding.weight", "wpe.weight")]
    for i in range(config.n_layers):
        hf, kqv = f"h.{i}.", f"decoder.blocks.{i}."
        q, kv = kqv + "self_attention.to_queries", kqv + "self_attention.to_keys_values"
        rules += [
            Rule((f"{q}.weight", f"{kv}.weight"), (hf + "attn.c_attn.weight",),
                 lambda w: (w.T[:d], w.T[d:]), lambda q, kv: (torch.cat((q, kv)).T,)),
            Rule((f"{q}.bias", f"{kv}.bias"), (hf + "attn.c_attn.bias",),
                 lambda b: (b[:d], b[d:]), lambda q, kv: (torch.cat((q, kv)),)),
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
        raise ValueError(f"kqv folds BERT's token type 0 into its positions, so it needs type_vocab_size >= 1, "
                         f"got {c.type_vocab_size}")
    return ModelConfig(
        vocab_size=c.vocab_size, d_model=c.hidden_size, n_heads=c.num_attention_heads,
        n_layers=c.num_hidden_layers, d_ff=c.intermediate_size, max_len=c.max_position_embeddings, dropout=0.0,
        position="learned", norm="layernorm", norm_first=False, norm_eps=float(c.layer_norm_eps),
        activation=hf_activation(c.hidden_act, "hidden_act"), bias=True, embed_norm=True,
        tie_embeddings=bool(getattr(c, "tie_word_embeddings", True)),
    )


def bert_config_to_hf(c: ModelConfig, base: dict[str, Any], target: str = "BertModel") -> dict[str, Any]:
    require_kqv(c, target, position="learned", norm="layernorm", norm_first=False, bias=True,
                scale_embeddings=False, embed_norm=True)
    return {**dropouts(base, c, "hidden_dropout_prob", "attention_probs_dropout_prob"),
            "vocab_size": c.vocab_size, "hidden_size": c.d_model, "num_attention_heads": c.n_heads,
            "num_hidden_layers": c.n_layers, "intermediate_size": c.d_ff, "max_position_embeddings": c.max_len,
            "layer_norm_eps": c.norm_eps, "hidden_act": activation_to_hf(c.activation, base.get("hidden_act"), target),
            "tie_word_embeddings": c.tie_embeddings}


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
    rules = [copy(kqv + "embeddings.tokens.weight", "embeddings.word_embeddings.weight"),
             Rule((kqv + "embeddings.positions.embedding.weight",),
                  ("embeddings.position_embeddings.weight", "embeddings.token_type_embeddings.weight"),
                  fold_token_type, unfold_token_type(hf_config.type_vocab_size), keep=True),
             *affine(kqv + "embeddings.norm", "embeddings.LayerNorm")]
    for i in range(config.n_layers):
        hf, block = f"encoder.layer.{i}.", f"{kqv}blocks.{i}."
        rules += [
            *attention(block + "self_attention", hf + "attention.self.query", hf + "attention.self.key",
                       hf + "attention.self.value", hf + "attention.output.dense"),
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
    require(c, name, is_decoder=False, add_cross_attention=False, normalize_before=False, add_final_layer_norm=False,
            normalize_embedding=True, add_bias_logits=False, static_position_embeddings=False)
    for encoder_option, decoder_option in (("encoder_attention_heads", "decoder_attention_heads"),
                                           ("encoder_ffn_dim", "decoder_ffn_dim")):
        if getattr(c, encoder_option) != getattr(c, decoder_option):
            raise ValueError(f"kqv cannot represent {name} with {encoder_option}={getattr(c, encoder_option)} and "
                             f"{decoder_option}={getattr(c, decoder_option)}: kqv's encoder and decoder share one "
                             f"{'n_heads' if 'heads' in encoder_option else 'd_ff'}")
    shared = c.share_encoder_decoder_embeddings if marian else True
    tied = bool(c.tie_word_embeddings)
    return ModelConfig(
        vocab_size=c.vocab_size, d_model=c.d_model, n_heads=c.encoder_attention_heads, n_layers=c.encoder_layers,
        n_decoder_layers=None if c.decoder_layers == c.encoder_layers else c.decoder_layers,
        d_ff=c.encoder_ffn_dim, max_len=c.max_position_embeddings, dropout=0.0,
        position="sinusoidal" if marian else "learned", norm="layernorm", norm_first=False, norm_eps=1e-5,
        activation=hf_activation(c.activation_function, "activation_function"), bias=True, tie_embeddings=tied,
        output_bias=True, scale_embeddings=bool(c.scale_embedding), embed_norm=not marian,
        # Hugging Face shares encoder, decoder and output embeddings only when both flags say so
        tgt_vocab_size=None if shared and tied else (c.decoder_vocab_size if marian else c.vocab_size),
    )


def marian_config(c: Any) -> ModelConfig:
    return seq2seq_config(c, "Marian")


def bart_config(c: Any) -> ModelConfig:
    return seq2seq_config(c, "BART")


def seq2seq_config_to_hf(c: ModelConfig, base: dict[str, Any], target: str) -> dict[str, Any]:
    marian = target == "MarianMTModel"
    require_kqv(c, target, position="sinusoidal" if marian else "learned", norm="layernorm", norm_first=False,
                norm_eps=1e-5, bias=True, output_bias=True, embed_norm=not marian)
    values = {**dropouts(base, c, "dropout", "attention_dropout"),
              "activation_dropout": base.get("activation_dropout", 0.0),  # kqv has no dropout inside the FFN
              "vocab_size": c.vocab_size, "d_model": c.d_model, "encoder_layers": c.encoder_layers,
              "decoder_layers": c.decoder_layers, "encoder_attention_heads": c.n_heads,
              "decoder_attention_heads": c.n_heads, "encoder_ffn_dim": c.d_ff, "decoder_ffn_dim": c.d_ff,
              "max_position_embeddings": c.max_len, "scale_embedding": c.scale_embeddings,
              "activation_function": activation_to_hf(c.activation, base.get("activation_function"), target),
              "tie_word_embeddings": c.tie_embeddings}
    separate = c.tgt_vocab_size is not None
    if marian:
        share = not separate if c.tie_embeddings else c.target_vocab_size == c.vocab_size and (
            not separate or base.get("share_encoder_decoder_embeddings", False))
        values |= {"decoder_vocab_size": c.target_vocab_size, "share_encoder_decoder_embeddings": share}
    elif separate and (c.tie_embeddings or c.tgt_vocab_size != c.vocab_size):
        raise ValueError(f"a kqv model with tgt_vocab_size={c.tgt_vocab_size} and tie_embeddings="
                         f"{c.tie_embeddings} cannot become a {target}, which has one vocabulary and ties encoder, "
                         f"decoder and output embeddings all or none (tgt_vocab_size=None, or tie_embeddings=False)")
    return values


def marian_config_to_hf(c: ModelConfig, base: dict[str, Any]) -> dict[str, Any]:
    return seq2seq_config_to_hf(c, base, "MarianMTModel")


def bart_config_to_hf(c: ModelConfig, base: dict[str, Any]) -> dict[str, Any]:
    return seq2seq_config_to_hf(c, base, "BartForConditionalGeneration")


def seq2seq_layer(kqv: str, hf: str, cross_attention: bool) -> list[Rule]:
    rules = [*attention(kqv + "self_attention", hf + "self_attn.q_proj", hf + "self_attn.k_proj",
                        hf + "self_attn.v_proj", hf + "self_attn.out_proj"),
             *affine(kqv + "self_attention_residual.norm", hf + "self_attn_layer_norm")]
    if cross_attention:
        rules += [*attention(kqv + "cross_attention", hf + "encoder_attn.q_proj", hf + "encoder_attn.k_proj",
                             hf + "encoder_attn.v_proj", hf + "encoder_attn.out_proj"),
                  *affine(kqv + "cross_attention_residual.norm", hf + "encoder_attn_layer_norm")]
    return rules + [*affine(kqv + "feed_forward.up", hf + "fc1"), *affine(kqv + "feed_forward.down", hf + "fc2"),
                    *affine(kqv + "feed_forward_residual.norm", hf + "final_layer_norm")]


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
        mapping.rules += [copy("encoder.embeddings.tokens.weight", "encoder.embed_tokens.weight"),
                          copy("decoder.embeddings.tokens.weight", "decoder.embed_tokens.weight")]
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
            mapping.computed[f"{side}.embed_positions.weight"] = lambda: SinusoidalPositions(config.d_model)(
                torch.arange(n_positions))
        else:
            positions = Rule((f"{side}.embeddings.positions.embedding.weight",), (f"{side}.embed_positions.weight",),
                             without_offset_rows, with_offset_rows, keep=True)
            mapping.rules += [positions, *affine(f"{side}.embeddings.norm", f"{side}.layernorm_embedding")]
        n_layers = config.encoder_layers if side == "encoder" else config.decoder_layers
        for i in range(n_layers):
            mapping.rules += seq2seq_layer(f"{side}.blocks.{i}.", f"{side}.layers.{i}.", side == "decoder")
    return mapping


ARCHITECTURES: dict[str, Architecture] = {a.hf_class: a for a in [
    Architecture("GPT2LMHeadModel", "gpt2", DecoderLM, gpt2_config, gpt2_config_to_hf, gpt2_mapping,
                 base_prefix="transformer.", heads=("lm_head.",),
                 ignored=(r"h\.\d+\.attn\.(masked_)?bias",)),  # causal-mask buffers of old checkpoints
    Architecture("BertModel", "bert", Encoder, bert_config, bert_config_to_hf, bert_mapping,
                 base_prefix="bert.", prefixed=False,
                 # index buffers, and the heads of a BertForPreTraining checkpoint (BertModel ignores them too)
                 ignored=(r"embeddings\.(position_ids|token_type_ids)", r"cls\..*"),
                 hf_options=lambda state: {"add_pooling_layer": "pooler.dense.weight" in state}),
    Architecture("BertForMaskedLM", "bert", MaskedLM, bert_config, bert_mlm_config_to_hf, bert_mlm_mapping,
                 base_prefix="bert.", heads=("cls.",),
                 ignored=(r"embeddings\.(position_ids|token_type_ids)", r"pooler\..*", r"cls\.seq_relationship\..*")),
    Architecture("MarianMTModel", "marian", EncoderDecoder, marian_config, marian_config_to_hf, seq2seq_mapping,
                 base_prefix="model.", heads=("lm_head.", "final_logits_bias")),
    Architecture("BartForConditionalGeneration", "bart", EncoderDecoder, bart_config, bart_config_to_hf,
                 seq2seq_mapping, base_prefix="model.", heads=("lm_head.", "final_logits_bias"),
                 ignored=(r"(encoder|decoder)\.version",)),
]}
