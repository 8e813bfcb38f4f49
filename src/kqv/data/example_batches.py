"""Batches of prompt -> completion examples (`kqv.data.completions`), padded or packed, never letting one example
attend to another.

An example of L tokens (prompt, completion, end of text) is read as its first L - 1 tokens, each predicting the
next. Its targets on the prompt's tokens are -100 (ignored) when the prompt's loss weight is 0 (the default), and
weighted by `prompt_loss_weight` otherwise (`weights`, 1 on the completion); padding is always ignored.

* **Padding** (the default): one example per row, right-padded to the batch's longest with targets -100. A
  causal model never attends from a real token to the padding after it, and each example has its own row.
* **Packing**: several examples per row, up to `context` tokens, so that little of a batch is padding. Each
  token carries the number of its example in the row (`sequences`), from which the model's attention mask is
  block-diagonal (`kqv.nn.cores.packed_mask`), and its position within its own example (`positions`,
  restarting at 0), so each example is computed as if it were alone in its row.

A batch is one of two types, `PaddedBatch` or `PackedBatch`, each with its prompt weights (`weights`) or None, so
the loss learns the layout from the batch's type, never from which keys it holds. Whether rows are packed is decided
once for a run, before any batch is made (`kqv.jobs.lm_completions.decide_packing`, from the model and `fills`).

Batch i depends only on i and the seed (the trainer's determinism contract): training rows come from a stream of
epochs, each a permutation of the training examples drawn from `batch_generator(seed, epoch)`, cut into rows
(one example each, or packed by best fit on each example's own length, `pack`); batch i is rows i * batch_size ...
of that stream.
Validation rows take the examples in file order, and batch i is rows i * batch_size ... of them, cyclically.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import torch
from torch import Tensor

from .batches import batch_generator

IGNORE = -100  # a target that counts for nothing (F.cross_entropy's ignore_index)
# the fields of a batch: name, what pads a row, dtype
FIELDS = (
    ("ids", 0, torch.long),
    ("targets", IGNORE, torch.long),
    ("weights", 0.0, torch.float32),
    ("sequences", -1, torch.long),
    ("positions", 0, torch.long),
)


class PaddedBatch(NamedTuple):
    """A batch of one example a row: `ids` and `targets` (batch, width), width the longest row, padded with 0 and
    -100; `attention_mask` (batch, width) bool, True on real tokens (the padding comes after them, so a causal model
    never attends to it); `weights` (batch, width) float, each target's weight, where the prompt's weight is neither 0
    nor 1 (None: every target that counts weighs 1). A named tuple: moved to the device and cut into a rank's rows
    field by field (`kqv.nn.devices`, `kqv.train.distributed`)."""

    ids: Tensor
    targets: Tensor
    attention_mask: Tensor
    weights: Tensor | None = None


class PackedBatch(NamedTuple):
    """A batch of rows packed with several examples: `ids`, `targets` and `weights` as in `PaddedBatch`;
    `sequences` (batch, width), the number of each token's example in its row (-1 on padding), from which the
    attention mask is block-diagonal (`kqv.nn.cores.packed_mask`), and `positions` (batch, width), each token's
    place in its own example."""

    ids: Tensor
    targets: Tensor
    sequences: Tensor
    positions: Tensor
    weights: Tensor | None = None


ExampleBatch = PaddedBatch | PackedBatch


@dataclass(frozen=True)
class EncodedExamples:
    """Examples as `kqv.data.completions.encode_examples` gives them: `ids` (total,) one after another and
    `lengths` (examples, 2), each one's prompt and completion token counts (the completion's with the end of
    text)."""

    ids: Tensor
    lengths: Tensor

    def __len__(self) -> int:
        return self.lengths.shape[0]

    @cached_property
    def spans(self) -> list[tuple[int, int, int]]:
        """(start, prompt length, total length) of every example in `ids`, read once on the host."""
        prompts, completions = self.lengths[:, 0].tolist(), self.lengths[:, 1].tolist()
        starts, start = [], 0
        for prompt, completion in zip(prompts, completions):
            starts.append((start, prompt, prompt + completion))
            start += prompt + completion
        return starts

    def parts(self, k: int) -> tuple[list[int], list[int]]:
        """The ids of example k's prompt, and of its completion with the end of text."""
        start, prompt, total = self.spans[k]
        ids = self.ids[start : start + total].tolist()
        return ids[:prompt], ids[prompt:]

    def inputs(self, k: int) -> int:
        """How many tokens the model reads of example k: all but its last."""
        return self.spans[k][2] - 1


