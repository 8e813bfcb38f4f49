"""Training planned to a time budget (`kqv.train.budget`), on fake machines: a clock that moves only when the model
works, so the plan, the schedule's end and the progress lines are exact, with no sleeping and no timed assertion."""

import io
import json
import re
import sys
from dataclasses import replace

import pytest
import torch

from kqv.errors import ConfigError
from kqv.train.budget import SKIPPED_UPDATES, TIMED_UPDATES, events, fit_steps, predicted_seconds
from kqv.train.checkpoints import read_checkpoint
from kqv.train.config import TrainConfig
from kqv.train.metrics import format_duration, progress_bar, progress_line, read_metrics
from kqv.train.reporter import LINE_EVERY_S, Reporter
from kqv.train.trainer import Trainer
from test_training import failing_at, make_model, token_batches, weights


class FakeMachine:
    """The trainer's clock. Time passes only in `loss`: `batch_s` per training micro-batch (the first
    `SKIPPED_UPDATES` cost `first_s` more: kernels being built), a third of it per validation batch."""

    def __init__(self, batch_s: float, first_s: float = 0.0):
        self.now, self.batch_s, self.first_s, self.calls = 0.0, batch_s, first_s, 0

    def __call__(self) -> float:
        return self.now

    def loss(self, model, batch):
        if model.training:
            self.calls += 1
            self.now += self.batch_s + (self.first_s if self.calls <= SKIPPED_UPDATES else 0.0)
        else:
            self.now += self.batch_s / 3
        return model(*batch)


class LoadedMachine(FakeMachine):
    """A machine that another job slows down after `calls_before` training micro-batches: each takes `factor`
    times as long from then on (validation batches too)."""

    def __init__(self, batch_s: float, calls_before: int, factor: float):
        super().__init__(batch_s)
        self.calls_before, self.factor = calls_before, factor

    def loss(self, model, batch):
        if model.training and self.calls == self.calls_before:
            self.batch_s *= self.factor
        return super().loss(model, batch)


def budget_config(**changes) -> TrainConfig:
    defaults = dict(
        steps=10_000,  # the upper bound: the budget decides
        budget_minutes=1.0,
        batch_size=4,
        lr=1e-2,
        min_lr_ratio=0.1,
        warmup_steps=12,
        eval_every=20,
        eval_batches=2,
        checkpoint_every=50,
        log_every=5,
        precision="fp32",
    )
    return TrainConfig(**{**defaults, **changes})


def budget_trainer(run_dir, cfg, machine, batches=None, quiet=True, work_after_training=0.0, resume=False) -> Trainer:
    return Trainer(
        make_model(seed=123 if resume else 0),
        cfg,
        run_dir,
        train_batches=batches or token_batches(cfg.batch_size),
        loss_fn=machine.loss,
        val_batches=token_batches(cfg.batch_size, offset=10_000),
        quiet=quiet,
        work_after_training=work_after_training,
        clock=machine,
        if_exists="resume" if resume else "error",
    )


def plan_of(run_dir) -> dict:
    (record,) = [r for r in read_metrics(run_dir / "metrics.jsonl") if "plan" in r]
    return record["plan"]


# -- a budgeted run completes its schedule within its budget -----------------------------------------------------


@pytest.mark.parametrize("batch_s", [0.15, 1.5], ids=["fast machine", "slow machine"])
def test_a_budgeted_run_ends_its_schedule_within_its_budget(tmp_path, batch_s):
    machine = FakeMachine(batch_s, first_s=4 * batch_s)
    cfg = budget_config()
    run = budget_trainer(tmp_path, cfg, machine, work_after_training=3)
    final = run.train()
    for _ in range(3):  # the job's work after training, which the plan reserved
        run.evaluate()
    plan = plan_of(tmp_path)
    assert plan["limited_by"] == "budget" and plan["steps"] == run.step == final["step"] < cfg.steps
    assert final["lr"] == pytest.approx(cfg.min_lr_ratio * cfg.lr, rel=1e-12)  # the cosine reached its end
    assert 0.9 * 60 <= machine.now <= 60  # within the budget, and most of it used
    assert plan["predicted_s"] == pytest.approx(machine.now, abs=1e-6)  # the fake machine keeps its pace exactly


