"""The training loop's contract: exact resume, schedules, weight-decay groups, gradient accumulation, safe
checkpoints, Ctrl-C, and torchrun equal to one process."""

import importlib.util
import json
import math
import os
import random
import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import kqv
from kqv.train import checkpoints
from kqv.train import trainer as training
from kqv.train.checkpoints import load_weights, read_checkpoint
from kqv.train.config import TrainConfig, learning_rate
from kqv.train.metrics import read_metrics
from kqv.train.optimizer import parameter_groups
from kqv.train.trainer import Trainer

VOCAB, SEQ = 32, 16
TINY = kqv.ModelConfig(vocab_size=VOCAB, d_model=32, n_heads=2, n_layers=2, d_ff=64, max_len=32, dropout=0.1)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and a second one only spins when other work shares the 2 cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_model(dropout: float = 0.1, seed: int = 0, **changes) -> kqv.DecoderLM:
    torch.manual_seed(seed)
    return kqv.DecoderLM(TINY.replace(dropout=dropout, **changes))


def token_batches(batch_size: int, offset: int = 0):
    """Random tokens, the same for the same index: (inputs, next-token targets), each (batch_size, SEQ)."""

    def batch(i: int):
        ids = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=torch.Generator().manual_seed(offset + i))
        return ids[:, :-1], ids[:, 1:]

    return batch


def lm_loss(model, batch):
    return model(*batch)


def config(**changes) -> TrainConfig:
    defaults = dict(
        steps=6,
        batch_size=4,
        lr=1e-2,
        warmup_steps=2,
        log_every=1,
        eval_every=3,
        eval_batches=2,
        checkpoint_every=100,
        precision="fp32",
    )
    return TrainConfig(**{**defaults, **changes})


def trainer(run_dir, cfg, model=None, batches=None, **options) -> Trainer:
    return Trainer(
        model or make_model(),
        cfg,
        run_dir,
        train_batches=batches or token_batches(cfg.batch_size),
        loss_fn=lm_loss,
        val_batches=token_batches(cfg.batch_size, offset=10_000),
        quiet=True,
        **options,
    )


def resume(run_dir, batches=None, cfg=None, **model_changes) -> Trainer:
    return Trainer.resume(
        run_dir,
        make_model(seed=123, **model_changes),
        train_batches=batches or token_batches(4),
        loss_fn=lm_loss,
        val_batches=token_batches(4, offset=10_000),
        config=cfg,
        quiet=True,
    )


def curve(run_dir) -> list[dict]:
    """The metrics of every step without the wall-clock ones."""
    timing = {"elapsed_s", "train_seconds", "tokens_per_s", "mfu", "peak_memory_mb", "batch_ms", "wait_ms"}
    return [{k: v for k, v in r.items() if k not in timing} for r in read_metrics(run_dir / "metrics.jsonl")]


def weights(run_dir) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoint" / "model.safetensors")


def failing_at(index: int, error: BaseException, batches=None):
    batches = batches or token_batches(4)

    def batch(i: int):
        if i == index:
            raise error
        return batches(i)

    return batch


# ---------------------------------------------------------------------------------------------------------------
# Resume


@pytest.mark.parametrize(
    "model_changes", [{}, dict(ffn="switch", experts={"count": 4}, position="rope")], ids=["dense", "switch"]
)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_resumed_run_repeats_every_loss_of_the_uninterrupted_run(tmp_path, precision, model_changes):
    cfg = config(steps=8, checkpoint_every=4, precision=precision)  # dropout 0.1: generator states matter
    trainer(tmp_path / "full", cfg, model=make_model(**model_changes)).train()
    with pytest.raises(RuntimeError, match="crash"):  # dies in update 7, after logging steps 5 and 6
        trainer(
            tmp_path / "cut", cfg, model=make_model(**model_changes), batches=failing_at(6, RuntimeError("crash"))
        ).train()
    assert read_checkpoint(tmp_path / "cut").step == 4
    resume(tmp_path / "cut", **model_changes).train()
    assert [r["step"] for r in curve(tmp_path / "cut")] == list(range(1, 9))
    assert curve(tmp_path / "cut") == curve(tmp_path / "full")
    full, cut = weights(tmp_path / "full"), weights(tmp_path / "cut")
    assert all(torch.equal(full[name], cut[name]) for name in full)


