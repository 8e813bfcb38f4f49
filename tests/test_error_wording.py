"""Error messages speak the interface they are raised through: a command-line user is told about flags
(`--overwrite`), a Python user about arguments (`if_exists='overwrite'`), and never about the other's."""

import re
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


# ---------------------------------------------------------------------------------------------------------------
# Flags are the command line's words alone (issue 44): messages of jobs, train and nn name options as Python does,
# through kqv.errors.option, and kqv.cli.wording says each of them as a command-line user types it.

import ast  # noqa: E402
from pathlib import Path  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src" / "kqv"
BELOW = ("jobs", "train", "nn")  # the layers the command line's flags must not reach
OTHER_PROGRAMS = ("--index-url",)  # pip's, in a command to install torch


def strings_outside_docstrings(tree: ast.AST) -> list[ast.Constant]:
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_module_below_the_command_line_spells_a_flag():
    found = []
    for path in SRC.rglob("*.py"):
        where = str(path.relative_to(SRC))
        if not where.startswith(BELOW):
            continue
        for node in strings_outside_docstrings(ast.parse(path.read_text())):
            text = node.value
            for flag in OTHER_PROGRAMS:
                text = text.replace(flag, "")
            if re.search(r"(^|[\s`'(])--[a-z]", text):
                found.append(f"{where}:{node.lineno}: {node.value!r}")
    assert not found, "\n".join(found)


def test_every_wording_of_an_option_has_the_command_line_s_words():
    """Each `option("...")` of src/ (its Python words, a constant) is in kqv.cli.wording.WORDS, or the command line
    would print Python's words."""
    from kqv.cli.wording import WORDS

    used = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) in ("option", "worded")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                used.add(node.args[0].value)
    assert len(used) > 20
    assert not used - set(WORDS), sorted(used - set(WORDS))


def test_an_option_is_said_in_the_words_of_the_interface():
    from kqv.cli.wording import WORDS
    from kqv.errors import command_line, option

    assert option("beam_size") == "beam_size" and option("the config's {name}", name="x") == "the config's x"
    with command_line(WORDS):
        assert option("beam_size") == "--beam" and option("the config's {name}", name="x") == '--set x="..."'
    assert option("if_exists='overwrite'") == "if_exists='overwrite'"
