"""The decoding step of a `DecoderLM`, lean: one new token per row through every layer, with the KV cache.

Generating a token runs every layer on a single query. For a small model on a CPU the arithmetic of such a step
is a few matrix-vector products, and the time goes to what surrounds them: module calls, argument checks, views,
masks and positions rebuilt per token (a 14M-parameter model: ~700 tensor operations per token on the general
path). `DecodeStep` runs the same computation with ~25 operations per layer: the same torch kernels (`F.linear`,
`F.layer_norm`, `kqv.nn.cores.fused_attention`, ...) on the same operands in the same order, reading the
model's own parameters and writing the model's own `KVCache` buffers, so for several rows its logits are
bit-identical to `DecoderLM.next_token_logits` and the general path can take over at any step. For one row the
matrix-vector products, which are then nearly all of the time, read their weights in the layout and on the
threads that stream them fastest (`one_row_product`); their sums run in another order, so the logits move in the
last bits, not the greedy tokens (tests/test_fast_decoding.py compares both cases). It covers the models most
people decode with: full attention with absolute positions or RoPE, dense feed-forward networks; `supports` says
whether a model qualifies, and `generate` falls back to the general path when it does not (ALiBi or relative
positions, sparse cores, mixtures of experts, blockwise="always").

What the step computes in place of a module's forward it takes only from a module that keeps that forward
(`kqv.nn.capability.keeps`): a subclass of nn.Linear, nn.Embedding, LayerNorm, `LearnedPositions` or `Embeddings`
that overrides it is called as a module, and a model whose blocks or attention cores do is decoded on the general
path. A block's steps are read from its declaration (`DecoderBlock.SUBLAYERS`, `kqv.nn.layers.Sublayer`), which
must be exactly the ones `LayerStep` computes (`LEAN_SUBLAYERS`). All of it is decided once, when the step is built.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import KVCache, MultiHeadAttention
from .capability import keeps
from .cores import FullAttention, fused_attention
from .devices import kernels, model_device
from .embeddings import Embeddings
from .layers import FeedForward, Residual, Sublayer
from .positions import LearnedPositions
from .vocabulary import PaddedHead

__all__ = ["DecodeStep"]


def norm_function(norm: nn.Module):
    """The functional form of a LayerNorm or RMSNorm module: the kernel its forward calls, without the module call
    (torch.layer_norm is what F.layer_norm calls after its Python-level checks)."""
    if keeps(norm, nn.LayerNorm, "forward"):
        return lambda x: torch.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    if keeps(norm, nn.RMSNorm, "forward"):
        return lambda x: torch.rms_norm(x, norm.normalized_shape, norm.weight, norm.eps)
    return norm


def embed_function(embeddings: nn.Module):
    """The functional form of `Embeddings` in eval mode, from token ids (batch,) at positions (batch,) or (1,) to
    rows (batch, d_model): the same lookups and additions without five module calls, the learned table's length
    check (`generate` checks the length once, up front) and the multiplication by a scale of 1 (exact either way).
    Inputs it does not cover (another token module, an embedding norm, a forward of their own) go through the
    module itself."""
    tokens, positions, scale = embeddings.tokens, embeddings.positions, embeddings.scale
    plain_tokens = keeps(tokens, nn.Embedding, "forward") and tokens.max_norm is None  # max_norm renorms rows
    if not (keeps(embeddings, Embeddings, "forward") and plain_tokens) or embeddings.norm is not None:
        return lambda ids, at: embeddings(ids[:, None], at[..., None]).squeeze(1)
    table = tokens.weight
    learned = keeps(positions, LearnedPositions, "forward")

    def embed(ids: Tensor, at: Tensor) -> Tensor:
        x = F.embedding(ids, table)  # (batch, d_model)
        if scale != 1.0:
            x = x * scale
        if learned:
            return x + F.embedding(at, positions.embedding.weight)
        return x if positions is None else x + positions(at).to(x.dtype)

    return embed


def linear(layer: nn.Module, one_row: bool = False):
    """The functional form of an nn.Linear, and of a `PaddedHead` (its padded product, then its real columns);
    any other projection (an int8 one from `in_dtype`, a subclass with a forward of its own) is called as is."""
    if keeps(layer, PaddedHead, "forward"):
        product, real = matrix_product(layer.weight, layer.bias, one_row), layer.vocab_size
        return lambda x: product(x)[:, :real]  # (rows, vocab)
    if not keeps(layer, nn.Linear, "forward"):
        return layer
    return matrix_product(layer.weight, layer.bias, one_row)


def matrix_product(weight: Tensor, bias: Tensor | None, one_row: bool = False):
    """x (rows, in) -> x weight^T + bias.

    For several rows this is what `F.linear` computes in fp32 (addmm, or mm without a bias, on the transposed
    weight), called directly: a dispatch and a transpose fewer per call, and the same numbers. For one row
    (`one_row`) it is a matrix-vector product, bound by reading the weight: see `one_row_product`."""
    if weight.dtype != torch.float32:
        return lambda x: F.linear(x, weight, bias)
    if one_row:
        return one_row_product(weight, bias, parts=torch.get_num_threads())
    transposed = weight.t()  # (in, out), a view
    if bias is None:
        return lambda x: torch.mm(x, transposed)
    return lambda x: torch.addmm(bias, x, transposed)


SPLIT_MIN_WEIGHTS = 1 << 16  # a weight smaller than this (256 KB in fp32) is one block: see `one_row_blocks`


def one_row_blocks(out_features: int, in_features: int, parts: int) -> int:
    """How many column blocks `one_row_product` cuts an (out, in) weight into for `parts` threads: `parts` when it
    divides `out` and the weight has at least `SPLIT_MIN_WEIGHTS` entries, else one.

    A small weight stays whole for two reasons. Its product is a few thousand multiply-adds, less than waking a
    thread costs. And a BLAS chooses its kernel by the shape: small products may go to small-matrix kernels whose
    sums over `in` run in an order that depends on the width (on an AMX Xeon, the products of a 96 x 32 weight
    cut into 2, 3 or 4 blocks differed from the whole's in the last bits), so cut, a small weight's product would
    depend on `parts`. Large blocks go to the BLAS's streaming kernel, which sums every output over `in` in one
    order whatever the width (tests/test_fast_decoding.py checks parts 1 to 5 at 384 x 384, 1152 x 384 and
    384 x 1536, which held on that Xeon too)."""
    if parts < 2 or out_features % parts or out_features * in_features < SPLIT_MIN_WEIGHTS:
        return 1
    return parts


def one_row_product(weight: Tensor, bias: Tensor | None, parts: int):
    """x (1, in) -> x weight^T + bias, with the weight read as fast as this CPU's BLAS reads one.

    Two things decide that speed (measured on a 2-core Zen 4: `python benchmarks/one_row_products.py` times the
    products, `python benchmarks/generation_speed.py` the whole step):
    * The layout. For a matrix at least as wide as it is deep, MKL streams an (in, out) copy up to twice as fast
      as the (out, in) rows `nn.Linear` keeps; for a deeper one (the feed-forward network's down projection) the
      rows are the faster. Wide matrices get an (in, out) copy, made once here.
    * Threads. MKL's matrix-vector product ran on one thread there, so a large weight is cut into `parts` column
      blocks (parts, in, out / parts), one per thread, multiplied by one batched product (`torch.baddbmm`, which
      torch spreads over its threads) whose result is already laid out as the row (1, out).
    Each output is still one dot product summed in the same order whatever the blocks, so the result does not
    depend on `parts` (a small weight is never cut, because there it would: `one_row_blocks`); the (in, out) copy
    sums in another order than `F.linear`, so the logits move from the general path's in the last bits (about
    1e-6), not the greedy tokens (tests/test_fast_decoding.py checks both)."""
    out_features, in_features = weight.shape
    parts = one_row_blocks(out_features, in_features, parts)
    width = out_features // parts
    if out_features >= in_features:  # (parts, in, width): a copy in the fast layout
        blocks = weight.t().reshape(in_features, parts, width).transpose(0, 1).contiguous()
    else:  # (parts, in, width): views of the (out, in) rows, F.linear's own layout
        blocks = weight.view(parts, width, in_features).transpose(1, 2)
    if parts == 1:
        matrix = blocks[0]
        return (lambda x: torch.mm(x, matrix)) if bias is None else (lambda x: torch.addmm(bias, x, matrix))
    if bias is None:
        return lambda x: torch.bmm(x.expand(parts, 1, in_features), blocks).view(1, out_features)
    bias = bias.view(parts, 1, width)
    return lambda x: torch.baddbmm(bias, x.expand(parts, 1, in_features), blocks).view(1, out_features)


def fused_linear(*layers: nn.Module):
    """One product for the given layers, on their weights stacked by rows, or None when they are not all plain
    fp32 nn.Linear layers, with and without bias alike; for one input row (`DecodeStep` stacks only at batch 1).

    For one row each output is its own dot product whatever other outputs the matrix has, so the stacked
    projection is bit-identical to the separate ones (tests/test_fast_decoding.py checks it); for several rows
    gemm's blocking may depend on the matrix width and move the last bits."""
    if (
        not all(keeps(layer, nn.Linear, "forward") for layer in layers)
        or any(layer.weight.dtype != torch.float32 for layer in layers)
        or len({layer.bias is None for layer in layers}) != 1
    ):
        return None
    weight = torch.cat([layer.weight for layer in layers])  # (sum of out_features, in_features)
    bias = None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])
    return matrix_product(weight, bias, one_row=True)


