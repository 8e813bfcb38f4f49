"""Training: the one `Trainer`, its `TrainConfig`, run directories, checkpoints, metrics, precision, torchrun."""
