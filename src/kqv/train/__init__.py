"""Training: the one `Trainer`, its `TrainConfig`, run directories, checkpoints, metrics, precision, torchrun."""

from .checkpoints import has_checkpoint, read_checkpoint
from .config import TrainConfig
from .score_statistics import difference_from_guess, difference_over_questions, mean_over_seeds, wilson_interval
from .metrics import read_metrics
from .precision import autocast, native_bf16, resolve_precision
from .topology import Topology
from .trainer import Trainer

__all__ = [
    "Topology",
    "TrainConfig",
    "Trainer",
    "autocast",
    "difference_from_guess",
    "difference_over_questions",
    "has_checkpoint",
    "mean_over_seeds",
    "native_bf16",
    "read_checkpoint",
    "read_metrics",
    "resolve_precision",
    "wilson_interval",
]
