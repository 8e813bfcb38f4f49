"""A run over two nodes, as torchrun starts one: two torchrun agents on this machine (`--nnodes=2
--nproc-per-node=1`, c10d rendezvous on a free port), each launched as its own process, train a sharded (FSDP)
model over gloo. Its checkpoints are sharded (every rank writes its own rows: `kqv.train.shards`); killed with
SIGKILL after a checkpoint and resumed by new agents, it ends with the loss curve of the same run left alone. A
rank that sees another checkpoint step than rank 0 (a node without the shared file system) makes every rank
refuse at once, with the shared-file-system requirement said, instead of hanging."""

import hashlib
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import fsdp_worker
from kqv.errors import ProcessLost, RunError
from kqv.train import distributed, shards
from kqv.train.checkpoints import load_weights, read_checkpoint
from kqv.train.metrics import read_metrics
from kqv.train.shards import is_sharded, whole_weights

SRC = str(Path(__file__).resolve().parents[1] / "src")
WORKER = str(Path(__file__).with_name("nodes_worker.py"))
GROUP = {"start_new_session": True}  # each agent leads its own process group, killed whole after a hang
TIMEOUT = 240  # seconds for one launch of both agents: a hang fails the test instead of stalling the suite


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def two_nodes(out: Path, mode: str) -> list[tuple[int | None, str]]:
    """Run nodes_worker.py's `mode` on two torchrun agents, as on two nodes; (exit status, stderr) of each agent,
    the status None for a launch that outlived TIMEOUT (a hang), whose agents are then killed, each agent with its
    processes (its own process group)."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    env.update(PYTHONPATH=SRC + os.pathsep + str(Path(WORKER).parent), OMP_NUM_THREADS="1")
    port = free_port()
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
    launcher += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=kqv-nodes", "--max-restarts=0"]
    logs = [out / f"{mode}-agent{i}.log" for i in range(2)]  # files, not pipes: no agent blocks on a full pipe
    agents = []
    try:
        for log in logs:
            with open(log, "w") as stderr:
                command = [*launcher, WORKER, str(out), mode]
                agents.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr, **GROUP))
        statuses = [agent.wait(timeout=TIMEOUT) for agent in agents]
        return [(status, log.read_text()) for status, log in zip(statuses, logs)]
    except subprocess.TimeoutExpired:
        return [(None, f"the launch {mode!r} did not end within {TIMEOUT} s (a hang)")] * 2
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, list, list, list]:
    """The straight run and the killed one (one launch), the refusal of two ranks apart, then the resume."""
    out = tmp_path_factory.mktemp("nodes")
    trained = two_nodes(out, "train")
    if (out / "killed").is_dir():
        shutil.copytree(out / "killed", out / "killed-at-4")  # as the kill left it
    apart = two_nodes(out, "apart")
    resumed = two_nodes(out, "resume")
    return out, trained, apart, resumed


def losses(run_dir: Path) -> list[tuple[int, float, float]]:
    return [(r["step"], r["train_loss"], r["grad_norm"]) for r in read_metrics(run_dir / "metrics.jsonl")]


def test_a_killed_two_node_run_resumes_to_the_loss_curve_of_the_run_left_alone(runs):
    out, trained, _, agents = runs
    assert all(status != 0 for status, _ in trained)  # the agents saw their processes killed
    assert all(status == 0 for status, _ in agents), [err[-3000:] for _, err in agents]
    straight, resumed = losses(out / "straight"), losses(out / "killed")
    assert [step for step, *_ in resumed] == [1, 2, 3, 4, 5, 6]
    flat = [figure for _, *figures in straight for figure in figures]  # training losses and gradient norms
    assert [figure for _, *figures in resumed for figure in figures] == pytest.approx(flat, abs=1e-6, rel=0)
    a, b = (load_weights_of(out / name) for name in ("straight", "killed"))
    assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6


def load_weights_of(run_dir: Path) -> dict[str, torch.Tensor]:
    return whole_weights(read_checkpoint(run_dir))


def test_the_checkpoint_is_written_in_shards_by_each_rank_and_verified(runs):
    out, *_ = runs
    checkpoint = read_checkpoint(out / "killed")
    assert checkpoint.step == 6 and is_sharded(checkpoint) and checkpoint.state["world_size"] == 2
    shards = sorted(p.name for p in (out / "killed" / "checkpoint" / "shards").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # each rank's own file, and the index
    recorded = json.loads((out / "killed" / "checkpoint" / "state.json").read_text())["files"]
    assert {f"shards/{name}" for name in shards} <= recorded.keys()
    assert "optimizer.pt" not in recorded  # no rank gathered the optimizer state
    # the final checkpoint holds the whole weights for export and inference, equal to the shards' rows
    exported, sharded = load_file(out / "killed" / "checkpoint" / "model.safetensors"), whole_weights(checkpoint)
    assert "model.safetensors" in recorded and exported and all(torch.equal(exported[k], sharded[k]) for k in exported)


def test_a_rank_that_sees_another_checkpoint_step_makes_every_rank_refuse_instead_of_hanging(runs):
    _, _, apart, _ = runs
    for status, err in apart:
        lines = [line for line in err.splitlines() if line.startswith("kqv: error:")]
        assert status is not None and status != 0 and len(lines) == 1, err[-3000:]
        assert "rank 0 on" in lines[0] and "sees the checkpoint of step 4" in lines[0]
        assert "rank 1 on" in lines[0] and "sees no checkpoint" in lines[0]
        assert "a file system every node sees" in lines[0]


def test_a_tampered_shard_index_is_refused_without_running_its_code(runs, tmp_path):
    """The shards' index is a pickle: one that names a function to run (its digest recorded to match, as a
    tamperer would) is refused, and the function never runs."""
    out, *_ = runs
    run = tmp_path / "run"
    shutil.copytree(out / "killed", run)
    marker = tmp_path / "ran"
    evil = pickle.dumps(Evil(str(marker)))
    (run / "checkpoint" / "shards" / ".metadata").write_bytes(evil)
    state = json.loads((run / "checkpoint" / "state.json").read_text())
    state["files"]["shards/.metadata"] = hashlib.sha256(evil).hexdigest()
    (run / "checkpoint" / "state.json").write_text(json.dumps(state))
    with pytest.raises(RunError, match="index that is damaged or not kqv's.*never runs code"):
        whole_weights(read_checkpoint(run))
    assert not marker.exists()


class Evil:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def test_a_survivor_names_the_ranks_of_another_node_it_cannot_look_at(monkeypatch):
    """A process on another node cannot be looked at from here: the survivor lists that node's ranks instead of
    claiming a lost one."""
    monkeypatch.setattr(distributed, "_PROCESSES", [(socket.gethostname(), os.getpid()), ("another-node", 1)])
    assert distributed.remote_ranks() == [1] and distributed.lost_ranks() == []
    with pytest.raises(ProcessLost, match=r"a process on another node \(one of ranks 1\) stopped or lost its conn"):
        with distributed.stops_when_a_process_is_lost(0, 2):
            raise RuntimeError("[gloo] Connection closed by peer")


def test_rank_0_refuses_a_checkpoint_whose_shards_it_cannot_see(tmp_path):
    """Each node wrote its shards into its own disk: rank 0 sees only its own, so it writes and swaps in nothing,
    and says why (every rank then stops with its words: `_from_rank0`)."""
    staging = tmp_path / ".checkpoint-tmp-x"
    (staging / "shards").mkdir(parents=True)
    (staging / "shards" / "__0_0.distcp").write_bytes(b"rank 0's rows")
    digests = {"shards/__0_0.distcp": "0" * 64, "shards/__1_0.distcp": "1" * 64}  # rank 1 saw its own file
    finished = []
    with pytest.raises(RunError, match=r"does not see shards/__1_0.distcp .*a file system every node sees"):
        shards._complete(staging, tmp_path / "checkpoint", digests, lambda *written: finished.append(written))
    assert not finished and not (tmp_path / "checkpoint").exists()


def test_a_checkpoint_in_shards_alone_loads_whole_into_one_process_for_inference(runs):
    """A checkpoint before the last holds no model.safetensors: `load_weights` (kqv.load, generate, eval, export)
    puts the whole weights together from the shards, in one process."""
    out, *_ = runs
    checkpoint = read_checkpoint(out / "killed-at-4")
    assert checkpoint.step == 4 and "model.safetensors" not in checkpoint.files
    model, fresh = fsdp_worker.model(), fsdp_worker.model().state_dict()
    load_weights(model, checkpoint)
    loaded, sharded = model.state_dict(), whole_weights(checkpoint)
    assert loaded.keys() == sharded.keys() and all(torch.equal(loaded[name], sharded[name]) for name in loaded)
    assert not all(torch.equal(loaded[name], fresh[name]) for name in loaded)  # 4 updates away from the start