# The steps of a block `LayerStep` computes, in its order: a block declaring anything else is decoded on the
# general path (`mirrors`).
LEAN_SUBLAYERS = (
    Sublayer("causal self-attention", "self_attention", "self_attention_residual"),
    Sublayer("feed-forward", "feed_forward", "feed_forward_residual"),
)


class LayerStep:
    """One decoder block's step on x (batch, d_model), one row per sequence, bound to its parameters and its
    self-attention cache. Rows rather than (batch, 1, d_model) spare `F.linear` the reshapes around its matrix
    product, which is the same kernel on the same numbers either way. The block's pieces are those its declaration
    names (`LEAN_SUBLAYERS`, which `mirrors` checked)."""

    def __init__(self, block: nn.Module, cache: KVCache, one_row: bool = False):
        attending, feeding = LEAN_SUBLAYERS
        attention: MultiHeadAttention = getattr(block, attending.module)
        attention_residual: Residual = getattr(block, attending.residual)
        feed_forward_residual: Residual = getattr(block, feeding.residual)
        self.cache, self.heads, self.head_dim = cache, attention.n_heads, attention.head_dim
        self.kv_heads = attention.n_kv_heads  # fewer than heads under grouped-query attention
        self.rotate = attention.positions.rotate  # RoPE; the identity for every other scheme this step takes
        self.rotates = attention.positions.rotates
        # queries, keys and values by one matrix-vector product (batch 1 only: see fused_linear)
        self.to_queries_keys_values = fused_linear(attention.to_queries, attention.to_keys_values) if one_row else None
        if self.to_queries_keys_values is None:
            self.to_queries = linear(attention.to_queries, one_row)
            self.to_keys_values = linear(attention.to_keys_values, one_row)
        self.to_output = linear(attention.to_output, one_row)
        feed_forward: FeedForward = getattr(block, feeding.module)
        self.up, self.down = linear(feed_forward.up, one_row), linear(feed_forward.down, one_row)
        self.activation = feed_forward.activation
        self.gated = feed_forward.gated
        self.norm_first = attention_residual.norm_first
        self.attention_norm = norm_function(attention_residual.norm)
        self.feed_forward_norm = norm_function(feed_forward_residual.norm)

    def __call__(self, x: Tensor, positions: Tensor, mask: Tensor | None) -> Tensor:
        h = self.attention_norm(x) if self.norm_first else x
        x = x.add_(self.to_output(self.attend(h, positions, mask)))  # x is this step's own tensor: add in place
        if not self.norm_first:
            x = self.attention_norm(x)
        h = self.feed_forward_norm(x) if self.norm_first else x
        hidden = self.up(h)  # (batch, d_ff or 2 * d_ff)
        if self.gated:
            gate, value = hidden.chunk(2, dim=-1)
            hidden = self.activation(gate) * value
        else:
            hidden = self.activation(hidden)
        x = x.add_(self.down(hidden))
        return x if self.norm_first else self.feed_forward_norm(x)

    def attend(self, h: Tensor, positions: Tensor, mask: Tensor | None) -> Tensor:
        """Multi-head self-attention of the newest token over the cache: (batch, d_model) -> the same."""
        batch = h.shape[0]
        if self.to_queries_keys_values is not None:  # [queries | keys | values] by one product, split by views
            projected = self.to_queries_keys_values(h)
            queries, keys_values = projected.split((self.heads * self.head_dim, 2 * self.kv_heads * self.head_dim), -1)
        else:
            queries, keys_values = self.to_queries(h), self.to_keys_values(h)
        # one new token: (batch, heads * head_dim) views as (batch, heads, 1, head_dim) without a transpose
        queries = queries.view(batch, self.heads, 1, self.head_dim)
        keys, values = keys_values.view(batch, 2, self.kv_heads, 1, self.head_dim).unbind(1)
        if self.rotates:
            queries, keys = self.rotate(queries, positions), self.rotate(keys, positions)
        keys, values = self.cache.append(keys, values)  # (batch, kv_heads, cached + 1, head_dim)
        output = fused_attention(queries, keys, values, mask=mask)  # (batch, heads, 1, head_dim)
        # with one query, (batch, heads, 1, head_dim) is laid out as (batch, 1, heads, head_dim): no transpose
        return output.reshape(batch, self.heads * self.head_dim)