def test_resume_without_a_checkpoint_names_the_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "checkpoint" / "state.json"))):
        resume(tmp_path)


def test_corrupt_checkpoint_is_reported_with_the_file_and_a_remedy(tmp_path):
    trainer(tmp_path, config(steps=2)).train()
    model_file = tmp_path / "checkpoint" / "model.safetensors"
    data = model_file.read_bytes()
    model_file.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=re.escape(str(model_file))) as error:
        resume(tmp_path)
    assert "corrupt" in str(error.value) and "overwrite" in str(error.value)


def test_unreadable_state_json_is_reported_as_corrupt(tmp_path):
    trainer(tmp_path, config(steps=2)).train()
    state = tmp_path / "checkpoint" / "state.json"
    state.write_text(state.read_text()[:50])
    with pytest.raises(ValueError, match=re.escape(str(state)) + ".*corrupt"):
        resume(tmp_path)


def test_keyboard_interrupt_saves_a_checkpoint_that_resumes_exactly(tmp_path):
    cfg = config(steps=8, grad_accum=2)
    trainer(tmp_path / "full", cfg).train()
    # Interrupt at the second micro-batch of update 6: the first one has already drawn dropout masks.
    with pytest.raises(KeyboardInterrupt):
        trainer(tmp_path / "cut", cfg, batches=failing_at(5 * 2 + 1, KeyboardInterrupt())).train()
    assert read_checkpoint(tmp_path / "cut").step == 5
    resume(tmp_path / "cut").train()
    assert curve(tmp_path / "cut") == curve(tmp_path / "full")


# ---------------------------------------------------------------------------------------------------------------
# Checkpoint safety


def test_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    run = trainer(tmp_path, config(steps=4, checkpoint_every=2))
    real_save = torch.save

    def disk_full(obj, path, *args, **kwargs):
        if run.step == 4:
            Path(path).write_bytes(b"half an optimizer")
            raise OSError("disk full")
        real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoints.torch, "save", disk_full)
    with pytest.raises(OSError, match="disk full"):
        run.train()
    monkeypatch.undo()
    assert read_checkpoint(tmp_path).step == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "checkpoint", "loss.png", "metrics.jsonl"]
    resume(tmp_path).train()
    assert read_checkpoint(tmp_path).step == 4


def test_crash_between_the_checkpoint_renames_resumes_from_the_old_checkpoint(tmp_path, monkeypatch):
    run = trainer(tmp_path, config(steps=4, checkpoint_every=2))
    real_replace = os.replace

    def power_cut(src, dst):  # the old checkpoint has moved aside, the new one never arrives
        if Path(src).name.startswith(".checkpoint-tmp-") and (tmp_path / "checkpoint.old").exists():
            raise OSError("power cut")
        real_replace(src, dst)

    monkeypatch.setattr(checkpoints.os, "replace", power_cut)
    with pytest.raises(OSError, match="power cut"):
        run.train()
    monkeypatch.undo()
    assert not (tmp_path / "checkpoint").exists()
    assert read_checkpoint(tmp_path).step == 2
    resume(tmp_path).train()
    assert read_checkpoint(tmp_path).step == 4
    assert not (tmp_path / "checkpoint.old").exists()


def test_fresh_run_refuses_a_run_dir_that_holds_a_run(tmp_path):
    trainer(tmp_path, config(steps=2)).train()
    files = lambda: {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.name != ".lock"}
    before = files()  # the run lock names its current holder and when it took the lock: not part of the run
    with pytest.raises(FileExistsError, match="resume.*overwrite"):
        trainer(tmp_path, config(steps=2)).train()
    assert files() == before


def test_overwrite_starts_the_run_over(tmp_path):
    trainer(tmp_path, config(steps=4)).train()
    trainer(tmp_path, config(steps=2), if_exists="overwrite").train()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    assert read_checkpoint(tmp_path).step == 2


def test_tied_weights_survive_a_checkpoint(tmp_path):
    trainer(tmp_path, config(steps=2)).train()
    model = make_model(seed=7)
    load_weights(model, tmp_path)
    assert model.lm_head.weight is model.decoder.embeddings.tokens.weight
    assert torch.equal(model.lm_head.weight, weights(tmp_path)["decoder.embeddings.tokens.weight"])


# ---------------------------------------------------------------------------------------------------------------
# Optimisation


