"""A NaN or inf loss or gradient never reaches the weights or a checkpoint: the update is skipped and counted, and
too many in a row stop the run with a message that names the step, the last good checkpoint and the causes."""

import math

import pytest
import torch

from kqv.train.checkpoints import read_checkpoint
from kqv.train.metrics import read_metrics
from kqv.train.nonfinite import TrainingDiverged
from kqv.train.trainer import Trainer
from test_training import config, make_model, token_batches, weights


class _InfGradient(torch.autograd.Function):
    """Identity forward, an infinite gradient backward: a finite loss whose gradient is not."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return torch.full_like(grad, math.inf)


def poisoned_loss(bad_batches: set[int], kind: str = "nan"):
    """The LM loss, except for the micro-batches in `bad_batches`: a NaN loss, or an infinite gradient."""
    batches = token_batches(4)

    def loss_fn(model, batch):
        index, (inputs, targets) = batch
        loss = model(inputs, targets)
        if index in bad_batches:
            loss = loss * math.nan if kind == "nan" else _InfGradient.apply(loss)
        return loss

    return (lambda i: (i, batches(i))), loss_fn


def guarded_trainer(run_dir, bad: set[int], kind: str = "nan", **changes) -> Trainer:
    """A dropout-free run at a constant learning rate, so a skipped update is the only difference."""
    batches, loss_fn = poisoned_loss(bad, kind)
    cfg = config(schedule="constant", warmup_steps=0, eval_every=100, **changes)
    return Trainer(make_model(dropout=0.0), cfg, run_dir, train_batches=batches, loss_fn=loss_fn, quiet=True)


@pytest.mark.parametrize("kind", ["nan", "inf-gradient"])
def test_a_non_finite_step_is_skipped_so_the_weights_are_those_before_it(tmp_path, kind):
    before = guarded_trainer(tmp_path / "two", bad=set(), steps=2)
    before.train()
    poisoned = guarded_trainer(tmp_path / "three", bad={2}, kind=kind, steps=3)  # update 3 uses micro-batch 2
    poisoned.train()
    assert poisoned.step == 3 and poisoned.bad_steps == 1
    two, three = weights(tmp_path / "two"), poisoned.model.state_dict()
    assert all(torch.equal(two[name], three[name]) for name in two)  # the skipped update changed nothing
    assert not (tmp_path / "three" / "checkpoint").exists()  # due while updates were skipped: not written


def test_skipped_steps_are_counted_in_metrics_and_training_goes_on(tmp_path):
    run = guarded_trainer(tmp_path, bad={1, 3}, steps=6)
    run.train()
    records = read_metrics(tmp_path / "metrics.jsonl")
    logged = [(r["step"], r["bad_steps"]) for r in records if "train_loss" in r]
    assert logged == [(1, 0), (3, 1), (5, 2), (6, 2)]  # updates 2 and 4 were skipped: no loss to log
    assert all(math.isfinite(r["train_loss"]) for r in records if "train_loss" in r)
    assert read_checkpoint(tmp_path).state["bad_steps"] == 2
    assert all(torch.isfinite(w).all() for w in weights(tmp_path).values())


def test_consecutive_bad_steps_stop_the_run_naming_step_checkpoint_and_causes(tmp_path):
    run = guarded_trainer(tmp_path, bad={4, 5, 6}, steps=10, checkpoint_every=2, max_bad_steps=3)
    with pytest.raises(TrainingDiverged) as stopped:
        run.train()
    message = str(stopped.value)
    assert "stopped at step 7" in message and "steps 5-7" in message
    # step 6's checkpoint was due during the skipped updates 5 and 6: not written, step 4's is the last good one
    assert f"{tmp_path / 'checkpoint'} (step 4, the last one before the skipped updates began" in message
    assert "learning rate" in message and "bf16" not in message and "fp32 itself" in message
    assert "max_bad_steps" in message
    checkpoint = read_checkpoint(tmp_path)
    assert checkpoint.step == 4
    assert all(torch.isfinite(w).all() for w in weights(tmp_path).values())
    assert read_metrics(tmp_path / "metrics.jsonl")[-1]["stopped"] == "non-finite loss or gradient"


def test_bf16_runs_name_the_bf16_range_among_the_causes(tmp_path):
    run = guarded_trainer(tmp_path, bad={0}, steps=3, max_bad_steps=1, precision="bf16")
    with pytest.raises(TrainingDiverged, match="bf16 autocast") as stopped:
        run.train()
    assert "no checkpoint was written" in str(stopped.value)


def test_weights_that_overflow_are_never_checkpointed(tmp_path):
    run = guarded_trainer(tmp_path, bad=set(), steps=2, checkpoint_every=1)
    run.train()
    saved = weights(tmp_path)
    with torch.no_grad():
        next(run.model.parameters()).fill_(math.inf)
    with pytest.raises(TrainingDiverged, match="no longer finite"):
        run.save_checkpoint()
    assert all(torch.equal(saved[n], w) for n, w in weights(tmp_path).items())


def test_max_bad_steps_must_be_at_least_one():
    with pytest.raises(ValueError, match="max_bad_steps"):
        config(max_bad_steps=0)


def test_an_interrupt_while_updates_are_skipped_keeps_the_last_good_checkpoint(tmp_path):
    batches, loss_fn = poisoned_loss({2, 3})
    cfg = config(schedule="constant", warmup_steps=0, eval_every=100, steps=10, checkpoint_every=2)

    def interrupted(i):
        if i == 4:  # update 5, after the skipped updates 3 and 4
            raise KeyboardInterrupt
        return batches(i)

    run = Trainer(make_model(dropout=0.0), cfg, tmp_path, train_batches=interrupted, loss_fn=loss_fn, quiet=True)
    with pytest.raises(KeyboardInterrupt):
        run.train()
    assert run.step == 4 and read_checkpoint(tmp_path).step == 2


LM_CONFIG = """
[data]
tokenizer = "char"
context = 16
[model]
d_model = 16
n_heads = 2
n_layers = 1
d_ff = 32
dropout = 0.0
[train]
batch_size = 4
warmup_steps = 2
eval_every = 100
checkpoint_every = 5
log_every = 1
precision = "fp32"
[sample]
prompt = "To"
count = 1
max_new_tokens = 8
"""


def test_a_learning_rate_blow_up_keeps_the_good_checkpoint_and_the_model_still_generates(tmp_path, capsys):
    """Issue 25, item 1: lr 1e10 makes update 11 finite but ruinous (weights ~1e10) and every later loss NaN; the
    checkpoint due at step 15 is not written, the stop names step 10's, and that one loads and generates."""
    from kqv.api import load
    from kqv.cli import main

    (tmp_path / "run.toml").write_text(LM_CONFIG)
    (tmp_path / "tiny.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    out = tmp_path / "R2"
    common = ["train", "lm", "--config", str(tmp_path / "run.toml"), "--data", str(tmp_path / "tiny.txt"), "--quiet"]
    constant = ["--set", 'train.schedule="constant"', "--out", str(out)]
    assert main([*common, *constant, "--steps", "10"]) == 0
    good = weights(out)
    assert main([*common, *constant, "--resume", "--steps", "40", "--set", "train.lr=1e10"]) == 2
    error = capsys.readouterr().err
    assert "stopped at step 16" in error and "steps 12-16" in error
    assert f"{out / 'checkpoint'} (step 10, the last one before the skipped updates began" in error
    assert read_checkpoint(out).step == 10
    assert all(torch.equal(good[name], w) for name, w in weights(out).items())  # the good one, untouched
    run = load(out)
    logits = run.model(torch.tensor([[1, 2, 3]]))
    assert torch.isfinite(logits).all()
    assert main(["generate", str(out), "--prompt", "To"]) == 0
    assert main([*common, *constant, "--resume", "--steps", "20", "--set", "train.lr=1e-3"]) == 0
    assert read_checkpoint(out).step == 20 and all(torch.isfinite(w).all() for w in weights(out).values())


def test_a_compiled_step_never_finite_from_its_first_update_points_at_the_compiled_kernels():
    """A compiled step whose gradient was never finite, from update 1 on, is more likely the compiled kernels' fault
    than the data's or the rate's (an Intel AMX Xeon's compiled bf16 step did that): the message says how to tell.
    A streak after good updates, or an uncompiled step, gets the usual causes only."""
    from kqv.train.nonfinite import diverged_message

    hint = "train once with train.compile = false to tell"
    compiled = config(compile=True, device="cpu", precision="bf16")
    assert hint in diverged_message(compiled, "the gradient norm is nan", (1, 2, 3, 4, 5), None)
    assert "compiled step (bf16 on cpu)" in diverged_message(compiled, "nan", (1, 2, 3), None)
    assert hint not in diverged_message(compiled, "nan", (7, 8, 9), None)
    assert hint not in diverged_message(config(compile=False, device="cpu"), "nan", (1, 2, 3), None)
    assert hint not in diverged_message(config(compile="auto", device="cpu"), "nan", (1, 2, 3), None)  # not compiled
