"""Tiny language-model runs used by test_fsdp.py: launched once under torchrun with 2 processes (several runs in
one process group, to keep the suite quick), and called in-process (`train`) for the one-process references.
Usage: python fsdp_worker.py OUT_DIR, where OUT_DIR/one-3 holds a 3-step one-process run to resume under FSDP."""

import contextlib
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import kqv
from kqv.train.config import TrainConfig
from kqv.train.sharding import local_bytes
from kqv.train.trainer import Trainer

CONFIG = TrainConfig(
    steps=6,
    batch_size=4,
    grad_accum=2,
    lr=3e-3,
    warmup_steps=1,
    schedule="constant",  # resuming to more steps then equals planning them from the start
    precision="fp32",
    log_every=1,
    eval_every=3,
    eval_batches=2,
    checkpoint_every=3,
)


def batches(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The i-th global batch of random tokens: (inputs, next-token targets), each (4, 16)."""
    ids = torch.randint(0, 32, (CONFIG.batch_size, 17), generator=torch.Generator().manual_seed(i))
    return ids[:, :-1], ids[:, 1:]


def model(**changes) -> kqv.DecoderLM:
    """A 2-block decoder with tied input and output embeddings (the default), with `changes` to its config."""
    torch.manual_seed(0)
    sizes = dict(vocab_size=32, d_model=32, n_heads=2, n_layers=2, d_ff=64, max_len=32, dropout=0.0)
    return kqv.DecoderLM(kqv.ModelConfig(**{**sizes, **changes}))


def inspect(model: torch.nn.Module) -> dict[str, float]:
    """The eval_fn: what rank 0 evaluates is a plain model (no sharded DTensor) in eval mode, with these weights."""
    return {
        "plain_model": float(not any(isinstance(p, DTensor) for p in model.parameters())),
        "eval_mode": float(not model.training),
        "weight_sum": sum(p.double().sum().item() for p in model.parameters()),
    }


def train(
    run_dir: Path, steps: int, parallel: str = "ddp", resume: bool = False, given: str = "model", **changes
) -> kqv.DecoderLM:
    """Train (or resume) the tiny run in `run_dir` to `steps` updates; returns the caller's model afterwards. On
    ranks other than 0 the trainer is `given` the "model", a "meta" model, or the "factory" that builds it; the
    largest parameter bytes this process held in the updates (its shards, the caller's model) go to a JSON file."""
    meta = given != "model" and dist.is_initialized() and dist.get_rank() > 0
    with torch.device("meta") if meta else contextlib.nullcontext():
        net = model(**changes)
    held = {"shards": 0, "callers_model": 0}

    def loss_fn(m: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if m.training:  # between updates; an evaluation's forward keeps the root module's weights gathered
            held["shards"] = max(held["shards"], local_bytes(m))
            held["callers_model"] = max(held["callers_model"], local_bytes(trainer.callers_model))
        return m(*batch)

    trainer = Trainer(
        net if given != "factory" or dist.get_rank() == 0 else lambda: model(**changes),
        replace(CONFIG, steps=steps, parallel=parallel),
        run_dir,
        train_batches=batches,
        loss_fn=loss_fn,
        val_batches=lambda i: batches(10_000 + i),
        eval_fn=inspect,
        if_exists="resume" if resume else "error",
        quiet=True,
    )
    trainer.train()
    rank = dist.get_rank() if dist.is_initialized() else 0
    (run_dir.parent / f"{run_dir.name}-held-rank{rank}.json").write_text(json.dumps(held))
    return trainer.callers_model


def main(out: Path) -> None:
    """The FSDP runs: 6 steps straight; 3 steps, then resumed to 6; a one-process run's 3 steps resumed to 6.
    Then a mixture-of-experts model under DDP."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    trained = train(out / "fsdp-6", 6, "fsdp", given="factory")
    if rank == 0:  # the caller's model after a sharded run, to compare with the checkpoint
        torch.save(trained.state_dict(), out / "fsdp-6-model.pt")
    train(out / "fsdp-3-6", 3, "fsdp", given="meta")
    if rank == 0:
        shutil.copytree(out / "fsdp-3-6", out / "fsdp-3")  # kept at step 3, for a one-process resume
    dist.barrier()
    train(out / "fsdp-3-6", 6, "fsdp", resume=True)
    train(out / "one-3", 6, "fsdp", resume=True)
    train(out / "ddp-switch", 3, "ddp", ffn="switch", experts={"count": 4})  # experts a process may leave unused
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
