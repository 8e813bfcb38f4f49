"""Training: the one `Trainer`, its `TrainConfig`, run directories, checkpoints, metrics, precision, torchrun."""

# The names applications (kqv_lab, the benchmarks) use, exported here: they import kqv.train, not its modules.
from .checkpoints import has_checkpoint, read_checkpoint
from .config import TrainConfig
from .files import refuse_writing_over, write_atomically, write_png, write_text
from .layout import RunFiles
from .metrics import read_metrics
from .nonfinite import TrainingDiverged
from .precision import autocast, native_bf16, resolve_precision
from .runs import override_value
from .score_statistics import difference_from_guess, difference_over_questions, mean_over_seeds, wilson_interval
from .topology import Topology
from .trainer import Trainer

__all__ = [
    "RunFiles",
    "Topology",
    "TrainConfig",
    "Trainer",
    "TrainingDiverged",
    "autocast",
    "difference_from_guess",
    "difference_over_questions",
    "has_checkpoint",
    "mean_over_seeds",
    "native_bf16",
    "override_value",
    "read_checkpoint",
    "read_metrics",
    "refuse_writing_over",
    "resolve_precision",
    "wilson_interval",
    "write_atomically",
    "write_png",
    "write_text",
]
