"""The job contract (kqv.jobs.base) and the registries: a job is one entry in `kqv.jobs.JOBS` (its flags and
commands one entry each in the command line's), and `kqv train` and `kqv COMMAND RUN` serve it."""

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import pytest
import torch

from kqv import DecoderLM, ModelConfig
from kqv.cli import flags
from kqv.cli.commands import JobCommand, RunCommand
from kqv.cli.flags import Flag
from kqv.cli.main import COMMANDS, all_commands, build_parser, main
from kqv.errors import RunError
from kqv.jobs import JOBS, Job, TrainedRun, all_jobs, get_job, load_run
from kqv.jobs.base import Outcome
from kqv.jobs.offers import CAPABILITIES, Capability
from kqv.train.options import TrainerOptions
from kqv.train.runs import RunConfig, read_summary
from kqv.validation import Config

TOY_CONFIG = """
[model]
d_model = 8
n_heads = 2
n_layers = 1
d_ff = 16

[toy]
length = 6

[train]
steps = 2
batch_size = 2
warmup_steps = 1
precision = "fp32"
"""


@dataclass
class ToySection(Config):
    section: ClassVar[str] = "toy"
    length: int = 4


@dataclass
class ToyRunConfig(RunConfig):
    task: ClassVar[str] = "toy"
    toy: ToySection = field(default_factory=ToySection)


@runtime_checkable
class Guesses(Protocol):
    """The toy job's capability: guess the token after 0."""

    def guess(self) -> int: ...


@dataclass(repr=False)
class ToyRun(TrainedRun, Guesses):
    """The toy job's operation on a trained run, in plain Python."""

    def guess(self) -> int:
        """The model's guess of the token after 0."""
        return int(self.model(torch.tensor([[0]]))[0, -1].argmax())


class ToyJob(Job):
    name = "toy"
    help = "count to `toy.length`"
    config_class = ToyRunConfig
    run_class = ToyRun

    def build_model(self, model_config: ModelConfig, config: RunConfig, values: dict[str, Any]) -> DecoderLM:
        return DecoderLM(model_config)

    def load_tokenizer(self, run_dir: Path) -> None:
        return None

    def make_corpus(self, training, *, note=None):
        training.handed = note
        return torch.arange(training.config.toy.length).repeat(training.config.train.batch_size, 1)  # (batch, length)

    def make_model(self, training):
        return self.start(
            training.config, training.run, training.config.model.replace(vocab_size=training.config.toy.length)
        )

    def trainer_options(self, training):
        return TrainerOptions(train_batches=lambda i: training.data, loss_fn=lambda m, ids: m(ids[:, :-1], ids[:, 1:]))

    def outcome(self, training):
        return Outcome({"note": training.handed})


def print_count(run: ToyRun, args: argparse.Namespace) -> None:
    """`kqv count RUN --times N`: the command line's side, which calls the run and prints."""
    for _ in range(args.times):
        print(run.guess())


@pytest.fixture
def toy_job(monkeypatch):
    """A job defined outside kqv, in a test: a language model of counting sequences, with a command of its own.
    Adding it is one entry in each registry: the job, its training flags, its run's capability, and its command."""
    job = ToyJob()
    monkeypatch.setitem(JOBS, "toy", job)
    monkeypatch.setitem(CAPABILITIES, "guess", Capability(Guesses, "guess", "guess the token after 0", "toy runs"))
    monkeypatch.setitem(
        flags.TRAIN_FLAGS,
        "toy",
        (Flag("--length", "how far to count", "toy.length", {"type": int}), Flag("--note", "written into the summary")),
    )
    monkeypatch.setitem(
        COMMANDS,
        "count",
        RunCommand(
            Guesses,
            {
                "toy": JobCommand(
                    "print the model's guess after 0",
                    print_count,
                    (Flag("--times", "how often", options={"type": int, "default": 1}),),
                )
            },
        ),
    )
    return job


