"""flex_attention on CUDA GPUs: the attention that torch's fused SDPA cannot take, as one fused kernel.

`torch.nn.attention.flex_attention` (Dong et al. 2024, "Flex Attention") computes softmax(q k^T / sqrt(d)) v
with two hooks: a `score_mod(score, b, h, q_idx, kv_idx)` that changes each scaled score, and a block mask built
from a `mask_mod(b, h, q_idx, kv_idx)` that says which keys a query may see (blocks of 128 x 128 scores that are
wholly masked are skipped, so local and BigBird attention cost what they attend). Compiled, it is one Triton
kernel with O(n) memory, forward and backward. The score biases and masks it is given here are exactly those of
today's cores (tests/test_kernels.py compares them):

* ALiBi: score - slope_h |i - j| (`ALiBiPositions.score_mod`); Shaw et al.'s relative keys without relative values:
  score + (q_i . a_clip(j - i)) / sqrt(d), the per-distance products gathered (`RelativePositions.score_mod`);
* the causal mask, padding, local attention's blocks and BigBird's block layout (`*_mask` below).

Where it does not apply, today's cores run: the CPU and Apple silicon (`kernels(device).flex_attention` is for
CUDA only, so CPU speed is unchanged), attention dropout (flex has none), attention weights asked for, Shaw's
relative values (they need the weights), decoding with a KV cache (one new query per step: nothing to skip), and
memory-compressed attention, whose keys are a learned convolution of the keys and whose causal form mixes
compressed and raw keys in one softmax (a rewrite, not a mask: kept as it is). Linformer never forms the scores.
Nor does it take a head dimension its Triton kernel cannot: below 16 (the smallest `tl.dot`) or not a power of two
(torch 2.5 refuses those, later versions pad them to one): `head_dim_fits`.

A block mask that depends on the shape alone (causal, local blocks, BigBird's layout) is built once per (mask,
shape, device) and kept, not rebuilt every forward. A padding mask changes with every batch: its block mask is
built once per forward, by the first layer, and taken by every other layer given the same mask tensor, unchanged
(`padding=`; the last one is kept, by a weak reference to that tensor and its version counter). Inside
`torch.compile` neither cache is used: each layer's block mask is built in the traced graph, where the compiler
shares what the layers have in common, and the model compiles to one graph (`fullgraph=True` holds) instead of a
graph per cache lookup.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention

from .devices import kernels

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
_compiled: Callable | None = None  # flex_attention compiled once (its Triton kernel), on first use on a GPU
MIN_HEAD_DIM = 16  # Triton's smallest matrix-product block (tl.dot needs K >= 16)
BLOCK_MASKS = 32  # block masks kept, the least recently used dropped first
_block_masks: OrderedDict[Hashable, object] = OrderedDict()
_padding_block_mask: tuple[weakref.ref, Hashable, object] | None = None  # the last padding's, for the next layer


def head_dim_fits(head_dim: int) -> bool:
    """Whether flex_attention's kernel takes heads of `head_dim`: a power of two, at least `MIN_HEAD_DIM`."""
    return head_dim >= MIN_HEAD_DIM and head_dim & (head_dim - 1) == 0


def applies(queries: Tensor, keys: Tensor, dropout: float, need_weights: bool) -> bool:
    """Whether this call goes through flex_attention: on a device whose kernels include it, without dropout or
    weights, over a whole sequence (queries and keys at the same positions: training, a prompt, an encoder), with
    heads its kernel takes (`head_dim_fits`; elsewhere today's cores run, as on the CPU)."""
    same = queries.shape[2] == keys.shape[2]
    fits = head_dim_fits(queries.shape[-1])
    return kernels(queries.device).flex_attention and dropout == 0 and not need_weights and same and fits


def attend(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    score_mod: ScoreMod | None = None,
    mask_mod: MaskMod | None = None,
    padding: Tensor | None = None,
    mask_key: Hashable | None = None,
) -> Tensor:
    """softmax(q k^T / sqrt(d) changed by `score_mod`, keys `mask_mod` hides = -inf) v, (batch, heads, q_time,
    head_dim); a query that may see no key gets zeros, as today's cores give. Keys and values may have fewer heads
    than the queries (grouped-query attention; a score_mod's `h` is the query head). `padding`: the padding mask tensor
    `mask_mod` reads (its block mask differs between batch rows), the same object in every layer of a forward.
    `mask_key` names what else `mask_mod` depends on beside the shape, so that its block mask is reused."""
    block_mask = None
    if mask_mod is not None:
        shape = (queries.shape[2], keys.shape[2], queries.device)
        if torch.compiler.is_compiling():  # traced: built in the graph, no cache (its weak references, versions and
            # dict are Python state a graph cannot guard without breaking or recompiling per call)
            block_mask = create_block_mask(mask_mod, queries.shape[0] if padding is not None else None, None, *shape)
        elif padding is None:
            block_mask = _block_mask(mask_mod, mask_key, None, *shape)
        else:
            block_mask = _padding_mask(mask_mod, padding, mask_key, queries.shape[0], *shape)
    grouped = keys.shape[1] != queries.shape[1]  # grouped-query attention: flex reads key/value head h // group
    return _kernel(queries.device)(
        queries, keys, values, score_mod=score_mod, block_mask=block_mask, enable_gqa=grouped
    )