def test_warmup_then_cosine_schedule_matches_the_closed_form():
    cfg = TrainConfig(steps=110, batch_size=1, lr=1e-3, min_lr_ratio=0.1, warmup_steps=10)
    floor = 1e-4
    assert learning_rate(cfg, 1) == pytest.approx(1e-4)
    assert learning_rate(cfg, 5) == pytest.approx(5e-4)
    assert learning_rate(cfg, 10) == pytest.approx(1e-3)  # the peak
    assert learning_rate(cfg, 35) == pytest.approx(floor + (1e-3 - floor) * 0.5 * (1 + math.cos(math.pi / 4)))
    assert learning_rate(cfg, 60) == pytest.approx((1e-3 + floor) / 2)  # half way down
    assert learning_rate(cfg, 110) == pytest.approx(floor)  # the floor, exactly at the last step
    decay = [learning_rate(cfg, t) for t in range(10, 111)]
    assert all(a > b for a, b in zip(decay, decay[1:]))


def test_inverse_sqrt_schedule_is_vaswani_scaled_to_peak_at_lr():
    cfg = TrainConfig(steps=100, batch_size=1, lr=2e-3, warmup_steps=16, schedule="inverse_sqrt")

    def vaswani(t, d_model=512, warmup=16):
        return d_model**-0.5 * min(t**-0.5, t * warmup**-1.5)

    for t in (1, 8, 16, 17, 64, 100):
        assert learning_rate(cfg, t) == pytest.approx(2e-3 * vaswani(t) / vaswani(16))
    assert learning_rate(cfg, 64) == pytest.approx(1e-3)


def test_constant_schedule_warms_up_then_stays_at_lr():
    cfg = TrainConfig(steps=20, batch_size=1, lr=1e-3, warmup_steps=4, schedule="constant")
    assert [learning_rate(cfg, t) for t in (2, 4, 5, 20)] == pytest.approx([5e-4, 1e-3, 1e-3, 1e-3])


def test_trainer_uses_the_scheduled_lr_at_every_step(tmp_path):
    cfg = config(steps=6, warmup_steps=2, lr=1e-2)
    run = trainer(tmp_path, cfg)
    run.train()
    assert [r["lr"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [learning_rate(cfg, t) for t in range(1, 7)]
    assert run.optimizer.param_groups[0]["lr"] == learning_rate(cfg, 6)


@pytest.mark.parametrize("changes", [dict(), dict(norm="rmsnorm", position="learned", tie_embeddings=False)])
def test_weight_decay_applies_to_matrices_but_not_to_biases_norms_or_embeddings(changes):
    model = make_model(**changes)
    decay, no_decay = parameter_groups(model, 0.1)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    norm_gains = {id(m.weight) for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.RMSNorm))}
    biases = {id(p) for name, p in model.named_parameters() if name.endswith("bias")}
    assert {id(p) for p in decay["params"]} == linear_weights - embeddings
    assert {id(p) for p in no_decay["params"]} == embeddings | norm_gains | biases
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert norm_gains and biases and embeddings


def test_modules_can_exempt_named_parameters_from_weight_decay():
    class Table(nn.Module):
        no_weight_decay = ("keys",)

        def __init__(self):
            super().__init__()
            self.keys = nn.Parameter(torch.zeros(5, 4))
            self.weight = nn.Parameter(torch.zeros(4, 4))

    table = Table()
    decay, no_decay = parameter_groups(nn.Sequential(table), 0.1)
    assert decay["params"] == [table.weight] and no_decay["params"] == [table.keys]


def test_trainer_optimizer_uses_the_weight_decay_groups(tmp_path):
    model = make_model()
    run = Trainer(model, config(weight_decay=0.3), tmp_path, train_batches=token_batches(4), loss_fn=lm_loss)
    groups = run.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [0.3, 0.0]
    assert [len(g["params"]) for g in groups] == [len(g["params"]) for g in parameter_groups(model, 0.3)]


