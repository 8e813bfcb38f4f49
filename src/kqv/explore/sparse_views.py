"""Attention weights of the sparse cores, which never form them: rebuilt densely from their queries and keys.

`model.attention_weights()` exists only for full attention: Linformer and BigBird compute their output without a
(query, key) matrix. For a short input the explorer can afford one, so it records the queries, keys and call
options each core receives (a forward hook) and rebuilds what the core attends with:

* BigBird (Zaheer et al. 2020): softmax(q k^T / sqrt(d)) over the pairs of its block pattern (`bigbird_mask`:
  window, global and random blocks, and the causal mask), zero elsewhere: a (time, time) matrix whose zeros show
  the sparse pattern.
* Linformer (Wang et al. 2020): the query attends to k learned mixtures of the keys, E^T K, not to tokens, so its
  weights are (time, k): one column per mixture ("slot"). In the causal variant query i mixes keys 0..i only.

The tests check the rebuilt weights against the cores' own outputs: weights @ values (BigBird) or weights @ F^T V
(Linformer) = output.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.sparse import BigBirdAttention, LinformerAttention, bigbird_mask


@dataclass
class Weights:
    """Self-attention weights per layer, each (batch, heads, q_time, k_time), or a note saying why there are none.
    `keys` labels the key axis when it is not the tokens (Linformer's slots)."""

    layers: list[Tensor] | None
    note: str | None = None
    keys: list[str] | None = None

    @property
    def over_tokens(self) -> bool:
        return self.keys is None


def self_attention_weights(model: nn.Module, full: Callable[[], list[Tensor]], run: Callable[[], Any]) -> Weights:
    """The self-attention weights of `model` on one input: `full()` for full attention; for a sparse core, the
    weights rebuilt from what each core received while `run()` ran the model on the same input."""
    kind = getattr(model.config, "attention", "full")
    if kind == "full":
        return Weights([w.cpu() for w in full()])  # the views read them on the CPU, wherever the model runs
    cores = [m for m in model.modules() if isinstance(m, (BigBirdAttention, LinformerAttention))]
    calls: list[tuple[nn.Module, tuple, dict]] = []
    hooks = [
        core.register_forward_hook(lambda m, args, kwargs, out: calls.append((m, args, kwargs)), with_kwargs=True)
        for core in cores
    ]
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    if kind == "bigbird":
        bigbird = model.config.bigbird
        block = bigbird.block
        note = (
            f"BigBird scores only the pairs of its block pattern ({block}-token blocks: a window of "
            f"{bigbird.window} block(s) each side, {bigbird.global_blocks} global and "
            f"{bigbird.random_blocks} random block(s)); the zeros are the pairs it never scores"
        )
        return Weights([bigbird_weights(core, *args, **kwargs).cpu() for core, args, kwargs in calls], note)
    note = (
        f"Linformer attends to {model.config.linformer.k} learned mixtures of the tokens (E^T K), not to the "
        f"tokens themselves: each "
        f"column is one mixture (slot), so the views show queries x slots; distances and previous-token "
        f"weights do not apply"
    )
    layers = [linformer_weights(core, *args, **kwargs).cpu() for core, args, kwargs in calls]
    return Weights(layers, note, [f"slot {j + 1}" for j in range(layers[0].shape[-1])])


def bigbird_weights(
    core: BigBirdAttention,
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    causal: bool = False,
    key_padding: Tensor | None = None,
) -> Tensor:
    """(batch, heads, time, time): softmax over the pairs BigBird scores, 0 for the others."""
    time = keys.shape[2]
    allowed = bigbird_mask(time, core.block, core.window, core.global_blocks, core.random_blocks, causal, core.seed)
    allowed = allowed[-queries.shape[2] :].to(queries.device)  # with a cache, the queries are the last positions
    if key_padding is not None:
        allowed = allowed & key_padding.bool()[:, None, None, :]
    scores = queries.float() @ keys.float().transpose(-2, -1) / math.sqrt(queries.shape[-1])  # (batch, heads, q, k)
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)


def linformer_weights(
    core: LinformerAttention,
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    causal: bool = False,
    key_padding: Tensor | None = None,
) -> Tensor:
    """(batch, heads, q_time, k): each query's softmax over the k compressed keys it scores."""
    if key_padding is not None:
        keys = keys * key_padding[:, None, :, None].to(keys.dtype)
    e, _ = core.projection(keys.shape[2])  # (heads | 1, time, k)
    scale = 1.0 / math.sqrt(queries.shape[-1])
    if not causal:
        return (queries @ (e.transpose(1, 2) @ keys).transpose(-2, -1) * scale).softmax(-1)
    # query i scores the summaries of keys 0..i: prefix sums of E[j]^T k_j, (batch, heads, time, k, head_dim)
    summaries = (e[None, :, :, :, None] * keys[:, :, :, None, :]).cumsum(2)[:, :, -queries.shape[2] :]
    return (torch.einsum("bhqd,bhqkd->bhqk", queries, summaries) * scale).softmax(-1)
