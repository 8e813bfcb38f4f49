"""One writer per run directory, any number of readers: a second writer is refused with the holder's pid, a
killed holder leaves no stale lock, and a reader during training always sees a complete checkpoint."""

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as load_file_bytes

from kqv.train import rundir
from kqv.train.checkpoints import load_weights, read_checkpoint
from kqv.train.layout import MODEL_FILE
from kqv.train.rundir import RunDirectory, RunDirectoryBusy, check_run_lock, hold_run_lock
from kqv.train.topology import Topology
from test_training import config, make_model, trainer

SRC = str(Path(__file__).resolve().parents[1] / "src")
TESTS = str(Path(__file__).resolve().parent)  # a child imports test_training, as this module does
HOLD = (
    "from kqv.train.rundir import hold_run_lock; import sys, time\n"
    "with hold_run_lock(sys.argv[1]):\n    print('locked', flush=True); time.sleep(120)\n"
)


def start(script: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, TESTS]), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True, env=env)


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of tmp_path / 'run', killed with SIGKILL at the end."""
    process = start(HOLD, str(tmp_path / "run"))
    assert process.stdout.readline().strip() == "locked"
    yield process
    process.kill()
    process.wait()


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path, holder):
    with pytest.raises(RunDirectoryBusy, match=f"pid {holder.pid} "):
        trainer(tmp_path / "run", config(steps=2))
    with pytest.raises(RunDirectoryBusy, match=f"pid {holder.pid} "):
        check_run_lock(tmp_path / "run")


@pytest.mark.parametrize("if_exists", ["resume", "overwrite"])
def test_resume_or_overwrite_under_a_running_writer_changes_nothing(tmp_path, if_exists):
    trainer(tmp_path / "run", config(steps=2)).train()
    before = snapshot(tmp_path / "run")
    process = start(HOLD, str(tmp_path / "run"))
    try:
        assert process.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirectoryBusy, match=str(process.pid)):
            trainer(tmp_path / "run", config(steps=4), if_exists=if_exists).train()
    finally:
        process.kill()
        process.wait()
    after = snapshot(tmp_path / "run")
    assert {k: v for k, v in after.items() if k != ".lock"} == {k: v for k, v in before.items() if k != ".lock"}


def test_kill_9_of_the_holder_leaves_no_stale_lock(tmp_path, holder):
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with hold_run_lock(tmp_path / "run") as lock_file:  # at once: the kernel released the dead process's lock
        assert lock_file.read_text().startswith(f"pid {os.getpid()} ")


def test_the_lock_is_not_reentrant_and_is_released_after_training(tmp_path):
    """A run directory opened once holds the lock for its trainer; a second writer in the same process is refused
    like one in another process (plain flock), and the lock is free once the block ends."""
    with RunDirectory.open(tmp_path / "run", topology=Topology()) as run:
        with pytest.raises(RunDirectoryBusy, match=f"pid {os.getpid()} "):
            trainer(tmp_path / "run", config(steps=2))  # a trainer given the path opens it itself: refused
        trainer(run, config(steps=2)).train()  # the trainer given the opened directory takes no lock
        with pytest.raises(RunDirectoryBusy):
            check_run_lock(tmp_path / "run")
    process = start(HOLD, str(tmp_path / "run"))  # now free for another process
    try:
        assert process.stdout.readline().strip() == "locked"
    finally:
        process.kill()
        process.wait()


def test_kqv_train_takes_the_lock_once_per_training(tmp_path, monkeypatch):
    """The job opens the run directory once and its Trainer uses it: one lock for the whole training."""
    from kqv.cli.main import main

    taken = []
    real = rundir.hold_run_lock
    monkeypatch.setattr(rundir, "hold_run_lock", lambda path: taken.append(path) or real(path))
    text = tmp_path / "text.txt"
    text.write_text("ROMEO: to be, or not to be, that is the question\n" * 50)  # the sample's prompt: ROMEO:
    for flag in ([], ["--resume"], ["--overwrite"]):
        taken.clear()
        assert (
            main(
                [
                    "train",
                    "lm",
                    "--config",
                    "quick",
                    "--data",
                    str(text),
                    "--out",
                    str(tmp_path / "run"),
                    "--quiet",
                    "--set",
                    "train.steps=2",
                    "--set",
                    "model.n_layers=1",
                    *flag,
                ]
            )
            == 0
        )
        assert taken == [tmp_path / "run"], flag


TRAIN_FOREVER = textwrap.dedent("""
    import sys, torch
    from test_training import config, trainer
    torch.set_num_threads(1)
    run = trainer(sys.argv[1], config(steps=100_000, checkpoint_every=1, eval_every=100_000, log_every=50))
    print("training", flush=True)
    run.train()