def test_gradient_accumulation_equals_one_large_batch(tmp_path):
    micro = token_batches(2)

    def large(i):
        parts = [micro(4 * i + j) for j in range(4)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    # lr 1e-3: Adam divides by sqrt(v), so a rounding-level difference in a near-zero gradient can move a weight
    # by up to lr; the sums differ only in their order of addition.
    Trainer(
        make_model(dropout=0.0),
        config(batch_size=2, grad_accum=4, lr=1e-3),
        tmp_path / "accum",
        train_batches=micro,
        loss_fn=lm_loss,
        quiet=True,
    ).train()
    Trainer(
        make_model(dropout=0.0),
        config(batch_size=8, lr=1e-3),
        tmp_path / "large",
        train_batches=large,
        loss_fn=lm_loss,
        quiet=True,
    ).train()
    accum, big = read_metrics(tmp_path / "accum" / "metrics.jsonl"), read_metrics(tmp_path / "large" / "metrics.jsonl")
    assert [r["train_loss"] for r in accum] == pytest.approx([r["train_loss"] for r in big], rel=1e-6, abs=0)
    accum_w, big_w = weights(tmp_path / "accum"), weights(tmp_path / "large")
    assert max((accum_w[n] - big_w[n]).abs().max().item() for n in big_w) < 1e-6


def test_loss_falls_on_a_learnable_sequence(tmp_path):
    def repeating(i):  # 0 1 2 ... 31 0 1 ...: every next token is predictable
        start = torch.randint(0, VOCAB, (8, 1), generator=torch.Generator().manual_seed(i))
        ids = (start + torch.arange(SEQ + 1)) % VOCAB
        return ids[:, :-1], ids[:, 1:]

    cfg = config(steps=30, batch_size=8, precision="bf16", eval_every=100)
    result = Trainer(
        make_model(dropout=0.0, position="learned"), cfg, tmp_path, train_batches=repeating, loss_fn=lm_loss, quiet=True
    ).train()
    first = read_metrics(tmp_path / "metrics.jsonl")[0]["train_loss"]
    assert result["train_loss"] < 0.5 * first


# ---------------------------------------------------------------------------------------------------------------
# Evaluation, metrics, configuration


def test_evaluation_runs_without_gradients_in_eval_mode_then_returns_to_training(tmp_path):
    seen = []

    def eval_fn(model):
        seen.append((model.training, torch.is_grad_enabled()))
        return {"answer": 42}

    model = make_model()
    result = Trainer(
        model,
        config(steps=4, eval_every=2),
        tmp_path,
        train_batches=token_batches(4),
        loss_fn=lm_loss,
        eval_fn=eval_fn,
        quiet=True,
    ).train()
    assert seen == [(False, False), (False, False)]
    assert model.training and result["answer"] == 42.0


def test_evaluation_drawing_random_numbers_does_not_change_training(tmp_path):
    def sampling_eval(model):
        return {"sample": torch.rand(()).item() + random.random()}  # e.g. sampling text to show progress

    cfg = config(steps=4, eval_every=1)  # dropout 0.1 draws from the same generator during training
    Trainer(make_model(), cfg, tmp_path / "plain", train_batches=token_batches(4), loss_fn=lm_loss, quiet=True).train()
    Trainer(
        make_model(),
        cfg,
        tmp_path / "sampled",
        train_batches=token_batches(4),
        loss_fn=lm_loss,
        eval_fn=sampling_eval,
        quiet=True,
    ).train()
    plain, sampled = curve(tmp_path / "plain"), curve(tmp_path / "sampled")
    assert [r["train_loss"] for r in sampled] == [r["train_loss"] for r in plain]


def test_bf16_runs_the_forward_in_bfloat16_and_keeps_weights_and_adam_state_in_fp32(tmp_path):
    seen = []

    def loss_fn(model, batch):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return model(*batch)

    model = make_model()
    run = Trainer(
        model, config(steps=2, precision="bf16"), tmp_path, train_batches=token_batches(4), loss_fn=loss_fn, quiet=True
    )
    run.train()
    assert seen == [(True, torch.bfloat16)] * 2
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {s["exp_avg"].dtype for s in run.optimizer.state.values()} == {torch.float32}


def test_metrics_record_every_log_and_eval_and_a_loss_plot_is_drawn(tmp_path):
    trainer(tmp_path, config(steps=6, log_every=2, eval_every=3)).train()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [2, 3, 4, 6]
    for record in records:
        assert record["elapsed_s"] > 0
        if record["step"] % 2 == 0:
            assert {"train_loss", "lr", "tokens_per_s"} <= set(record) and record["tokens_per_s"] > 0
        if record["step"] % 3 == 0:
            assert math.isfinite(record["val_loss"])
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_state_json_keeps_the_config_and_extra_state(tmp_path):
    cfg = config(steps=2)
    trainer(tmp_path, cfg, extra_state={"model": TINY.to_dict()}).train()
    checkpoint = read_checkpoint(tmp_path)
    assert checkpoint.config == cfg and checkpoint.extra_state == {"model": TINY.to_dict()}
    assert resume(tmp_path).extra_state == {"model": TINY.to_dict()}


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(steps=0), "steps must be at least 1"),
        (dict(lr=-1.0), "lr must be positive"),
        (dict(min_lr_ratio=1.5), "min_lr_ratio"),
        (dict(schedule="linear"), "schedule must be one of"),
        (dict(precision="fp8"), "precision must be one of"),
        (dict(betas=(0.9, 1.0)), "betas"),
        (dict(grad_accum=0), "grad_accum must be at least 1"),
        (dict(max_minutes=-1.0), "max_minutes must be >= 0"),
    ],
)
def test_train_config_rejects_invalid_values_with_a_clear_message(changes, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{"steps": 10, "batch_size": 2, **changes})


