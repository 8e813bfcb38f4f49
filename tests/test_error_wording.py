"""Error messages speak the interface they are raised through: a command-line user is told about flags
(`--overwrite`), a Python user about arguments (`if_exists='overwrite'`), and never about the other's."""

import re
import shutil

import pytest

from kqv.cli.main import main
from kqv.errors import RunError
from kqv.jobs import load_run
from kqv.train.layout import MODEL_FILE
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
# Flags are the command line's words alone: below it (jobs, train, nn, and data, explore, experiments), messages name
# options through kqv.errors.option and a `Word` constant, which holds both interfaces' spellings.

import argparse  # noqa: E402
import ast  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

from kqv import errors  # noqa: E402
from kqv.cli.main import build_parser  # noqa: E402
from kqv.errors import Word, command_line, option  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src" / "kqv"
LAB = SRC.parent / "kqv_lab"  # the applications beside the library: their messages are held to the same words
# the layers whose messages reach both interfaces (kqv's, and kqv_lab's experiments and worlds)
BELOW = ("jobs", "train", "nn", "data", "explore", "experiments", "worlds")
# other programs' flags, in the commands kqv runs or tells of (pip's, tar's, git's): none of them is kqv's
OTHER_PROGRAMS = {
    "--index-url",
    "--no-deps",
    "--no-binary",
    "--only-binary",
    "--disable-pip-version-check",
    "--timeout",
    "--retries",
    "--strip-components",
    "--wildcards",
    "--porcelain",
    "--untracked-files",
    "--verify",
    "--detach",
    "--force",
}
# texts written into the experiments' pages and records, which show the command that made them (no caller reads
# them): where each is, and a part of its text
RECORDS = {
    ("experiments/heads.py", "RERUN"): "needs rerun (`kqv experiment run heads",  # a verdict in results.json
    ("experiments/long_attention.py", "RERUN"): "needs rerun (`kqv experiment run long-attention",
    ("experiments/position_extrapolation.py", "RERUN"): "(`kqv experiment run position-extrapolation",
    ("experiments/runner.py", "SMOKE_TEST"): "smoke test (--quick)",  # the label of a quick run in results.json
    ("experiments/gallery.py", "METHOD"): "## How the experiments were run and judged",  # the gallery page
    ("experiments/gallery.py", "gallery"): "` (`kqv experiment run {} --out {}`)",  # its experiments not yet run
}
FLAG = re.compile(r"(?:^|[\s`'(\[])(--[a-z][\w-]*)")
ARGUMENT = re.compile(r"\s*--[a-z][\w-]*(=\S*)?\s*")  # one argument of a command line kqv builds or runs