def _padding_mask(
    mask_mod: MaskMod, padding: Tensor, mask_key: Hashable, rows: int, q_time: int, k_time: int, device: torch.device
) -> object:
    """The block mask of a mask that reads `padding`: the last one built when `padding` is the same tensor, not
    changed since (its version counter), under the same `mask_key` and shape; else built and kept in its place."""
    global _padding_block_mask
    key = (mask_key, rows, q_time, k_time, str(device), padding._version)
    if _padding_block_mask is not None:
        tensor, kept_key, block_mask = _padding_block_mask
        if tensor() is padding and kept_key == key:
            return block_mask
    block_mask = _block_mask(mask_mod, None, rows, q_time, k_time, device)
    _padding_block_mask = (weakref.ref(padding), key, block_mask)
    return block_mask


def _block_mask(
    mask_mod: MaskMod, key: Hashable | None, rows: int | None, q_time: int, k_time: int, device: torch.device
) -> object:
    """flex's BlockMask of `mask_mod`: built anew without a `key`, else once per (key, shape, device) and kept."""
    # compiled on a GPU, the block mask is built block by block, never as a dense (q_time, k_time) tensor
    build = lambda: create_block_mask(
        mask_mod, rows, None, q_time, k_time, device=device, _compile=device.type == "cuda"
    )
    if key is None:
        return build()
    key = (key, q_time, k_time, str(device))
    if key not in _block_masks:
        _block_masks[key] = build()
        while len(_block_masks) > BLOCK_MASKS:
            _block_masks.popitem(last=False)
    _block_masks.move_to_end(key)
    return _block_masks[key]


def fixed(captured: Tensor) -> Tensor:
    """`captured`, a tensor a score_mod or mask_mod reads at an index it computes (Shaw's per-distance products,
    BigBird's block layout), marked static for torch.compile. Inductor's flex_attention template does not lower
    such a read of a tensor whose size is symbolic: torch 2.11 on CUDA fails with "'ShapeAsConstantBuffer' object
    has no attribute 'dtype'", 2.13 on the CPU with a C++ compile error, once a second length makes the sizes
    dynamic (tests/test_flex_compile.py). Marked static, flex_attention compiled by `_kernel` compiles once per
    size of it instead (the query, key and value sizes stay dynamic), up to dynamo's recompile limit, after which
    it runs uncompiled. Inside a traced model nothing is marked: the score_mods that capture such a tensor are
    not used there (`AttentionPositions.score_mod_in_graphs`), and BigBird's layout is a constant of the graph."""
    if not torch.compiler.is_compiling():
        torch._dynamo.mark_static(captured)
    return captured


def constant(value: int, device: torch.device) -> Tensor:
    """`value`, an option a score_mod or mask_mod computes with, as a 0-d tensor on `device`: a Python int in its
    closure is a value torch.compile may make symbolic (one graph for every value), and inductor's flex_attention
    template does not lower a symbolic value captured by a score_mod (torch 2.13 on the CPU: "'Mul' object has no
    attribute 'get_name'"; the "'ShapeAsConstantBuffer' object has no attribute 'dtype'" of 2.11 on CUDA)."""
    return torch.full((), value, dtype=torch.long, device=device)


def _kernel(device: torch.device) -> Callable:
    """flex_attention compiled on a GPU (uncompiled it materialises every score); as it is elsewhere (tests)."""
    global _compiled
    if device.type != "cuda" or torch.compiler.is_compiling():  # inside a traced model: compiled with it
        return flex_attention
    if _compiled is None:
        _compiled = torch.compile(flex_attention)  # new lengths recompile once, then as dynamic shapes
    return _compiled


# ---------------------------------------------------------------------------------------------------------------
# Masks: which keys (kv_idx) query q_idx may see. Queries and keys are at the same positions 0..time-1.


def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    return kv_idx <= q_idx


def padding(key_padding: Tensor) -> MaskMod:
    """Keys that are real tokens, key_padding (batch, k_time) bool, True = token."""

    def real(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return key_padding[b, kv_idx]

    return real


def local_mask(block: int, device: torch.device) -> MaskMod:
    """Liu et al. 2018's local attention: a query sees the keys of its own block of `block` positions."""
    block = constant(block, device)

    def same_block(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx // block == kv_idx // block

    return same_block


def block_layout_mask(layout: Tensor, block: int) -> MaskMod:
    """BigBird's blocks: query block i sees key block j where layout (n_blocks, n_blocks) bool says so."""
    layout, block = fixed(layout), constant(block, layout.device)

    def chosen(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return layout[q_idx // block, kv_idx // block]

    return chosen


def combined(mask_mod: MaskMod | None, is_causal: bool, key_padding: Tensor | None) -> MaskMod | None:
    """`mask_mod` (or none) and the causal mask and padding where asked, as one mask; None when nothing masks."""
    parts = [m for m in (mask_mod, causal if is_causal else None) if m is not None]
    if key_padding is not None:
        parts.append(padding(key_padding))
    return None if not parts else parts[0] if len(parts) == 1 else and_masks(*parts)
