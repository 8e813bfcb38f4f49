"""docs/architecture.md cannot rot: every module, file and registry it names exists in the tree."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
# `kqv/...py` or `src/...` or `tests/...py` or `configs/...`, as written in backquotes on the page
PATH = re.compile(r"`((?:src/)?kqv/[\w/]+(?:\.py)?|tests/\w+\.py|src/kqv/configs/[\w.-]+)`")


def named_paths() -> list[str]:
    return sorted(set(PATH.findall(PAGE.read_text())))


def resolve(name: str) -> Path:
    return ROOT / name if name.startswith(("src/", "tests/")) else ROOT / "src" / name


def test_the_page_names_modules_at_all():
    assert len(named_paths()) > 60


@pytest.mark.parametrize("name", named_paths())
def test_every_path_named_on_the_page_exists(name):
    if "NAME" in name:  # placeholders in the step-by-step guides (kqv/jobs/NAME.py)
        assert resolve(name).parent.is_dir(), f"{name}: its folder does not exist"
        return
    assert resolve(name).exists(), f"docs/architecture.md names {name}, which does not exist"


def test_every_module_of_the_package_map_is_on_the_page():
    """New modules appear in the map; the experiment modules are listed by `kqv experiment list` instead."""
    from kqv.experiments import EXPERIMENTS

    registered = {experiment.module.rpartition(".")[2] for experiment in EXPERIMENTS.values()}
    named = set(named_paths())
    package = ROOT / "src" / "kqv"
    modules = [
        str(p.relative_to(ROOT / "src"))
        for p in sorted(package.rglob("*.py"))
        if p.name not in ("__init__.py", "__main__.py")
        and not (p.parent.name == "experiments" and p.stem in registered)
    ]
    missing = [m for m in modules if m not in named]
    assert not missing, f"modules missing from docs/architecture.md's package map: {missing}"


@pytest.mark.parametrize(
    "registry",
    [
        "CORES",
        "AttentionKind",
        "Position",
        "POSITIONS",
        "VARIANTS",
        "EXPERIMENTS",
        "get_job",
        "load_run",
        "all_jobs",
        "JOBS",
        "COMMANDS",
        "TRAIN_FLAGS",
        "RUN_COMMANDS",
        "input_positions",
        "attention_positions",
        "has_score_bias",
        "has_value_bias",
        "PaddingOnlyCore",
    ],
)
def test_the_registries_the_guides_name_exist(registry):
    sources = [*(ROOT / "src" / "kqv").rglob("*.py"), ROOT / "tests" / "conftest.py"]
    assert any(re.search(rf"\b{registry}\b\s*[:=(]|(?:class|def) {registry}\b", p.read_text()) for p in sources), (
        f"docs/architecture.md names {registry}, which nothing in kqv or tests/conftest.py defines"
    )
    assert f"`{registry}" in PAGE.read_text()


def test_the_readme_links_the_page():
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()