def docstrings(tree: ast.AST) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def texts(module: ast.Module) -> Iterator[tuple[int, str, str]]:
    """(line, text, the function or module constant it is in) of each string of a module outside docstrings; an
    f-string is one text, with {} for each value."""
    skipped = docstrings(module)

    def visit(node: ast.AST, where: str) -> Iterator[tuple[int, str, str]]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            where = node.name
        elif isinstance(node, ast.Assign) and not where and isinstance(node.targets[0], ast.Name):
            where = node.targets[0].id
        children = list(ast.iter_child_nodes(node))
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values), where
            children = [value.value for value in node.values if isinstance(value, ast.FormattedValue)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            yield node.lineno, node.value, where
        for child in children:
            yield from visit(child, where)

    return visit(module, "")


def flags_in(path: Path, where: str) -> Iterator[tuple[str, str]]:
    """Each flag of kqv's a module's strings spell, as (the place it is in, what it says)."""
    for line, text, name in texts(ast.parse(path.read_text())):
        if ARGUMENT.fullmatch(text) or RECORDS.get((where, name), "\0") in text:
            continue
        if any(flag not in OTHER_PROGRAMS for flag in FLAG.findall(text)):
            yield f"{where}:{line} ({name or 'module'})", text


def flags_below(root: Path = SRC) -> list[str]:
    return [
        f"{place}: {text!r}"
        for path in sorted(root.rglob("*.py"))
        if (where := path.relative_to(root).as_posix()).startswith(BELOW)
        for place, text in flags_in(path, where)
    ]


def test_no_module_below_the_command_line_spells_a_flag():
    assert not (found := flags_below() + flags_below(LAB)), "\n".join(found)


def test_the_scan_finds_a_flag_told_to_a_python_caller(tmp_path):
    """The old data/shakespeare.py told every caller to pass `--data`; the scan sees it there, and in each layer."""
    for layer in ("data", "explore", "experiments", "jobs"):
        (tmp_path / layer).mkdir()
        (tmp_path / layer / "m.py").write_text(
            "def f(path):\n"
            '    """Docstrings may say `--data`."""\n'
            '    run(["kqv", "train", "--data", path])  # an argument of a command it runs\n'
            '    return f"Train on your own text instead: pass `--data {path}` (a file)"\n'
        )
    assert [line.split(":")[0] for line in flags_below(tmp_path)] == [
        "data/m.py",
        "experiments/m.py",
        "explore/m.py",
        "jobs/m.py",
    ]


def kqv_flags(parser: argparse.ArgumentParser) -> set[str]:
    found = set()
    for action in parser._actions:
        found |= {name for name in action.option_strings if name.startswith("--")}
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                found |= kqv_flags(command)
    return found


def test_the_other_programs_flags_are_not_kqv_s_and_each_record_is_still_there():
    assert not OTHER_PROGRAMS & kqv_flags(build_parser())
    found = {
        place
        for package in (SRC, LAB)
        for path in package.rglob("*.py")
        for _, text, name in texts(ast.parse(path.read_text()))
        if (place := (path.relative_to(package).as_posix(), name)) in RECORDS and RECORDS[place] in text
    }
    assert found == set(RECORDS), sorted(set(RECORDS) - found)


# Each message names an option through a Word, never a string: the words are constants, so each can be checked.

WORDS = {name: value for name, value in vars(errors).items() if isinstance(value, Word)}
TABLES = {name: value for name, value in vars(errors).items() if isinstance(value, dict) and value}
TABLES = {name: table for name, table in TABLES.items() if all(isinstance(w, Word) for w in table.values())}
PYTHON_MARKERS = ("if_exists", "overwrite=", "Trainer.", "kqv.", "(config", "=[", "torch.")


def every_word() -> list[Word]:
    return [*WORDS.values(), *(word for table in TABLES.values() for word in table.values())]


def test_every_word_has_both_spellings_and_each_speaks_its_interface():
    assert len(every_word()) > 40 and {"GENERATION_OPTIONS", "RUN_INPUTS"} <= set(TABLES)
    for word in every_word():
        assert word.python.strip() and word.cli.strip() and word.python != word.cli, word
        assert not FLAG.search(word.python) and "`kqv " not in word.python, word
        assert not any(marker in word.cli for marker in PYTHON_MARKERS), word


def option_calls(tree: ast.AST) -> Iterator[ast.Call]:
    """The calls of `kqv.errors.option` in a module, under its own name or the one it is imported as."""
    names = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("errors")
        for alias in node.names
        if alias.name == "option"
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in names:
            yield node


def named_word(argument: ast.expr) -> str | None:
    """The constant of kqv.errors an argument of `option` names (a Word, or a table of them looked up), if any."""
    if isinstance(argument, ast.Name) and argument.id in WORDS:
        return argument.id
    if isinstance(argument, ast.Subscript) and isinstance(argument.value, ast.Name) and argument.value.id in TABLES:
        return argument.value.id
    return None


def test_every_message_names_its_option_by_a_word_of_kqv_errors():
    """No `option("...")` of free text, and no f-string key: each is a constant that has both spellings."""
    bare, used = [], set()
    for path in [*SRC.rglob("*.py"), *LAB.rglob("*.py")]:
        for call in option_calls(ast.parse(path.read_text())):
            name = named_word(call.args[0]) if len(call.args) == 1 else None
            if name is None:
                bare.append(f"{path.relative_to(SRC.parent)}:{call.lineno}: {ast.unparse(call)}")
            used.add(name)
    assert len(used) > 30 and not bare, "\n".join(bare)
    by_value = {id(word): name for name, word in WORDS.items()}
    unused = {by_value[id(word)] for word in WORDS.values()} - used - {"COUNT"}  # COUNT: a GENERATION_OPTIONS entry
    assert not unused, f"words no message names: {sorted(unused)}"


def python_words_below(root: Path = SRC) -> list[str]:
    """Each message below the command line that spells a Python remedy itself (a call, a keyword's value) instead of
    through `option`, which would tell a command-line user about arguments."""
    spelled = {word.python.split("{")[0] for word in every_word()}
    remedies = {text for text in spelled if any(mark in text for mark in ("(", "'", "=True", "=["))}
    return [
        f"{where}:{line}: {text!r}"
        for path in sorted(root.rglob("*.py"))
        if (where := path.relative_to(root).as_posix()).startswith(BELOW)
        for line, text, _ in texts(ast.parse(path.read_text()))
        if any(remedy in text for remedy in remedies)
    ]


def test_no_message_below_the_command_line_spells_a_python_remedy(tmp_path):
    assert not (found := python_words_below() + python_words_below(LAB)), "\n".join(found)
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "m.py").write_text("""m = f"{path} exists; pass if_exists='overwrite' to replace it"\n""")
    assert python_words_below(tmp_path) == ["train/m.py:1: \"{} exists; pass if_exists='overwrite' to replace it\""]


