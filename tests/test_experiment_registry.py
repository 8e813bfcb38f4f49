"""The experiment registry against the package's modules, the contract checked when a module is registered,
`--set` overrides read and validated as run-config overrides are, and a diverging arm scored, not fatal."""

import dataclasses
import json
import math
import pkgutil
import types

import pytest

import kqv_lab.experiments
from kqv.errors import ConfigError
from kqv.train.runs import apply_override, override_value
from kqv_lab.experiments import EXPERIMENTS, SUPPORT_MODULES, get, heads, norm_placement
from kqv_lab.experiments.base import CONTRACT, Experiment, ExperimentError, Progress, with_overrides
from kqv_lab.experiments.lm import QUICK_LM
from kqv_lab.experiments.records import RESULTS_FILE
from kqv_lab.experiments.runner import write_results

# ---------------------------------------------------------------------------------------------------------------
# The registry


def test_every_experiment_module_is_registered_under_its_own_name():
    modules = {info.name for info in pkgutil.iter_modules(kqv_lab.experiments.__path__)}
    assert set(SUPPORT_MODULES) <= modules, "a support module listed in SUPPORT_MODULES is gone"
    registered = {experiment.module.rpartition(".")[2] for experiment in EXPERIMENTS.values()}
    assert registered == modules - set(SUPPORT_MODULES), "an experiment module is missing from EXPERIMENTS"
    assert len(registered) == len(EXPERIMENTS), "a module is registered twice"
    for key, experiment in EXPERIMENTS.items():
        assert isinstance(experiment, Experiment)
        assert experiment.name == key, f"EXPERIMENTS[{key!r}] holds the experiment named {experiment.name!r}"
        module = __import__(experiment.module, fromlist=["NAME"])
        assert module.NAME == key and experiment.full is module.FULL and experiment.checks is module.checks


def _module_like(source: types.ModuleType, *, without: tuple[str, ...] = (), **changes) -> types.ModuleType:
    """A copy of an experiment module's contract, less the parts `without`, with `changes`."""
    module = types.ModuleType("kqv_lab.experiments.made_up")
    for part in CONTRACT:
        if part not in without:
            setattr(module, part, getattr(source, part))
    for part, value in changes.items():
        setattr(module, part, value)
    return module


def test_a_module_lacking_parts_of_the_contract_is_refused_naming_the_module_and_the_parts():
    assert Experiment.of(_module_like(heads)).name == "heads"  # the copy itself is a valid experiment
    with pytest.raises(ExperimentError, match=r"kqv_lab\.experiments\.made_up lacks FIELDS, checks:"):
        Experiment.of(_module_like(heads, without=("checks", "FIELDS")))
    with pytest.raises(ExperimentError, match="lacks Config, QUICK"):
        Experiment.of(_module_like(heads, without=("QUICK", "Config")))


def test_a_module_whose_parts_do_not_fit_the_contract_is_refused():
    with pytest.raises(ExperimentError, match="QUICK must be a kqv_lab.experiments.made_up.Config"):
        Experiment.of(_module_like(heads, QUICK=norm_placement.QUICK))
    with pytest.raises(ExperimentError, match="table must be functions"):
        Experiment.of(_module_like(heads, table="a table"))
    with pytest.raises(ExperimentError, match="FIELDS must be a tuple of result keys"):
        Experiment.of(_module_like(heads, FIELDS="arms"))
    with pytest.raises(ExperimentError, match="deriving from ExperimentConfig"):
        Experiment.of(_module_like(heads, Config=dict))


# ---------------------------------------------------------------------------------------------------------------
# Overrides


def test_override_values_are_read_as_run_config_overrides_are():
    for raw in ("200", "0.5", "[64, 128]", '"rope"', "rope", "true"):
        values: dict = {}
        apply_override(values, f"train.x={raw}")
        assert values["train"]["x"] == override_value(raw)
    config = with_overrides(heads.QUICK, ["head_counts=[2, 8]", "position=alibi", "lr=0.5", "blocks=3"])
    assert (config.head_counts, config.position, config.lr, config.blocks) == ((2, 8), "alibi", 0.5, 3)
    assert with_overrides(heads.QUICK, ["head_counts=2"]).head_counts == (2,), "one value for a list is a list of one"
    assert heads.QUICK.head_counts == (1, 4), "overrides make a copy"


@pytest.mark.parametrize(
    "override, message",
    [
        ("position=sideways", "position must be one of ['sinusoidal', 'learned'"),
        ("steps=1.5", "steps must be int"),
        ("lr=fast", "lr must be a finite number"),
        ("head_counts=[4, 0]", "head_counts must be positive, got 0"),
        ("head_counts=[]", "head_counts must list at least one value"),
        ("colour=3", "unknown option 'colour' for heads; its options are ['batch_size', 'blocks', 'context'"),
        ("section=3", "unknown option 'section'"),
        ("steps", "must look like field=value"),
    ],
)
def test_a_bad_override_names_the_field_and_what_it_may_be(override, message):
    with pytest.raises(ConfigError) as error:
        get("heads").config(quick=True, overrides=[override])
    assert message in str(error.value)


