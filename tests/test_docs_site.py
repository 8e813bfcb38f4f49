"""The guide holds together: the README is a short front door, and the site built from docs/ by mkdocs has no dead
link, missing page or broken cross-reference (`mkdocs build --strict`, offline, from the repository alone)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
COMMANDS = (
    "# the main job: train a character-level GPT on Shakespeare's complete works, then sample from it",
    "# the tests",
)


def test_the_site_builds_strictly_offline(tmp_path):
    """`mkdocs build --strict` fails on any warning: a link to a page or anchor that does not exist, a page missing
    from the navigation, a docstring mkdocstrings cannot resolve. The material theme fetches no fonts (font: false)
    and no plugin needs the network."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "OMP_NUM_THREADS": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
    for page in ("index.html", "getting-started/index.html", "lecture/index.html", "api/index.html"):
        assert (tmp_path / "site" / page).is_file(), f"the site has no {page}"
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert 'id="kqv.api.load"' in api and 'id="kqv.nn.attention.MultiHeadAttention"' in api


def test_the_readme_is_a_front_door_with_the_two_commands_on_its_first_screen():
    text = README.read_text()
    assert len(text.encode()) <= 12_500, f"README.md is {len(text.encode()):,} bytes: move detail to docs/"
    first_screen = text.splitlines()[:30]
    for marker in COMMANDS:
        assert marker in first_screen, f"README.md's first screen lacks {marker!r} and the command under it"


def test_getting_started_repeats_the_readme_commands_exactly():
    lines = README.read_text().splitlines()
    page = (ROOT / "docs" / "getting-started.md").read_text()
    for marker in COMMANDS:
        command = lines[lines.index(marker) + 1]
        assert f"{marker}\n{command}\n" in page, f"docs/getting-started.md differs from README.md at {marker!r}"


def test_the_site_copy_of_the_mt_comparison_plot_is_the_benchmarks():
    """mkdocs serves only docs/, so translation.md shows a copy of the plot benchmarks/mt_compare.py writes."""
    original = ROOT / "benchmarks" / "results" / "mt_compare-60min.png"
    assert (ROOT / "docs" / "mt_compare-60min.png").read_bytes() == original.read_bytes(), (
        f"docs/mt_compare-60min.png differs from {original.relative_to(ROOT)}: copy it again"
    )
