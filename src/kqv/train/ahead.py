"""Batches made ahead of the step: while update i trains, a worker thread makes the batch update i + 1 asks for.

A job's `train_batches(i)` makes batch i on the host (examples drawn, corrupted, packed; blocks cut from a corpus),
which a GPU would otherwise wait for at every update. Batch i depends only on i and the seed (the trainer's
determinism contract), so making it early, on another thread, gives the same batch: the worker makes the next index
after handing one out, and an index it did not guess (the first update, a resume) is made on the spot. Only the
worker calls the job's batch maker once training starts, so a maker that keeps caches (epochs planned, a mixture's
draws) is never called from two threads at once; its token count for tokens/s (`tokens_per_batch`, when a function)
is taken on the worker too.

What it costs is counted: the host seconds making batches and the seconds an update waited for its batch, which the
trainer's log records report as `batch_ms` and `wait_ms`, means per batch (`take_times`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

Made = tuple[Any, "int | None", float]  # (batch, its tokens or None, host seconds it took)


class BatchesAhead:
    """`get(i)` -> (batch i, its token count or None), batch i + 1 then made on a worker thread."""

    def __init__(self, make: Callable[[int], Any], tokens: Callable[[int], int] | int | None = None):
        self._make, self._tokens = make, tokens
        self._pool: ThreadPoolExecutor | None = None
        self._next: tuple[int, Future[Made]] | None = None
        self.made_s = self.waited_s = 0.0
        self.batches = 0

    def _made(self, i: int) -> Made:
        start = time.perf_counter()
        batch = self._make(i)
        tokens = self._tokens(i) if callable(self._tokens) else None
        return batch, tokens, time.perf_counter() - start

    def get(self, i: int) -> tuple[Any, int | None]:
        """Batch i and its token count (None when `tokens` is not a function), waiting only if it is not made yet."""
        start = time.perf_counter()
        ahead, self._next = self._next, None
        if ahead is not None and ahead[0] != i:
            ahead[1].exception()  # a guess that missed: let it finish, so the maker is never used on two threads
            ahead = None
        batch, tokens, made = ahead[1].result() if ahead is not None else self._made(i)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="kqv-batches")
        self._next = (i + 1, self._pool.submit(self._made, i + 1))
        self.made_s += made
        self.waited_s += time.perf_counter() - start
        self.batches += 1
        return batch, tokens

    def take_times(self) -> dict[str, float]:
        """`batch_ms` (host milliseconds making a batch) and `wait_ms` (milliseconds an update waited for one), each
        a mean over the batches since the last call (none: empty)."""
        count = self.batches
        times = {"batch_ms": 1e3 * self.made_s / count, "wait_ms": 1e3 * self.waited_s / count} if count else {}
        self.made_s = self.waited_s = 0.0
        self.batches = 0
        return times

    def close(self) -> None:
        """Stop the worker (a batch it is making is finished and dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool, self._next = None, None