def test_zero_is_allowed_only_where_the_config_says_so():
    assert get("rnn-vs-transformer").config(True, ["verses=0"]).verses == 0
    with pytest.raises(ExperimentError, match="eval_every must be positive"):
        get("rnn-vs-transformer").config(True, ["eval_every=0"])


@pytest.mark.parametrize(
    "name, override, message",
    [
        ("long-attention", "steps=[10]", "lengths and steps pair up: got 2 lengths and 1 steps"),
        ("scaling-laws", "depths=[2, 3, 4]", "widths and depths pair up: got 6 widths and 3 depths"),
    ],
)
def test_paired_fields_must_be_as_long_as_each_other(name, override, message):
    with pytest.raises(ExperimentError, match=message):
        get(name).config(True, [override])


# ---------------------------------------------------------------------------------------------------------------
# A diverging arm is scored, not fatal


def test_a_diverging_arm_is_reported_and_scored_while_the_experiment_goes_on(tmp_path):
    """norm-placement at lr 1e-2 and at lr 1e6: every lr-1e6 run's loss turns non-finite at once, the Trainer stops
    it (TrainingDiverged), and the experiment records it as diverged, counts it as a failed run at the unigram
    loss, and goes on to train and score the other arms."""
    config = norm_placement.Config(
        **{**QUICK_LM, "n_layers": 1, "steps": 40, "warmup_steps": 4, "eval_every": 40}, lrs=(1e-2, 1e6)
    )
    results = norm_placement.run(config, [0], Progress("norm-placement", enabled=False))
    unigram = results["unigram_loss"]
    for placement in ("post-LN", "pre-LN"):
        for warmup in (True, False):
            wild = results["arms"][norm_placement.arm_name(placement, warmup, 1e6)]
            tame = results["arms"][norm_placement.arm_name(placement, warmup, 1e-2)]
            assert wild["diverged"] == [True] and math.isnan(wild["val_loss"][0])
            assert wild["val_curves"] == [[]], "a diverged run stops before its evaluation at the last step"
            assert tame["diverged"] == [False] and tame["val_loss"][0] < unigram - norm_placement.FAIL_MARGIN
            assert tame["val_curves"][0][-1][0] == config.steps
            assert norm_placement.outcome(results, norm_placement.arm_name(placement, warmup, 1e6)) == (unigram, 1)
    record = write_results(
        get("norm-placement"),
        config,
        results,
        tmp_path,
        quick=True,
        seconds=1.0,
        threads=1,
        load=(None, None),
        command="kqv experiment run norm-placement --quick",
    )
    assert [row[-1] for row in record["table"]["rows"]] == ["diverged (failed 1/1)"] * 4
    pre_ln_better, pre_ln_never_fails, post_ln_trains = record["checks"]
    # both placements failed at lr 1e6 (each scored at the unigram loss), and one seed gives no interval: undecided
    assert pre_ln_better["outcome"] == "inconclusive" and "failed 1" in pre_ln_better["figure"]
    assert not pre_ln_never_fails["holds"] and "failed pre-LN runs 2 of 4" in pre_ln_never_fails["figure"]
    assert post_ln_trains["role"] == "control" and post_ln_trains["holds"], "post-LN trains at lr 1e-2"
    assert record["verdict"] == "does not hold here"
    saved = json.loads((tmp_path / RESULTS_FILE).read_text())
    assert saved["results"]["arms"][norm_placement.arm_name("pre-LN", False, 1e6)]["diverged"] == [True]


# ---------------------------------------------------------------------------------------------------------------
# LMConfig -> ModelConfig, TrainConfig


def test_lm_config_builds_the_model_and_train_configs_its_fields_declare():
    from kqv import ModelConfig
    from kqv.train.config import TrainConfig
    from kqv_lab.experiments.lm import MODEL_FIELDS, TRAIN_FIELDS, LMConfig

    assert {f.name for f in dataclasses.fields(LMConfig)} == {*MODEL_FIELDS, *TRAIN_FIELDS, "seeds"}
    setup = LMConfig(
        d_model=48,
        n_heads=3,
        n_layers=5,
        d_ff=96,
        context=24,
        position="alibi",
        batch_size=7,
        steps=90,
        lr=2e-3,
        warmup_steps=9,
        eval_every=45,
        eval_batches=3,
    )
    assert setup.model_config(65, n_layers=2) == ModelConfig(
        vocab_size=65, d_model=48, n_heads=3, n_layers=2, d_ff=96, max_len=24, position="alibi", dropout=0.0
    )
    assert setup.train_config(4, lr=0.5) == TrainConfig(
        steps=90,
        batch_size=7,
        lr=0.5,
        warmup_steps=9,
        precision="fp32",
        eval_every=45,
        eval_batches=3,
        checkpoint_every=90,
        log_every=9,
        seed=4,
    )
