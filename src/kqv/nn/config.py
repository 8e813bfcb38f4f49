"""One validated dataclass that every kqv model is built from.

The config is the model's contract: every choice the lecture offers (position representation, norm placement,
activation) is a typed field, checked when the config is made, so a typo fails here and not deep inside torch.
"""

from __future__ import annotations

import functools
import math
import tomllib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import tomli_w

from ..errors import ConfigError
from ..validation import Config, build, check_positive

Position = Literal["sinusoidal", "learned", "relative", "rope", "alibi", "none"]
Norm = Literal["layernorm", "rmsnorm"]
Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu"]
AttentionKind = Literal["full", "linformer", "bigbird", "local", "memory_compressed"]
Blockwise = Literal["auto", "always", "never"]
LinformerSharing = Literal["none", "headwise", "key_value", "layerwise"]
FeedForwardKind = Literal["dense", "switch", "moe"]


@dataclass
class RelativeConfig(Config):
    """Shaw et al. 2018's relative positions (`position = "relative"`): a learned embedding per clipped distance."""

    section: ClassVar[str] = "model.relative"
    max_distance: int = 16  # clip relative distances to [-max_distance, max_distance]
    values: bool = True  # add relative embeddings on the value side too

    def check(self) -> None:
        check_positive(self.qualified("max_distance"), self.max_distance)


@dataclass
class LinformerConfig(Config):
    """Linformer (Wang et al. 2020, `attention = "linformer"`): keys and values projected from max_len to k rows."""

    section: ClassVar[str] = "model.linformer"
    k: int = 256  # the projected length (at most max_len)
    sharing: LinformerSharing = "headwise"  # which projections the heads, keys/values, layers share

    def check(self) -> None:
        check_positive(self.qualified("k"), self.k)


