"""Several processes with `train.parallel`: FSDP2 over gloo on 2 CPU processes equals one process up to rounding,
its checkpoints are every rank's shards (resumed on any number of processes) with the one-process weights file in
a run's last one, gradient accumulation reduces once per update under DDP and every micro-batch into the shards
under FSDP, and the CLI trains under torchrun with either kind of parallelism. The torchrun launches are few (one
for the Trainer runs, one per parallelism for the CLI): each costs seconds."""

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import kqv
from kqv.cli.main import main
from kqv.errors import ConfigError, ConfigTypeError
from kqv.train.checkpoints import read_checkpoint
from kqv.train.config import TrainConfig
from kqv.train.distributed import backend_for, gradient_sync
from kqv.train.metrics import read_metrics
from kqv.train.sharding import local_bytes, plain_on_rank0, shard
from kqv.train.shards import OPTIMIZER_KEY, is_sharded, whole_tensors, whole_weights
from kqv.train.topology import Topology
from kqv.train.trainer import Trainer

SRC = str(Path(kqv.__file__).resolve().parents[1])  # where this process found kqv: src/, or site-packages
WORKER = Path(__file__).with_name("fsdp_worker.py")
TOLERANCE = 1e-5  # float rounding: 2 processes sum their gradients in another order


def load_worker():
    spec = importlib.util.spec_from_file_location("fsdp_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    return worker


def worker_environment() -> dict[str, str]:
    """The environment of `torchrun`'s processes: this one's, less torchrun's own variables, kqv's source first on
    PYTHONPATH, one thread each, no GPU, and a stack from each rank that crashes."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    path = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH", "")) if p)
    env.update(PYTHONPATH=path, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1", CUDA_VISIBLE_DEVICES="")
    return env


def test_the_worker_processes_import_this_kqv_and_see_no_gpu(tmp_path):
    """From another directory, as torchrun starts them: the same kqv (not another checkout or an install)."""
    probe = "import kqv, torch; print(kqv.__file__); print(torch.cuda.device_count())"
    done = subprocess.run(
        [sys.executable, "-c", probe], env=worker_environment(), cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found, gpus = done.stdout.split()
    assert Path(found).resolve() == Path(kqv.__file__).resolve() and gpus == "0"


def torchrun(*args: str) -> subprocess.CompletedProcess:
    """Run `args` under torchrun with 2 CPU processes; fails the test with the processes' stderr if it fails.
    The processes import the kqv this one imported (`SRC` first on their path) and whatever else this one's
    PYTHONPATH held (on a GPU machine they once failed at `import kqv` with PYTHONPATH set to src/ alone), and see
    no GPU: their "auto" device is the CPU, as in the suite, on a machine with one GPU or none."""
    env = worker_environment()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as stuck:  # say where the processes were
        pytest.fail(f"torchrun timed out; its output so far:\n{(stuck.stderr or b'')[-4000:]!r}")
    assert done.returncode == 0, crash_report(done.stderr)
    return done


def crash_report(stderr: str, size: int = 4000) -> str:
    """The end of the processes' `stderr`, after the Python stack of each rank that crashed (faulthandler's
    "Fatal Python error" sections, which the surviving ranks' tracebacks would otherwise push out of view)."""
    crashes = [part[:size] for part in stderr.split("Fatal Python error")[1:]]
    return "".join(f"Fatal Python error{crash}\n...\n" for crash in crashes) + stderr[-size:]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The whole weights of a run's checkpoint: its model.safetensors (one process's, or a sharded run's final
    checkpoint's), else assembled from its shards."""
    if (run_dir / "checkpoint" / "model.safetensors").is_file():
        return load_file(run_dir / "checkpoint" / "model.safetensors")
    return whole_weights(read_checkpoint(run_dir))


def optimizer_state(run_dir: Path) -> dict:
    """The optimizer state of a run's checkpoint: optimizer.pt's (by position), or a sharded checkpoint's moments
    put whole (by parameter name)."""
    checkpoint = read_checkpoint(run_dir)
    if not is_sharded(checkpoint):
        return torch.load(run_dir / "checkpoint" / "optimizer.pt", weights_only=True)
    state: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in whole_tensors(checkpoint, OPTIMIZER_KEY).items():
        fqn, _, key = name.rpartition("/")
        state.setdefault(fqn, {})[key] = tensor
    return {"state": state}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[name] - b[name]).abs().max().item() for name in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """One-process references (6 steps; 3 steps, to resume under FSDP), then the worker's FSDP runs under torchrun,
    then a one-process resume of a 3-step FSDP checkpoint."""
    out = tmp_path_factory.mktemp("fsdp")
    worker = load_worker()
    worker.train(out / "one-6", 6)
    worker.train(out / "one-3", 3)
    shutil.copytree(out / "one-3", out / "one-3-kept")
    torchrun(str(WORKER), str(out))
    worker.train(out / "fsdp-3", 6, resume=True)  # FSDP's 3 steps on 2 processes, continued in 1
    return out


