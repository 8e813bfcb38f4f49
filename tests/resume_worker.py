"""Two-process runs with dropout on, for test_torchrun.py: `python resume_worker.py OUT_DIR first` trains a DDP
and an FSDP run 6 updates straight and another pair 3 updates; `python resume_worker.py OUT_DIR second`, a new
torchrun (new processes, fresh generators), resumes the 3-update runs to 6. Each rank's dropout draws from its own
generator, so the resumed runs equal the straight ones only if every rank's generator state came back."""

import sys
from pathlib import Path

import torch.distributed as dist

import fsdp_worker

DROPOUT = 0.1


def main(out: Path, stage: str) -> None:
    dist.init_process_group("gloo")
    for parallel in ("ddp", "fsdp"):
        if stage == "first":
            fsdp_worker.train(out / f"{parallel}-6", 6, parallel, dropout=DROPOUT)
            fsdp_worker.train(out / f"{parallel}-3-6", 3, parallel, dropout=DROPOUT)
        else:
            fsdp_worker.train(out / f"{parallel}-3-6", 6, parallel, resume=True, dropout=DROPOUT)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