class DecodeStep:
    """`DecoderLM.next_token_logits` for one new token per row, continuing `cache`, with fewer operations.

    `batch` is the number of rows it will be called with, when known: at batch 1 every product is a
    `one_row_product` (its weight copies made here, once per `generate` call; its thread count is torch's now) and
    each layer computes queries, keys and values by one stacked projection (`fused_linear`). Call it with ids
    (batch, 1), positions (1,) (the token's place in the buffer), the padding mask (batch, 1, 1, cached + 1) or
    None, and `left_padding` (batch,) or None, as `generate` builds them; it returns the logits (batch, vocab),
    bit-identical to the general path's for several rows and within about 1e-5 of them for one.
    """

    def __init__(self, model: nn.Module, cache: list[tuple[KVCache, KVCache]], batch: int | None = None):
        decoder = model.decoder
        self.embeddings = embed_function(decoder.embeddings)
        one_row = batch == 1 and kernels(model_device(model)).one_row_products
        self.layers = [LayerStep(block, self_cache, one_row) for block, (self_cache, _) in zip(decoder.blocks, cache)]
        self.final_norm = norm_function(decoder.final_norm)
        self.lm_head = linear(model.lm_head, one_row)

    @staticmethod
    def supports(model: nn.Module) -> bool:
        """Whether every layer is one this step computes exactly: a block declaring causal self-attention then the
        feed-forward network (`LEAN_SUBLAYERS`), full attention without score or value biases (absolute positions
        or RoPE), a dense feed-forward network, LayerNorm or RMSNorm, in eval mode."""
        decoder = getattr(model, "decoder", None)
        if decoder is None or model.training or not hasattr(model, "lm_head"):
            return False
        norms_ok = isinstance(decoder.final_norm, (nn.LayerNorm, nn.RMSNorm, nn.Identity))
        return norms_ok and all(supported_block(block) for block in decoder.blocks)

    def __call__(self, ids: Tensor, positions: Tensor, mask: Tensor | None, left_padding: Tensor | None) -> Tensor:
        own_positions = positions if left_padding is None else (positions - left_padding).clamp(min=0)
        x = self.embeddings(ids[:, 0], own_positions)  # (batch, d_model)
        for layer in self.layers:
            x = layer(x, positions, mask)
        return self.lm_head(self.final_norm(x))  # (batch, vocab)


