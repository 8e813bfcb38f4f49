"""One validated dataclass that every kqv model is built from.

The config is the model's contract: every choice the lecture offers (position representation, norm placement,
activation) is a typed field, checked when the config is made, so a typo fails here and not deep inside torch.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tomli_w

from ..errors import ConfigError
from ..validation import Config, check_positive

Position = Literal["sinusoidal", "learned", "relative", "rope", "alibi", "none"]
Norm = Literal["layernorm", "rmsnorm"]
Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu"]
AttentionKind = Literal["full", "linformer", "bigbird", "local", "memory_compressed"]
Blockwise = Literal["auto", "always", "never"]
LinformerSharing = Literal["none", "headwise", "key_value", "layerwise"]
FeedForwardKind = Literal["dense", "switch", "moe"]


@dataclass
class ModelConfig(Config):
    """Sizes and choices of a Transformer. Used by `Encoder`, `DecoderLM` and `EncoderDecoder` alike.

    `d_ff` is the hidden width of the feed-forward network; gated activations (swiglu, geglu) use two
    input projections of that width, so choose about 2/3 of the ungated width to keep the parameter count.
    `norm_first=True` is pre-LN (GPT-2 and later); `False` is post-LN as in Vaswani et al. 2017 and BERT.

    `attention` picks the self-attention core: "full" is exact softmax attention over every key; "linformer"
    (Wang et al. 2020) and "bigbird" (Zaheer et al. 2020) are the cheaper approximations of docs/long-inputs.md;
    "local" (blocks of `local_block` tokens) and "memory_compressed" (keys and values shortened `compression`-fold)
    are the two layers of Liu et al. 2018's Transformer-DMCA (`kqv.nn.dmca`). `layer_pattern`, a comma-separated
    list of attention kinds, overrides `attention` per layer, cycling: "local,memory_compressed" is DMCA's.
    Cross-attention is always full. `blockwise` decides when full attention runs through `kqv.nn.blockwise`'s exact
    O(n)-memory path: "auto" when a position bias or padding would otherwise build a large n x n matrix.

    `ffn` picks the feed-forward network: "dense" (one per block), or a mixture of `n_experts` experts in every
    `moe_every`-th block (`kqv.nn.experts`): "switch" sends each token to one expert (Fedus et al. 2021), "moe" to
    `top_k` (default 2; Shazeer et al. 2017). In training an expert takes at most `capacity_factor` times its even
    share of a batch (the rest pass through the residual); `aux_loss_coefficient` weighs the load-balancing loss.
    """

    vocab_size: int
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 1024
    max_len: int = 512
    dropout: float = 0.1
    position: Position = "sinusoidal"
    norm: Norm = "layernorm"
    norm_first: bool = True
    norm_eps: float = 1e-5
    activation: Activation = "gelu"
    bias: bool = True
    tie_embeddings: bool = True
    output_bias: bool = False  # a bias on the output projection to the vocabulary (Marian and BART have one)
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model), as Vaswani et al. do
    embed_norm: bool = False  # a norm right after the embeddings, as BERT does
    max_relative_distance: int = 16  # Shaw et al. 2018: clip relative distances to [-k, k]
    relative_values: bool = True  # Shaw et al. 2018: add relative embeddings on the value side too
    n_encoder_layers: int | None = None  # encoder-decoder only; defaults to n_layers
    n_decoder_layers: int | None = None  # encoder-decoder only; defaults to n_layers
    tgt_vocab_size: int | None = None  # encoder-decoder only; None shares the source vocabulary
    attention: AttentionKind = "full"
    blockwise: Blockwise = "auto"  # exact O(n)-memory attention for attention="full" (no attention dropout)
    linformer_k: int = 256  # Linformer's projected length (at most max_len)
    linformer_sharing: LinformerSharing = "headwise"  # which projections the heads, keys/values, layers share
    bigbird_block: int = 64  # tokens per block
    bigbird_window: int = 1  # neighbouring blocks on each side
    bigbird_global: int = 1  # leading blocks that attend to and are attended by everything
    bigbird_random: int = 2  # random key blocks per query block
    bigbird_seed: int = 0
    local_block: int = 64  # tokens per block of local attention (must divide max_len)
    compression: int = 3  # memory-compressed attention: kernel and stride of the key/value compression
    layer_pattern: str | None = None  # e.g. "local,memory_compressed": attention kinds cycled over the layers
    ffn: FeedForwardKind = "dense"
    n_experts: int = 8
    top_k: int | None = None  # experts per token: None = 1 for "switch", 2 for "moe"
    capacity_factor: float = 1.25  # slots per expert in training, as a multiple of an even share of the batch
    aux_loss_coefficient: float = 0.01  # Switch's alpha: weight of the load-balancing loss
    moe_every: int = 1  # experts in every k-th block (1: all blocks; 2: every other block, as in Switch)

    def check(self) -> None:
        """Raise ConfigError naming the first field that is out of range or inconsistent with another."""
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_len", "max_relative_distance",
                     "linformer_k", "bigbird_block"):
            check_positive(name, getattr(self, name))
        for name in ("n_encoder_layers", "n_decoder_layers", "tgt_vocab_size"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.norm_eps <= 0:
            raise ConfigError(f"norm_eps must be positive, got {self.norm_eps}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}): each head gets "
                f"d_model / n_heads dimensions; try n_heads in {_divisors(self.d_model)}"
            )
        if self.position == "rope" and self.head_dim % 2:
            raise ConfigError(f"position='rope' rotates pairs of dimensions, so head_dim must be even, got {self.head_dim}")
        if self.position == "sinusoidal" and self.d_model % 2:
            raise ConfigError(f"position='sinusoidal' pairs sines and cosines, so d_model must be even, got {self.d_model}")
        self._check_attention()
        self._check_experts()

    def _check_experts(self) -> None:
        for name in ("n_experts", "moe_every"):
            check_positive(name, getattr(self, name))
        if self.top_k is not None:
            check_positive("top_k", self.top_k)
        if not self.capacity_factor > 0:
            raise ConfigError(f"capacity_factor must be positive, got {self.capacity_factor}")
        if self.aux_loss_coefficient < 0:
            raise ConfigError(f"aux_loss_coefficient must be >= 0, got {self.aux_loss_coefficient}")
        if self.ffn == "dense":
            return
        if self.ffn == "switch" and self.top_k not in (None, 1):
            raise ConfigError(f"ffn='switch' sends each token to one expert, so top_k must be 1 (or unset), got "
                              f"{self.top_k}; use ffn='moe' for top_k={self.top_k}")
        if self.ffn == "moe" and self.top_k == 1:
            raise ConfigError("ffn='moe' with top_k=1 is Switch routing: use ffn='switch' (its gate is the router's "
                              "probability, so the router learns), or top_k >= 2")
        if self.experts_per_token > self.n_experts:
            raise ConfigError(f"top_k ({self.experts_per_token}) cannot exceed n_experts ({self.n_experts}): each "
                              f"token goes to top_k different experts")
        layers = max(self.n_layers, self.encoder_layers, self.decoder_layers)
        if self.moe_every > layers:
            raise ConfigError(f"moe_every ({self.moe_every}) exceeds the number of layers ({layers}), so no block "
                              f"would get experts; use a value in 1..{layers}")

    def _check_attention(self) -> None:
        for name in ("bigbird_window", "bigbird_global", "bigbird_random"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        check_positive("local_block", self.local_block)
        if self.compression < 2:
            raise ConfigError(f"compression must be at least 2 (3 in Liu et al. 2018): it is how many keys become "
                              f"one, got {self.compression}")
        kinds = set(self.layer_attention_kinds())
        if "local" in kinds and self.max_len % self.local_block:
            fits = _divisors(self.max_len)
            raise ConfigError(f"local_block ({self.local_block}) must divide max_len ({self.max_len}) so that a "
                              f"full-length input is whole blocks; choose one of {fits} or change max_len")
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
            raise ConfigError(f"layer_pattern {self.layer_pattern!r} has unknown attention kind(s) {unknown}: give "
                              f"a comma-separated list of {valid}, e.g. 'local,memory_compressed'")
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
                f"relative and alibi at any length")
        if kind == "linformer" and self.linformer_k > self.max_len:
            raise ConfigError(f"linformer_k ({self.linformer_k}) must be at most max_len ({self.max_len}): "
                              f"Linformer projects max_len positions down to linformer_k")

    @property
    def head_dim(self) -> int:
        """d_model / n_heads: each head's share of the model width."""
        return self.d_model // self.n_heads

    @property
    def experts_per_token(self) -> int:
        """top_k, or its default: 1 for Switch, 2 for the top-2 mixture."""
        return self.top_k if self.top_k is not None else (1 if self.ffn == "switch" else 2)

    @property
    def encoder_layers(self) -> int:
        """n_encoder_layers, or n_layers when it is not set."""
        return self.n_encoder_layers or self.n_layers

    @property
    def decoder_layers(self) -> int:
        """n_decoder_layers, or n_layers when it is not set."""
        return self.n_decoder_layers or self.n_layers

    @property
    def target_vocab_size(self) -> int:
        """tgt_vocab_size, or vocab_size when source and target share one vocabulary."""
        return self.tgt_vocab_size or self.vocab_size

    def to_toml(self) -> str:
        """TOML text of the config; fields left at None are omitted (TOML has no null)."""
        return tomli_w.dumps({k: v for k, v in self.to_dict().items() if v is not None})

    @classmethod
    def from_toml(cls, text_or_path: str | Path) -> ModelConfig:
        """A checked config from TOML text, or from the file at a Path."""
        text = Path(text_or_path).read_text() if isinstance(text_or_path, Path) else text_or_path
        return cls.from_dict(tomllib.loads(text))

    def replace(self, **changes: Any) -> ModelConfig:
        """A checked copy with some fields changed."""
        return self.from_dict({**self.to_dict(), **changes})


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, min(n, 64) + 1) if n % k == 0]
