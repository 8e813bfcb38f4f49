"""A mixture of data sources: batch i comes from one source, drawn by weight from (seed, i) alone.

Each source is a batch maker of its own (`ExampleBatches`, `DocumentBatches`) with `batch(n)` and `tokens(n)`.
Batch i draws its source s with probability weight_s / sum(weights) from `random.Random(seed * 1_000_003 + i)`
(`stream` keeps training and validation draws apart) and is that source's batch n, n the number of earlier
batches that drew s: each source walks through its own epochs in order, as it would alone, at the rate its weight
gives it. The draws are made on the host, in order, and kept, so batch i depends only on i and the seed, and a
resume at step i redraws 0 ... i - 1 (microseconds each) to find where every source stands.
"""

from __future__ import annotations

import bisect
import itertools
import random
from dataclasses import dataclass, field
from typing import Any

STREAMS = {"train": 0, "val": 1}


@dataclass
class MixtureBatches:
    """Batches drawn from `sources` by `weights` (positive and finite, of any scale; normalised here)."""

    sources: list[Any]
    weights: list[float]
    seed: int = 0
    stream: str = "train"
    _places: list[tuple[int, int]] = field(default_factory=list, repr=False)
    _counts: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        largest = max(self.weights)  # scaled to at most 1 first: a sum of weights near 1e308 would overflow to inf
        scaled = [w / largest for w in self.weights]
        total = sum(scaled)
        self._cumulative = list(itertools.accumulate(w / total for w in scaled))
        self._counts = [0] * len(self.sources)

    def source_of(self, i: int) -> int:
        """The source batch i draws: s with probability weight_s / sum(weights)."""
        u = random.Random((self.seed * 1_000_003 + i) * 2 + STREAMS[self.stream]).random()
        return min(bisect.bisect_right(self._cumulative, u), len(self.sources) - 1)

    def place(self, i: int) -> tuple[int, int]:
        """(source, its batch number) of batch i."""
        while len(self._places) <= i:
            s = self.source_of(len(self._places))
            self._places.append((s, self._counts[s]))
            self._counts[s] += 1
        return self._places[i]

    def batch(self, i: int) -> Any:
        s, n = self.place(i)
        return self.sources[s].batch(n)

    def tokens(self, i: int) -> int:
        s, n = self.place(i)
        return self.sources[s].tokens(n)
