"""Installs are reproducible: the README's commands and CI install the exact versions of constraints.txt."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def pinned() -> dict[str, Version]:
    """{canonical name: version} of constraints.txt, which may hold only exact `name==version` pins."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            match = re.fullmatch(r"([A-Za-z0-9._-]+)==([0-9][^\s;]*)", line.strip())
            assert match, f"constraints.txt line {line!r} is not an exact pin name==version"
            pins[canonicalize_name(match[1])] = Version(match[2])
    return pins


def test_every_direct_dependency_is_pinned_within_the_range_pyproject_allows():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    requirements = [
        Requirement(r) for r in project["dependencies"] + extras["test"] + extras["embed"] + extras["bench"]
    ]
    pins = pinned()
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in pins, (
            f"{requirement.name} is a dependency but not pinned in constraints.txt: install it, "
            f"run the suite, then `python .ci/update_constraints.py`"
        )
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject's {requirement}"
        )
    assert pins["torch"] == Version("2.13.0")


def readme_command(marker: str) -> str:
    lines = (ROOT / "README.md").read_text().splitlines()
    return lines[lines.index(marker) + 1]


def test_readme_commands_and_ci_install_through_the_constraints():
    main_job, tests = (
        readme_command(
            "# the main job: train a character-level GPT on Shakespeare's complete works, then sample from it"
        ),
        readme_command("# the tests"),
    )
    for command in (main_job, tests):
        assert command.startswith("python -m pip install ") and " -c constraints.txt " in command
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci, ".ci/run must run exactly the README's test command"