def supported_block(block: nn.Module) -> bool:
    """Whether `LayerStep` computes `block` exactly: the block mirrors it, its attention is full attention on the
    fused kernel without score or value biases, and its norms are LayerNorm or RMSNorm."""
    if not mirrors(block):
        return False
    attention, core = block.self_attention, block.self_attention.core
    return (
        keeps(core, FullAttention, "attend", "use_blockwise")
        and core.blockwise != "always"
        and core.fused
        and not attention.positions.has_score_bias
        and not attention.positions.has_value_bias
        and all(
            isinstance(residual.norm, (nn.LayerNorm, nn.RMSNorm))
            for residual in (block.self_attention_residual, block.feed_forward_residual)
        )
    )


def mirrors(block: nn.Module) -> bool:
    """Whether `block` performs the steps `LayerStep` computes, with the pieces it computes them for: it declares
    exactly `LEAN_SUBLAYERS`, its forward is the one the declaration is about, and the attention, the
    feed-forward network and the residual connections keep the methods `LayerStep` computes in their stead."""
    if declared_sublayers(block) != LEAN_SUBLAYERS:
        return False
    attending, feeding = LEAN_SUBLAYERS
    return (
        keeps(getattr(block, attending.module), MultiHeadAttention, "forward", "keys_values", "project_keys_values")
        and keeps(getattr(block, feeding.module), FeedForward, "forward")
        and all(
            keeps(getattr(block, step.residual), Residual, "forward", "sublayer_input", "add")
            for step in LEAN_SUBLAYERS
        )
    )


def declared_sublayers(block: nn.Module) -> tuple[Sublayer, ...] | None:
    """The steps `block`'s forward performs, in order, as its class declares them in `SUBLAYERS` (a sub-layer the
    block was built without left out); None when it declares none, or when its forward is not the one its
    declaration is about (a subclass that overrides forward without declaring its own steps)."""
    owner = lambda name: next((c for c in type(block).__mro__ if name in c.__dict__), None)
    if owner("SUBLAYERS") is None or owner("forward") is not owner("SUBLAYERS"):
        return None
    return tuple(step for step in block.SUBLAYERS if getattr(block, step.module, None) is not None)
