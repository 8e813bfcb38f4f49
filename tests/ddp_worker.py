"""A tiny language-model run used by test_training.py: launched under torchrun with 2 processes, and called
in-process (`run`) for the one-process reference. Under torchrun each rank prints how often its processes agreed
on the time limit (`rank0_says`, a broadcast). Usage: python ddp_worker.py RUN_DIR"""

import sys
from pathlib import Path

import torch

import kqv
from kqv.train.config import TrainConfig
from kqv.train.trainer import Trainer

CONFIG = TrainConfig(
    steps=4,
    batch_size=4,
    grad_accum=2,
    lr=1e-3,
    warmup_steps=1,
    precision="fp32",
    log_every=2,
    eval_every=4,
    max_minutes=60.0,  # never reached: the processes agree on it at log intervals only
    eval_batches=2,
)


def batches(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The i-th global batch of random tokens: (inputs, next-token targets), each (4, 16)."""
    ids = torch.randint(0, 32, (CONFIG.batch_size, 17), generator=torch.Generator().manual_seed(i))
    return ids[:, :-1], ids[:, 1:]


def run(run_dir: Path) -> dict:
    torch.manual_seed(0)
    model = kqv.DecoderLM(
        kqv.ModelConfig(vocab_size=32, d_model=32, n_heads=2, n_layers=2, d_ff=64, max_len=32, dropout=0.0)
    )
    trainer = Trainer(
        model,
        CONFIG,
        run_dir,
        train_batches=batches,
        loss_fn=lambda m, b: m(*b),
        val_batches=lambda i: batches(10_000 + i),
        quiet=True,
    )
    return trainer.train()


def counting_agreements() -> list[bool]:
    """Every `rank0_says` of the trainer, recorded."""
    from kqv.train import distributed

    said, agree = [], distributed.rank0_says
    distributed.rank0_says = lambda flag, world_size: said.append(agree(flag, world_size)) or said[-1]
    return said


if __name__ == "__main__":
    agreements = counting_agreements()
    run(Path(sys.argv[1]))
    sys.stdout.write(f"rank0_says {len(agreements)}\n")  # one write: two ranks share the pipe
    sys.stdout.flush()
