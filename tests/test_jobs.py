"""The job contract (kqv.jobs.base): a job registers itself, and the command line serves it without changes."""

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from kqv import DecoderLM, ModelConfig
from kqv.cli.main import build_parser, main
from kqv.jobs import Flag, Job, RunCommand, TrainedRun, all_jobs, base, get_job, load_run
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


@pytest.fixture
def toy_job():
    """A job defined outside kqv, in a test: a language model of counting sequences, with a command of its own."""

    class ToyJob(Job):
        name = "toy"
        help = "count to `toy.length`"
        config_class = ToyRunConfig
        train_flags = (Flag("--length", "how far to count", "toy.length", {"type": int}),
                       Flag("--note", "written into the summary"))
        commands = {"count": RunCommand("print the model's guess after 0", "count",
                                        (Flag("--times", "how often", options={"type": int, "default": 1}),))}

        def build_model(self, model_config: ModelConfig, config: RunConfig, values: dict[str, Any]) -> DecoderLM:
            return DecoderLM(model_config)

        def load_tokenizer(self, run_dir: Path) -> None:
            return None

        def train(self, config, run_dir, *, resume=False, overwrite=False, quiet=False, note=None):
            with self.open_run(run_dir, resume=resume, overwrite=overwrite) as run:
                length = config.toy.length
                model = self.start(config, run, config.model.replace(vocab_size=length))
                counting = torch.arange(length).repeat(config.train.batch_size, 1)  # (batch, length)
                result = self.fit(self.make_trainer(model, config, run, quiet=quiet, train_batches=lambda i: counting,
                                                    loss_fn=lambda m, ids: m(ids[:, :-1], ids[:, 1:])))
                return self.summarise(run.path, result, model, note=note)

        def count(self, run: TrainedRun, args: argparse.Namespace) -> None:
            for _ in range(args.times):
                print(int(run.model(torch.tensor([[0]]))[0, -1].argmax()))

    yield all_jobs()["toy"]
    del base._REGISTRY["toy"]


def test_a_new_job_trains_and_answers_its_commands_through_the_unchanged_cli(toy_job, tmp_path, capsys):
    config = tmp_path / "toy.toml"
    config.write_text(TOY_CONFIG)
    out = tmp_path / "run"
    assert main(["train", "toy", "--config", str(config), "--out", str(out), "--length", "5", "--note", "hi",
                 "--quiet"]) == 0
    summary = read_summary(out)
    assert summary["steps"] == 2 and summary["note"] == "hi"
    assert load_run(out).job is toy_job and load_run(out).config.toy.length == 5  # --length set toy.length
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


def test_the_shipped_jobs_are_registered_with_their_commands():
    jobs = all_jobs()
    assert {"lm", "mt", "mlm", "cls"} <= set(jobs)
    assert set(jobs["lm"].commands) == {"generate", "eval", "attention"}
    assert set(jobs["mt"].commands) == {"translate", "eval", "attention"}
    for job in jobs.values():
        assert job is get_job(job.name) and job.config_class.task == job.name
        for command in job.commands.values():
            assert callable(getattr(job, command.method))


def test_every_command_and_flag_of_the_cli_is_still_there():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert {"train", "generate", "eval", "attention", "translate", "embed", "similarity"} <= set(commands)
    shared = {"--config", "--out", "--steps", "--set", "--resume", "--overwrite", "--quiet"}
    expected = {"lm": {"--data"}, "mt": {"--pair", "--data", "--tgt-data", "--data-from", "--model", "--threads"},
                "mlm": {"--data"}, "cls": {"--data", "--init"}}
    train = commands["train"]._subparsers._group_actions[0].choices
    for job, flags in expected.items():
        assert shared | flags <= set(train[job]._option_string_actions)
    runs = {"generate": {"--prompt", "--max-new-tokens", "--temperature", "--top-k", "--top-p", "--count", "--seed",
                         "--no-cache"},
            "eval": {"--data", "--max-tokens", "--json", "--src", "--ref", "--beam", "--length-penalty",
                     "--max-sentences"},
            "attention": {"--text", "--src", "--tgt", "--out"}, "translate": {"--file", "--beam", "--length-penalty"}}
    for name, flags in runs.items():
        assert flags <= set(commands[name]._option_string_actions)
