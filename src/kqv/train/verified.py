"""A verified checkpoint as its readers hold it (`Checkpoint`), and what to do about a broken one (`remedy`): shared
by the checkpoint files' reader (`kqv.train.checkpoints`) and a sharded checkpoint's (`kqv.train.shard_files`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import IF_EXISTS_OVERWRITE, option
from .config import TrainConfig


@dataclass
class Checkpoint:
    """A verified checkpoint: where it is, the update it was taken after, its config and extra_state.

    It also holds its files open (`open(name)`), so what is loaded from it is what was verified, even when a
    training process swaps in a newer checkpoint meanwhile: readers never lock the run directory.
    """

    path: Path
    step: int
    config: TrainConfig
    extra_state: dict[str, Any]
    state: dict[str, Any]  # the whole state.json
    files: dict[str, BinaryIO] = field(default_factory=dict, repr=False)

    def open(self, name: str) -> BinaryIO:
        """The verified file `name` of this checkpoint, rewound to its start."""
        file = self.files[name]
        file.seek(0)
        return file

    def path_of(self, name: str) -> Path:
        """A path that opens the verified file `name` itself, for readers that open by path (safetensors'
        `safe_open`, `torch.load(mmap=True)`): /proc/self/fd/N where there is one (Linux), else its name in the
        checkpoint directory, which a resuming trainer, holding the run's lock, knows no one replaces."""
        fd = Path(f"/proc/self/fd/{self.files[name].fileno()}")
        return fd if fd.exists() else self.path / name

    def close(self) -> None:
        for file in self.files.values():
            file.close()

    def __del__(self) -> None:
        self.close()


def remedy(path: Path) -> str:
    """What to do about a broken checkpoint, in the words of the interface the user called (`option`)."""
    overwrite = option(IF_EXISTS_OVERWRITE)
    return f"restore {path} from a backup, or start the run over with {overwrite} (which deletes it)"
