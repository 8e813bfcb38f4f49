"""User pages speak of the software, never of its making: no page under docs/ (the generated experiment reports and
the gallery included, the notebook's cells and the site's navigation too) nor README.md names an issue, a commit,
"uncommitted" work or a /tmp path. The project's history belongs in CHANGELOG.md."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ISSUE = re.compile(r"\bissues? #?\d+|(?<![\w&/#])#\d+\b", re.IGNORECASE)
UNCOMMITTED = re.compile(r"uncommitted", re.IGNORECASE)
TMP = re.compile(r"(?<![\w.~-])/tmp\b")
# a commit's hash as prose writes it: 7-40 hex digits, at least one digit and one letter, a word of its own
HEX = re.compile(r"(?<![\w.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)  # fenced blocks and inline code: identifiers, not prose
URL = re.compile(r"\]\([^)]*\)|https?://\S+|\b(?:src|href)=\"[^\"]*\"")


def pages() -> list[Path]:
    """Every page a reader of the site or the repository sees: docs/**/*.md, the notebook, README.md, and the site's
    navigation and description (mkdocs.yml)."""
    found = sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "docs").rglob("*.ipynb"))
    return [ROOT / "README.md", ROOT / "mkdocs.yml", *found]


def page_text(path: Path) -> str:
    """The text a reader sees: a notebook's cell sources and text outputs, the site's name, description and
    navigation titles (not mkdocs.yml's comments), a Markdown page as it is."""
    if path.suffix == ".yml":
        lines = path.read_text(encoding="utf-8").splitlines()
        return "\n".join(line.partition(" #")[0] for line in lines if not line.lstrip().startswith("#"))
    if path.suffix != ".ipynb":
        return path.read_text(encoding="utf-8")
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    parts = []
    for cell in cells:
        parts.append(
            "".join(cell["source"]) if cell["cell_type"] == "markdown" else "```" + "".join(cell["source"]) + "```"
        )
        for output in cell.get("outputs", []):
            text = output.get("text") or output.get("data", {}).get("text/plain") or []
            parts.append("```" + "".join(text) + "```")
    return "\n\n".join(parts)


def history(text: str) -> list[str]:
    """What in `text` speaks of the project's making: issue numbers, 'uncommitted', /tmp paths anywhere; commit
    hashes in prose (outside code and link targets, where a hash may be a content address)."""
    found = [m.group() for pattern in (ISSUE, UNCOMMITTED, TMP) for m in pattern.finditer(text)]
    prose = URL.sub(" ", CODE.sub(" ", text))
    return found + [f"hash {m.group()}" for m in HEX.finditer(prose)]


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_user_pages_hold_no_history(path):
    text = page_text(path)
    lines = [f"{n}: {', '.join(history(line))}" for n, line in enumerate(text.splitlines(), 1) if history(line)]
    blocks = history(text)  # fenced code across lines
    assert not lines and not blocks, f"{path.relative_to(ROOT)} speaks of the project's history: {lines or blocks}"


def test_history_is_found_in_prose_and_hashes_are_left_in_code_and_links():
    said = "Fixed in issue 41 (#42) by commit 4ad9405, with uncommitted changes, run from /tmp/lm29."
    assert history(said) == ["issue 41", "#42", "uncommitted", "/tmp", "hash 4ad9405"]
    kept = "`git worktree add its 4ad9405`, [a report](https://github.com/o/r/issues/161), bf16, 1e-3, deadbeef, x#1"
    assert history(kept) == []


# what a reader who searches the pages for the project's making types (code included, where the scan above leaves
# hashes alone): an issue, uncommitted work, a /tmp path, a commit named, a git command checking one out
SCANS = (
    ["grep", "-rnE", r"issues? [0-9]+|uncommitted|/tmp/|commit [0-9a-f]{7}|--base [0-9a-f]{7}|worktree add"],
    ["grep", "-rn", "used to crash"],
)


@pytest.mark.parametrize("scan", SCANS, ids=lambda scan: scan[-1][:20])
def test_a_search_for_history_finds_nothing_in_the_readme_or_the_guide(scan):
    found = subprocess.run([*scan, "README.md", "docs"], cwd=ROOT, capture_output=True, text=True, errors="replace")
    assert found.returncode == 1, f"{shlex.join(scan)} README.md docs found:\n{found.stdout[:3000]}{found.stderr}"
