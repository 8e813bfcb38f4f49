"""One lifecycle: every job trains through `Job.train` of the base class, says what happens as events, and prints
nothing itself; one `Reporter` shows the events (progress lines without a terminal) or hands them to a callback."""

import io
import re
import sys

import pytest

import kqv
from kqv.jobs import JOBS, Job
from kqv.train.events import Evaluation, Message, Plan, Progress, Sample, Summary
from kqv.train.reporter import LINE_EVERY_S, Reporter
from test_cli import TINY


@pytest.fixture
def tiny_lm(tmp_path):
    """A tiny LM config and corpus; `train(**options)` trains it into a fresh run directory."""
    (tmp_path / "tiny.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    (tmp_path / "tiny.toml").write_text(TINY.format(position="rope"))
    runs = iter(range(100))

    def train(**options):
        out = tmp_path / f"run{next(runs)}"
        return kqv.train(
            "lm", tmp_path / "tiny.toml", out=out, overrides=[f"data.path={tmp_path / 'tiny.txt'}"], **options
        )

    return train


@pytest.mark.parametrize("name", sorted(JOBS))
def test_every_job_trains_through_the_one_lifecycle_of_the_base_class(name):
    job = type(JOBS[name])
    assert job.train is Job.train, f"{job.__name__} overrides Job.train"
    for hook in ("make_corpus", "make_model", "trainer_options"):
        assert getattr(job, hook) is not getattr(Job, hook), f"{job.__name__} lacks the hook {hook}"


def test_a_callback_receives_the_events_of_a_tiny_lm_run_in_order(tiny_lm, capsys):
    events = []
    summary = tiny_lm(on_event=events.append)
    kinds = [type(e) for e in events]
    assert kinds[0] is Plan and kinds[-1] is Summary
    assert events[0].steps == 6 and events[0].parameters > 0 and "run directory" in events[0].text
    assert events[-1].figures == summary and "validation loss" in events[-1].text
    assert kinds.index(Sample) == len(kinds) - 2 and events[-2].text.startswith("To")
    progress = [e for e in events if isinstance(e, Progress)]
    assert [e.step for e in progress] == [1, 2, 3, 4, 5, 6] and all(e.steps == 6 for e in progress)
    assert all(e.train_loss is not None and e.elapsed_s > 0 for e in progress)  # log_every = 1
    evaluations = [e for e in events if isinstance(e, Evaluation)]
    assert [e.step for e in evaluations] == [3, 6] and all("val_loss" in e.metrics for e in evaluations)
    order = [k.__name__ for k in kinds if k is not Message]  # an evaluation comes before its update's progress
    assert order == [
        "Plan",
        *["Progress"] * 2,
        "Evaluation",
        *["Progress"] * 3,
        "Evaluation",
        "Progress",
        "Sample",
        "Summary",
    ]
    assert capsys.readouterr().out == ""  # given a callback, nothing is shown


def test_a_quiet_run_prints_nothing_and_a_run_that_speaks_prints_its_plan_sample_and_result(tiny_lm, capsys):
    tiny_lm(quiet=True)
    assert capsys.readouterr().out == ""
    tiny_lm()
    out = capsys.readouterr().out
    assert re.match(r"kqv: [\d,]+ parameters, [\d,]+ training tokens \(char tokenizer", out)
    assert "--- sample ---\nTo" in out and "--- end of sample ---" in out
    assert re.search(r"kqv: validation loss \d+\.\d+ nats/token .* after 6 steps in \d+\.\d min\n$", out)
    assert "step 3/6" in out and "step 6/6" in out  # the evaluations' progress lines


def test_without_a_terminal_the_reporter_writes_a_progress_line_at_least_every_30_seconds(capsys):
    report, seconds = Reporter(), 0.0  # under pytest standard error is not a terminal: no bar
    report(Plan("a model", 1, 400, "runs/x"))
    assert capsys.readouterr().out == "kqv: a model\n"
    times = []
    for step in range(1, 401):
        seconds += 0.7
        report(Progress(step, 400, seconds, left_s=(400 - step) * 0.8, train_loss=2.0, tokens_per_s=100.0))
        if capsys.readouterr().out:
            times.append(seconds)
    gaps = [b - a for a, b in zip([0.0, *times], times)]
    assert len(times) >= seconds / LINE_EVERY_S - 1 and max(gaps) <= LINE_EVERY_S
    report(Evaluation(400, 400, {"step": 400, "val_loss": 1.5, "elapsed_s": seconds}, 0.0))
    assert capsys.readouterr().out == f"step 400/400  val 1.500  {seconds / 60:.1f} min  left 0 s\n"


def test_a_reporter_logs_warnings_even_when_quiet_and_hands_every_event_to_its_callback(caplog, capsys):
    received = []
    report = Reporter(quiet=True, on_event=received.append)
    events = [Message("planned 10 updates"), Message("the budget is too short", warning=True)]
    for event in events:
        report(event)
    assert received == events
    assert "the budget is too short" in caplog.text and "planned" not in caplog.text
    assert capsys.readouterr().out == ""


def test_on_a_terminal_the_reporter_draws_the_bar_with_the_time_left_and_the_last_loss(monkeypatch, capsys):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    report = Reporter()
    for step in (1, 2):
        report(Progress(step, 100, 40.0 * step, left_s=252.0, train_loss=1.25, lr=1e-3))
    report.bar.refresh()
    report(Summary({}, "done"))
    assert "2/100" in sys.stderr.getvalue() and "left 4 min 12 s" in sys.stderr.getvalue()
    assert "loss=1.2500" in sys.stderr.getvalue()
    assert capsys.readouterr().out == "kqv: done\n"  # on a terminal the bar stands in for the progress lines


def test_a_resumed_run_says_where_it_resumed_and_its_last_line_counts_the_minutes_its_progress_lines_count(tmp_path):
    (tmp_path / "tiny.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    (tmp_path / "tiny.toml").write_text(TINY.format(position="rope"))
    options = dict(out=tmp_path / "run", overrides=[f"data.path={tmp_path / 'tiny.txt'}"])
    kqv.train("lm", tmp_path / "tiny.toml", quiet=True, **options)
    events = []
    kqv.train("lm", resume=True, steps=9, on_event=events.append, **options)
    said = [e.text for e in events if isinstance(e, Message)]
    assert any(re.fullmatch(r"resumed .*checkpoint at update 6 of 9, \d+ s into the run", text) for text in said)
    last = [e for e in events if isinstance(e, Progress)][-1]
    summary = events[-1].text
    assert f"after 9 steps in {last.elapsed_s / 60:.1f} min (" in summary  # the run's minutes, every session
    assert re.search(r"\(\d+\.\d min in this session, resumed at update 6\)$", summary)
