"""The pieces around attention: norms, the position-wise feed-forward network, residual connections, and the
encoder and decoder blocks built from them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from .attention import KVCache, MultiHeadAttention
from .config import ModelConfig
from .cores import padding_of
from .dropout import Dropout
from .experts import MixtureOfExperts


def make_norm(config: ModelConfig) -> nn.Module:
    """torch's LayerNorm, or RMSNorm (Zhang & Sennrich 2019): LayerNorm without centring or bias."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=config.norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias)


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "swiglu": F.silu,
    "geglu": F.gelu,
}


class FeedForward(nn.Module):
    """The same two-layer network applied at every position: W2 act(W1 x), or W2 (act(W1 x) * W3 x) when gated.

    Gated variants (SwiGLU, GeGLU; Shazeer 2020) compute the gate and the value with one fused projection of
    width 2 * d_ff, so W1 has shape (2 * d_ff, d_model) and W2 (d_model, d_ff).
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gated = config.activation in ("swiglu", "geglu")
        self.activation = ACTIVATIONS[config.activation]
        self.up = nn.Linear(config.d_model, config.d_ff * (2 if self.gated else 1), bias=config.bias)
        self.down = nn.Linear(config.d_ff, config.d_model, bias=config.bias)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.up(x)  # (batch, time, d_ff or 2 * d_ff)
        if self.gated:
            gate, value = hidden.chunk(2, dim=-1)
            return self.down(self.activation(gate) * value)
        return self.down(self.activation(hidden))


def make_feed_forward(config: ModelConfig, layer: int) -> nn.Module:
    """The feed-forward network of block `layer` (0-based): dense, or a mixture of `FeedForward` experts
    (`kqv.nn.experts`) in every `experts.every`-th block when `ffn` is "switch" or "moe" (Switch and GShard put one in
    every other block)."""
    if config.ffn != "dense" and (layer + 1) % config.experts.every == 0:
        return MixtureOfExperts(config, lambda: FeedForward(config))
    return FeedForward(config)


def run_feed_forward(module: nn.Module, x: Tensor, mask: Tensor | None) -> Tensor:
    """A block's feed-forward network on x (batch, time, d_model); only a mixture of experts needs to know which
    tokens are padding (they take no expert capacity), read from the attention mask when it is a padding mask."""
    if not isinstance(module, MixtureOfExperts):
        return module(x)
    padding = padding_of(mask, x.shape[0])  # (batch, cached + time) or None
    return module(x, None if padding is None else padding[:, -x.shape[1] :])


class Residual(nn.Module):
    """x + sublayer(x), with the norm before the sublayer (pre-LN) or after the sum (post-LN).

    `forward(x, sublayer)` wraps a sublayer that returns a tensor. Attention also returns its weights, so the
    blocks call the two halves around it: `sublayer_input(x)`, then `add(x, output)`.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.norm = make_norm(config)
        self.norm_first = config.norm_first
        self.dropout = Dropout(config.dropout)

    def sublayer_input(self, x: Tensor) -> Tensor:
        """What the sublayer reads: the normed stream (pre-LN) or the stream itself (post-LN)."""
        return self.norm(x) if self.norm_first else x

    def add(self, x: Tensor, output: Tensor) -> Tensor:
        """The stream after the sublayer: x + dropout(output), normed after the sum for post-LN."""
        x = x + self.dropout(output)
        return x if self.norm_first else self.norm(x)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return self.add(x, sublayer(self.sublayer_input(x)))


@dataclass(frozen=True)
class Sublayer:
    """One step of a block's forward, as the block declares it: the sub-layer `module` (an attribute of the block)
    computing `kind` inside the `Residual` `residual` (its norm placement and dropout). Code that computes a block
    without calling its forward (the lean decoding step, `kqv.nn.decoding`) checks the declaration first."""

    kind: str  # "causal self-attention", "bidirectional self-attention", "cross-attention" or "feed-forward"
    module: str
    residual: str


class EncoderBlock(nn.Module):
    """Bidirectional self-attention, then the feed-forward network, each inside a residual connection."""

    SUBLAYERS: ClassVar[tuple[Sublayer, ...]] = (
        Sublayer("bidirectional self-attention", "self_attention", "self_attention_residual"),
        Sublayer("feed-forward", "feed_forward", "feed_forward_residual"),
    )

    def __init__(self, config: ModelConfig, layer: int = 0):
        super().__init__()
        self.self_attention = MultiHeadAttention(config, layer=layer)
        self.feed_forward = make_feed_forward(config, layer)
        self.self_attention_residual = Residual(config)
        self.feed_forward_residual = Residual(config)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """x (batch, time, d_model) -> (the same shape, self-attention weights if asked for, else None)."""
        attended, weights = self.self_attention(
            self.self_attention_residual.sublayer_input(x), mask=mask, need_weights=need_weights
        )
        x = self.self_attention_residual.add(x, attended)
        return self.feed_forward_residual(x, lambda h: run_feed_forward(self.feed_forward, h, mask)), weights


class DecoderBlock(nn.Module):
    """Masked (causal) self-attention, cross-attention to the encoder memory when there is one, feed-forward."""

    SUBLAYERS: ClassVar[tuple[Sublayer, ...]] = (
        Sublayer("causal self-attention", "self_attention", "self_attention_residual"),
        Sublayer("cross-attention", "cross_attention", "cross_attention_residual"),
        Sublayer("feed-forward", "feed_forward", "feed_forward_residual"),
    )

    def __init__(self, config: ModelConfig, cross_attention: bool = False, layer: int = 0):
        super().__init__()
        self.self_attention = MultiHeadAttention(config, layer=layer)
        self.self_attention_residual = Residual(config)
        self.cross_attention = MultiHeadAttention(config, cross_attention=True) if cross_attention else None
        self.cross_attention_residual = Residual(config) if cross_attention else None
        self.feed_forward = make_feed_forward(config, layer)
        self.feed_forward_residual = Residual(config)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        positions: Tensor | range | None = None,
        cache: tuple[KVCache, KVCache] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, dict[str, Tensor | None]]:
        """x (batch, time, d_model); memory (batch, src_time, d_model); `cache` = (self, cross) caches."""
        self_cache, cross_cache = cache if cache is not None else (None, None)
        weights: dict[str, Tensor | None] = {}
        attended, weights["self"] = self.self_attention(
            self.self_attention_residual.sublayer_input(x),
            mask=mask,
            causal=True,
            positions=positions,
            cache=self_cache,
            need_weights=need_weights,
        )
        x = self.self_attention_residual.add(x, attended)
        if self.cross_attention is not None:
            attended, weights["cross"] = self.cross_attention(
                self.cross_attention_residual.sublayer_input(x),
                memory,
                mask=memory_mask,
                cache=cross_cache,
                need_weights=need_weights,
            )
            x = self.cross_attention_residual.add(x, attended)
        return self.feed_forward_residual(x, lambda h: run_feed_forward(self.feed_forward, h, mask)), weights