def test_a_failed_torchrun_shows_the_stack_of_the_rank_that_crashed_before_the_others_tracebacks():
    crash = 'Fatal Python error: Segmentation fault\n\nThread 0x1 (most recent call first):\n  File "x.py", line 3'
    stderr = "rank 1 starts\n" + crash + "\n" + "[rank0]: RuntimeError: Connection closed by peer\n" * 200
    report = crash_report(stderr)
    assert 'File "x.py", line 3' in report and report.endswith("closed by peer\n")
    assert crash_report("no crash\n") == "no crash\n"


def test_two_process_fsdp_gives_the_loss_curve_and_weights_of_one_process(runs):
    one, two = read_metrics(runs / "one-6" / "metrics.jsonl"), read_metrics(runs / "fsdp-6" / "metrics.jsonl")
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2, 3, 4, 5, 6]
    for key in ("train_loss", "val_loss", "grad_norm"):
        assert [key in r for r in two] == [key in r for r in one]
        logged = [(a[key], b[key]) for a, b in zip(one, two) if key in a]
        assert logged and [b for _, b in logged] == pytest.approx([a for a, _ in logged], abs=TOLERANCE, rel=0)
    assert max_difference(weights(runs / "one-6"), weights(runs / "fsdp-6")) < TOLERANCE


def held(runs: Path, name: str, rank: int) -> dict[str, int]:
    """The most parameter bytes a worker process held in the updates of run `name`: its shards, the caller's model."""
    return json.loads((runs / f"{name}-held-rank{rank}.json").read_text())


@pytest.mark.parametrize("run", ["fsdp-6", "fsdp-3-6"])
def test_each_of_two_fsdp_processes_holds_half_the_weights_and_no_whole_model(runs, run):
    whole = held(runs, "one-6", 0)["shards"]  # one process: the whole model
    for rank in (0, 1):
        assert held(runs, run, rank)["shards"] == pytest.approx(whole / 2, rel=0.01)
        assert held(runs, run, rank)["callers_model"] == 0  # released to the meta device while training


def test_rank_0_evaluates_a_plain_model_holding_the_sharded_runs_weights(runs):
    one, two = read_metrics(runs / "one-6" / "metrics.jsonl"), read_metrics(runs / "fsdp-6" / "metrics.jsonl")
    evaluated = [(a, b) for a, b in zip(one, two) if "weight_sum" in a]
    assert [b["step"] for _, b in evaluated] == [3, 6]
    assert all(b["plain_model"] == 1.0 and b["eval_mode"] == 1.0 for _, b in evaluated)
    assert [b["weight_sum"] for _, b in evaluated] == pytest.approx([a["weight_sum"] for a, _ in evaluated], abs=1e-3)


def test_an_fsdp_checkpoint_holds_each_ranks_shards_and_in_the_end_one_process_weights(runs):
    one, two = runs / "one-6" / "checkpoint", runs / "fsdp-6" / "checkpoint"
    assert sorted(p.name for p in one.iterdir()) == [
        "model.safetensors",
        "optimizer.pt",
        "rng.safetensors",
        "state.json",
    ]
    assert sorted(p.name for p in two.iterdir()) == ["model.safetensors", "rng.safetensors", "shards", "state.json"]
    assert sorted(p.name for p in (two / "shards").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    exported = load_file(two / "model.safetensors")  # the final checkpoint's whole weights, for export
    assert {k: v.shape for k, v in exported.items()} == {k: v.shape for k, v in weights(runs / "one-6").items()}
    sharded = whole_weights(read_checkpoint(runs / "fsdp-6"))
    assert all(torch.equal(exported[name], sharded[name]) for name in exported)
    assert max_difference(weights(runs / "one-6"), exported) < TOLERANCE
    moments = optimizer_state(runs / "fsdp-6")["state"]
    whole = dict(load_worker().model().named_parameters())
    assert moments.keys() == whole.keys()  # every parameter (the tied one once), whole, as one process holds it
    assert all(moments[n]["exp_avg"].shape == whole[n].shape and moments[n]["step"] == 6 for n in moments)
    assert read_checkpoint(runs / "fsdp-6").state["world_size"] == 2


def test_the_callers_model_holds_the_trained_weights_after_a_sharded_run(runs):
    trained = torch.load(runs / "fsdp-6-model.pt", weights_only=True)
    saved = weights(runs / "fsdp-6")
    assert all(torch.equal(trained[name], saved[name]) for name in saved)
    assert torch.equal(trained["lm_head.weight"], trained["decoder.embeddings.tokens.weight"])  # still tied


def test_fsdp_resumes_exactly_on_the_same_number_of_processes(runs):
    straight, resumed = runs / "fsdp-6", runs / "fsdp-3-6"

    def curve(run_dir: Path) -> list[tuple]:
        return [(r["step"], r["train_loss"], r["grad_norm"]) for r in read_metrics(run_dir / "metrics.jsonl")]

    assert curve(resumed) == curve(straight)
    a, b = weights(straight), weights(resumed)
    assert all(torch.equal(a[name], b[name]) for name in a)
    sa, sb = optimizer_state(straight)["state"], optimizer_state(resumed)["state"]
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])