def test_a_machine_slowed_after_the_plan_re_plans_and_still_ends_within_its_budget(tmp_path, capsys):
    """Load that comes after the plan (updates twice as slow from update 100) would overrun a plan fixed once: the
    run re-plans at a log interval, says so, records it, and ends its schedule within the budget."""
    machine = LoadedMachine(0.15, calls_before=100, factor=2.0)
    cfg = budget_config()
    run = budget_trainer(tmp_path, cfg, machine, quiet=False, work_after_training=2)
    final = run.train()
    for _ in range(2):
        run.evaluate()
    planned = plan_of(tmp_path)["steps"]
    assert 100 < planned  # the first plan counted on the unloaded pace
    assert machine.now <= 60  # the promise: within the budget (the plan fixed once took 101 s)
    assert run.step == final["step"] < planned
    assert final["lr"] == pytest.approx(cfg.min_lr_ratio * cfg.lr, rel=1e-12)  # the schedule reached its new end
    replans = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "replan" in r]
    assert replans and replans[-1]["replan"]["steps"] == run.step
    assert replans[-1]["replan"]["update_s"] == pytest.approx(0.3)
    assert read_checkpoint(tmp_path).state["plan"]["steps"] == run.step  # a resume replays the new plan
    out = capsys.readouterr().out
    said = rf"re-planned at update \d+: updates now take [\d.]+ s \(planned 0.15 s\), so {planned} updates would"
    assert re.search(said + r" overrun the 1-minute budget; now \d+ updates, about \d+ s in all", out)


def test_a_machine_that_speeds_up_re_plans_upward_and_uses_its_budget(tmp_path, capsys):
    """Load that ends after the plan (updates twice as fast from update 100) would leave much of the budget unused:
    the run re-plans to more updates, says so, and still ends its schedule within the budget."""
    machine = LoadedMachine(0.3, calls_before=100, factor=0.5)
    cfg = budget_config()
    run = budget_trainer(tmp_path, cfg, machine, quiet=False)
    final = run.train()
    planned = plan_of(tmp_path)["steps"]
    replans = [r["replan"] for r in read_metrics(tmp_path / "metrics.jsonl") if "replan" in r]
    assert replans and planned < replans[0]["steps"] and replans[-1]["update_s"] == pytest.approx(0.15)
    assert run.step == final["step"] == replans[-1]["steps"] <= cfg.steps
    assert final["lr"] == pytest.approx(cfg.min_lr_ratio * cfg.lr, rel=1e-12)  # the schedule reached its new end
    assert 0.9 * 60 <= machine.now <= 60
    said = rf"so {planned} updates would leave much of the 1-minute budget; now \d+ updates"
    assert re.search(said, capsys.readouterr().out)


def test_a_pace_within_the_slack_keeps_its_plan(tmp_path):
    machine = LoadedMachine(0.3, calls_before=100, factor=0.97)
    budget_trainer(tmp_path, budget_config(), machine).train()
    assert not [r for r in read_metrics(tmp_path / "metrics.jsonl") if "replan" in r]
    assert read_checkpoint(tmp_path).step == plan_of(tmp_path)["steps"] and machine.now < 60


# -- compilation is not training's time ---------------------------------------------------------------------------


class CompilingMachine(FakeMachine):
    """A machine on which torch.compile's backend ("aot_eager" underneath) takes `compile_s` of the clock in a
    micro-batch that compiles (its graphs, however many): compilation, as slow as it is on a GPU, and no part of
    what an update costs."""

    def __init__(self, batch_s: float, compile_s: float):
        super().__init__(batch_s)
        self.compile_s, self.graphs, self.compiled_calls = compile_s, 0, set()

    def backend(self, graph, example_inputs, **options):
        self.graphs += 1
        if self.calls not in self.compiled_calls:
            self.compiled_calls.add(self.calls)
            self.now += self.compile_s
        return torch._dynamo.lookup_backend("aot_eager")(graph, example_inputs, **options)


def varying_batches(batch_size: int, from_index: int):
    """token_batches, whose rows are shorter in every other micro-batch from `from_index` on: shapes that change
    inside the timed updates, as span corruption's or pairs' do, so torch.compile compiles again there."""
    batches = token_batches(batch_size)

    def batch(i: int):
        inputs, targets = batches(i)
        width = inputs.shape[1] - (4 if i >= from_index and i % 2 == 0 else 0)
        return inputs[:, :width], targets[:, :width]

    return batch


