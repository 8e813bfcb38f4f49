"""Dropout whose random mask is cheap on every CPU.

torch draws dropout masks on the CPU with `bernoulli_`, which runs in parallel through MKL on Intel CPUs only.
Elsewhere (AMD's, for one) it draws one double per element on one thread, several times slower than these
(`python benchmarks/step_kernels.py`; docs/translation.md has its table). Here one 64-bit draw from torch's own
generator gives the masks of four elements, 16 bits each, so an element is dropped with probability p to within
2^-17; the kept ones are scaled by 1 / (1 - p) as in `F.dropout`. On other devices (`kqv.nn.devices.kernels`), and
with p outside (0, 1), this is `F.dropout` itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError
from .devices import kernels

_LEVELS = 1 << 16  # a 16-bit draw per element: p is rounded to a multiple of 2^-16


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element of x with probability p and scale the rest by 1 / (1 - p) (identity unless training)."""
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"dropout probability must be between 0 and 1, got {p}")
    if not training or p == 0.0:
        return x
    if not kernels(x.device).cheap_dropout or p == 1.0 or not x.is_floating_point():
        return F.dropout(x, p, training)
    return x * keep_mask(x, p)


def keep_mask(x: Tensor, p: float) -> Tensor:
    """x's shape and dtype: 0 where an element is dropped (probability p), 1 / (1 - p) where it is kept."""
    draws = torch.empty((x.numel() + 3) // 4, dtype=torch.int64, device=x.device).random_(-(1 << 63), None)
    bits = draws.view(torch.int16)[: x.numel()].view(x.shape)  # uniform over [-2^15, 2^15)
    threshold = round(p * _LEVELS) - _LEVELS // 2  # P(bits < threshold) = p, rounded to 2^-16
    return (bits >= threshold).to(x.dtype).mul_(1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """`nn.Dropout` (same arguments, same state) drawing its mask with `dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