def test_an_fsdp_checkpoint_resumes_in_one_process(runs):
    assert read_checkpoint(runs / "fsdp-3").step == 6
    assert max_difference(weights(runs / "one-6"), weights(runs / "fsdp-3")) < TOLERANCE


def test_a_one_process_checkpoint_resumes_under_two_process_fsdp(runs):
    assert read_checkpoint(runs / "one-3-kept").step == 3 and read_checkpoint(runs / "one-3").step == 6
    assert read_checkpoint(runs / "one-3").state["world_size"] == 2
    assert max_difference(weights(runs / "one-6"), weights(runs / "one-3")) < TOLERANCE


def test_two_micro_batches_of_b_rows_equal_one_batch_of_2b_rows(tmp_path):
    worker = load_worker()

    def train(batch_size: int, grad_accum: int, batches) -> dict[str, torch.Tensor]:
        config = TrainConfig(steps=3, batch_size=batch_size, grad_accum=grad_accum, lr=3e-3, precision="fp32")
        run_dir = tmp_path / f"{batch_size}x{grad_accum}"
        Trainer(worker.model(), config, run_dir, train_batches=batches, loss_fn=lambda m, b: m(*b), quiet=True).train()
        return weights(run_dir)

    def half(i: int) -> tuple[torch.Tensor, torch.Tensor]:  # micro-batch i: half of the whole batch i // 2
        inputs, targets = worker.batches(i // 2)
        rows = slice(0, 2) if i % 2 == 0 else slice(2, 4)
        return inputs[rows], targets[rows]

    assert max_difference(train(4, 1, worker.batches), train(2, 2, half)) < 1e-6


def test_a_mixture_of_experts_model_trains_under_two_process_ddp(runs):
    assert read_checkpoint(runs / "ddp-switch").step == 3
    losses = [r["train_loss"] for r in read_metrics(runs / "ddp-switch" / "metrics.jsonl")]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)


def test_a_model_on_the_meta_device_is_refused_outside_fsdp(tmp_path):
    worker = load_worker()
    with torch.device("meta"):
        meta = worker.model()
    config = TrainConfig(steps=1, batch_size=4, precision="fp32")
    with pytest.raises(ConfigError, match="meta device.*only ranks other than 0"):
        Trainer(meta, config, tmp_path / "run", train_batches=worker.batches, loss_fn=lambda m, b: m(*b))
    with pytest.raises(ConfigTypeError, match="must return an nn.Module, got int"):
        Trainer(lambda: 3, config, tmp_path / "run", train_batches=worker.batches, loss_fn=lambda m, b: m(*b))


def test_a_factory_builds_the_model_in_one_process(tmp_path):
    worker = load_worker()
    config = TrainConfig(steps=2, batch_size=4, precision="fp32", log_every=1)
    for name, given in (("built", worker.model()), ("factory", worker.model)):
        Trainer(given, config, tmp_path / name, train_batches=worker.batches, loss_fn=lambda m, b: m(*b)).train()
    assert max_difference(weights(tmp_path / "built"), weights(tmp_path / "factory")) == 0