@pytest.fixture
def compiled_machine(monkeypatch):
    """A CompilingMachine whose backend `train.compile` compiles with (20 s for a micro-batch's graphs, 0.15 s per
    micro-batch)."""
    from kqv.train import compiling

    machine = CompilingMachine(0.15, compile_s=20.0)
    monkeypatch.setattr(compiling, "BACKEND", machine.backend)
    torch._dynamo.reset()
    yield machine
    torch._dynamo.reset()


def test_a_compiled_run_plans_from_updates_that_compile_nothing(tmp_path, compiled_machine):
    """A budgeted run with `train.compile = true`, recompiled inside its timed updates (its batches change width at
    update 7), plans at the pace of its updates, not of its compilations: had the recompiling update been timed,
    20 s among eight updates of 0.15 s, it would plan the minimum (its warmup and one update); it plans about a
    hundred more."""
    machine = compiled_machine
    cfg = budget_config(compile=True)
    run = budget_trainer(tmp_path, cfg, machine, batches=varying_batches(cfg.batch_size, from_index=6))
    final = run.train()
    plan = plan_of(tmp_path)
    assert len(machine.compiled_calls) == 2  # the first shapes, then the dynamic widths, inside the timed updates
    assert plan["update_s"] == pytest.approx(0.15) and plan["compiling_updates"] >= 1
    assert plan["limited_by"] == "budget" and plan["steps"] > cfg.warmup_steps + 50
    assert run.step == final["step"] == plan["steps"] and machine.now <= 60
    assert not [r for r in read_metrics(tmp_path / "metrics.jsonl") if "replan" in r]


def test_without_a_cosine_warmup_a_compiled_run_waits_for_updates_that_compile_nothing(tmp_path, compiled_machine):
    """Without a cosine warmup to end it first, the plan waits until `TIMED_UPDATES` updates that compile nothing
    are timed, and fills the budget."""
    machine = compiled_machine
    cfg = budget_config(compile=True, schedule="constant", budget_minutes=2.0)
    run = budget_trainer(tmp_path, cfg, machine, batches=varying_batches(cfg.batch_size, from_index=6))
    run.train()
    plan = plan_of(tmp_path)
    assert plan["planned_at"] == SKIPPED_UPDATES + TIMED_UPDATES + plan["compiling_updates"]
    assert plan["update_s"] == pytest.approx(0.15) and plan["limited_by"] == "budget"
    assert run.step == plan["steps"] and 0.9 * 120 <= machine.now <= 120


def test_the_slow_machine_plans_fewer_updates_than_the_fast_one(tmp_path):
    steps = {}
    for name, batch_s in (("fast", 0.15), ("slow", 1.5)):
        budget_trainer(tmp_path / name, budget_config(), FakeMachine(batch_s)).train()
        steps[name] = plan_of(tmp_path / name)["steps"]
    assert steps["slow"] < steps["fast"] / 5


def test_the_plan_is_fixed_inside_the_warmup_from_the_updates_after_the_skipped_ones(tmp_path):
    """The updates before the plan had the rates of any plan: it is fixed at the latest at the warmup's end."""
    machine = FakeMachine(
        1.0, first_s=30.0
    )  # the skipped updates are slow; had they been timed, the plan would be short
    budget_trainer(tmp_path / "short", budget_config(warmup_steps=12, budget_minutes=3), machine).train()
    plan = plan_of(tmp_path / "short")
    assert plan["planned_at"] == 12 and plan["update_s"] == 1.0
    budget_trainer(tmp_path / "long", budget_config(warmup_steps=100), FakeMachine(1.0)).train()
    assert plan_of(tmp_path / "long")["planned_at"] == SKIPPED_UPDATES + TIMED_UPDATES


def test_the_plan_is_recorded_in_metrics_and_in_the_checkpoint(tmp_path):
    budget_trainer(tmp_path, budget_config(), FakeMachine(1.5)).train()
    plan = plan_of(tmp_path)
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert state["plan"] == plan
    assert read_checkpoint(tmp_path).config.steps == plan["steps"] == read_checkpoint(tmp_path).step
    assert plan["upper_bound"] == 10_000 and plan["budget_minutes"] == 1.0
    record = next(r for r in read_metrics(tmp_path / "metrics.jsonl") if "plan" in r)
    assert record["step"] == plan["planned_at"] and "val_loss" in record  # the timed evaluation is kept


