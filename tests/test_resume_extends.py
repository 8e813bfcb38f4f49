"""Resume that extends: a finished run continues to a new number of steps, and where the schedule allows it the
result equals a run planned that long from the start, bit for bit."""

import pytest
import torch

from kqv.train.checkpoints import read_checkpoint
from kqv.train.config import learning_rate
from kqv.train.metrics import read_metrics
from test_training import config, resume, trainer, weights


def extended_and_planned(tmp_path, first: int, total: int, **changes):
    """(weights after `first` steps then resumed to `total`, weights of one run planned for `total`)."""
    trainer(tmp_path / "extended", config(steps=first, **changes)).train()
    resume(tmp_path / "extended", cfg=config(steps=total, **changes)).train()
    trainer(tmp_path / "planned", config(steps=total, **changes)).train()
    return weights(tmp_path / "extended"), weights(tmp_path / "planned")


@pytest.mark.parametrize("schedule", ["constant", "inverse_sqrt"])
def test_extending_a_finished_run_equals_planning_the_longer_run(tmp_path, schedule):
    extended, planned = extended_and_planned(tmp_path, 4, 8, schedule=schedule)  # dropout on: generators resume
    assert all(torch.equal(extended[name], planned[name]) for name in planned)
    assert read_checkpoint(tmp_path / "extended").step == 8
    assert "schedule_replanned" not in (tmp_path / "extended" / "metrics.jsonl").read_text()


def test_a_cosine_run_extended_during_its_warmup_equals_the_planned_run(tmp_path):
    extended, planned = extended_and_planned(tmp_path, 3, 8, schedule="cosine", warmup_steps=4)
    assert all(torch.equal(extended[name], planned[name]) for name in planned)


def test_a_cosine_run_extended_after_warmup_is_recomputed_to_the_new_end_and_says_so(tmp_path, caplog):
    extended, planned = extended_and_planned(tmp_path, 4, 8, schedule="cosine", warmup_steps=2)
    assert not all(torch.equal(extended[name], planned[name]) for name in planned)
    records = read_metrics(tmp_path / "extended" / "metrics.jsonl")
    replanned = [r for r in records if "schedule_replanned" in r]
    old, new = config(steps=4, schedule="cosine", warmup_steps=2), config(steps=8, schedule="cosine", warmup_steps=2)
    assert replanned == [
        {
            "step": 4,
            "schedule_replanned": {
                "from_steps": 4,
                "to_steps": 8,
                "first_differing_step": 3,
                "lr_before": learning_rate(old, 4),
                "lr_after": learning_rate(new, 5),
            },
        }
    ]
    assert [r["lr"] for r in records if r.get("step", 0) > 4 and "lr" in r] == [
        learning_rate(new, t) for t in range(5, 9)
    ]
    assert "will differ from one planned for 8 steps" in caplog.text


def test_asking_for_fewer_steps_than_done_is_a_clear_error(tmp_path):
    trainer(tmp_path, config(steps=4)).train()
    with pytest.raises(ValueError, match="already at step 4.*more than 4 steps"):
        resume(tmp_path, cfg=config(steps=3))


def test_a_longer_time_budget_continues_a_run_stopped_by_its_budget(tmp_path):
    """max_minutes counts training time over every session, so a resumed run gets the rest of a larger budget."""
    cut = trainer(tmp_path / "cut", config(steps=8, max_minutes=1e-9))  # stops after the first update
    cut.train()
    assert cut.step == 1
    resume(tmp_path / "cut", cfg=config(steps=8)).train()  # no time limit now: on to the planned end
    trainer(tmp_path / "whole", config(steps=8)).train()
    assert read_checkpoint(tmp_path / "cut").step == 8
    cut_weights, whole = weights(tmp_path / "cut"), weights(tmp_path / "whole")
    assert all(torch.equal(cut_weights[name], whole[name]) for name in whole)  # the schedule follows steps