@dataclass(frozen=True)
class ExampleBatches:
    """Batch i of `examples` (`batch(i)`) for training (`shuffle=True`) or validation (file order, cyclic): rows of
    one example each, or packed up to `context` tokens (`packing`, decided for a run by
    `kqv.jobs.lm_completions.decide_packing`), with prompt targets weighted by `prompt_loss_weight` (0: ignored)."""

    examples: EncodedExamples
    batch_size: int
    context: int
    seed: int = 0
    shuffle: bool = True
    packing: bool = False  # several examples a row (block-diagonal attention), or one each
    prompt_loss_weight: float = 0.0
    _epochs: list[list[list[int]]] = field(default_factory=list, init=False, repr=False, compare=False)
    _ends: list[int] = field(default_factory=list, init=False, repr=False, compare=False)

    def epoch_rows(self, epoch: int) -> list[list[int]]:
        """The rows (lists of example labels) of one pass over the examples: shuffled by epoch, or in order."""
        epoch = epoch if self.shuffle else 0
        while len(self._epochs) <= epoch:  # made in order and kept: epoch e's rows decide where e + 1 starts
            self._epochs.append(self.cut_rows(self.epoch_labels(len(self._epochs))))
        return self._epochs[epoch]

    def epoch_labels(self, epoch: int) -> list[int]:
        """The labels of epoch `epoch`'s examples in the order its rows take them: a permutation drawn from
        `batch_generator(seed, epoch)`, or file order."""
        count = len(self.examples)
        order = torch.randperm(count, generator=batch_generator(self.seed, epoch)).tolist() if self.shuffle else None
        return self.labels(epoch, order if order is not None else list(range(count)))

    def labels(self, epoch: int, order: list[int]) -> list[int]:
        """What epoch `epoch`'s rows hold: the examples' numbers (a subclass that draws each example anew per epoch,
        `kqv.data.document_batches`, numbers the draws instead)."""
        return order

    def inputs(self, label: int) -> int:
        """How many tokens the model reads of the example `label`: all but its last."""
        return self.examples.inputs(label)

    def cut_rows(self, labels: list[int]) -> list[list[int]]:
        """The examples `labels` as rows: one each, or packed (`pack`) up to `context` tokens by their own lengths."""
        if not self.packing:
            return [[k] for k in labels]
        return pack(labels, [self.inputs(k) for k in labels], self.context)

    def fills(self) -> tuple[float, float]:
        """(padded, packed): the share of real tokens in the first pass's batches of `batch_size` rows, each batch
        as wide as its longest row, with one example a row and with rows packed by `pack`, whichever `packing` is:
        what `kqv.jobs.lm_completions.decide_packing` weighs for data.packing = "auto"."""
        sizes = [self.inputs(k) for k in self.epoch_labels(0)]
        rows = pack(list(range(len(sizes))), sizes, self.context)
        return fill(sizes, self.batch_size), fill([sum(sizes[k] for k in row) for row in rows], self.batch_size)

    def rows(self, i: int) -> list[list[int]]:
        """The `batch_size` rows of batch i."""
        first = i * self.batch_size
        if not self.shuffle:
            rows = self.epoch_rows(0)
            return [rows[(first + j) % len(rows)] for j in range(self.batch_size)]
        return [self.stream_row(first + j) for j in range(self.batch_size)]

    def stream_row(self, g: int) -> list[int]:
        """Row g of the training stream: the epochs' rows one after another (epochs made as far as g needs)."""
        while not self._ends or self._ends[-1] <= g:  # _ends[e]: the stream index after epoch e's last row
            self._ends.append((self._ends[-1] if self._ends else 0) + len(self.epoch_rows(len(self._ends))))
        epoch = bisect.bisect_right(self._ends, g)
        return self.epoch_rows(epoch)[g - (self._ends[epoch - 1] if epoch else 0)]

    def tokens(self, i: int) -> int:
        """The real (not padding) tokens batch i feeds the model: its count for tokens/s."""
        return sum(self.inputs(k) for row in self.rows(i) for k in row)

    def batch(self, i: int) -> ExampleBatch:
        """Batch i as tensors made on the host: a `PackedBatch` where rows are packed, else a `PaddedBatch`, with
        `weights` when the prompt's weight is neither 0 nor 1."""
        return self.collate(self.rows(i))

    def collate(self, rows: list[list[int]]) -> ExampleBatch:
        """The batch whose rows hold the examples `rows` (lists of example labels), as `batch` describes it: each
        row made as Python lists and each field one tensor, so a batch costs one tensor per field, not per example."""
        made = [self.row(row) for row in rows]
        width = max(len(row[0]) for row in made)
        weighted = self.prompt_loss_weight not in (0.0, 1.0)
        ids, targets, weights, sequences, positions = (
            torch.tensor([row[n] + [fill] * (width - len(row[n])) for row in made], dtype=dtype)
            if name != "weights" or weighted
            else None
            for n, (name, fill, dtype) in enumerate(FIELDS)
        )
        if self.packing:
            return PackedBatch(ids, targets, sequences, positions, weights)
        return PaddedBatch(ids, targets, sequences >= 0, weights)

    @staticmethod
    def loss_terms(batch: ExampleBatch) -> float:
        """What `example_loss` divides by in `batch`: its targets that count (not -100), each by its weight when
        the batch has `weights`. Under torchrun a rank's loss is weighted by its share of them
        (`kqv.train.distributed.share`): examples differ in length, so rows are not equal shares. On the host."""
        counted = batch.targets != IGNORE
        if batch.weights is not None:
            return float((batch.weights * counted).sum())
        return float(counted.sum())

    def row(self, examples: list[int]) -> tuple[list, ...]:
        """(ids, targets, weights, sequences, positions) of one row holding `examples`, unpadded."""
        columns: tuple[list, ...] = ([], [], [], [], [])
        for number, k in enumerate(examples):
            for column, part in zip(columns, self.example(k, number)):
                column.extend(part)
        return columns

    def example_tokens(self, k: int) -> tuple[list[int], int]:
        """Example k's tokens (prompt, completion, end of text) and its prompt's length."""
        start, prompt, total = self.examples.spans[k]
        return self.examples.ids[start : start + total].tolist(), prompt

    def example(self, k: int, number: int) -> tuple[list, ...]:
        """(ids, targets, weights, sequences, positions) of example k, the `number`-th of its row."""
        tokens, prompt = self.example_tokens(k)
        inputs = len(tokens) - 1
        on_prompt = max(prompt - 1, 0)  # the first targets that are prompt tokens
        targets = tokens[1:]
        if self.prompt_loss_weight == 0:
            targets[:on_prompt] = [IGNORE] * on_prompt
        weights = [self.prompt_loss_weight] * on_prompt + [1.0] * (inputs - on_prompt)
        return tokens[:-1], targets, weights, [number] * inputs, list(range(inputs))


def fill(rows: list[int], batch_size: int) -> float:
    """The share of real tokens in batches of `batch_size` rows of `rows` tokens, each padded to its longest."""
    chunks = [rows[start : start + batch_size] for start in range(0, len(rows), batch_size)]
    return sum(rows) / max(sum(max(chunk) * len(chunk) for chunk in chunks), 1)


def pack(labels: list[int], sizes: list[int], capacity: int) -> list[list[int]]:
    """`labels` (of `sizes` tokens, each at most `capacity`) packed into rows of at most `capacity` tokens, best
    fit: each, in order, into the open row with the least room that holds it, else into a new row. Rows come in
    the order they were opened; a row's examples in the order they came. For sizes spread evenly up to the
    capacity this fills about 95% of every row, where putting each into the last row (next fit) fills about 75%."""
    rows: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (free tokens, row) of the rows that still have room, ascending
    for label, size in zip(labels, sizes):
        at = bisect.bisect_left(room, (size, -1))
        if at == len(room):
            rows.append([label])
            free, row = capacity - size, len(rows) - 1
        else:
            free, row = room.pop(at)
            rows[row].append(label)
            free -= size
        if free > 0:
            bisect.insort(room, (free, row))
    return rows
