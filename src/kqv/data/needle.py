"""A task that needs long-range lookups: find the value a needle token carries, hundreds of tokens back.

A sequence of random filler tokens hides one needle, a marker token followed by a value token (one of 8), somewhere
in its first quarter; its last quarter holds `QUERIES` query tokens, and after each the model must predict the
value. The answer is only in the needle, so a model can solve it only if its attention reaches that position
(chance is 1/8). Used by benchmarks/long_context_quality.py and the `long-attention` experiment.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ConfigError

VALUES = 8  # token ids 0..7 are the answers
MARKER, QUERY = 8, 9
FILLER = range(10, 64)
VOCAB = 64
QUERIES = 16  # query tokens per sequence, all asking for the same value


def needle_batch(batch: int, time: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """ids (batch, time), the query positions (batch, QUERIES) and the answers (batch,): filler, a needle
    [MARKER, value] in the first quarter, QUERY tokens at distinct places in the last quarter."""
    if time < 4 * QUERIES or time % 4:
        raise ConfigError(
            f"needle sequences need a length that is a multiple of 4 and at least {4 * QUERIES}, got {time}"
        )
    ids = torch.randint(FILLER.start, FILLER.stop, (batch, time), generator=generator)
    answers = torch.randint(0, VALUES, (batch,), generator=generator)
    where = torch.randint(0, time // 4 - 1, (batch,), generator=generator)
    rows = torch.arange(batch)
    ids[rows, where] = MARKER
    ids[rows, where + 1] = answers
    last_quarter = torch.rand(batch, time - 3 * time // 4, generator=generator).argsort(-1)[:, :QUERIES]
    queries = 3 * time // 4 + last_quarter
    ids[rows[:, None], queries] = QUERY
    return ids, queries, answers