# -- resume replays the plan ---------------------------------------------------------------------------------------


def test_a_budgeted_run_interrupted_and_resumed_equals_the_uninterrupted_run(tmp_path):
    cfg = budget_config(steps=5_000, warmup_steps=8, eval_every=10, checkpoint_every=10, log_every=1)
    budget_trainer(tmp_path / "whole", cfg, FakeMachine(1.5)).train()
    planned = plan_of(tmp_path / "whole")["steps"]
    with pytest.raises(KeyboardInterrupt):  # after the plan, between two checkpoints
        budget_trainer(tmp_path / "cut", cfg, FakeMachine(1.5), batches=failing_at(24, KeyboardInterrupt())).train()
    assert read_checkpoint(tmp_path / "cut").step == 24 and planned > 24
    faster = FakeMachine(0.01)  # the resumed session runs elsewhere: the recorded plan, not a new one, decides
    resumed = budget_trainer(tmp_path / "cut", cfg, faster, resume=True)
    resumed.train()
    assert resumed.step == planned and read_checkpoint(tmp_path / "cut").step == planned
    cut, whole = weights(tmp_path / "cut"), weights(tmp_path / "whole")
    assert all(torch.equal(cut[name], whole[name]) for name in whole)
    losses = {
        name: {r["step"]: r["train_loss"] for r in read_metrics(tmp_path / name / "metrics.jsonl") if "train_loss" in r}
        for name in ("cut", "whole")
    }
    assert losses["cut"] == losses["whole"]


def test_a_resume_with_another_budget_is_refused_and_one_with_other_steps_trains_to_them(tmp_path):
    cfg = budget_config(steps=5_000, warmup_steps=8)
    budget_trainer(tmp_path, cfg, FakeMachine(1.5)).train()
    planned = plan_of(tmp_path)["steps"]
    with pytest.raises(ConfigError, match="planned for a 1-minute budget.*budget_minutes=0"):
        budget_trainer(tmp_path, replace(cfg, budget_minutes=2.0), FakeMachine(1.5), resume=True)
    extended = budget_trainer(tmp_path, replace(cfg, steps=planned + 5), FakeMachine(1.5), resume=True)
    extended.train()
    assert extended.step == planned + 5 and read_checkpoint(tmp_path).state["plan"]["steps"] == planned + 5


# -- steps and budget together ------------------------------------------------------------------------------------


def test_where_the_steps_fit_the_budget_the_run_is_the_fixed_steps_run_bit_for_bit(tmp_path):
    """`steps` is the upper bound: a machine fast enough trains exactly `steps` updates, the same numbers as without
    a budget (the timed evaluation and checkpoint change nothing)."""
    cfg = budget_config(steps=40, warmup_steps=30, eval_every=10)
    budget_trainer(tmp_path / "budget", cfg, FakeMachine(0.1)).train()
    budget_trainer(tmp_path / "fixed", replace(cfg, budget_minutes=0.0), FakeMachine(0.1)).train()
    plan = plan_of(tmp_path / "budget")
    assert plan["steps"] == 40 and plan["limited_by"] == "steps"
    budget, fixed = weights(tmp_path / "budget"), weights(tmp_path / "fixed")
    assert all(torch.equal(budget[name], fixed[name]) for name in fixed)
    assert not [r for r in read_metrics(tmp_path / "fixed" / "metrics.jsonl") if "plan" in r]


def test_a_run_that_ends_before_its_plan_would_be_fixed_plans_nothing(tmp_path):
    budget_trainer(
        tmp_path, budget_config(steps=SKIPPED_UPDATES + TIMED_UPDATES, warmup_steps=100), FakeMachine(1.0)
    ).train()
    assert not [r for r in read_metrics(tmp_path / "metrics.jsonl") if "plan" in r]
    assert read_checkpoint(tmp_path).state["plan"] is None


def test_max_minutes_wins_over_a_budget(tmp_path):
    """A cap at equal training time (comparisons) is not planned: the run stops at the cap, its schedule unchanged."""
    cfg = budget_config(steps=200, max_minutes=0.5, schedule="inverse_sqrt")
    run = budget_trainer(tmp_path, cfg, FakeMachine(1.0))
    run.train()
    assert run.step == 30 and run.config.steps == 200 and run.plan is None


