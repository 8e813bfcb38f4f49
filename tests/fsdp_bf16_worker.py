"""A tiny bf16 run under FSDP, for test_fsdp_precision.py: launched under torchrun with 2 processes, or called
in-process for one process's reference. Usage: python fsdp_bf16_worker.py OUT_DIR. Each rank writes what FSDP
gathered and reduced in (rank-N.json); rank 0's metrics.jsonl holds the losses."""

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch
from torch.distributed.fsdp import FSDPModule

from fsdp_worker import CONFIG, batches, model
from kqv.nn.layers import DecoderBlock
from kqv.train.trainer import Trainer

BF16 = replace(CONFIG, steps=2, precision="bf16", parallel="fsdp", eval_every=100, checkpoint_every=100)


def train(run_dir: Path) -> dict[str, object]:
    """Train the tiny rope model in bf16 in `run_dir`; returns the dtypes its blocks computed and reduced in."""
    trainer = Trainer(model(position="rope"), BF16, run_dir, train_batches=batches, loss_fn=lambda m, b: m(*b))
    seen: dict[str, object] = {"computed": set()}
    block = next(m for m in trainer.model.modules() if isinstance(m, DecoderBlock))
    for layer in (m for m in block.modules() if isinstance(m, torch.nn.Linear)):
        layer.register_forward_pre_hook(lambda m, _: seen["computed"].add(str(m.weight.dtype)))
    trainer.train()
    policies = [m._get_fsdp_state()._mp_policy for m in trainer.model.modules() if isinstance(m, FSDPModule)]
    seen.update(
        computed=sorted(seen["computed"]),
        policies=sorted({(str(p.param_dtype), str(p.reduce_dtype)) for p in policies}),
        shards=sorted({str(p.dtype) for p in trainer.model.parameters()}),
    )
    return seen


if __name__ == "__main__":
    out = Path(sys.argv[1])
    seen = train(out / "fsdp")
    (out / f"rank-{os.environ.get('RANK', '0')}.json").write_text(json.dumps(seen))  # the group is gone by now