def test_a_time_budget_makes_the_update_that_exhausts_it_the_last_one(tmp_path, monkeypatch):
    clock = iter(range(0, 10_000, 10))  # every reading of the trainer's clock is 10 s after the previous one
    monkeypatch.setattr(training, "time", SimpleNamespace(perf_counter=lambda: float(next(clock))))
    run = trainer(tmp_path, config(steps=100, max_minutes=1.0, eval_every=50, checkpoint_every=50))
    run.train()
    # each update spans one 10 s tick of its own (plus ticks spent outside updates, which do not count)
    assert run.step == 6 and run.train_seconds == 60.0
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records[-1]["step"] == 6 and "val_loss" in records[-1]  # the last update is evaluated ...
    assert read_checkpoint(tmp_path).step == 6  # ... and checkpointed
    assert all(r["train_seconds"] < r["elapsed_s"] for r in records)  # evaluation and logging excluded


def test_training_time_is_kept_across_a_resume(tmp_path):
    trainer(tmp_path, config(steps=3)).train()
    first = json.loads((tmp_path / "checkpoint" / "state.json").read_text())["train_seconds"]
    resumed = resume(tmp_path, cfg=config(steps=6))
    assert resumed.train_seconds == first > 0
    resumed.train()
    assert resumed.train_seconds > first


def test_train_config_round_trips_through_json():
    cfg = TrainConfig(steps=10, batch_size=2, betas=(0.8, 0.9), schedule="inverse_sqrt")
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_loss_fn_must_return_a_scalar(tmp_path):
    run = Trainer(
        make_model(),
        config(),
        tmp_path,
        train_batches=token_batches(4),
        loss_fn=lambda model, batch: model(batch[0]),
        quiet=True,
    )
    with pytest.raises(TypeError, match="scalar"):
        run.train()


# ---------------------------------------------------------------------------------------------------------------
# Several processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_torchrun_matches_one_process(tmp_path):
    worker_path = Path(__file__).with_name("ddp_worker.py")
    spec = importlib.util.spec_from_file_location("ddp_worker", worker_path)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    worker.run(tmp_path / "one")

    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        str(worker_path),
        str(tmp_path / "two"),
    ]
    done = subprocess.run(command, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]

    one, two = read_metrics(tmp_path / "one" / "metrics.jsonl"), read_metrics(tmp_path / "two" / "metrics.jsonl")
    assert [r["step"] for r in two] == [2, 4]  # rank 0 alone wrote the metrics
    # the time limit was agreed on after update 2, the one log interval before the last update (which ends the
    # run without asking), not after each of updates 1-3
    assert re.findall(r"rank0_says (\d+)", done.stdout) == ["1", "1"], done.stdout  # the ranks' lines may interleave
    for key in ("train_loss", "val_loss"):  # both runs log the same keys at the same steps
        assert [key in r for r in two] == [key in r for r in one]
        logged = [(a[key], b[key]) for a, b in zip(one, two) if key in a]
        assert logged, f"no {key} was logged"
        assert [b for _, b in logged] == pytest.approx([a for a, _ in logged], abs=1e-5, rel=0)
    one_w, two_w = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert max((one_w[n] - two_w[n]).abs().max().item() for n in one_w) < 1e-5
