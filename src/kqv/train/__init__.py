"""Training: the one `Trainer`, its `TrainConfig`, run directories, checkpoints, metrics, precision, torchrun."""

# The names applications (kqv_lab, the benchmarks) use, exported here: they import kqv.train, not its modules.
from .config import TrainConfig
from .files import refuse_writing_over, write_atomically, write_png, write_text
from .layout import RunFiles
from .metrics import read_metrics
from .nonfinite import TrainingDiverged
from .runs import override_value
from .trainer import Trainer

__all__ = [
    "RunFiles",
    "TrainConfig",
    "Trainer",
    "TrainingDiverged",
    "override_value",
    "read_metrics",
    "refuse_writing_over",
    "write_atomically",
    "write_png",
    "write_text",
]
