"""Error messages speak the interface they are raised through: a command-line user is told about flags
(`--overwrite`), a Python user about arguments (`if_exists='overwrite'`), and never about the other's."""

import shutil

import pytest

from kqv.cli.main import main
from kqv.errors import RunError
from kqv.jobs import load_run
from kqv.train.checkpoints import MODEL_FILE
from test_cli import TINY
from test_training import config, trainer

PYTHON_WORDS = ("if_exists", "Trainer.resume", "train(config")
CLI_WORDS = ("--overwrite", "--resume", "kqv train")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("wording")
    corpus = root / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 40)
    (root / "tiny.toml").write_text(TINY.format(position="rope"))
    run = root / "run"
    assert (
        main(["train", "lm", "--config", str(root / "tiny.toml"), "--data", str(corpus), "--out", str(run), "--quiet"])
        == 0
    )
    broken = root / "broken"
    shutil.copytree(run, broken)
    weights = broken / "checkpoint" / MODEL_FILE
    weights.write_bytes(weights.read_bytes()[:-10] + b"0123456789")
    return root, corpus, run, broken


def cli_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("kqv: error: ") and "Traceback" not in error
    return error


def speaks_cli(message: str, *flags: str) -> None:
    assert all(flag in message for flag in flags), message
    assert not any(word in message for word in PYTHON_WORDS), message


def speaks_python(message: str, *arguments: str) -> None:
    assert all(argument in message for argument in arguments), message
    assert not any(word in message for word in CLI_WORDS), message


def test_a_corrupt_checkpoint_names_the_flag_or_the_argument(setup, capsys):
    _, _, _, broken = setup
    speaks_cli(cli_error(capsys, ["generate", str(broken), "--prompt", "To"]), "`--overwrite`")
    with pytest.raises(RunError) as error:
        load_run(broken)
    speaks_python(str(error.value), "if_exists='overwrite'")


def test_a_run_in_the_way_names_the_flags_or_the_arguments(setup, capsys, tmp_path):
    root, corpus, run, _ = setup
    message = cli_error(
        capsys,
        ["train", "lm", "--config", str(root / "tiny.toml"), "--data", str(corpus), "--out", str(run), "--quiet"],
    )
    speaks_cli(message, "`--resume`", "`--overwrite`")
    trainer(tmp_path / "run", config(steps=1)).train()
    with pytest.raises(FileExistsError) as error:
        trainer(tmp_path / "run", config(steps=1))
    speaks_python(str(error.value), "if_exists='resume'", "Trainer.resume(...)", "if_exists='overwrite'")


def test_a_missing_run_names_the_command_or_the_function(capsys, tmp_path):
    speaks_cli(cli_error(capsys, ["eval", str(tmp_path / "nowhere")]), f"kqv train lm --out {tmp_path / 'nowhere'}")
    with pytest.raises(FileNotFoundError) as error:
        load_run(tmp_path / "nowhere")
    speaks_python(str(error.value), "train(config, run_dir)")


def test_a_diverging_run_is_an_error_line_naming_resume_in_the_interfaces_words(setup, capsys, tmp_path):
    """A loss that is never finite stops the run: on the command line an error line (not a traceback)."""
    root, corpus, _, _ = setup
    message = cli_error(
        capsys,
        [
            "train",
            "lm",
            "--config",
            str(root / "tiny.toml"),
            "--data",
            str(corpus),
            "--out",
            str(tmp_path / "run"),
            "--quiet",
            "--set",
            "train.lr=1e38",
            "--set",
            "train.grad_clip=0",
            "--set",
            "train.max_bad_steps=1",
        ],
    )
    assert "training stopped" in message
    assert not any(word in message for word in PYTHON_WORDS), message