@pytest.mark.parametrize("warmup", [0, 1, SKIPPED_UPDATES])
def test_a_cosine_warmup_too_short_to_plan_in_is_refused_when_the_config_is_read(tmp_path, warmup):
    """The plan must come inside a cosine warmup; one with no update to time would leave the budget unused and
    train all of `steps` (100,000 in the issue's try): a ConfigError that names the fix, before any file."""
    with pytest.raises(ConfigError, match=r"warmup_steps = \d+ leaves none to time.*raise train.warmup_steps"):
        budget_config(steps=40, warmup_steps=warmup)
    assert not any(tmp_path.iterdir())
    shortest = budget_config(steps=40, warmup_steps=SKIPPED_UPDATES + 1)
    run = budget_trainer(tmp_path / "timed", shortest, FakeMachine(9.0))
    run.train()
    assert run.plan is not None and run.plan["planned_at"] == SKIPPED_UPDATES + 1  # one update timed: planned
    budget_config(warmup_steps=0, max_minutes=1.0)  # max_minutes wins: nothing is planned, nothing refused
    inverse_sqrt = budget_config(warmup_steps=0, schedule="inverse_sqrt")  # its rates never depend on steps
    budget_trainer(tmp_path / "inverse_sqrt", inverse_sqrt, FakeMachine(1.5)).train()
    assert plan_of(tmp_path / "inverse_sqrt")["limited_by"] == "budget"
    with pytest.raises(ConfigError, match="budget_minutes must be >= 0"):
        budget_config(budget_minutes=-1)


# -- the plan's arithmetic, against a step-by-step simulation --------------------------------------------------


def simulated_seconds(cfg: TrainConfig, done: int, steps: int, update_s: float, eval_s: float, ckpt_s: float):
    """The trainer's loop, walked: each update, then an evaluation and a checkpoint when due (always after the last)."""
    seconds = 0.0
    for step in range(done + 1, steps + 1):
        seconds += update_s
        seconds += eval_s if step % cfg.eval_every == 0 or step == steps else 0.0
        seconds += ckpt_s if step % cfg.checkpoint_every == 0 or step == steps else 0.0
    return seconds


@pytest.mark.parametrize("done", [0, 7, 20])
@pytest.mark.parametrize("steps", [21, 40, 57, 100])
def test_the_predicted_time_is_the_loops_time(done, steps):
    cfg = budget_config(eval_every=10, checkpoint_every=25)
    expected = simulated_seconds(cfg, done, steps, 0.5, 3.0, 1.25)
    assert predicted_seconds(cfg, done, steps, 0.5, 3.0, 1.25) == pytest.approx(expected)
    assert events(done, steps, 10) == sum(1 for s in range(done + 1, steps + 1) if s % 10 == 0 or s == steps)


@pytest.mark.parametrize("available", [30.0, 47.5, 80.0, 500.0])
def test_the_plan_is_the_most_updates_that_fit(available):
    cfg = budget_config(steps=300, warmup_steps=12, eval_every=10, checkpoint_every=25)
    steps, limited_by = fit_steps(cfg, 20, available, 0.5, 3.0, 1.25)
    fitting = [n for n in range(21, 301) if simulated_seconds(cfg, 20, n, 0.5, 3.0, 1.25) <= available]
    assert steps == max(fitting) and limited_by == ("steps" if steps == 300 else "budget")


def test_a_budget_too_short_for_the_warmup_is_kept_by_cutting_the_run_inside_it():
    cfg = budget_config(steps=300, warmup_steps=12)
    assert fit_steps(cfg, 10, 6.0, 0.5, 3.0, 1.25) == (13, "budget")  # one update past the warmup: the cosine's end
    assert fit_steps(cfg, 10, 5.0, 0.5, 3.0, 1.25) == (11, "cut")  # the most that fit, inside the warmup
    assert fit_steps(cfg, 10, 1.0, 0.5, 3.0, 1.25) == (10, "cut")  # not one more: stop now


