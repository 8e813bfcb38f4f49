"""`train.loggers`: the metrics of metrics.jsonl, at the same steps, in TensorBoard's event files (read back by
TensorBoard's own EventAccumulator), in metrics.csv and in a Weights & Biases run (offline, read back from its
file); a resume after a crash continues the same curves with no step twice; a missing package and an unknown name
are one-line refusals before anything is written."""

import csv
import json
import math
import sys
from pathlib import Path

import pytest

from kqv.cli.main import main
from kqv.errors import ConfigError
from kqv.train.config import TrainConfig
from kqv.train.metrics import read_metrics
from kqv.train.rundir import RunDirectory
from kqv.train.topology import Topology
from test_cli import TINY
from test_training import config, failing_at, trainer

LOGGED = ("train_loss", "val_loss", "lr", "tokens_per_s", "grad_norm", "peak_memory_mb", "elapsed_s")


def metrics(run: Path, name: str) -> list[tuple[int, float]]:
    """(step, value) of `name` in every metrics.jsonl record that has it."""
    return [(r["step"], r[name]) for r in read_metrics(run / "metrics.jsonl") if r.get(name) is not None]


def tensorboard(run: Path, name: str) -> list[tuple[int, float]]:
    """(step, value) of the scalar `name` as TensorBoard reads the run's event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(name)]


def table(run: Path, name: str) -> list[tuple[int, float]]:
    """(step, value) of the column `name` of metrics.csv, rows with an empty cell left out."""
    with open(run / "metrics.csv", newline="") as file:
        return [(int(row["step"]), float(row[name])) for row in csv.DictReader(file) if row.get(name)]


def same_curve(logged: list[tuple[int, float]], recorded: list[tuple[int, float]], exact: bool = False) -> bool:
    """The same steps, in order, with the same values (TensorBoard keeps float32)."""
    steps = [step for step, _ in logged] == [step for step, _ in recorded]
    close = (a == b if exact else math.isclose(a, b, rel_tol=1e-6) for (_, a), (_, b) in zip(logged, recorded))
    return steps and all(close)


@pytest.fixture
def lm(tmp_path):
    """The command line's tiny LM run, given its config and corpus: `train(*flags)` trains it into tmp_path/run."""
    (tmp_path / "tiny.toml").write_text(TINY.format(position="learned"))
    (tmp_path / "corpus.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    command = ["train", "lm", "--config", str(tmp_path / "tiny.toml"), "--data", str(tmp_path / "corpus.txt")]
    return lambda *flags: main([*command, "--out", str(tmp_path / "run"), "--quiet", *flags])


def test_tensorboard_and_the_table_hold_the_curves_of_metrics_jsonl(lm, tmp_path):
    assert lm("--set", 'train.loggers=["tensorboard","csv"]') == 0
    run = tmp_path / "run"
    assert len(metrics(run, "train_loss")) == 6 and len(metrics(run, "val_loss")) == 2
    for name in LOGGED:
        assert same_curve(tensorboard(run, name), metrics(run, name)), name
        assert same_curve(table(run, name), metrics(run, name), exact=True), name


def test_without_loggers_the_run_holds_kqv_s_own_files_only(lm, tmp_path):
    assert lm() == 0
    assert not {"tensorboard", "metrics.csv", "wandb"} & {p.name for p in (tmp_path / "run").iterdir()}


def test_a_resume_after_a_crash_continues_each_curve_with_no_step_twice(tmp_path):
    """The crash comes after update 5, two updates past the checkpoint of update 3: the resume redoes 4 and 5."""
    cfg = config(steps=8, checkpoint_every=3, loggers=("tensorboard", "csv"))
    trainer(tmp_path / "full", cfg).train()
    with pytest.raises(RuntimeError, match="crash"):
        trainer(tmp_path / "cut", cfg, batches=failing_at(5, RuntimeError("crash"))).train()
    cut = tmp_path / "cut"
    assert [step for step, _ in tensorboard(cut, "train_loss")] == [1, 2, 3, 4, 5]
    assert [step for step, _ in table(cut, "train_loss")] == [1, 2, 3, 4, 5]
    trainer(cut, cfg, if_exists="resume").train()
    for name in ("train_loss", "val_loss", "lr", "tokens_per_s"):
        assert [step for step, _ in metrics(cut, name)] == [step for step, _ in metrics(tmp_path / "full", name)]
        assert same_curve(tensorboard(cut, name), metrics(cut, name)), name  # the redone steps, once each
        assert same_curve(table(cut, name), metrics(cut, name), exact=True), name
    assert same_curve(tensorboard(cut, "train_loss"), metrics(tmp_path / "full", "train_loss"))  # the same run


def test_a_logger_named_on_a_resume_starts_with_the_curves_before_it(tmp_path):
    cfg = config(steps=6, checkpoint_every=3)
    with pytest.raises(RuntimeError, match="crash"):
        trainer(tmp_path, cfg, batches=failing_at(3, RuntimeError("crash"))).train()
    trainer(tmp_path, config(steps=6, checkpoint_every=3, loggers=("tensorboard", "csv")), if_exists="resume").train()
    for name in ("train_loss", "val_loss"):
        assert same_curve(tensorboard(tmp_path, name), metrics(tmp_path, name)), name
        assert same_curve(table(tmp_path, name), metrics(tmp_path, name), exact=True), name


def test_an_overwrite_deletes_the_loggers_files_with_the_run(tmp_path):
    trainer(tmp_path, config(steps=2, loggers=("tensorboard", "csv"))).train()
    assert (tmp_path / "tensorboard").is_dir() and (tmp_path / "metrics.csv").is_file()
    trainer(tmp_path, config(steps=2), if_exists="overwrite").train()
    assert not (tmp_path / "tensorboard").exists() and not (tmp_path / "metrics.csv").exists()


def test_only_the_writing_process_opens_the_loggers(tmp_path):
    for rank in (1, 0):
        with RunDirectory.open(tmp_path / f"rank{rank}", topology=Topology(rank, rank, 2)) as run:
            run.prepare(0, ("csv", "tensorboard"))
            assert len(run.loggers.opened) == (2 if rank == 0 else 0)
    assert (tmp_path / "rank0" / "tensorboard").is_dir() and not (tmp_path / "rank1" / "tensorboard").exists()


def test_a_missing_package_is_one_line_naming_its_install_command_before_anything_is_written(
    lm, tmp_path, capsys, monkeypatch
):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` fails, as where it is missing
    monkeypatch.setattr(RunDirectory, "open", lambda *_, **__: pytest.fail("the run directory was opened"))
    assert lm("--set", 'train.loggers=["csv","tensorboard"]') == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "train.loggers" in error and "pip install tensorboard" in error, error
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        trainer(tmp_path / "python", config(loggers=("tensorboard",)))
    assert not (tmp_path / "python").exists()
    assert config(loggers=("tensorboard",)).loggers == ("tensorboard",)  # a run trained with it still loads


def test_an_unknown_logger_is_one_line_listing_the_valid_ones(lm, capsys, tmp_path):
    assert lm("--set", 'train.loggers=["tensorbord"]') == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "'tensorbord'" in error and "did you mean 'tensorboard'" in error, error
    assert all(f"'{name}'" in error for name in ("tensorboard", "csv", "wandb")), error
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="names 'csv' twice"):
        TrainConfig(steps=1, batch_size=1, loggers=("csv", "csv"))


# -- Weights & Biases, offline ---------------------------------------------------------------------------------


def wandb_files(run: Path) -> list[tuple[str, list[tuple[int, float]]]]:
    """(run id, [(step, train_loss)]) of each W&B session's file under `run`/wandb, in the order they were written,
    read with wandb's own record type from its log format (blocks of 32 KiB, records of 7-byte headers)."""
    from wandb.proto import wandb_internal_pb2

    found = []
    for path in sorted(run.glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, pending, run_id, rows = path.read_bytes(), 7, b"", None, []
        assert data[:4] == b":W&B"
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
                pos += 32768 - pos % 32768
                continue
            length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
            pending, pos = pending + data[pos + 7 : pos + 7 + length], pos + 7 + length
            if kind in (1, 4):  # a whole record, or the last piece of one
                record = wandb_internal_pb2.Record.FromString(pending)
                pending = b""
                if record.WhichOneof("record_type") == "run":
                    run_id = record.run.run_id
                if record.WhichOneof("record_type") == "history":
                    items = record.history.item
                    row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}
                    if "train_loss" in row:
                        rows.append((row["_step"], row["train_loss"]))
        found.append((run_id, rows))
    return found


@pytest.fixture
def fresh_wandb():
    """wandb as a new process finds it: its settings (read from the environment once) dropped before and after."""
    wandb = pytest.importorskip("wandb", reason="wandb is not installed (an optional logger)")
    wandb.teardown()
    yield
    wandb.teardown()


def test_a_wandb_run_offline_holds_the_curve_and_a_resume_continues_the_same_run(tmp_path, monkeypatch, fresh_wandb):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = config(steps=5, checkpoint_every=2, eval_every=100, loggers=("wandb",))
    with pytest.raises(RuntimeError, match="crash"):
        trainer(tmp_path, cfg, batches=failing_at(3, RuntimeError("crash"))).train()
    trainer(tmp_path, cfg, if_exists="resume").train()
    (first, before), (second, after) = wandb_files(tmp_path)
    assert first == second == (tmp_path / "wandb" / "kqv-run-id").read_text()  # one W&B run
    assert [step for step, _ in before] == [1, 2, 3] and [step for step, _ in after] == [3, 4, 5]
    recorded = dict(metrics(tmp_path, "train_loss"))
    assert all(loss == recorded[step] for step, loss in before + after)  # a resume redoes step 3 exactly


def test_wandb_without_a_login_is_one_line_naming_the_login_and_offline_mode(tmp_path, monkeypatch, fresh_wandb):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # no key stored for this test's user either
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    with pytest.raises(ConfigError) as refused:
        trainer(tmp_path / "run", config(steps=2, loggers=("wandb",))).train()
    assert (
        "\n" not in str(refused.value)
        and "wandb login" in str(refused.value)
        and "WANDB_MODE=offline" in str(refused.value)
    )
