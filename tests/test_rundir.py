"""RunDirectory (kqv.train.rundir): opened once per training, it locks (rank 0), inspects the earlier run once
and gives the resume plan; an overwrite deletes the old run's files only when training starts."""

import pytest

from kqv.train.rundir import RunDirectory, RunDirectoryBusy
from kqv.train.topology import Topology
from test_run_lock import HOLD, start
from test_training import config, trainer


def test_a_fresh_directory_has_nothing_to_resume_and_rank_0_writes(tmp_path):
    with RunDirectory.open(tmp_path / "run", "resume", topology=Topology()) as run:
        assert (run.checkpoint, run.resuming, run.step, run.writes) == (None, False, 0, True)
        assert run.metrics_file == tmp_path / "run" / "metrics.jsonl"
        assert run.checkpoint_dir == tmp_path / "run" / "checkpoint"


def test_the_resume_plan_is_the_verified_checkpoint(tmp_path):
    trainer(tmp_path / "run", config(steps=3, checkpoint_every=2)).train()
    with RunDirectory.open(tmp_path / "run", "resume", topology=Topology()) as run:
        assert run.resuming and run.step == 3 and run.checkpoint.config.steps == 3
        assert {p.name for p in run.existing} == {"checkpoint", "metrics.jsonl", "loss.png"}


def test_refusal_and_overwrite(tmp_path):
    trainer(tmp_path / "run", config(steps=2)).train()
    (tmp_path / "run" / "run.toml").write_text("task = 'lm'\n")  # a job's file: not the trainer's to delete
    with pytest.raises(FileExistsError, match=r"already holds a run \(checkpoint, metrics.jsonl, loss.png\)"):
        with RunDirectory.open(tmp_path / "run", topology=Topology()):
            pass
    with RunDirectory.open(tmp_path / "run", "overwrite", topology=Topology()) as run:
        assert not run.resuming and (tmp_path / "run" / "checkpoint").exists()  # nothing deleted yet ...
        run.prepare(0)  # ... until training starts
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".lock", "run.toml"]


def test_only_rank_0_takes_the_lock(tmp_path):
    process = start(HOLD, str(tmp_path / "run"))
    try:
        assert process.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirectoryBusy, match=f"pid {process.pid} "):
            with RunDirectory.open(tmp_path / "run", topology=Topology()):
                pass
        second = Topology(rank=1, local_rank=1, world_size=2)  # another torchrun rank reads, never writes
        with RunDirectory.open(tmp_path / "run", topology=second) as run:
            assert not run.writes
    finally:
        process.kill()
        process.wait()
