"""Exact attention in O(n) memory, for every kqv position scheme: the lecture's "what if n >= 50,000?".

Plain attention builds the (n, n) score matrix; at n = 65,536 that is 16 GiB in fp32 for one head. torch's fused
`F.scaled_dot_product_attention` avoids it for plain and causal attention, but not once an explicit bias is needed
(Shaw relative positions, ALiBi, a padding mask): the bias itself is n x n.

`blockwise_attention` computes the same numbers one block of queries against one block of keys at a time, with
the online softmax of Milakov & Gimelshein 2018 (a running maximum and running sum per query; what was
accumulated is rescaled whenever the maximum grows; Rabe & Staats 2021). The backward pass is FlashAttention's
(Dao et al. 2022): it keeps only queries, keys, values, the output and each query's log-sum-exp, and recomputes
every block's weights from them. Memory is O(n * head_dim) plus a few (q_block, k_block) buffers, whatever the
position scheme, because every in-attention scheme is a function of (query positions, key positions) and so can
be evaluated one block at a time.

A position scheme adds to a block of scores in one of three shapes, each as cheap as it can be:

* a column per key, added to the block (ALiBi on a block wholly left or right of its queries, where
  -slope * |i - j| = slope * j - slope * i);
* a row per query, folded into the softmax's subtraction of the maximum, so it costs nothing per score (the
  ALiBi row term above; Shaw's embeddings on a block farther than the clipping distance, where every distance
  clips alike);
* a full block, only where nothing cheaper is exact: blocks that straddle the diagonal for ALiBi and Shaw, and
  every block for a scheme this module doesn't know (any `AttentionPositions` subclass works, through autograd).

Plain blocks, whose bias is at most a row per query (no positions; Shaw beyond the clipping distance), go a
contiguous run at a time to torch's own fused CPU kernel (the private op behind `F.scaled_dot_product_attention`,
`aten::_scaled_dot_product_flash_attention_for_cpu`), which also returns its log-sum-exp, so its result merges into
the online softmax like one more block; its backward is given the whole row's output and log-sum-exp. Without
that op (another torch), with a padding mask or another dtype, every block takes the plain-PyTorch path.

ALiBi also lets whole blocks be skipped. Far enough from its queries, a block's largest possible score
(|q| |k| / sqrt(d), by Cauchy-Schwarz) minus slope * distance is more than 50 below each query's running maximum,
so all its weights are below e^-50 times the largest weight, the same threshold as the clamp described below;
it is skipped in forward and backward alike. Key blocks are visited nearest first so the maximum is known early.

Queries and keys are taken as `MultiHeadAttention` has them, already rotated by `positions.rotate`: RoPE changes
the inputs only and needs nothing here.

Three CPU facts shape the code. A fresh block-sized tensor per block costs more than filling a reused one, so
blocks live in a `Workspace`. `exp` of an fp32 number below log(smallest normal) ~ -87.3 (-inf included) takes a
slow path, 50x slower. And arithmetic on subnormal numbers (below 1.2e-38), which the matmuls meet when tiny
weights multiply values, is about as slow again: ALiBi at n = 65,536 gives most weights e^-100 or less and ran 20x
slower for it. So the shifted scores are clamped at -50 before `exp`: a weight below e^-50 = 2e-22 (relative to
the row's largest, 1) becomes 2e-22, which changes no fp32 result (n * 2e-22 is far below fp32's 6e-8 resolution
for any n that fits in memory), and masked weights are then set to exactly 0.
"""

from .attention import FUSED, SCORE_BLOCK_ELEMENTS, block_sizes, blockwise_attention
from .blocks import EXP_FLOOR, Trace

__all__ = ["EXP_FLOOR", "FUSED", "SCORE_BLOCK_ELEMENTS", "Trace", "block_sizes", "blockwise_attention"]
