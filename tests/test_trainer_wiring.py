"""How the Trainer is wired: what a job hands it is one typed `TrainerOptions`; where it trains (`Placement`) is one
object handed whole to its checkpoints, evaluation and updates; its steps are read from its one plan, and a budget's
plan changes nothing else (no config rewritten)."""

import inspect
from dataclasses import FrozenInstanceError

import pytest

from kqv.errors import ConfigError, ConfigTypeError
from kqv.train.evaluator import Evaluator
from kqv.train.options import TrainerOptions
from kqv.train.saving import Checkpointer
from kqv.train.trainer import Trainer
from kqv.train.update import Updater
from test_budget import FakeMachine, budget_config, budget_trainer, plan_of
from test_training import config, lm_loss, make_model, token_batches


def test_the_trainer_keeps_its_placement_whole_and_hands_it_to_its_parts(tmp_path):
    run = Trainer(make_model(), config(), tmp_path, train_batches=token_batches(4), loss_fn=lm_loss, quiet=True)
    assert run.checkpoints.placement is run.evaluator.placement is run.updater.placement is run.placement
    assert run.model is run.placement.model and run.rank == run.placement.rank == 0


def test_no_part_takes_the_placements_fields_one_by_one():
    """The fields of `Placement` reach the Trainer's parts inside it, never as loose arguments."""
    loose = {"rank", "world_size", "sharded", "precision", "device", "model", "callers_model"}
    for part in (Checkpointer, Evaluator, Updater):
        assert not loose & set(inspect.signature(part).parameters), part.__name__


def test_a_budgets_plan_is_the_one_place_its_steps_are_read_from(tmp_path):
    """The config stays as given (its steps the plan's upper bound); the plan alone says how many updates run, and
    the checkpoint records the planned config, which a resume replays."""
    cfg = budget_config()
    run = budget_trainer(tmp_path, cfg, FakeMachine(1.5))
    run.train()
    planned = plan_of(tmp_path)["steps"]
    assert run.config is cfg and run.config.steps == 10_000  # not rewritten
    assert run.steps == run.plan["steps"] == planned == run.step < cfg.steps
    assert run.planned_config().steps == planned


def test_what_a_job_hands_the_trainer_is_a_frozen_typed_object(tmp_path):
    options = TrainerOptions(train_batches=token_batches(4), loss_fn=lm_loss, quiet=True)
    with pytest.raises(FrozenInstanceError):
        options.quiet = False
    run = Trainer(make_model(), config(steps=2), tmp_path, options)
    assert run.options is options and run.train()["step"] == 2
    changed = Trainer(make_model(), config(steps=2), tmp_path / "b", options, val_batches=token_batches(4))
    assert changed.options.val_batches is not None and changed.options.loss_fn is lm_loss  # keywords over options


@pytest.mark.parametrize(
    "options, given, error, message",
    [
        ({"train_batches": 1}, {}, ConfigTypeError, "options must be a TrainerOptions, got dict"),
        (None, {"train_batches": 1, "loss_fn": lm_loss, "val_batch": 1}, ConfigTypeError, "no option val_batch"),
        (None, {"train_batches": 1}, ConfigTypeError, "needs loss_fn"),
        (None, {"train_batches": 1, "loss_fn": lm_loss, "if_exists": "keep"}, ConfigError, "if_exists must be one"),
        (None, {"train_batches": 1, "loss_fn": lm_loss, "extra_state": {"x": object()}}, ConfigTypeError, "JSON"),
    ],
    ids=["a dict", "an unknown option", "no loss", "a bad if_exists", "extra state not JSON"],
)
def test_bad_options_are_refused_before_anything_is_placed_or_opened(tmp_path, options, given, error, message):
    with pytest.raises(error, match=message):
        Trainer(make_model(), config(), tmp_path / "run", options, **given)
    assert not (tmp_path / "run").exists()