def test_a_machine_too_slow_to_time_its_updates_in_the_budget_plans_at_once_and_stops_within_it(tmp_path, caplog):
    """A loaded machine (8 s an update) on which the updates the plan waits for would take 96 s of a 60 s budget:
    at half the budget the plan comes at once from what was timed, cuts the run inside its warmup, and says so;
    the run, its final evaluations included, ends within the budget."""
    machine = FakeMachine(8.0)
    cfg = budget_config(warmup_steps=12)
    run = budget_trainer(tmp_path, cfg, machine, work_after_training=1)
    final = run.train()
    run.evaluate()  # the job's work after training, which the plan reserved
    plan = plan_of(tmp_path)
    assert plan["planned_at"] < cfg.warmup_steps and plan["limited_by"] == "cut"
    assert run.step == final["step"] == plan["steps"] < cfg.warmup_steps
    assert machine.now <= 60  # the promise kept
    assert "too short for this machine to finish the schedule's warmup: the run stops after" in caplog.text


# -- progress a person can read ----------------------------------------------------------------------------------


def test_without_a_terminal_a_progress_line_with_the_time_left_comes_at_least_every_30_seconds(tmp_path, monkeypatch):
    machine, lines = FakeMachine(1.5, first_s=6.0), []
    write = Reporter.write

    def progress(self, line):  # the progress lines, not the plan's
        if line.startswith("step"):
            lines.append((machine.now, line))
        write(self, line)

    monkeypatch.setattr(Reporter, "write", progress)
    cfg = budget_config(budget_minutes=3, eval_every=40, log_every=10)
    run = budget_trainer(tmp_path, cfg, machine, quiet=False)  # under pytest standard error is not a terminal
    run.train()
    times = [0.0] + [t for t, _ in lines]
    assert len(lines) >= 180 / LINE_EVERY_S
    assert max(b - a for a, b in zip(times, times[1:])) <= LINE_EVERY_S
    assert machine.now - times[-1] <= LINE_EVERY_S
    for t, line in lines[1:]:  # the first may come before any estimate
        left = re.search(r"left (?:(\d+) min )?(\d+) s$", line)
        assert left, line
        seconds = 60 * int(left[1] or 0) + int(left[2])
        assert abs(seconds - (run.elapsed_s - t)) <= 0.1 * 180, line  # a usable estimate of the training left


def test_every_progress_line_and_the_bar_show_the_time_left():
    assert progress_line(20, 100, {"train_loss": 1.5, "elapsed_s": 90.0}, 252.0).endswith("1.5 min  left 4 min 12 s")
    assert progress_line(0, 100, {"elapsed_s": 0.0}).endswith("left ?")
    assert [format_duration(s) for s in (45, 252, 3900)] == ["45 s", "4 min 12 s", "1 h 05 min"]


def test_on_a_terminal_the_bar_shows_the_time_left(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = progress_bar(100, 0, shown=True)
    bar.left_s = 252.0
    bar.update(1)
    bar.refresh()
    bar.close()
    assert "1/100" in sys.stderr.getvalue() and "left 4 min 12 s" in sys.stderr.getvalue()


def test_two_processes_plan_and_watch_their_budget_together(tmp_path):
    """Under torchrun every rank looks at the pace at the same log intervals (rank 0 decides, the others receive
    its steps), however many looks: each rank measures afresh after a look. (A rank other than 0 kept counting
    its updates and looked alone at the next log interval, waiting for a broadcast rank 0 never sent.)"""
    import os
    import signal
    import socket
    import subprocess
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker = Path(__file__).with_name("budget_worker.py")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(worker.parent), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
    command += ["--master_port", str(port), str(worker), str(tmp_path)]
    launched = subprocess.Popen(
        command, env={**env, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = launched.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(launched.pid, signal.SIGKILL)  # the launcher and both ranks, waiting for each other
        launched.communicate()
        pytest.fail("the two processes did not finish in 150 s: they wait for each other")
    assert launched.returncode == 0, stderr[-4000:]
    records = read_metrics(tmp_path / "metrics.jsonl")
    plans = [r.get("plan") or r.get("replan") for r in records if "plan" in r or "replan" in r]
    logged = [r["step"] for r in records if "train_loss" in r]
    assert plans and logged[-1] == plans[-1]["steps"] and stdout.count(f"trained {logged[-1]} of") == 2
    assert logged[-1] > plans[0]["planned_at"] + 2 * TIMED_UPDATES  # the pace was looked at after the plan
