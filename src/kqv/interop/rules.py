"""The vocabulary of the weight mapping: `Rule`s that turn checkpoint tensors into kqv tensors and back, the
`Mapping` of one config, the `Architecture` entry of one Hugging Face class, and the small rules and checks every
architecture uses."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConversionError
from ..nn.config import ModelConfig

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
# The gated feed-forward networks of the Llama family: `hidden_act` names the gate's activation (W2 (act(W1 x) * W3 x)).
HF_GATED_ACTIVATIONS = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu"}  # geglu's GELU is the erf form
KQV_TO_HF_GATED = {"swiglu": "silu", "geglu": "gelu"}
# The name each kqv activation is exported under, unless the model came from a checkpoint that named it otherwise.
KQV_TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


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
    family: str = ""  # its name in messages and run records ("GPT-2", "Llama"); the class's by default
    renamed: tuple[tuple[str, str], ...] = ()  # (regex, replacement) of older checkpoints' names, applied on import
    exported: bool = True  # whether `to_hf` writes this class (a Mistral or Qwen2 is written as a Llama)

    @property
    def name(self) -> str:
        """The family's name ("GPT-NeoX"), as messages and a fine-tune's `[source]` kind say it."""
        return self.family or self.hf_class

    def kqv_model(self, config: ModelConfig) -> nn.Module:
        return self.kqv_class(config)

    def hf_name(self, name: str) -> str:
        """The full state-dict name of a checkpoint name (which is without the base-model prefix)."""
        return self.base_prefix + name if self.prefixed and not name.startswith(self.heads) else name


# The config translations: one table of names each architecture, read both ways


SIZES = ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_len")  # what ConfigNames.sizes name
# how BERT, GPT-NeoX and the Llama family name SIZES in their configs
HF_SIZES = (
    "vocab_size",
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "intermediate_size",
    "max_position_embeddings",
)


@dataclass(frozen=True)
class ConfigNames:
    """How a Hugging Face config of one architecture says what kqv's ModelConfig holds, read by the translations
    both ways: `sizes`, the Hugging Face fields of kqv's `SIZES` in that order; the fields of the norm's epsilon,
    the activation and the dropout rates; `fixed`, the kqv options the architecture always has (set on import,
    required on export); and whether its feed-forward network is `gated` (the Llama family: its activation is the
    gate's, SwiGLU's SiLU or GeGLU's GELU). A config without tie_word_embeddings ties them, as Hugging Face does."""

    sizes: tuple[str, ...]
    norm_eps: str
    activation: str
    dropouts: tuple[str, ...]
    fixed: dict[str, Any]
    gated: bool = False

    def activations(self) -> tuple[dict[str, str], dict[str, str]]:
        """(Hugging Face name -> kqv activation, kqv activation -> the name it is exported under)."""
        return (HF_GATED_ACTIVATIONS, KQV_TO_HF_GATED) if self.gated else (HF_ACTIVATIONS, KQV_TO_HF_ACTIVATION)

    def to_kqv(self, c: Any, **given: Any) -> ModelConfig:
        """The ModelConfig of the Hugging Face config `c` (dropout 0: inference); `given` fields override its."""
        sizes = {kqv: getattr(c, hf) for kqv, hf in zip(SIZES, self.sizes, strict=True)}
        return ModelConfig(
            **(sizes | given),
            dropout=0.0,
            norm_eps=float(getattr(c, self.norm_eps)),
            activation=(hf_gated_activation if self.gated else hf_activation)(
                getattr(c, self.activation), self.activation
            ),
            tie_embeddings=bool(getattr(c, "tie_word_embeddings", True)),
            **self.fixed,
        )

    def to_hf(self, c: ModelConfig, base: dict[str, Any], target: str) -> dict[str, Any]:
        """The config.json values of a `target` for kqv's config `c`; `base`, the original checkpoint's, if any."""
        read, written = self.activations()
        require_kqv(c, target, **self.fixed, activation=tuple(written))
        base_name = base.get(self.activation)  # the checkpoint's own name for it, kept where it means the same
        return {
            **dropouts(base, c, *self.dropouts),
            **{hf: getattr(c, kqv) for kqv, hf in zip(SIZES, self.sizes, strict=True)},
            self.norm_eps: c.norm_eps,
            self.activation: base_name if read.get(base_name) == c.activation else written[c.activation],
            "tie_word_embeddings": c.tie_embeddings,
        }


def converted(rule: Rule, originals: list[Tensor]) -> tuple[Tensor, ...]:
    """`rule.to_kqv` of the checkpoint tensors; a ConversionError when their shapes are not the config's (a split or
    a reshape that does not fit: a config.json that does not describe the weights saved beside it)."""
    try:
        return rule.to_kqv(*originals)
    except RuntimeError:
        shapes = ", ".join(f"{name} {tuple(t.shape)}" for name, t in zip(rule.hf, originals, strict=True))
        raise ConversionError(
            f"the checkpoint's weights do not fit its config: {shapes} cannot become kqv's {', '.join(rule.kqv)}; "
            f"correct config.json to describe the weights saved beside it"
        ) from None


def renamed(weights: dict[str, Tensor], renames: tuple[tuple[str, str], ...]) -> dict[str, Tensor]:
    """`weights` under today's names: each (regex, replacement) of `Architecture.renamed` applied to every name."""
    for pattern, replacement in renames:
        weights = {re.sub(pattern, replacement, name): tensor for name, tensor in weights.items()}
    return weights


def hf_activation(name: str, option: str) -> str:
    if name not in HF_ACTIVATIONS:
        raise ConversionError(f"{option}={name!r} is not an activation kqv has; supported: {sorted(HF_ACTIVATIONS)}")
    return HF_ACTIVATIONS[name]


def hf_gated_activation(name: str, option: str) -> str:
    if name not in HF_GATED_ACTIVATIONS:
        raise ConversionError(
            f"{option}={name!r} is not a gate activation kqv has; supported: {sorted(HF_GATED_ACTIVATIONS)}"
        )
    return HF_GATED_ACTIVATIONS[name]


def activation_to_hf(activation: str, base_name: str | None, target: str) -> str:
    """The Hugging Face name of a kqv activation: the original checkpoint's name if it means the same."""
    if base_name is not None and HF_ACTIVATIONS.get(base_name) == activation:
        return base_name
    if activation not in KQV_TO_HF_ACTIVATION:
        raise ConversionError(
            f"a kqv model with activation={activation!r} cannot become a {target}, whose feed-forward "
            f"network is not gated; it needs one of {sorted(KQV_TO_HF_ACTIVATION)}"
        )
    return KQV_TO_HF_ACTIVATION[activation]


def require(hf_config: Any, architecture_name: str, **expected: Any) -> None:
    """ValueError naming every option whose value kqv cannot represent (a missing option counts as expected)."""
    wrong = {k: getattr(hf_config, k) for k, v in expected.items() if getattr(hf_config, k, v) != v}
    if wrong:
        need = ", ".join(f"{k}={expected[k]!r}" for k in wrong)
        raise ConversionError(f"kqv cannot represent {architecture_name} with {wrong}; it needs {need}")


def require_kqv(config: ModelConfig, target: str, **expected: Any) -> None:
    """ValueError naming every kqv option that the Hugging Face class `target` cannot represent, and the `--set`
    overrides that train a model it can (a fine-tune's model is its source's: those go to the source's training).
    An expected value may be a tuple of the values it allows (the first is the remedy's). The error's `misses` is
    how many options are wrong, by which `kqv.interop.convert.export_architecture` finds the nearest class."""
    wrong = {k: v for k, v in expected.items() if not allows(v, getattr(config, k))}
    if wrong:
        have = ", ".join(f"{k}={getattr(config, k)!r}" for k in wrong)
        need = ", ".join(f"{k}={needed_text(v)}" for k, v in wrong.items())
        remedy = " ".join(f"--set model.{k}={override_text(first(v))}" for k, v in wrong.items())
        error = ConversionError(
            f"a kqv model with {have} cannot become a {target}, which needs {need}: train one with {remedy} "
            "(a fine-tune takes its model from its --init run)"
        )
        error.misses = len(wrong)
        raise error


def allows(expected: Any, value: Any) -> bool:
    """Whether `value` is the expected value, or one of them when `expected` is a tuple of alternatives."""
    return value in expected if isinstance(expected, tuple) else value == expected


def first(expected: Any) -> Any:
    """The expected value, or the first of a tuple of alternatives: what a remedy names."""
    return expected[0] if isinstance(expected, tuple) else expected


def needed_text(expected: Any) -> str:
    """`'learned'`, or `'swiglu' or 'geglu'` for a tuple of alternatives."""
    if not isinstance(expected, tuple):
        return repr(expected)
    if len(expected) == 1:
        return repr(expected[0])
    return ", ".join(map(repr, expected[:-1])) + " or " + repr(expected[-1])


def override_text(value: Any) -> str:
    """How `--set` writes `value` on a command line: a string bare (`learned`), a flag `true`/`false`."""
    return str(value).lower() if isinstance(value, bool) else str(value)


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
    return [
        *affine(f"{kqv}.to_queries", queries),
        *(
            Rule((f"{kqv}.to_keys_values.{p}",), (f"{keys}.{p}", f"{values}.{p}"), stack, unstack)
            for p in ("weight", "bias")
        ),
        *affine(f"{kqv}.to_output", output),
    ]
