"""One process of a run over two nodes, for test_nodes.py: each of two torchrun agents on this machine (c10d
rendezvous, `--nnodes=2 --nproc-per-node=1`) runs `python nodes_worker.py OUT MODE`, a sharded (FSDP) tiny language
model with dropout (each rank draws its own masks, so a resume must bring back every rank's generators).

- `train`: 6 updates straight into OUT/straight; then OUT/killed, whose ranks kill themselves (SIGKILL) right
  after its checkpoint of step 4, before step 5;
- `resume`: OUT/killed resumed to 6 updates by new processes;
- `apart`: rank 0 resumes OUT/killed while rank 1 is given OUT/elsewhere/killed, as a node that sees another file
  system at the run's path would: both must refuse, neither may hang."""

import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist

import fsdp_worker
from kqv.errors import KqvError
from kqv.train.events import Progress
from kqv.train.reporter import Reporter
from kqv.train.trainer import Trainer

CONFIG = replace(fsdp_worker.CONFIG, parallel="fsdp", checkpoint_every=2, eval_every=100)
KILLED_AFTER = 4


class KilledAfter(Reporter):
    """Kills its own process (SIGKILL: no handler, no checkpoint) at the progress event of update `step`, which
    the trainer reports after that update's checkpoint is written."""

    def __init__(self, step: int):
        super().__init__(quiet=True)
        self.step = step

    def __call__(self, event) -> None:
        if isinstance(event, Progress) and event.step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def train(run_dir: Path, resume: bool = False, reporter: Reporter | None = None) -> None:
    Trainer(
        fsdp_worker.model(dropout=0.1),
        CONFIG,
        run_dir,
        train_batches=fsdp_worker.batches,
        loss_fn=lambda m, b: m(*b),
        if_exists="resume" if resume else "error",
        quiet=True,
        reporter=reporter,
    ).train()


def main(out: Path, mode: str) -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        if mode == "train":
            train(out / "straight")
            train(out / "killed", reporter=KilledAfter(KILLED_AFTER))
        elif mode == "resume":
            train(out / "killed", resume=True)
        else:
            train(out / "killed" if rank == 0 else out / "elsewhere" / "killed", resume=True)
    except KqvError as error:  # as the command line says it
        print(f"kqv: error: {error}", file=sys.stderr)
        return 3
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2]))
