"""Compiled runs under torchrun for test_kernels.py: fsdp_worker's tiny run with `train.compile`, once under DDP
(the DDP model compiled whole) and once under FSDP (each sharded block compiled in place), with the "aot_eager"
backend. Usage: python compile_worker.py OUT_DIR."""

import sys
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist

import fsdp_worker
from kqv.train import compiling


def main(out: Path) -> None:
    compiling.BACKEND = "aot_eager"
    fsdp_worker.CONFIG = replace(fsdp_worker.CONFIG, compile=True)
    dist.init_process_group("gloo")
    fsdp_worker.train(out / "ddp", 6, "ddp")
    fsdp_worker.train(out / "fsdp", 6, "fsdp")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
