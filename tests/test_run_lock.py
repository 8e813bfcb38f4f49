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

from kqv.train.checkpoints import MODEL_FILE, load_weights, read_checkpoint
from kqv.train.lock import RunDirectoryBusy, check_run_lock, hold_run_lock
from test_training import config, make_model, trainer

SRC = str(Path(__file__).resolve().parents[1] / "src")
HOLD = "from kqv.train.lock import hold_run_lock; import sys, time\n" \
       "with hold_run_lock(sys.argv[1]):\n    print('locked', flush=True); time.sleep(120)\n"


def start(script: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
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


def test_the_lock_is_reentrant_within_a_process_and_released_after_training(tmp_path):
    with hold_run_lock(tmp_path / "run"):
        run = trainer(tmp_path / "run", config(steps=2))  # the job holds the lock and builds its trainer
        run.train()
    process = start(HOLD, str(tmp_path / "run"))  # now free for another process
    try:
        assert process.stdout.readline().strip() == "locked"
    finally:
        process.kill()
        process.wait()


TRAIN_FOREVER = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, sys.argv[2])
    from test_training import config, trainer
    torch.set_num_threads(1)
    run = trainer(sys.argv[1], config(steps=100_000, checkpoint_every=1, eval_every=100_000, log_every=50))
    print("training", flush=True)
    run.train()
""")


def test_a_reader_during_training_always_sees_a_complete_checkpoint(tmp_path):
    """A writer swaps in a new checkpoint after every update; every read verifies against the SHA-256 recorded
    in that checkpoint's state.json, and the weights it loads are those bytes."""
    process = start(TRAIN_FOREVER, str(tmp_path / "run"), str(Path(__file__).parent))
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