""")


def test_a_reader_during_training_always_sees_a_complete_checkpoint(tmp_path):
    """A writer swaps in a new checkpoint after every update; every read verifies against the SHA-256 recorded
    in that checkpoint's state.json, and the weights it loads are those bytes."""
    process = start(TRAIN_FOREVER, str(tmp_path / "run"))
    try:
        assert process.stdout.readline().strip() == "training"
        while not (tmp_path / "run" / "checkpoint").exists():
            time.sleep(0.01)
        steps, deadline = set(), time.monotonic() + 8
        model = make_model()
        while time.monotonic() < deadline:
            checkpoint = read_checkpoint(tmp_path / "run")
            data = checkpoint.open(MODEL_FILE).read()
            assert hashlib.sha256(data).hexdigest() == checkpoint.state["files"][MODEL_FILE]
            load_weights(model, checkpoint)
            assert next(iter(model.state_dict().values())).isfinite().all()
            steps.add(checkpoint.step)
            checkpoint.close()
        assert process.poll() is None, "the writer died"
        assert len(steps) >= 5, f"the reader saw only steps {sorted(steps)}"
    finally:
        process.kill()
        process.wait()


REWRITE_FOREVER = textwrap.dedent("""
    import sys, torch
    from pathlib import Path
    from kqv.train.checkpoints import FORMAT, write_checkpoint
    from kqv.train.config import TrainConfig
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    config = TrainConfig(steps=1, batch_size=1).to_dict()
    print("writing", flush=True)
    for i in range(1, 1_000_000):  # checkpoint i: every weight, the optimizer's lr and the rng tensor equal i
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(i)
        optimizer.param_groups[0]["lr"] = float(i)
        state = {"format": FORMAT, "step": i, "config": config, "extra_state": {}}
        write_checkpoint(Path(sys.argv[1]), model, optimizer, state, {"rank0": torch.full((4,), i)})
""")


def test_checkpoints_rewritten_in_a_loop_are_never_read_torn(tmp_path):
    """A writer process swaps in checkpoint after checkpoint as fast as it can; a reader loading them all the
    while gets, every time, files whose SHA-256 (computed here) matches the one recorded in state.json, and all
    of them from one checkpoint (weights, optimizer and generator state all carry the same step), or a clean
    retry (read_checkpoint's own, or its error asking to try again)."""
    process = start(REWRITE_FOREVER, str(tmp_path / "run"))
    loads, retries, steps = 0, 0, set()
    try:
        assert process.stdout.readline().strip() == "writing"
        while not (tmp_path / "run" / "checkpoint").exists():
            time.sleep(0.01)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                checkpoint = read_checkpoint(tmp_path / "run")
            except RuntimeError as error:  # replaced 20 times while being read: try again, as it says
                assert "try again" in str(error)
                retries += 1
                continue
            for name, digest in checkpoint.state["files"].items():
                assert hashlib.sha256(checkpoint.open(name).read()).hexdigest() == digest
            load_weights(model, checkpoint)
            step = checkpoint.step
            assert all(torch.equal(p, torch.full_like(p, step)) for p in model.parameters())
            optimizer = torch.load(checkpoint.open("optimizer.pt"), weights_only=True)
            assert optimizer["param_groups"][0]["lr"] == step
            assert torch.equal(
                load_file_bytes(checkpoint.open("rng.safetensors").read())["rank0"], torch.full((4,), step)
            )
            checkpoint.close()
            loads, steps = loads + 1, steps | {step}
        assert process.poll() is None, "the writer died"
    finally:
        process.kill()
        process.wait()
    assert loads >= 20 and len(steps) >= 10, f"{loads} loads ({retries} retries) saw only steps {sorted(steps)}"


@pytest.mark.parametrize("flag", ["--overwrite", "--resume"])
def test_kqv_train_under_a_running_writer_is_refused_before_it_writes_anything(tmp_path, capsys, flag):
    """The job holds the lock from its first write (run.toml, tokenizer, data come before the Trainer): a second
    `kqv train` gets `kqv: error:` naming the holder, exit status 2, and the run directory is untouched."""
    from kqv.cli.main import main

    run = tmp_path / "run"
    trainer(run, config(steps=2)).train()
    (run / "run.toml").write_text("task = 'lm'\n")  # what the job would rewrite first
    (run / "tokens.safetensors").write_bytes(b"the running writer's data")
    before = snapshot(run)
    process = start(HOLD, str(run))
    try:
        assert process.stdout.readline().strip() == "locked"
        text = tmp_path / "text.txt"
        text.write_text("to be, or not to be, that is the question\n" * 50)
        status = main(
            [
                "train",
                "lm",
                "--config",
                "quick",
                "--data",
                str(text),
                "--out",
                str(run),
                "--quiet",
                "--set",
                "train.steps=3",
                flag,
            ]
        )
    finally:
        process.kill()
        process.wait()
    error = capsys.readouterr().err
    assert status == 2 and error.startswith("kqv: error: ") and f"pid {process.pid} " in error
    assert "Traceback" not in error
    after = snapshot(run)
    assert {k: v for k, v in after.items() if k != ".lock"} == {k: v for k, v in before.items() if k != ".lock"}
