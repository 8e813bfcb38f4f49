"""A run stopped by `kill -9`, Ctrl-C or SIGTERM at any moment (checkpoint writes included) and resumed with `--resume`
ends bit-identical to the same run left alone: benchmarks/crash_resume.py at a tiny size, a few stops."""

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "crash_resume.py"
STOPS = [
    {"kind": "write", "write": 2, "delay_ms": 4.0, "signal": "SIGKILL"},  # inside or just after a write
    {"kind": "swap", "write": 1, "delay_ms": 0.0, "signal": "SIGKILL"},  # between a swap's two renames
    {"kind": "write", "write": 1, "delay_ms": 2.0, "signal": "SIGINT"},  # Ctrl-C
    {"kind": "write", "write": 2, "delay_ms": 3.0, "signal": "SIGTERM"},  # timeout, kill, a cluster scheduler
]


@pytest.fixture(scope="module")
def crash():
    spec = importlib.util.spec_from_file_location("crash_resume", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def stopped(crash, tmp_path_factory):
    """The reference run (trained meanwhile in its own process) and the stopped-and-resumed one."""
    work = tmp_path_factory.mktemp("crash")
    base = crash.prepare(work, steps=40, checkpoint_every=3)
    reference = crash.start_reference(base, work / "reference")
    rows = crash.stopped_run(base, work / "stopped", STOPS, crash.signal.SIGKILL)
    crash.finish_reference(reference)
    return crash, work, rows


def test_every_stop_leaves_a_verified_checkpoint_and_the_resume_goes_on(stopped):
    _, _, rows = stopped
    assert [(row["signal"], row["recovered"]) for row in rows] == [(stop["signal"], True) for stop in STOPS]
    assert [row["exit_status"] for row in rows] == [-9, -9, 130, 143]  # kqv's statuses after Ctrl-C and SIGTERM
    assert all(row["checkpoint_step"] is None or 0 < row["checkpoint_step"] < 40 for row in rows)


def test_killed_and_interrupted_run_ends_bit_identical_to_the_uninterrupted_one(stopped):
    crash, work, _ = stopped
    assert crash.same_final_state(work / "stopped", work / "reference") == {
        "weights": True,
        "optimizer": True,
        "steps": True,
    }


def test_the_comparison_sees_a_single_changed_bit(stopped, tmp_path):
    """The bit-identity check itself can fail: the reference against a copy with one weight moved by one ulp."""
    crash, work, _ = stopped
    shutil.copytree(work / "reference", tmp_path / "copy")
    path = tmp_path / "copy" / "checkpoint" / "model.safetensors"
    weights = load_file(path)
    first = next(iter(weights.values())).view(-1)
    first[0] = torch.nextafter(first[0], torch.tensor(1e9))
    save_file(weights, path)
    assert crash.same_final_state(tmp_path / "copy", work / "reference")["weights"] is False


def test_a_run_stopped_before_its_first_checkpoint_resumes_from_step_0(tmp_path, caplog):
    """`--resume` (if_exists='resume') on a run that died before any checkpoint trains it from the start, drops the
    dead run's metrics records, and ends equal to a run never stopped."""
    from test_training import config, curve, failing_at, trainer, weights

    cfg = config(steps=6, checkpoint_every=100)
    trainer(tmp_path / "full", cfg).train()
    with pytest.raises(RuntimeError, match="crash"):  # dies in update 4, having logged steps 1-3, no checkpoint
        trainer(tmp_path / "cut", cfg, batches=failing_at(3, RuntimeError("crash"))).train()
    assert not (tmp_path / "cut" / "checkpoint").exists() and curve(tmp_path / "cut")
    trainer(tmp_path / "cut", cfg, if_exists="resume").train()
    assert "nothing to resume" in caplog.text and "training from step 0" in caplog.text
    assert curve(tmp_path / "cut") == curve(tmp_path / "full")
    full, cut = weights(tmp_path / "full"), weights(tmp_path / "cut")
    assert all(torch.equal(full[name], cut[name]) for name in full)