def test_a_new_job_trains_and_answers_its_commands_through_the_unchanged_cli(toy_job, tmp_path, capsys):
    config = tmp_path / "toy.toml"
    config.write_text(TOY_CONFIG)
    out = tmp_path / "run"
    assert (
        main(["train", "toy", "--config", str(config), "--out", str(out), "--length", "5", "--note", "hi", "--quiet"])
        == 0
    )
    summary = read_summary(out)
    assert summary["steps"] == 2 and summary["note"] == "hi"
    assert load_run(out).job is toy_job and load_run(out).config.toy.length == 5  # --length set toy.length
    assert isinstance(load_run(out), ToyRun) and load_run(out).guess() in range(5)
    with pytest.raises(RunError, match="is a toy run, which cannot generate text; generate works on lm runs"):
        load_run(out).generate("0")  # what the toy's runs do not offer is refused as any job's
    capsys.readouterr()
    assert main(["count", str(out), "--times", "2"]) == 0
    assert len(capsys.readouterr().out.split()) == 2
    assert main(["train", "toy", "--out", str(out), "--resume", "--quiet"]) == 0  # resumes with its run.toml


def test_a_command_on_a_run_of_another_job_names_the_jobs_that_have_it(toy_job, tmp_path, capsys):
    config = tmp_path / "toy.toml"
    config.write_text(TOY_CONFIG)
    assert main(["train", "toy", "--config", str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    assert main(["translate", str(tmp_path / "run"), "eins"]) == 2
    assert "kqv translate works on runs of ['mt']" in capsys.readouterr().err


def test_each_job_is_registered_under_its_config_s_task():
    jobs = all_jobs()
    assert set(jobs) == {"cls", "lm", "mlm", "mt", "vit"}
    for name, job in jobs.items():
        assert job is get_job(name) is JOBS[name] and job.name == name and job.config_class.task == name
        assert issubclass(job.run_class, TrainedRun)
    assert set(flags.TRAIN_FLAGS) <= set(JOBS)


def test_every_command_of_the_parser_is_in_the_registry_and_serves_registered_jobs():
    parser = build_parser()
    assert list(parser._subparsers._group_actions[0].choices) == list(all_commands())
    runs = {name: command for name, command in COMMANDS.items() if isinstance(command, RunCommand)}
    assert {name: set(command.by_job) for name, command in runs.items()} == {
        "generate": {"lm"},
        "eval": {"lm", "mt", "vit"},
        "attention": {"lm", "mt", "vit"},
        "translate": {"mt"},
        "export": {"lm", "mlm"},
    }
    for command in runs.values():
        assert set(command.by_job) <= set(JOBS)


def test_every_command_and_flag_of_the_cli_is_still_there():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert {"train", "generate", "eval", "attention", "translate", "embed", "similarity"} <= set(commands)
    shared = {"--config", "--out", "--steps", "--set", "--resume", "--overwrite", "--quiet"}
    expected = {
        "lm": {"--data"},
        "mt": {"--pair", "--data", "--tgt-data", "--data-from", "--model", "--threads"},
        "mlm": {"--data"},
        "cls": {"--data", "--init"},
    }
    train = commands["train"]._subparsers._group_actions[0].choices
    for job, job_flags in expected.items():
        assert shared | job_flags <= set(train[job]._option_string_actions)
    runs = {
        "generate": {
            "--prompt",
            "--max-new-tokens",
            "--temperature",
            "--top-k",
            "--top-p",
            "--count",
            "--seed",
            "--no-cache",
        },
        "eval": {"--data", "--max-tokens", "--json", "--src", "--ref", "--beam", "--length-penalty", "--max-sentences"},
        "attention": {"--text", "--src", "--tgt", "--out"},
        "translate": {"--file", "--beam", "--length-penalty"},
    }
    for name, run_flags in runs.items():
        assert run_flags <= set(commands[name]._option_string_actions)