@dataclass
class BigBirdConfig(Config):
    """BigBird (Zaheer et al. 2020, `attention = "bigbird"`): blocks attend to a window, global and random blocks."""

    section: ClassVar[str] = "model.bigbird"
    block: int = 64  # tokens per block
    window: int = 1  # neighbouring blocks on each side
    global_blocks: int = 1  # leading blocks that attend to and are attended by everything
    random_blocks: int = 2  # random key blocks per query block
    seed: int = 0  # of the random blocks

    def check(self) -> None:
        check_positive(self.qualified("block"), self.block)
        for name in ("window", "global_blocks", "random_blocks"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{self.qualified(name)} must be >= 0, got {getattr(self, name)}")


@dataclass
class LocalConfig(Config):
    """Local attention of Liu et al. 2018's Transformer-DMCA (`attention = "local"`): attention within blocks."""

    section: ClassVar[str] = "model.local"
    block: int = 64  # tokens per block (must divide max_len)

    def check(self) -> None:
        check_positive(self.qualified("block"), self.block)


@dataclass
class CompressionConfig(Config):
    """Memory-compressed attention of Liu et al. 2018 (`attention = "memory_compressed"`): keys and values
    shortened by a strided convolution."""

    section: ClassVar[str] = "model.memory_compressed"
    compression: int = 3  # kernel and stride of the key/value compression: how many keys become one

    def check(self) -> None:
        if self.compression < 2:
            raise ConfigError(
                f"{self.qualified('compression')} must be at least 2 (3 in Liu et al. 2018): it is "
                f"how many keys become one, got {self.compression}"
            )


@dataclass
class ExpertsConfig(Config):
    """A mixture of experts in place of the feed-forward network (`ffn = "switch"`: Fedus et al. 2021;
    `ffn = "moe"`: Shazeer et al. 2017; `kqv.nn.experts`)."""

    section: ClassVar[str] = "model.experts"
    count: int = 8  # experts per mixture
    top_k: int | None = None  # experts per token: None = 1 for "switch", 2 for "moe"
    capacity_factor: float = 1.25  # slots per expert in training, as a multiple of an even share of the batch
    aux_loss_coefficient: float = 0.01  # Switch's alpha: weight of the load-balancing loss
    every: int = 1  # experts in every k-th block (1: all blocks; 2: every other block, as in Switch)

    def check(self) -> None:
        for name in ("count", "every", *(("top_k",) if self.top_k is not None else ())):
            check_positive(self.qualified(name), getattr(self, name))
        if not self.capacity_factor > 0:
            raise ConfigError(f"{self.qualified('capacity_factor')} must be positive, got {self.capacity_factor}")
        if self.aux_loss_coefficient < 0:
            raise ConfigError(f"{self.qualified('aux_loss_coefficient')} must be >= 0, got {self.aux_loss_coefficient}")


# The flat option names of kqv before the sub-tables, and where each lives now: run.toml files and user configs
# written with them load unchanged (`ModelConfig.from_dict`).
OLD_NAMES = {
    "max_relative_distance": ("relative", "max_distance"),
    "relative_values": ("relative", "values"),
    "linformer_k": ("linformer", "k"),
    "linformer_sharing": ("linformer", "sharing"),
    "bigbird_block": ("bigbird", "block"),
    "bigbird_window": ("bigbird", "window"),
    "bigbird_global": ("bigbird", "global_blocks"),
    "bigbird_random": ("bigbird", "random_blocks"),
    "bigbird_seed": ("bigbird", "seed"),
    "local_block": ("local", "block"),
    "compression": ("memory_compressed", "compression"),
    "n_experts": ("experts", "count"),
    "top_k": ("experts", "top_k"),
    "capacity_factor": ("experts", "capacity_factor"),
    "aux_loss_coefficient": ("experts", "aux_loss_coefficient"),
    "moe_every": ("experts", "every"),
}


def nest_old_names(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with every old flat option (`linformer_k`) moved into its sub-table (`linformer.k`)."""
    values = dict(values)
    for old in [name for name in values if name in OLD_NAMES]:
        table, name = OLD_NAMES[old]
        given = values.get(table, {})
        given = given.to_dict() if isinstance(given, Config) else dict(given) if isinstance(given, dict) else given
        if not isinstance(given, dict):
            continue  # a malformed sub-table: the validator reports it
        if name in given:
            raise ConfigError(
                f"model option {old} is the old name of {table}.{name}, and both are given: keep "
                f"{table}.{name} ([model.{table}] {name} = ...) and remove {old}"
            )
        values[table] = {**given, name: values.pop(old)}
    return values


def old_keywords(options: dict[str, Any], call: str) -> dict[str, Any]:
    """Keyword arguments of `call` (e.g. "ModelConfig") with old flat names (`n_experts=4`) read into their
    sub-tables as `nest_old_names` reads a [model] table's (`experts={"count": 4}`), and a DeprecationWarning that
    names the new spelling: Python code written for the release before the sub-tables keeps working."""
    old = [name for name in options if name in OLD_NAMES]
    if old:
        spelled = ", ".join(f"{name}= is now {OLD_NAMES[name][0]}={{{OLD_NAMES[name][1]!r}: ...}}" for name in old)
        warnings.warn(
            f"{call}: the flat option names of the previous release are deprecated ({spelled}); they are "
            f"translated for now",
            DeprecationWarning,
            stacklevel=3,
        )
    return nest_old_names(options)


@dataclass
class ModelConfig(Config):
    """Sizes and choices of a Transformer. Used by `Encoder`, `DecoderLM` and `EncoderDecoder` alike.

    `d_ff` is the hidden width of the feed-forward network; gated activations (swiglu, geglu) use two
    input projections of that width, so choose about 2/3 of the ungated width to keep the parameter count.
    `norm_first=True` is pre-LN (GPT-2 and later); `False` is post-LN as in Vaswani et al. 2017 and BERT.
    `n_kv_heads` below `n_heads` gives keys and values fewer heads than queries, each shared by a group of
    n_heads / n_kv_heads query heads: grouped-query attention (Ainslie et al. 2023), multi-query attention at 1
    (Shazeer 2019). The KV cache shrinks by n_heads / n_kv_heads; every attention layer and kind takes it.

    `attention` picks the self-attention core: "full" is exact softmax attention over every key; "linformer"
    (Wang et al. 2020) and "bigbird" (Zaheer et al. 2020) are the cheaper approximations of docs/long-inputs.md;
    "local" (blocks of `local.block` tokens) and "memory_compressed" (keys and values shortened
    `memory_compressed.compression`-fold)
    are the two layers of Liu et al. 2018's Transformer-DMCA (`kqv.nn.dmca`). `layer_pattern`, a comma-separated
    list of attention kinds, overrides `attention` per layer, cycling: "local,memory_compressed" is DMCA's.
    Cross-attention is always full. `blockwise` decides when full attention runs through `kqv.nn.blockwise`'s exact
    O(n)-memory path: "auto" when a position bias or padding would otherwise build a large n x n matrix.

    `ffn` picks the feed-forward network: "dense" (one per block), or a mixture of `experts.count` experts in every
    `experts.every`-th block (`kqv.nn.experts`): "switch" sends each token to one expert (Fedus et al. 2021), "moe"
    to `experts.top_k` (default 2; Shazeer et al. 2017). In training an expert takes at most
    `experts.capacity_factor` times its even share of a batch (the rest pass through the residual);
    `experts.aux_loss_coefficient` weighs the load-balancing loss.

    The options of one kind live in its sub-config (a sub-table in TOML: `[model.linformer] k = 128`): `relative`,
    `linformer`, `bigbird`, `local`, `memory_compressed` and `experts`; `to_dict` writes those of the kinds in use.
    `vocab_size` None means "decided by the tokenizer": a job sets it, and a model cannot be built without it.
    `vocab_multiple` pads the token table and the output layer to a multiple of it, as nanoGPT pads GPT-2's 50,257
    tokens to 50,304 = 786 x 64 so that the output layer's products run in whole tiles on a GPU; the padded ids are
    never read nor scored (`kqv.nn.vocabulary`), and exported weights keep the real vocabulary.
    """

    vocab_size: int | None = None
    d_model: int = 256
    n_heads: int = 4
    n_kv_heads: int | None = None  # key/value heads, each shared by n_heads / n_kv_heads query heads (None: n_heads)
    n_layers: int = 4
    d_ff: int = 1024
    max_len: int = 512
    dropout: float = 0.1
    position: Position = "sinusoidal"
    rope_base: float = 10000.0  # RoPE's base θ (Su et al. 2021: 10,000; Llama 3: 500,000; Qwen2: 1,000,000)
    norm: Norm = "layernorm"
    norm_first: bool = True
    norm_eps: float = 1e-5
    activation: Activation = "gelu"
    bias: bool = True
    tie_embeddings: bool = True
    vocab_multiple: int = 1  # pad the token table and the output layer to a multiple of this (1: no padding)
    output_bias: bool = False  # a bias on the output projection to the vocabulary (Marian and BART have one)
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model), as Vaswani et al. do
    embed_norm: bool = False  # a norm right after the embeddings, as BERT does
    relative: RelativeConfig = field(default_factory=RelativeConfig)
    n_encoder_layers: int | None = None  # encoder-decoder only; defaults to n_layers
    n_decoder_layers: int | None = None  # encoder-decoder only; defaults to n_layers
    tgt_vocab_size: int | None = None  # encoder-decoder only; None shares the source vocabulary
    attention: AttentionKind = "full"
    blockwise: Blockwise = "auto"  # exact O(n)-memory attention for attention="full" (no attention dropout)
    linformer: LinformerConfig = field(default_factory=LinformerConfig)
    bigbird: BigBirdConfig = field(default_factory=BigBirdConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    memory_compressed: CompressionConfig = field(default_factory=CompressionConfig)
    layer_pattern: str | None = None  # e.g. "local,memory_compressed": attention kinds cycled over the layers
    ffn: FeedForwardKind = "dense"
    experts: ExpertsConfig = field(default_factory=ExpertsConfig)

    def check(self) -> None:
        """Raise ConfigError naming the first field that is out of range or inconsistent with another."""
        for name in ("d_model", "n_heads", "n_layers", "d_ff", "max_len"):
            check_positive(name, getattr(self, name))
        for name in ("vocab_size", "n_encoder_layers", "n_decoder_layers", "tgt_vocab_size"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        if self.vocab_multiple < 1:
            raise ConfigError(
                f"vocab_multiple must be at least 1 (1: no padding; 64 pads GPT-2's 50,257 tokens to 50,304), "
                f"got {self.vocab_multiple}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.norm_eps <= 0:
            raise ConfigError(f"norm_eps must be positive, got {self.norm_eps}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}): each head gets "
                f"d_model / n_heads dimensions; try n_heads in {_divisors(self.d_model)}"
            )
        self._check_kv_heads()
        if not (self.rope_base > 1 and math.isfinite(self.rope_base)):
            raise ConfigError(
                f"rope_base (RoPE's θ: position p turns pair i by p / rope_base^(2i/head_dim)) must be a finite number "
                f"above 1, got {self.rope_base}; 10000 is RoPE's own"
            )
        if self.position == "rope" and self.head_dim % 2:
            raise ConfigError(
                f"position='rope' rotates pairs of dimensions, so head_dim must be even, got {self.head_dim}"
            )
        if self.position == "sinusoidal" and self.d_model % 2:
            raise ConfigError(
                f"position='sinusoidal' pairs sines and cosines, so d_model must be even, got {self.d_model}"
            )
        self._check_attention()
        self._check_experts()

    def _check_kv_heads(self) -> None:
        if self.n_kv_heads is not None and (self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads):
            raise ConfigError(
                f"n_kv_heads ({self.n_kv_heads}) must be a positive divisor of n_heads ({self.n_heads}): each "
                f"key/value head serves n_heads / n_kv_heads query heads; choose one of {_divisors(self.n_heads)} "
                f"(1: multi-query attention, n_heads or unset: multi-head attention)"
            )

    def _check_experts(self) -> None:
        experts = self.experts
        if self.ffn == "dense":
            return
        if self.ffn == "switch" and experts.top_k not in (None, 1):
            raise ConfigError(
                f"ffn='switch' sends each token to one expert, so experts.top_k must be 1 (or unset), "
                f"got {experts.top_k}; use ffn='moe' for top_k={experts.top_k}"
            )
        if self.ffn == "moe" and experts.top_k == 1:
            raise ConfigError(
                "ffn='moe' with experts.top_k=1 is Switch routing: use ffn='switch' (its gate is the "
                "router's probability, so the router learns), or top_k >= 2"
            )
        if self.experts_per_token > experts.count:
            raise ConfigError(
                f"experts.top_k ({self.experts_per_token}) cannot exceed experts.count "
                f"({experts.count}): each token goes to top_k different experts"
            )
        layers = max(self.n_layers, self.encoder_layers, self.decoder_layers)
        if experts.every > layers:
            raise ConfigError(
                f"experts.every ({experts.every}) exceeds the number of layers ({layers}), so no block "
                f"would get experts; use a value in 1..{layers}"
            )

    def _check_attention(self) -> None:
        kinds = set(self.layer_attention_kinds())
        if "local" in kinds and self.max_len % self.local.block:
            fits = _divisors(self.max_len)
            raise ConfigError(
                f"local.block ({self.local.block}) must divide max_len ({self.max_len}) so that a "
                f"full-length input is whole blocks; choose one of {fits} or change max_len"
            )
        for kind in sorted(kinds - {"full"}):
            self._check_sparse_attention(kind)

    def layer_attention_kinds(self) -> list[str]:
        """The attention kind of each distinct slot of `layer_pattern` (or [attention])."""
        if self.layer_pattern is None:
            return [self.attention]
        kinds = [kind.strip() for kind in self.layer_pattern.split(",")]
        valid = list(AttentionKind.__args__)
        unknown = [kind for kind in kinds if kind not in valid]
        if unknown or not kinds:
            raise ConfigError(
                f"layer_pattern {self.layer_pattern!r} has unknown attention kind(s) {unknown}: give "
                f"a comma-separated list of {valid}, e.g. 'local,memory_compressed'"
            )
        return kinds

    def attention_of(self, layer: int) -> str:
        """The self-attention kind of block `layer` (0-based): `layer_pattern` cycled, or `attention`."""
        kinds = self.layer_attention_kinds()
        return kinds[layer % len(kinds)]

    def _check_sparse_attention(self, kind: str) -> None:
        if self.position in ("relative", "alibi"):
            raise ConfigError(
                f"attention={kind!r} cannot take position={self.position!r}: it adds a bias to every "
                f"(query, key) pair, and {kind} never scores all pairs. Use position='rope', "
                f"'sinusoidal', 'learned' or 'none', or attention='full', whose blockwise path handles "
                f"relative and alibi at any length"
            )
        if kind == "linformer" and self.linformer.k > self.max_len:
            raise ConfigError(
                f"linformer.k ({self.linformer.k}) must be at most max_len ({self.max_len}): "
                f"Linformer projects max_len positions down to linformer.k"
            )

    @property
    def head_dim(self) -> int:
        """d_model / n_heads: each head's share of the model width."""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """n_kv_heads, or n_heads when it is not set: the heads of keys and values (and of the KV cache)."""
        return self.n_kv_heads or self.n_heads

    @property
    def experts_per_token(self) -> int:
        """experts.top_k, or its default: 1 for Switch, 2 for the top-2 mixture."""
        top_k = self.experts.top_k
        return top_k if top_k is not None else (1 if self.ffn == "switch" else 2)

    @property
    def encoder_layers(self) -> int:
        """n_encoder_layers, or n_layers when it is not set."""
        return self.n_encoder_layers or self.n_layers

    @property
    def decoder_layers(self) -> int:
        """n_decoder_layers, or n_layers when it is not set."""
        return self.n_decoder_layers or self.n_layers

    def padded(self, vocab_size: int) -> int:
        """`vocab_size` rounded up to a multiple of `vocab_multiple`: the rows of the token table and the output
        layer of a vocabulary of that many tokens."""
        return -(-vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def target_vocab_size(self) -> int:
        """tgt_vocab_size, or vocab_size when source and target share one vocabulary."""
        return self.tgt_vocab_size or self.vocab_size

    def uses(self, sub_config: str) -> bool:
        """Whether the sub-config of that name matters to this model (its kind is in use)."""
        if sub_config == "relative":
            return self.position == "relative"
        if sub_config == "experts":
            return self.ffn != "dense"
        return sub_config in self.layer_attention_kinds()

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain values, with the sub-tables of the kinds in use (and of others only where they
        differ from their defaults, so that `from_dict(to_dict())` gives this config back exactly)."""
        values = super().to_dict()
        unused = [
            name for name in SUB_CONFIGS if not self.uses(name) and getattr(self, name) == type(getattr(self, name))()
        ]
        return {k: v for k, v in values.items() if k not in unused}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        """A checked config from a [model] table; old flat options (`linformer_k`) are read into their sub-tables."""
        return build(cls, nest_old_names(values))

    def to_toml(self) -> str:
        """TOML text of the config; fields left at None are omitted (TOML has no null)."""
        return tomli_w.dumps(_without_none(self.to_dict()))

    @classmethod
    def from_toml(cls, text_or_path: str | Path) -> ModelConfig:
        """A checked config from TOML text, or from the file at a Path."""
        text = Path(text_or_path).read_text() if isinstance(text_or_path, Path) else text_or_path
        return cls.from_dict(tomllib.loads(text))

    def replace(self, **changes: Any) -> ModelConfig:
        """A checked copy with some fields changed; a sub-config's changes are a table of its options
        (`replace(linformer={"k": 64})` keeps the other Linformer options)."""
        values = Config.to_dict(self)
        for name, value in old_keywords(changes, "ModelConfig.replace").items():
            merge = name in SUB_CONFIGS and isinstance(value, dict)
            values[name] = {**values[name], **value} if merge else value
        return self.from_dict(values)


def require_vocabulary(vocab_size: int | None) -> int:
    """vocab_size, which a model needs: ConfigError while it is None (left to a tokenizer that has not decided)."""
    if vocab_size is None:
        raise ConfigError(
            "the model config's vocab_size is None (to be decided by the tokenizer), and a model "
            "cannot be built without it: set it first, e.g. config.replace(vocab_size=tokenizer."
            "vocab_size)"
        )
    return vocab_size


SUB_CONFIGS = ("relative", "linformer", "bigbird", "local", "memory_compressed", "experts")


def _taking_old_names(init: Any) -> Any:
    """ModelConfig's dataclass-made `__init__`, also taking the old flat keyword names (`old_keywords`)."""

    @functools.wraps(init)
    def __init__(self: ModelConfig, *args: Any, **options: Any) -> None:
        init(self, *args, **old_keywords(options, "ModelConfig"))

    return __init__


ModelConfig.__init__ = _taking_old_names(ModelConfig.__init__)  # the dataclass decorator writes __init__ itself


def _without_none(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _without_none(v) if isinstance(v, dict) else v for k, v in values.items() if v is not None}


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, min(n, 64) + 1) if n % k == 0]
