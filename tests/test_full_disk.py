"""A disk that fills up at any write of a training (issue 35): the command ends with one line that says so, and
the run directory is either as it was or a valid run that `--resume` continues; no temporary file stays.

Every write primitive a training uses (open for writing, os.open creating a file, os.replace/rename, torch.save,
safetensors' savers) is counted in a clean run, then made to fail with ENOSPC at call k, for every k."""

import builtins
import errno
import io
import os
from pathlib import Path

import pytest
import torch

from kqv.cli.main import main
from kqv.errors import DiskFullError
from kqv.train import checkpoints, files
from kqv.train.checkpoints import read_checkpoint
from test_cli_fuzz import kqv

RUN = """
[data]
tokenizer = "char"
context = 8
[model]
d_model = 8
n_heads = 2
n_layers = 1
d_ff = 16
dropout = 0.0
[train]
steps = 2
batch_size = 2
warmup_steps = 1
eval_every = 100
eval_batches = 1
checkpoint_every = 1
log_every = 2
precision = "fp32"
[sample]
prompt = "To"
count = 1
max_new_tokens = 2
"""


class FullDisk:
    """Counts the write calls of everything patched by `install`; with `fail_at=k` the k-th raises ENOSPC."""

    def __init__(self, fail_at: int | None = None):
        self.calls, self.fail_at = 0, fail_at

    def hit(self, what: str) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), what)

    def install(self, monkeypatch) -> None:
        real_open, real_os_open, real_replace, real_rename = builtins.open, os.open, os.replace, os.rename

        def open_(file, mode="r", *args, **kwargs):
            if any(c in mode for c in "wax+"):
                self.hit(str(file))
            return real_open(file, mode, *args, **kwargs)

        def os_open(path, flags, *args, **kwargs):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                self.hit(str(path))
            return real_os_open(path, flags, *args, **kwargs)

        def wrap(function):
            def written(*args, **kwargs):
                self.hit(function.__name__)
                return function(*args, **kwargs)

            return written

        monkeypatch.setattr(builtins, "open", open_)
        monkeypatch.setattr(io, "open", open_)
        monkeypatch.setattr(os, "open", os_open)
        monkeypatch.setattr(os, "replace", wrap(real_replace))
        monkeypatch.setattr(os, "rename", wrap(real_rename))
        monkeypatch.setattr(torch, "save", wrap(torch.save))
        monkeypatch.setattr(checkpoints, "save_model", wrap(checkpoints.save_model))
        monkeypatch.setattr(checkpoints, "save_file", wrap(checkpoints.save_file))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    (root / "run.toml").write_text(RUN)
    (root / "corpus.txt").write_text("To be, or not to be, that is the question.\n" * 8)
    return root


def train(setup: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "lm", "--config", str(setup / "run.toml"), "--data", str(setup / "corpus.txt"),
            "--out", str(out), "--quiet", *extra]  # fmt: skip


def leftovers(run: Path) -> list[str]:
    return [p.name for p in run.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".checkpoint-tmp-")]


def check_every_failure(setup: Path, tmp_path: Path, monkeypatch, make_start, argv_of) -> int:
    """For each k: make the starting state, run with the k-th write failing, then check the outcome. Returns
    the number of writes of the clean run."""
    start = make_start(tmp_path / "count")
    with monkeypatch.context() as patch:
        counter = FullDisk()
        counter.install(patch)
        assert kqv(argv_of(start)) == (0, "")
    assert counter.calls > 10
    for k in range(1, counter.calls + 1):
        run = make_start(tmp_path / f"k{k}")
        with monkeypatch.context() as patch:
            FullDisk(fail_at=k).install(patch)
            status, error = kqv(argv_of(run))
        assert status == 2 and error.startswith("kqv: error: ") and error.count("\n") == 1, (k, error)
        assert "disk is full" in error, (k, error)
        if run.exists():
            assert leftovers(run) == [], (k, leftovers(run))
            # the old state or a valid new one: --resume continues it to the end
            assert main(train(setup, run, "--resume", "--steps", "3")) == 0, k
            assert read_checkpoint(run).step == 3
    return counter.calls


def test_a_fresh_run_on_a_disk_that_fills_at_any_write(setup, tmp_path, monkeypatch):
    calls = check_every_failure(setup, tmp_path, monkeypatch, lambda run: run, lambda run: train(setup, run))
    assert calls > 10


def test_a_resumed_run_on_a_disk_that_fills_at_any_write(setup, tmp_path, monkeypatch):
    def trained(run: Path) -> Path:
        assert main(train(setup, run)) == 0
        return run

    resume = lambda run: train(setup, run, "--resume", "--steps", "3")  # noqa: E731
    check_every_failure(setup, tmp_path, monkeypatch, trained, resume)


def test_torch_save_s_deep_error_on_a_full_disk_is_said_as_a_full_disk(setup, tmp_path, monkeypatch):
    """Issue 35: on a full disk torch.save raises `RuntimeError: [enforce fail at inline_container.cc:672] unexpected
    pos`; the write removes its partial files, keeps the last good checkpoint and says how much room it needed."""
    run = tmp_path / "run"
    assert main(train(setup, run)) == 0
    state = (run / "checkpoint" / "state.json").read_bytes()
    free = iter([10**12])  # room when the write starts, then none

    def filling(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch, "save", filling)
    monkeypatch.setattr(files, "free_bytes", lambda path: next(free, 0))
    status, error = kqv(train(setup, run, "--resume", "--steps", "3"))
    assert status == 2 and error.count("\n") == 1, error
    assert error.startswith("kqv: error: the disk is full: ") and f"needed at {run / 'checkpoint'}" in error
    assert "kB needed" in error or "MB needed" in error
    assert (run / "checkpoint" / "state.json").read_bytes() == state and leftovers(run) == []
    monkeypatch.undo()  # room again
    assert main(train(setup, run, "--resume", "--steps", "3")) == 0 and read_checkpoint(run).step == 3


def test_a_deep_error_with_room_on_the_disk_is_not_called_a_full_disk(tmp_path):
    with pytest.raises(RuntimeError, match="unrelated"):
        with files.disk_full_reported(tmp_path / "x", 10):
            raise RuntimeError("unrelated")
    with pytest.raises(DiskFullError, match="the disk is full: 2.0 MB needed at"):
        with files.disk_full_reported(tmp_path / "x", 2_000_000):
            raise OSError(errno.ENOSPC, "No space left on device")


def test_a_checkpoint_the_disk_has_no_room_for_is_refused_before_it_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "free_bytes", lambda path: 100)
    model = torch.nn.Linear(10, 10)
    with pytest.raises(DiskFullError, match=r"the disk is full: 0.4 kB needed at .*checkpoint \(0.1 kB free\)"):
        checkpoints.write_checkpoint(tmp_path, model, {"state": {}, "param_groups": []}, {"format": 1}, {})
    assert list(tmp_path.iterdir()) == []
