"""`kqv train` under torchrun: every rank runs the job, rank 0 alone locks and writes the run directory, and the
run equals one process up to float rounding (tests/test_training.py checks the same for a bare Trainer)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kqv.cli.main import main
from kqv.train.checkpoints import read_checkpoint
from kqv.train.metrics import read_metrics
from kqv.train.runs import read_summary
from test_fsdp import optimizer_state

SRC = str(Path(__file__).resolve().parents[1] / "src")

TINY_LM = """
[data]
tokenizer = "char"
context = 16
val_fraction = 0.2

[model]
d_model = 32
n_heads = 2
n_layers = 1
d_ff = 64
dropout = 0.0

[train]
steps = 3
batch_size = 4
lr = 1e-3
warmup_steps = 1
precision = "fp32"
log_every = 1
eval_every = 3
eval_batches = 2
checkpoint_every = 3

[sample]
prompt = "ROMEO:"
count = 1
max_new_tokens = 8
"""


def test_kqv_train_under_torchrun_with_two_processes_matches_one_process(tmp_path, capsys):
    config, text = tmp_path / "tiny.toml", tmp_path / "t.txt"
    config.write_text(TINY_LM)
    text.write_text("ROMEO: to be, or not to be, that is the question; whether 'tis nobler in the mind\n" * 40)
    common = ["train", "lm", "--config", str(config), "--data", str(text), "--quiet"]
    assert main([*common, "--out", str(tmp_path / "one")]) == 0

    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "kqv.cli",
        *common,
        "--out",
        str(tmp_path / "ddp"),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "in use by another training process" not in done.stderr

    ddp = tmp_path / "ddp"
    assert {
        "run.toml",
        "tokenizer",
        "tokens.safetensors",
        "checkpoint",
        "metrics.jsonl",
        "samples.txt",
        "summary.json",
    } <= {p.name for p in ddp.iterdir()}
    assert read_checkpoint(ddp).step == 3 and read_checkpoint(ddp).state["world_size"] == 2
    assert read_summary(ddp)["steps"] == 3
    one, two = read_metrics(tmp_path / "one" / "metrics.jsonl"), read_metrics(ddp / "metrics.jsonl")
    assert [r["step"] for r in two] == [1, 2, 3]  # rank 0 alone wrote the metrics
    for key in ("train_loss", "val_loss"):
        logged = [(a[key], b[key]) for a, b in zip(one, two) if key in a]
        assert logged and all(key in b for b in two if key in one[b["step"] - 1])
        assert [b for _, b in logged] == pytest.approx([a for a, _ in logged], abs=1e-5, rel=0)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_two_process_run_with_dropout_resumes_bit_exactly_in_new_processes(resumed_runs, parallel):
    straight, resumed = resumed_runs / f"{parallel}-6", resumed_runs / f"{parallel}-3-6"
    assert read_checkpoint(resumed).step == 6 and read_checkpoint(resumed).state["world_size"] == 2
    assert len(read_checkpoint(resumed).state["rng"]) == 2  # both ranks' generators, CUDA's too where in use
    assert curve(resumed) == curve(straight)
    a, b = (load_file(r / "checkpoint" / "model.safetensors") for r in (straight, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    sa, sb = (optimizer_state(r)["state"] for r in (straight, resumed))
    assert sa.keys() == sb.keys() and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])


def curve(run_dir: Path) -> list[tuple]:
    """Every metrics record's step, training loss, gradient norm and validation loss."""
    records = read_metrics(run_dir / "metrics.jsonl")
    return [(r["step"], r.get("train_loss"), r.get("grad_norm"), r.get("val_loss")) for r in records]


@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory) -> Path:
    """resume_worker's runs: DDP and FSDP with dropout, 6 updates straight, and 3 resumed to 6 by a new torchrun."""
    from test_fsdp import torchrun

    out = tmp_path_factory.mktemp("resume")
    worker = str(Path(__file__).with_name("resume_worker.py"))
    torchrun(worker, str(out), "first")
    torchrun(worker, str(out), "second")
    return out


def test_when_a_rank_is_killed_the_survivor_names_it_in_one_line_without_a_traceback(tmp_path):
    """Issue 35: after `kill -9` of rank 1, rank 0's next collective failed with gloo's "Connection closed by peer"
    traceback. torchrun is told to look at its processes only every 20 s, so rank 0 meets the closed connection
    before torchrun's SIGTERM (which the survivor answers alike, after saving a checkpoint)."""
    config, text = tmp_path / "tiny.toml", tmp_path / "t.txt"
    config.write_text(TINY_LM.replace("steps = 3", "steps = 100000"))
    text.write_text("ROMEO: to be, or not to be, that is the question; whether 'tis nobler in the mind\n" * 40)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    launcher = ["torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--monitor-interval", "20"]
    logs, out = tmp_path / "logs", tmp_path / "run"
    command = [sys.executable, "-m", *launcher, "--log-dir", str(logs), "--redirects", "3", "-m", "kqv.cli"]
    command += ["train", "lm", "--config", str(config), "--data", str(text), "--quiet", "--out", str(out)]
    torchrun = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").exists() and time.monotonic() < deadline and torchrun.poll() is None:
            time.sleep(0.2)
        assert (out / "metrics.jsonl").exists(), "the run did not start"
        os.kill(rank_process(torchrun.pid, 1), signal.SIGKILL)
        _, launcher_err = torchrun.communicate(timeout=120)  # the survivor stops by itself, or by torchrun's SIGTERM
    finally:
        torchrun.kill()
    survivor = next(logs.glob("*/attempt_0/0/stderr.log")).read_text()
    assert "Traceback" not in survivor and "Connection closed" not in survivor, survivor[-3000:]
    lines = [line for line in survivor.splitlines() if line.startswith("kqv: error:")]
    assert len(lines) == 1 and "rank 1 of 2 stopped" in lines[0] and "--resume" in lines[0], survivor[-3000:]
    assert torchrun.returncode != 0, launcher_err[-2000:]  # the run failed, and says so


def rank_process(parent: int, rank: int) -> int:
    """The process id of torchrun's worker `parent`'s child that runs `rank`."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) != parent:
                continue
            environ = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if f"RANK={rank}".encode() in environ:
            return int(stat.parent.name)
    raise AssertionError(f"no process of rank {rank} under {parent}")
