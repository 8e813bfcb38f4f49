"""No page of the guide names a file that is not there: every repository path written on the README or a page of
docs/ (in backquotes, code blocks or prose) and every relative link of the README exists in the tree."""

import glob
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs").glob("*/*/*.md"))]
# kqv/..., src/kqv/..., tests/....py, benchmarks/....py|json|png, configs/....toml, docs/..., .ci/...
PATH = re.compile(
    r"(?<![\w./-])((?:src/)?kqv/[\w/.-]*[\w/]|tests/[\w*]+\.py|benchmarks/[\w/.*-]+\.(?:py|json|png)"
    r"|configs/[\w.-]+\.toml|docs/[\w/.-]+\.(?:md|png|ipynb|py|txt)|\.ci/[\w.]+)"
)
# files a command writes that no one has produced yet, each with why
NOT_YET_WRITTEN = {"benchmarks/results/gpu_train.json": "written by benchmarks/gpu_train.py on a CUDA GPU"}


def resolve(name: str) -> Path:
    return ROOT / "src" / name if name.startswith("kqv/") else ROOT / name


def named(page: Path) -> list[str]:
    return sorted(set(PATH.findall(page.read_text())))


def test_the_pages_name_paths_at_all():
    assert len(PAGES) > 15 and sum(len(named(page)) for page in PAGES) > 150


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_path_a_page_names_exists(page):
    missing = []
    for name in named(page):
        if "NAME" in name:  # placeholders in the step-by-step guides (kqv/jobs/NAME.py): the folder must exist
            found = resolve(name).parent.is_dir() or resolve(name).parent.name == "NAME"
        elif "*" in name:
            found = bool(glob.glob(str(resolve(name))))
        else:
            found = resolve(name).exists() or name in NOT_YET_WRITTEN
        if not found:
            missing.append(name)
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_every_relative_link_of_the_readme_exists():
    """mkdocs checks the pages' links; the README is not on the site, so its links are checked here."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    assert links
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, f"README.md links files that do not exist: {missing}"


def test_a_missing_path_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("see `tests/test_efficient_attention.py` and `kqv/nn/attention.py`")
    assert [name for name in named(page) if not resolve(name).exists()] == ["tests/test_efficient_attention.py"]
