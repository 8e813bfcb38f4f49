"""Applications add commands to `kqv` through one registry, the entry-point group "kqv.commands" (kqv.cli's
`APPLICATION_COMMANDS`): kqv's command line lists them after its own without importing any application, and
pyproject.toml names kqv_lab's two, `kqv experiment` and `kqv world`."""

import argparse
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from kqv.cli import APPLICATION_COMMANDS, COMMANDS, Command, all_commands, application_commands, build_parser

ROOT = Path(__file__).resolve().parents[1]


class Hello(Command):
    """A command an application outside kqv adds: `kqv hello --name N`."""

    help = "say hello"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--name", default="world")

    def run(self, args: argparse.Namespace) -> None:
        print(f"hello {args.name}")


def points(**named: str) -> list[EntryPoint]:
    return [EntryPoint(name, value, APPLICATION_COMMANDS) for name, value in named.items()]


def test_an_application_s_command_joins_the_parser_after_kqv_s_own(capsys):
    found = points(hello=f"{__name__}:Hello")
    assert list(application_commands(found)) == ["hello"] and isinstance(application_commands(found)["hello"], Hello)
    assert list(all_commands(found)) == [*COMMANDS, "hello"]
    parser = build_parser(found)
    assert list(parser._subparsers._group_actions[0].choices) == [*COMMANDS, "hello"]
    args = parser.parse_args(["hello", "--name", "kqv"])
    args.func(args)
    assert capsys.readouterr().out == "hello kqv\n"
    assert "hello" not in build_parser([])._subparsers._group_actions[0].choices


def test_an_application_cannot_replace_a_command_of_kqv_s_own():
    with pytest.raises(RuntimeError, match=r"\['train'\] would replace kqv's own"):
        application_commands(points(train=f"{__name__}:Hello"))


def test_pyproject_registers_kqv_lab_s_commands_and_kqv_lab_s_commands_are_commands():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][APPLICATION_COMMANDS]
    assert declared == {"experiment": "kqv_lab.cli.experiment:Experiment", "world": "kqv_lab.cli.world:World"}
    commands = application_commands(points(**declared))
    assert all(isinstance(command, Command) and command.help for command in commands.values())
    parser = build_parser(points(**declared))
    assert parser.parse_args(["experiment", "run", "heads", "--quick"]).quick
    assert parser.parse_args(["world", "--out", "w", "--people", "3"]).people == 3


def test_the_installed_metadata_names_the_same_commands():
    """The environment's kqv (installed with `pip install -e .`) holds pyproject.toml's entry points: an install
    from before them lacks `kqv experiment` and `kqv world` until it is reinstalled."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][APPLICATION_COMMANDS]
    assert set(declared) <= set(all_commands()), "reinstall kqv: pip install -e ."
