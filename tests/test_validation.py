"""One annotation-driven validator for every config dataclass (kqv.validation), and kqv's own exception types."""

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import pytest

from kqv import ModelConfig, RNNConfig
from kqv.cli.main import main, packaged_config
from kqv.errors import ConfigError, ConfigTypeError, DataError, KqvError, RunError
from kqv.jobs import all_jobs, get_job
from kqv.jobs.cls import ClsDataConfig, HeadConfig
from kqv.jobs.lm import DataConfig, LMJob
from kqv.jobs.mlm import MaskingConfig, MLMDataConfig
from kqv.jobs.mt import DecodeConfig, MTDataConfig
from kqv.jobs.sampling import SampleConfig
from kqv.train.config import TrainConfig
from kqv.validation import Config, build, field_types

REQUIRED = {ModelConfig: {"vocab_size": 10}, RNNConfig: {"vocab_size": 10}, TrainConfig: {"steps": 1, "batch_size": 1}}
CONFIGS = [
    ModelConfig,
    RNNConfig,
    TrainConfig,
    DataConfig,
    SampleConfig,
    MLMDataConfig,
    MaskingConfig,
    ClsDataConfig,
    HeadConfig,
    MTDataConfig,
    DecodeConfig,
]


def wrong_value(annotation):
    """A value of the wrong type for a field annotation: a string for numbers and bools, a number otherwise."""
    options = [t for t in typing.get_args(annotation) if t is not type(None)]
    base = options[0] if typing.get_origin(annotation) is not Literal and options else annotation
    return "not a number" if base in (int, float, bool) or typing.get_origin(base) is tuple else 12345


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_field_of_every_config_is_checked_against_its_annotation(cls):
    for f in dataclasses.fields(cls):
        values = {**REQUIRED.get(cls, {}), f.name: wrong_value(field_types(cls)[f.name])}
        with pytest.raises(ConfigError, match=f.name):
            build(cls, values)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_config_round_trips_through_its_dict(cls):
    config = build(cls, REQUIRED.get(cls, {}))
    assert build(cls, config.to_dict()) == config


def test_the_string_none_is_none_only_where_the_annotation_allows_none():
    assert build(SampleConfig, {"top_k": "none"}).top_k is None
    assert build(ModelConfig, {"vocab_size": 10, "position": "none"}).position == "none"
    assert build(DataConfig, {"path": "none"}).path is None
    assert build(SampleConfig, {"prompt": "none"}).prompt == "none"  # a plain string field keeps the text


def test_set_model_position_none_configures_a_model_without_positions():
    config = LMJob().load_config(packaged_config("quick"), ["model.position=none", "sample.top_k=none"])
    assert config.model_config(vocab_size=65).position == "none"
    assert config.sample.top_k is None


def test_set_model_position_none_trains_through_the_cli(tmp_path):
    corpus = tmp_path / "text.txt"
    corpus.write_text("to be or not to be, that is the question\n" * 40)
    sets = [
        "model.position=none",
        "model.d_model=16",
        "model.n_heads=2",
        "model.n_layers=1",
        "model.d_ff=32",
        "data.context=16",
        "train.batch_size=2",
        "train.warmup_steps=1",
        "train.budget_minutes=0",  # two fixed updates: a budget needs a warmup long enough to time
        "sample.count=1",
        "sample.max_new_tokens=4",
        "sample.prompt=to",
        'train.precision="fp32"',
    ]
    args = ["train", "lm", "--data", str(corpus), "--steps", "2", "--out", str(tmp_path / "run"), "--quiet"]
    assert main(args + [f"--set={s}" for s in sets]) == 0
    assert 'position = "none"' in (tmp_path / "run" / "run.toml").read_text()


def test_unknown_and_missing_options_are_named_with_the_valid_ones():
    with pytest.raises(
        ConfigError,
        match=r"unknown \[sample\] option\(s\) \['topk'\] \(did you mean 'top_k'\?\); valid options are .*top_k",
    ):
        build(SampleConfig, {"topk": 3})
    with pytest.raises(ConfigError, match=r"TrainConfig needs the option\(s\) \['batch_size'\]"):
        build(TrainConfig, {"steps": 3})


def test_values_are_normalised_as_their_annotations_say():
    config = build(TrainConfig, {"steps": 3, "batch_size": 2, "betas": [0.8, 0.9], "lr": 1})
    assert config.betas == (0.8, 0.9) and config.lr == 1  # a list becomes the tuple; an int is a fine float
    with pytest.raises(ConfigTypeError, match="steps must be int, got bool"):
        build(TrainConfig, {"steps": True, "batch_size": 2})
    with pytest.raises(ConfigTypeError, match="lr must be a finite number"):
        build(TrainConfig, {"steps": 3, "batch_size": 2, "lr": float("nan")})
    with pytest.raises(ConfigError, match=r"betas must have 2 values"):
        build(TrainConfig, {"steps": 3, "batch_size": 2, "betas": [0.9]})


def test_nested_configs_are_built_from_their_tables():
    @dataclass
    class Inner(Config):
        section: ClassVar[str] = "inner"
        size: int = 1

    @dataclass
    class Outer(Config):
        inner: Inner = dataclasses.field(default_factory=Inner)

    assert build(Outer, {"inner": {"size": 3}}).inner == Inner(3)
    with pytest.raises(ConfigError, match=r"unknown \[inner\] option"):
        build(Outer, {"inner": {"width": 3}})


def test_every_run_config_builds_each_of_its_sections_from_the_shipped_configs():
    for job in all_jobs().values():
        shipped = Path(packaged_config("quick", job.name))
        config = job.load_config(shipped)
        assert type(config) is job.config_class and config.task == job.name
        assert type(config).from_dict(config.to_dict()) == config


def test_kqv_errors_are_also_the_builtin_errors_callers_catch():
    for error in (ConfigError, DataError, RunError):
        assert issubclass(error, KqvError) and issubclass(error, ValueError)
    assert issubclass(ConfigTypeError, TypeError)


def test_the_cli_reports_kqv_errors_in_one_line_and_lets_bugs_show_their_traceback(tmp_path, monkeypatch, capsys):
    def expected(*args, **kwargs):
        raise DataError("the corpus is empty; give some text")

    def bug(*args, **kwargs):
        raise RuntimeError("a bug in kqv")

    monkeypatch.setattr(LMJob, "train", expected)
    assert main(["train", "lm", "--out", str(tmp_path / "a")]) == 2
    assert capsys.readouterr().err == "kqv: error: the corpus is empty; give some text\n"
    monkeypatch.setattr(LMJob, "train", bug)
    with pytest.raises(RuntimeError, match="a bug in kqv"):
        main(["train", "lm", "--out", str(tmp_path / "b")])


def test_get_job_names_the_jobs_there_are():
    with pytest.raises(ConfigError, match=r"no job 'vision'; the jobs are \['cls', 'lm', 'mlm', 'mt'"):
        get_job("vision")


@pytest.mark.parametrize("seed", [0, 1, 2**63 - 1])
def test_check_seed_takes_every_non_negative_int64(seed):
    from kqv.validation import check_seed

    assert check_seed("seed", seed) == seed
    import torch

    torch.Generator().manual_seed(seed)  # what it lets through, torch takes


@pytest.mark.parametrize("seed", [-1, 2**63, 2**70, True, 1.0, "3"])
def test_check_seed_refuses_what_torch_cannot_take_in_one_line(seed):
    from kqv.validation import check_seed

    with pytest.raises(ConfigError, match=r"^train.seed must be an integer from 0 to 2\*\*63 - 1, got .*$"):
        check_seed("train.seed", seed)
