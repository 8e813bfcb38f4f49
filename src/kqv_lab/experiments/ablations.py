"""Taking the lecture's pieces away: surgery on kqv's own models, for the experiments only.

Each function takes a built model and changes it in place, keeping everything else the same, so the two arms of
a comparison differ by exactly one idea:

* `without_scaling`: scores q.k instead of q.k / sqrt(d_k) (Vaswani et al. 2017, §3.2.1);
* `peeking`: causal self-attention that sees the future while its `peek` flag is set;
* `without_query_key_maps`: queries and keys are the layer's input x itself (scores x_i . x_j); values keep W_V;
* `without_residuals`: every sublayer's output replaces the stream instead of being added to it;
* `without_norms`: every LayerNorm / RMSNorm becomes the identity.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from kqv.nn import AttentionCall, FullAttention, MultiHeadAttention, Residual


def self_attention_layers(model: nn.Module) -> list[MultiHeadAttention]:
    return [m for m in model.modules() if isinstance(m, MultiHeadAttention) and not m.cross_attention]


def replace_modules(model: nn.Module, kind: type | tuple[type, ...], make: Callable[[nn.Module], nn.Module]) -> int:
    """Replace every submodule of type `kind` by `make(old)`; returns how many were replaced."""
    targets = [(name, module) for name, module in model.named_modules() if isinstance(module, kind) and name]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, make(module))
    return len(targets)


# ---------------------------------------------------------------------------------------------------------------
# Attention cores


class UnscaledAttention(FullAttention):
    """Full attention with scores q.k: the queries are multiplied by sqrt(d_k) before the usual kernel divides
    the scores by it, so every kernel (fused, plain, blockwise) computes softmax(q k^T) v."""

    def attend(
        self, queries: Tensor, keys: Tensor, values: Tensor, call: AttentionCall
    ) -> tuple[Tensor, Tensor | None]:
        return super().attend(queries * math.sqrt(queries.shape[-1]), keys, values, call)


class PeekingAttention(FullAttention):
    """Causal attention whose causal mask is ignored while `peek` is True: each position also sees the tokens it
    is asked to predict. Set `peek = False` to evaluate the same weights honestly."""

    peek = True

    def attend(
        self, queries: Tensor, keys: Tensor, values: Tensor, call: AttentionCall
    ) -> tuple[Tensor, Tensor | None]:
        return super().attend(queries, keys, values, call._replace(causal=call.causal and not self.peek))


def _with_core(model: nn.Module, core: type[FullAttention]) -> nn.Module:
    for layer in self_attention_layers(model):
        layer.core = core(layer.core.blockwise)
    return model


def without_scaling(model: nn.Module) -> nn.Module:
    return _with_core(model, UnscaledAttention)


def peeking(model: nn.Module) -> nn.Module:
    return _with_core(model, PeekingAttention)


def set_peeking(model: nn.Module, peek: bool) -> None:
    """Switch every peeking layer of `model` between seeing the future (True) and honest causal attention."""
    for layer in self_attention_layers(model):
        if isinstance(layer.core, PeekingAttention):
            layer.core.peek = peek


# ---------------------------------------------------------------------------------------------------------------
# Projections, residuals, norms


class InputsAsKeys(nn.Module):
    """Stands in for the fused key/value projection: keys are the input itself, values keep a learned W_V.
    x (batch, time, d_model) -> (batch, time, 2 * d_model), keys first as `MultiHeadAttention` expects."""

    def __init__(self, d_model: int, bias: bool):
        super().__init__()
        self.to_values = nn.Linear(d_model, d_model, bias=bias)
        nn.init.normal_(self.to_values.weight, 0.0, 0.02)  # GPT-2's initialisation, as the rest of the model
        if bias:
            nn.init.zeros_(self.to_values.bias)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat((x, self.to_values(x)), dim=-1)


def without_query_key_maps(model: nn.Module) -> nn.Module:
    """Scores become x_i . x_j / sqrt(d_k) (per head, on that head's slice of x): no W_Q, no W_K."""
    for layer in self_attention_layers(model):
        d_model = layer.to_queries.in_features
        layer.to_queries = nn.Identity()
        layer.to_keys_values = InputsAsKeys(d_model, layer.to_output.bias is not None)
    return model


class SublayerOnly(Residual):
    """A `Residual` without its skip connection: the stream becomes dropout(sublayer(x)) (normed after it for
    post-LN), so every layer must carry the whole signal through its own weights."""

    def add(self, x: Tensor, output: Tensor) -> Tensor:
        output = self.dropout(output)
        return output if self.norm_first else self.norm(output)


def without_residuals(model: nn.Module) -> nn.Module:
    def strip(old: Residual) -> SublayerOnly:
        new = SublayerOnly(model.config)
        new.norm, new.dropout = old.norm, old.dropout  # the same modules: only `add` differs
        return new

    replace_modules(model, Residual, strip)
    return model


def without_norms(model: nn.Module) -> nn.Module:
    replace_modules(model, (nn.LayerNorm, nn.RMSNorm), lambda _: nn.Identity())
    return model
