"""Local and memory-compressed attention: the two attention layers of Liu et al. 2018's Transformer-DMCA
("Generating Wikipedia by Summarizing Long Sequences"), which let a decoder read 11,000 tokens.

Both are attention cores (`kqv.nn.cores.PaddingOnlyCore`, see its interface); `ModelConfig.layer_pattern`
alternates them per layer ("local,memory_compressed" is DMCA's pattern).

* `LocalAttention`: the sequence is cut into blocks of `local.block` tokens (by index: 0..B-1, B..2B-1, ...) and
  each query attends within its own block only; in the decoder, to the keys of its block at or before it. Memory
  and time O(n B) instead of O(n^2). One block covering the whole sequence is exactly full attention.
* `MemoryCompressedAttention`: keys and values are shortened by a strided convolution with kernel = stride =
  `memory_compressed.compression` (3 in the paper) along the sequence: each block of c consecutive keys
  (c * head_dim numbers) becomes one key by a learned linear map shared by the heads (the same for values, with
  its own map), so every query scores n / c keys: O(n^2 / c). A sequence whose length is not a multiple of c gets
  zero keys at the end.
  In the encoder a query sees every compressed block (the paper's layer).

  Causal (the decoder): a compressed key mixes c positions, so a query may only see the blocks that lie wholly
  before its own block: query i sees compressed blocks j < i // c, and, so that its own recent tokens are not
  invisible to it, the uncompressed keys of its own block at or before i (one softmax over both). So no future
  token ever reaches a past output: tests/test_dmca.py checks it by changing every token after a cut and
  comparing the outputs before it, for every cut position within and at the edges of the blocks.

Padding keys are zeroed before compression and never attended (a compressed block made only of padding is
masked). Blocks are counted from the first index, so a left-padded batch shifts the blocks of its shorter rows:
pad on the right (as training does) where outputs must match the unpadded ones. Queries are processed in chunks
of whole blocks, bounding memory by the chunk's scores (benchmarks/dmca_memory.py measures it at 16k tokens).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import flex
from .config import ModelConfig
from .cores import PaddingOnlyCore, scaled_dot_product_attention

QUERY_CHUNK = 512  # queries per chunk of memory-compressed attention (rounded down to whole blocks)


def aligned_blocks(x: Tensor, start: int, block: int) -> Tensor:
    """x (batch, heads, time, dim), whose first row is at index `start`, padded with zero rows so that it begins
    and ends on block boundaries -> (batch, heads, n_blocks, block, dim)."""
    before = start % block
    after = -(before + x.shape[2]) % block
    x = F.pad(x, (0, 0, before, after))
    return x.unflatten(2, (x.shape[2] // block, block))


def block_key_mask(
    key_padding: Tensor | None, batch: int, k_time: int, start: int, block: int, device: torch.device
) -> Tensor:
    """Which keys of the aligned blocks from `start` on are real: (batch, 1, n_blocks, 1, block) bool."""
    keep = torch.ones(batch, k_time, dtype=torch.bool, device=device) if key_padding is None else key_padding
    keep = keep[:, start - start % block :]
    keep = F.pad(keep, (0, -keep.shape[1] % block))  # (batch, n_blocks * block)
    return keep.view(batch, 1, -1, 1, block)


class LocalAttention(PaddingOnlyCore):
    """Attention within blocks of `block` tokens (Liu et al. 2018); see the module docstring."""

    name = "local attention"

    def __init__(self, block: int):
        super().__init__()
        self.block = block

    @classmethod
    def from_config(cls, config: ModelConfig) -> LocalAttention:
        return cls(config.local.block)

    def flex_mask(self, time: int, causal: bool, device: torch.device) -> flex.MaskMod:
        return flex.local_mask(self.block, device)

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, *, causal: bool = False, key_padding: Tensor | None = None
    ) -> Tensor:
        batch, _, q_time, _ = queries.shape
        k_time, block = keys.shape[2], self.block
        start = k_time - q_time  # queries are the last q_time positions (all, or the new ones after a cache)
        first = start - start % block  # the first key of the first query's block
        q = aligned_blocks(queries, start, block)  # (batch, heads, n_blocks, block, head_dim)
        k, v = aligned_blocks(keys[:, :, first:], first, block), aligned_blocks(values[:, :, first:], first, block)
        mask = block_key_mask(key_padding, batch, k_time, start, block, queries.device)
        if causal:
            mask = mask & torch.ones(block, block, dtype=torch.bool, device=queries.device).tril_()
        output, _ = scaled_dot_product_attention(q, k, v, mask=mask)  # (batch, heads, n_blocks, block, head_dim)
        offset = start % block
        return output.flatten(2, 3)[:, :, offset : offset + q_time]


class MemoryCompressedAttention(PaddingOnlyCore):
    """Attention over keys and values compressed `compression`-fold (Liu et al. 2018); see the module docstring.
    It stays this core on every device: its keys are a learned convolution, not a mask over full attention, so
    flex_attention (`kqv.nn.flex`) cannot take it as it is."""

    name = "memory-compressed attention"

    def __init__(self, head_dim: int, compression: int):
        super().__init__()
        self.compression = compression
        # the strided convolutions: kernel = stride = c over head_dim channels, as linear maps of flattened blocks
        self.compress_keys = nn.Linear(compression * head_dim, head_dim)
        self.compress_values = nn.Linear(compression * head_dim, head_dim)

    @classmethod
    def from_config(cls, config: ModelConfig) -> MemoryCompressedAttention:
        return cls(config.head_dim, config.memory_compressed.compression)

    def compress(self, keys: Tensor, values: Tensor, key_padding: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """(batch, heads, k_time, head_dim) each -> compressed keys and values (batch, heads, m, head_dim), m =
        ceil(k_time / c), and which compressed blocks hold a real token, (batch, 1, 1, m)."""
        batch, _, k_time, _ = keys.shape
        if key_padding is not None:
            keep = key_padding[:, None, :, None].to(keys.dtype)  # (batch, 1, k_time, 1)
            keys, values = keys * keep, values * keep
        blocks_of = lambda x: aligned_blocks(x, 0, self.compression).flatten(3)  # (batch, heads, m, c * head_dim)
        real = block_key_mask(key_padding, batch, k_time, 0, self.compression, keys.device).any(-1)  # (b, 1, m, 1)
        return self.compress_keys(blocks_of(keys)), self.compress_values(blocks_of(values)), real.transpose(2, 3)

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, *, causal: bool = False, key_padding: Tensor | None = None
    ) -> Tensor:
        compressed_keys, compressed_values, real = self.compress(keys, values, key_padding)
        if not causal:
            return scaled_dot_product_attention(queries, compressed_keys, compressed_values, mask=real)[0]
        c, q_time, k_time = self.compression, queries.shape[2], keys.shape[2]
        start = k_time - q_time
        first = start - start % c
        q = aligned_blocks(queries, start, c)  # (batch, heads, n_blocks, c, head_dim)
        k, v = aligned_blocks(keys[:, :, first:], first, c), aligned_blocks(values[:, :, first:], first, c)
        own = block_key_mask(key_padding, queries.shape[0], k_time, start, c, queries.device)  # (b, 1, nb, 1, c)
        own = own & torch.ones(c, c, dtype=torch.bool, device=queries.device).tril_()
        chunk = max(1, QUERY_CHUNK // c)  # query blocks per chunk
        outputs = [
            self.causal_chunk(
                q[:, :, i : i + chunk],
                k[:, :, i : i + chunk],
                v[:, :, i : i + chunk],
                own[:, :, i : i + chunk],
                compressed_keys,
                compressed_values,
                real,
                first // c + i,
            )
            for i in range(0, q.shape[2], chunk)
        ]
        offset = start % c
        return torch.cat(outputs, dim=2).flatten(2, 3)[:, :, offset : offset + q_time]

    def causal_chunk(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        own: Tensor,
        compressed_keys: Tensor,
        compressed_values: Tensor,
        real: Tensor,
        first_block: int,
    ) -> Tensor:
        """One chunk of query blocks q (batch, heads, n, c, head_dim), the first being block `first_block`: one
        softmax over the compressed blocks before each query's block and the raw keys k of its own block."""
        batch, heads, n, c, head_dim = q.shape
        scale = 1.0 / math.sqrt(head_dim)
        m = compressed_keys.shape[2]
        block_of_query = torch.arange(first_block, first_block + n, device=q.device)  # (n,)
        earlier = torch.arange(m, device=q.device)[None, :] < block_of_query[:, None]  # (n, m)
        earlier = earlier[None, None, :, None, :] & real[..., None, :]  # (batch | 1, 1, n, 1, m)
        far = torch.einsum("bhncd,bhmd->bhncm", q, compressed_keys) * scale  # (batch, heads, n, c, m)
        near = q @ k.transpose(-2, -1) * scale  # (batch, heads, n, c, c)
        scores = torch.cat([far.masked_fill(~earlier, float("-inf")), near.masked_fill(~own, float("-inf"))], -1)
        weights = scores.softmax(-1).nan_to_num(0.0)  # a dummy (alignment) query may see nothing
        output = weights[..., :m].flatten(2, 3) @ compressed_values  # (batch, heads, n * c, head_dim)
        return output.unflatten(2, (n, c)) + weights[..., m:] @ v  # (batch, heads, n, c, head_dim)
