"""A budgeted language-model run under torchrun with 2 processes (test_budget.py): the plan and the looks at the
pace after it, in which every rank takes part at the same log intervals. Usage: python budget_worker.py RUN_DIR"""

import sys

from kqv.train.config import TrainConfig
from kqv.train.trainer import Trainer
from test_training import make_model, token_batches

CONFIG = TrainConfig(
    steps=100_000,  # the upper bound: the budget decides
    batch_size=4,
    lr=1e-3,
    warmup_steps=50,
    budget_minutes=0.2,
    log_every=5,
    eval_every=40,
    eval_batches=2,
    checkpoint_every=10_000,
    precision="fp32",
    device="cpu",
)

if __name__ == "__main__":
    run = Trainer(
        make_model(dropout=0.0), CONFIG, sys.argv[1], train_batches=token_batches(4), loss_fn=lambda m, b: m(*b),
        val_batches=token_batches(4, offset=10_000), quiet=True,
    )  # fmt: skip
    print(f"trained {run.train()['step']} of {run.steps}", flush=True)
