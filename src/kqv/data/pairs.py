"""A translation corpus as token ids: encoded sentence pairs, their files in a run directory, token-budget batches.

A source is `ids + <eos>`; the decoder reads `<bos> + ids` and predicts `ids + <eos>` (teacher forcing).
`TokenBatches` sorts sentences by length and packs them so that rows * longest sentence <= `max_tokens` on both
sides; batch `i` depends only on `i` (and the seed), so a resumed run sees the same batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor

from .bible import Pair
from .lines import text_lines
from .padding import lengths_mask, pad_sequences
from .tokenizers import Tokenizer, encode_texts


@dataclass
class Encoded:
    """One split as lists of id tensors (int64): sources end in <eos>; targets are the bare sentence ids."""

    src: list[Tensor]
    tgt: list[Tensor]

    def __len__(self) -> int:
        return len(self.src)


def encode_pairs(tokenizer: Tokenizer, pairs: list[Pair], eos_id: int) -> Encoded:
    src = [torch.tensor(ids + [eos_id]) for ids in encode_texts(tokenizer, [p.src for p in pairs])]
    tgt = [torch.tensor(ids) for ids in encode_texts(tokenizer, [p.tgt for p in pairs])]
    return Encoded(src, tgt)


def split_tensors(splits: dict[str, Encoded]) -> dict[str, torch.Tensor]:
    """The encoded splits as flat tensors (each side's ids one after another, and their lengths), as a run's
    pairs.safetensors holds them (`load_splits` reads them back)."""
    tensors = {}
    for name, split in splits.items():
        for side in ("src", "tgt"):
            sequences = getattr(split, side)
            tensors[f"{name}.{side}"] = torch.cat(sequences).to(torch.int32)
            tensors[f"{name}.{side}_lengths"] = torch.tensor([len(s) for s in sequences], dtype=torch.int32)
    return tensors


def load_splits(path: Path) -> dict[str, Encoded]:
    tensors = load_file(str(path))
    names = sorted({key.split(".")[0] for key in tensors})
    split = lambda name, side: list(tensors[f"{name}.{side}"].long().split(tensors[f"{name}.{side}_lengths"].tolist()))
    return {name: Encoded(split(name, "src"), split(name, "tgt")) for name in names}


def text_files(texts: dict[str, tuple[list[str], list[str]]]) -> dict[str, str]:
    """Each split's sentences as files of a line each: NAME.src and NAME.tgt (`read_texts` reads them back)."""
    files = {}
    for name, (sources, references) in texts.items():
        files[f"{name}.src"] = "".join(s + "\n" for s in sources)
        files[f"{name}.tgt"] = "".join(t + "\n" for t in references)
    return files


def read_texts(directory: Path) -> dict[str, tuple[list[str], list[str]]]:
    read = lambda path: text_lines(path.read_bytes(), path)  # as written: one sentence a line, at newlines alone
    return {name: (read(directory / f"{name}.src"), read(directory / f"{name}.tgt")) for name in ("dev", "test")}


class TokenBatches:
    """Length-bucketed batches under a token budget; `batches(i)` depends only on i (and the seed).

    Each epoch, the sentences are shuffled by a generator seeded with (seed, epoch), stably sorted by (source,
    target) length, packed greedily into batches of at most `max_rows` rows whose padded size on either side
    stays within `max_tokens`, and the batches are shuffled. Since the packing only sees the sorted lengths,
    every epoch has the same number of batches.
    """

    def __init__(
        self,
        data: Encoded,
        *,
        max_tokens: int,
        max_rows: int,
        seed: int,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        shuffle: bool = True,
    ):
        self.data, self.max_tokens, self.max_rows, self.seed, self.shuffle = data, max_tokens, max_rows, seed, shuffle
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.src_lengths = torch.tensor([len(s) for s in data.src])
        self.tgt_lengths = torch.tensor([len(t) + 1 for t in data.tgt])  # <bos> + ids, or ids + <eos>
        self._epoch, self._plan = -1, []
        self.per_epoch = len(self._epoch_plan(0))

    def __len__(self) -> int:
        return self.per_epoch

    def _epoch_plan(self, epoch: int) -> list[Tensor]:
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            order = (
                torch.randperm(len(self.data), generator=generator) if self.shuffle else torch.arange(len(self.data))
            )
            key = self.src_lengths[order] * 10_000 + self.tgt_lengths[order]
            order = order[torch.sort(key, stable=True).indices]
            plan = self._pack(order)
            if self.shuffle:
                plan = [plan[j] for j in torch.randperm(len(plan), generator=generator).tolist()]
            self._epoch, self._plan = epoch, plan
        return self._plan

    def _pack(self, order: Tensor) -> list[Tensor]:
        plan, start, longest_src, longest_tgt = [], 0, 0, 0
        src, tgt = self.src_lengths[order].tolist(), self.tgt_lengths[order].tolist()
        for j in range(len(order)):
            new_src, new_tgt, rows = max(longest_src, src[j]), max(longest_tgt, tgt[j]), j - start + 1
            if rows > 1 and (rows > self.max_rows or rows * max(new_src, new_tgt) > self.max_tokens):
                plan.append(order[start:j])
                start, new_src, new_tgt = j, src[j], tgt[j]
            longest_src, longest_tgt = new_src, new_tgt
        if start < len(order):
            plan.append(order[start:])
        return plan

    def indices(self, i: int) -> Tensor:
        return self._epoch_plan(i // self.per_epoch)[i % self.per_epoch]

    def __call__(self, i: int) -> dict[str, Tensor]:
        return self.collate(self.indices(i))

    def collate(self, rows: Tensor) -> dict[str, Tensor]:
        """{"src", "src_mask", "tgt_in", "targets"}: right-padded; targets use -100 for padding."""
        rows = rows.tolist()
        src = [self.data.src[r] for r in rows]
        tgt = [self.data.tgt[r] for r in rows]
        src_ids = pad_sequences(src, self.pad_id)
        bos, eos = torch.tensor([self.bos_id]), torch.tensor([self.eos_id])
        return {
            "src": src_ids,
            "src_mask": lengths_mask([len(s) for s in src], src_ids.shape[1]),
            "tgt_in": pad_sequences([torch.cat((bos, t)) for t in tgt], self.pad_id),
            "targets": pad_sequences([torch.cat((t, eos)) for t in tgt], -100),
        }

    @staticmethod
    def target_tokens(batch: dict[str, Tensor]) -> int:
        """The targets of a batch that a loss averages over (padding's -100 excluded), counted on the host."""
        return int((batch["targets"] != -100).sum())

    def real_tokens(self, i: int) -> int:
        rows = self.indices(i)
        return int(self.src_lengths[rows].sum() + self.tgt_lengths[rows].sum())