def test_a_bare_string_or_an_f_string_key_is_found(tmp_path):
    source = "from ..errors import OUT, RUN_INPUTS, option as said\n" + "\n".join(
        f"x = said({argument})" for argument in ("OUT", "RUN_INPUTS[name]", '"out"', "f'data.{name}='", "NOT_A_WORD")
    )
    named = [named_word(call.args[0]) for call in option_calls(ast.parse(source))]
    assert named == ["OUT", "RUN_INPUTS", None, None, None]


def test_an_option_is_said_in_the_words_of_the_interface():
    assert option(errors.BEAM_SIZE) == "beam_size"
    assert option(errors.CONFIG_FIELD, name="x") == "the config's x"
    with command_line():
        assert option(errors.BEAM_SIZE) == "--beam" and option(errors.CONFIG_FIELD, name="x") == '--set x="..."'
        assert option(errors.GENERATION_OPTIONS["max_new_tokens"]) == "--max-new-tokens"
    assert option(errors.IF_EXISTS_OVERWRITE) == "if_exists='overwrite'"


# One vocabulary of flags: the command line spells each flag once (kqv.flag_names); its parsers and kqv.errors'
# command-line words take the spelling from there.

from kqv import flag_names  # noqa: E402

VOCABULARY = {value for name, value in vars(flag_names).items() if name.isupper()}
FLAG_LITERAL = re.compile(r"--[a-z][\w-]*")


def spelled_flags(path: Path, anywhere: bool) -> list[str]:
    """The strings of a module that spell a flag: any that names one (`anywhere`), or any that is one."""
    return [
        f"{path.name}:{line}: {text!r}"
        for line, text, _ in texts(ast.parse(path.read_text()))
        if (FLAG.search(text) if anywhere else FLAG_LITERAL.fullmatch(text))
    ]


def test_the_command_line_spells_each_flag_once_in_its_vocabulary():
    """Every flag of the parser is in kqv.flag_names, and no other; kqv.errors names no flag but through it, and no
    module of kqv.cli gives a flag's spelling as a string of its own."""
    assert kqv_flags(build_parser()) - {"--help"} == VOCABULARY
    assert all(
        value == f"--{name.lower().replace('_', '-')}" for name, value in vars(flag_names).items() if name.isupper()
    )
    assert not (found := spelled_flags(SRC / "errors.py", anywhere=True)), "\n".join(found)
    found = [text for path in sorted((SRC / "cli").glob("*.py")) for text in spelled_flags(path, anywhere=False)]
    assert not found, "\n".join(found)


def test_the_vocabulary_scan_finds_a_flag_spelled_twice(tmp_path):
    (tmp_path / "errors.py").write_text('"""Docstrings may say `--data`."""\nDATA = Word("data=", f"{flag.DATA} ")\n')
    assert spelled_flags(tmp_path / "errors.py", anywhere=True) == []
    (tmp_path / "errors.py").write_text('DATA = Word("data=", "--data ")\n')
    assert spelled_flags(tmp_path / "errors.py", anywhere=True) == ["errors.py:1: '--data '"]
    (tmp_path / "flags.py").write_text('TEXT = Flag("--data", "a text to train on --out")\n')
    assert spelled_flags(tmp_path / "flags.py", anywhere=False) == ["flags.py:1: '--data'"]