def test_sharding_releases_the_callers_model_and_gathering_fills_it_with_ties_kept(one_process_group):
    worker = load_worker()
    model, reference = worker.model(), worker.model()
    sharded = shard(model, Topology(), torch.device("cpu"))
    assert all(p.is_meta for p in model.parameters())
    assert model.lm_head.weight is model.decoder.embeddings.tokens.weight
    assert local_bytes(model) == 0 and local_bytes(sharded) == local_bytes(reference)  # one process: all of it
    with plain_on_rank0(model, sharded, Topology(), torch.device("cpu"), needed=True):
        assert model.lm_head.weight is model.decoder.embeddings.tokens.weight
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
        assert all(not t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert all(p.is_meta for p in model.parameters())


def test_fsdp_refuses_a_rank_0_model_on_the_meta_device(one_process_group):
    with torch.device("meta"):
        meta = load_worker().model()
    with pytest.raises(ConfigError, match="rank 0's model cannot be on the meta device unless every rank built"):
        shard(meta, Topology(), torch.device("cpu"))


def test_fsdp_refuses_mixture_of_experts_layers_with_a_clear_error():
    with pytest.raises(ConfigError, match='mixture-of-experts.*train.parallel = "ddp"'):
        shard(load_worker().model(ffn="switch", experts={"count": 2}), Topology(), torch.device("cpu"))


@pytest.fixture
def one_process_group():
    """A gloo process group of one process, for wrapping a model as a torchrun rank would."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_fsdp_reduce_scatters_every_micro_batch_so_no_whole_gradient_is_held(one_process_group):
    """Gradient sync during accumulation is a choice (docs/parallel.md): FSDP reduces every micro-batch into the
    gradient's shard, rather than hold every block's whole gradient until the last one."""
    worker = load_worker()
    reference, sharded = worker.model(), worker.model()
    for block in sharded.decoder.blocks:
        fully_shard(block, mesh=init_device_mesh("cpu", (1,)))
    fully_shard(sharded, mesh=init_device_mesh("cpu", (1,)))
    for i, last in ((0, False), (1, True)):
        reference(*worker.batches(i)).backward()
        with gradient_sync(sharded, last):
            sharded(*worker.batches(i)).backward()
        assert all(isinstance(p.grad, DTensor) for p in sharded.parameters())  # reduced into the shards already
    expected = dict(reference.named_parameters())
    for name, param in sharded.named_parameters():  # the sum of both micro-batches' gradients
        torch.testing.assert_close(param.grad.full_tensor(), expected[name].grad, atol=1e-6, rtol=1e-5)


def test_ddp_skips_the_gradient_all_reduce_except_after_the_last_micro_batch(one_process_group):
    ddp = torch.nn.parallel.DistributedDataParallel(load_worker().model())
    with gradient_sync(ddp, False):
        assert not ddp.require_backward_grad_sync
    with gradient_sync(ddp, True):
        assert ddp.require_backward_grad_sync


def test_the_backend_follows_the_device():
    assert backend_for(torch.device("cpu")) == "gloo"
    assert backend_for(torch.device("cuda", 0)) == "cpu:gloo,cuda:nccl"  # NCCL for CUDA tensors


def test_each_torchrun_process_takes_its_own_gpu(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    topology = Topology.of_process()
    assert topology == Topology(rank=0, local_rank=1, world_size=2)
    assert topology.device(torch.device("cuda")) == torch.device("cuda", 1)
    assert topology.device(torch.device("cpu")) == torch.device("cpu")
    assert Topology().device(torch.device("cuda")) == torch.device("cuda")  # one process: the device as given


def test_parallel_must_be_ddp_or_fsdp():
    assert TrainConfig(steps=1, batch_size=2).parallel == "ddp"
    with pytest.raises(ConfigError, match=r"parallel must be one of \['ddp', 'fsdp'\]"):
        TrainConfig(steps=1, batch_size=2, parallel="zero")


TINY_LM = """
[data]
tokenizer = "char"
context = 16
val_fraction = 0.2

[model]
d_model = 32
n_heads = 2
n_layers = 2
d_ff = 64
dropout = 0.0

[train]
steps = 3
batch_size = 4
grad_accum = 2
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


@pytest.fixture(scope="module")
def cli_one_process(tmp_path_factory) -> tuple[Path, list[str]]:
    """The tiny LM trained by `kqv train lm` in this process, and the arguments that trained it."""
    tmp = tmp_path_factory.mktemp("cli")
    config, text = tmp / "tiny.toml", tmp / "t.txt"
    config.write_text(TINY_LM)
    text.write_text("ROMEO: to be, or not to be, that is the question; whether 'tis nobler in the mind\n" * 40)
    common = ["train", "lm", "--config", str(config), "--data", str(text), "--quiet"]
    assert main([*common, "--out", str(tmp / "one")]) == 0
    return tmp, common


@pytest.mark.parametrize("parallel", ["fsdp", "ddp"])
def test_kqv_train_under_torchrun_with_either_parallelism_matches_one_process(cli_one_process, parallel):
    tmp, common = cli_one_process
    out = tmp / parallel
    done = torchrun("-m", "kqv.cli", *common, "--out", str(out), "--set", f'train.parallel="{parallel}"')
    assert "in use by another training process" not in done.stderr
    assert read_checkpoint(out).state["world_size"] == 2 and read_checkpoint(out).config.parallel == parallel
    assert (out / "samples.txt").read_text().startswith("ROMEO:")  # rank 0 samples from the trained model
    one, two = read_metrics(tmp / "one" / "metrics.jsonl"), read_metrics(out / "metrics.jsonl")
    for key in ("train_loss", "val_loss"):
        logged = [(a[key], b[key]) for a, b in zip(one, two) if key in a]
        assert logged and [b for _, b in logged] == pytest.approx([a for a, _ in logged], abs=TOLERANCE, rel=0)
    assert max_difference(weights(tmp / "one"), weights(out)) < TOLERANCE
