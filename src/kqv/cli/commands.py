"""Top-level commands that are not about one job's runs (`kqv embed`, `kqv similarity`, ...), and their registry.

A command is a `Command` subclass with a `name`, defined in any module of the `kqv.cli` package: `kqv --help`
lists it and `kqv NAME ...` runs it, with no change to `kqv.cli.main`. (Training and the commands on a run —
`kqv train NAME`, `kqv eval RUN`, ... — come from the jobs instead: see `kqv.jobs.base`.)
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from typing import ClassVar


class Command:
    """`kqv NAME ...`: its help, its arguments and what it does."""

    name: ClassVar[str]
    help: ClassVar[str]

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            _REGISTRY[cls.name] = cls()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare the command's arguments."""

    def run(self, args: argparse.Namespace) -> int | None:
        """Do it; return the exit status (None = 0). Raise a `kqv.errors.KqvError` for expected errors."""
        raise NotImplementedError


_REGISTRY: dict[str, Command] = {}


def all_commands() -> dict[str, Command]:
    """Every command defined in a module of `kqv.cli` (each module is imported to find them)."""
    package = importlib.import_module(__package__)
    for module in pkgutil.iter_modules(package.__path__):
        if module.name not in ("main", "__main__"):
            importlib.import_module(f"{__package__}.{module.name}")
    return dict(_REGISTRY)
