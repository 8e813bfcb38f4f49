"""Tiny language-model jobs under FSDP, used by test_fsdp_jobs.py: launched once under torchrun with 2 processes
(several runs in one process group), and called in-process (`train`) for the one-process references. Each run
writes, per process, the most CPU memory its allocator held at once during the job's start (building the model,
a fine-tune's source weights, the Trainer's shards and a resume's checkpoint), measured by torch's profiler, and
the parameter bytes FSDP held gathered at once during each evaluation and after it.
Usage: python fsdp_job_worker.py OUT_DIR CONFIG TEXT, where OUT_DIR/one-4 is a one-process run to fine-tune."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile

import kqv
from kqv.jobs.lm import LMJob
from kqv.train.trainer import Trainer

CONFIG = """
[data]
tokenizer = "char"
context = 16
val_fraction = 0.2

[model]
d_model = 64
n_heads = 2
n_layers = 4
d_ff = 256
max_len = 16
position = "learned"
dropout = 0.0

[train]
steps = 4
batch_size = 4
lr = 1e-3
warmup_steps = 1
schedule = "constant"
precision = "fp32"
log_every = 1
eval_every = 2
eval_batches = 2
checkpoint_every = 2

[sample]
prompt = "ROMEO:"
count = 1
max_new_tokens = 4
"""

TEXT = "ROMEO: to be, or not to be, that is the question; whether 'tis nobler in the mind!\n" * 40  # 27 characters:
# the embedding's 27 rows are cut 14 + 13, as FSDP2 pads them


class StartMemory:
    """The peak bytes the CPU allocator held at once, from the job's `make_model` to the end of its
    `make_trainer` (the Trainer built: model sharded, checkpoint loaded), above what it held before."""

    def __init__(self):
        self.profiler: profile | None = None
        self.peak = self.kept = 0

    def begin(self) -> None:
        self.profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self.profiler.start()

    def begin_and_end(self) -> None:
        """A start and stop around one allocation, measuring nothing that counts."""
        self.begin()
        torch.zeros(1)
        self.end()

    def end(self) -> None:
        self.profiler.stop()
        events = [e for e in self.profiler.profiler.kineto_results.events() if e.name() == "[memory]"]
        held = 0
        for event in sorted(events, key=lambda e: e.start_ns()):
            held += event.nbytes()
            self.peak = max(self.peak, held)
        self.kept = held  # still held at the end


def gathered_bytes(model: torch.nn.Module) -> int:
    """The bytes of `model`'s parameters that are whole right now: FSDP2 swaps a block's sharded DTensors for
    plain all-gathered tensors while the block runs, and back after."""
    return sum(p.nbytes for p in model.parameters() if not isinstance(p, DTensor) and p.untyped_storage().size())


def evaluations(peaks: list[tuple[int, int]]):
    """Trainer.evaluate, appending to `peaks` for each: the most parameter bytes that the sharded model held
    gathered at once as any of its modules ran (counted in forward hooks: what FSDP gathered, whatever gloo's
    thread does with its buffers later, which made the allocator's peak depend on the machine's load), and the
    bytes of the sharded model gathered or of rank 0's plain model filled after it."""
    evaluate = Trainer.evaluate

    def measured_evaluate(self):
        most = [0]

        def count(module, *_):
            most[0] = max(most[0], gathered_bytes(self.model))

        hooks = [m.register_forward_pre_hook(count) for m in self.model.modules()]
        hooks += [m.register_forward_hook(count) for m in self.model.modules()]
        try:
            return evaluate(self)
        finally:
            for hook in hooks:
                hook.remove()
            filled = sum(p.nbytes for p in self.callers_model.parameters() if not p.is_meta)
            peaks.append((most[0], gathered_bytes(self.model) + filled))

    return measured_evaluate


def measured(memory: StartMemory):
    """LMJob's make_model and make_trainer, timed by `memory` between the start of one and the end of the other."""
    make_model, make_trainer = LMJob.make_model, LMJob.make_trainer

    def start(self, training):
        memory.begin()
        return make_model(self, training)

    def trainer(self, *args, **options):
        made = make_trainer(self, *args, **options)
        memory.end()
        return made

    return start, trainer


def train(out: Path, name: str, steps: int, *overrides: str, resume: bool = False, init: Path | None = None) -> None:
    """The tiny LM job into out/name for `steps` updates (continuing it with `resume`; fine-tuning `init`); the
    start's peak memory of this process goes to out/name-start-rankR.json."""
    memory = StartMemory()
    options = dict(overrides=[*overrides, f"train.steps={steps}"], quiet=True, resume=resume)
    if init is not None:
        options["init"] = str(init)
    if not resume:
        options["overrides"].append(f'data.path="{out / "text.txt"}"')
    kept, evaluate, peaks = (LMJob.make_model, LMJob.make_trainer), Trainer.evaluate, []
    LMJob.make_model, LMJob.make_trainer = measured(memory)
    Trainer.evaluate = evaluations(peaks)
    try:
        kqv.train("lm", out / "tiny.toml" if not resume else None, out=out / name, **options)
    finally:
        (LMJob.make_model, LMJob.make_trainer), Trainer.evaluate = kept, evaluate
    rank = dist.get_rank() if dist.is_initialized() else 0
    (out / f"{name}-start-rank{rank}.json").write_text(json.dumps({"peak": memory.peak, "evaluations": peaks}))


def main(out: Path) -> None:
    """The FSDP jobs: 4 steps straight; 2 steps, then resumed to 4; a fine-tune of the one-process run one-4.
    The profiler starts once before the process group does: its first start sets up its threads, and two CI runs
    lost a rank to SIGSEGV in the first job's start, the profiler's first, beside gloo's first collective."""
    StartMemory().begin_and_end()
    dist.init_process_group("gloo")
    fsdp = 'train.parallel="fsdp"'
    train(out, "fsdp-4", 4, fsdp)
    train(out, "fsdp-2-4", 2, fsdp)
    dist.barrier()
    train(out, "fsdp-2-4", 4, resume=True)
    train(out, "fsdp-tune", 2, fsdp, init=out / "one-4")
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]))
