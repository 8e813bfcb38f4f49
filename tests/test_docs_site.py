"""The guide holds together: the README is a short front door, and the site built from docs/ by mkdocs has no dead
link, missing page or broken cross-reference (`mkdocs build --strict`, offline, from the repository alone)."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from html.parser import HTMLParser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from test_install import pinned

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
COMMANDS = (
    "# the main job: train a character-level GPT on Shakespeare's complete works, then sample from it",
    "# the tests",
)
# NO_MKDOCS_2_WARNING silences mkdocs-material's end-of-life banner (a notice, not a build warning)
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "OMP_NUM_THREADS": "1"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
_BUILT: dict[str, tuple[subprocess.CompletedProcess, Path]] = {}


def mkdocs_build(project: Path, site: Path) -> subprocess.CompletedProcess:
    """The documented command, `mkdocs build --strict`, run in `project`; only the output folder is given, so that
    a test never writes the working tree's site/. No --quiet: it hides strict mode's warnings (and then
    `--strict --quiet` exits 0 on a broken page)."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=project,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )


def warnings(built: subprocess.CompletedProcess) -> list[str]:
    """The WARNING and ERROR lines of a build's log (mkdocs writes `WARNING -  ...`)."""
    lines = ANSI.sub("", built.stdout + "\n" + built.stderr).splitlines()
    return [line.strip() for line in lines if re.match(r"\s*(WARNING|ERROR)\b", line)]


def built_site(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One strict build of the repository's site per test process, shared with tests/test_docs_screenshots.py."""
    if "site" not in _BUILT:
        site = tmp_path_factory.mktemp("docs-site") / "site"
        _BUILT["site"] = (mkdocs_build(ROOT, site), site)
    return _BUILT["site"]


def test_the_site_builds_strictly_offline_without_a_warning(tmp_path_factory):
    """`mkdocs build --strict` fails on any warning: a link to a page or anchor that does not exist, a page missing
    from the navigation, a docstring mkdocstrings cannot resolve, a `[word]` read as a reference link. The material
    theme fetches no fonts (font: false) and no plugin needs the network. The exit status and the log both count."""
    built, site = built_site(tmp_path_factory)
    log = f"{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    assert not warnings(built), f"mkdocs build --strict warned:\n{log}"
    for page in ("index.html", "getting-started/index.html", "lecture/index.html", "api/index.html"):
        assert (site / page).is_file(), f"the site has no {page}"
    api = (site / "api" / "index.html").read_text()
    assert 'id="kqv.api.load"' in api and 'id="kqv.nn.attention.MultiHeadAttention"' in api


def test_the_notebook_s_links_to_the_guide_are_site_addresses_with_anchors_that_exist(tmp_path_factory):
    """The notebook links `experiments.md#...` as Jupyter and GitHub read them; mkdocs-jupyter's HTML is not
    rewritten by MkDocs, so docs/hooks/notebook_links.py does it: no link of the built page points to a .md file,
    and every link to the gallery names an anchor the gallery has."""
    built, site = built_site(tmp_path_factory)
    page = (site / "lecture" / "index.html").read_text()
    links = re.findall(r'href="([^"]+)"', page)
    assert not [link for link in links if re.search(r"\.md($|#)", link)], "a link to a Markdown file"
    gallery = (site / "experiments" / "index.html").read_text()
    anchors = [link.partition("#")[2] for link in links if link.startswith("../experiments/#")]
    assert anchors and all(f'id="{anchor}"' in gallery for anchor in anchors)


def test_the_strict_build_fails_on_a_page_with_a_broken_reference_or_link(tmp_path):
    """The check above can fail: a copy of the site whose getting-started page gains a reference with no target
    (what `[PAD] [CLS]` once was) and a link to a page that does not exist does not build, and its log names both."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "docs", project / "docs")
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    (project / "src").symlink_to(ROOT / "src", target_is_directory=True)  # mkdocstrings reads the API from src/
    page = project / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [Nope][] and [the lost page](no-such-page.md).\n")
    built = mkdocs_build(project, tmp_path / "site")
    found = warnings(built)
    assert built.returncode != 0, f"a broken page built with --strict:\n{built.stderr[-3000:]}"
    assert any("Nope" in line for line in found), f"no warning names the reference [Nope][]: {found}"
    assert any("no-such-page.md" in line for line in found), f"no warning names the lost link: {found}"


class ProseText(HTMLParser):
    """The text of a built page outside code, scripts and styles (`prose`), and the text of each code element
    (`code`): what a reader sees as prose and as code."""

    VERBATIM = ("code", "pre", "script", "style", "textarea")

    def __init__(self) -> None:
        super().__init__()
        self.depth, self.prose, self.code = 0, [], []

    def handle_starttag(self, tag, attrs):
        if tag in self.VERBATIM:
            self.depth += 1
        if tag == "code":
            self.code.append("")

    def handle_endtag(self, tag):
        if tag in self.VERBATIM:
            self.depth -= 1

    def handle_data(self, data):
        if self.depth == 0:
            self.prose.append(data)
        elif self.code:
            self.code[-1] += data


def page_text(path: Path) -> ProseText:
    parsed = ProseText()
    parsed.feed(path.read_text(encoding="utf-8"))
    return parsed


def test_no_page_shows_markdown_it_failed_to_render(tmp_path_factory):
    """A backtick in a page's prose is a code span that Markdown did not close: a source line inside a list item
    that starts with a number and a full stop (`1923.`) opens a new list item and cuts the span in two. The
    notebook's page is left out: its cells are code set as text by mkdocs-jupyter."""
    _, site = built_site(tmp_path_factory)
    pages = [page for page in sorted(site.rglob("*.html")) if page.parent.name != "lecture"]
    assert len(pages) > 20
    stray = {
        str(page.relative_to(site)): [" ".join(t.split())[:100] for t in page_text(page).prose if "`" in t]
        for page in pages
    }
    assert not {page: texts for page, texts in stray.items() if texts}, "pages show unrendered backticks"
    tutorial = page_text(site / "pretrain-to-answers" / "index.html")
    sentence = "Puktri Drozain was born in 1923. Puktri Drozain comes from Luklei."
    assert any(sentence in " ".join(code.split()) for code in tutorial.code), "step 1's example lost its text"


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


def test_the_docs_extra_installs_the_site_packages_of_the_test_extra_at_pinned_versions():
    """`pip install -e '.[docs]'` is all `mkdocs serve` needs: the test extra's site packages, pinned the same way."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["docs"] and set(extras["docs"]) <= set(extras["test"]), "the docs extra differs from the test extra"
    pins = pinned()
    for requirement in map(Requirement, extras["docs"]):
        name = canonicalize_name(requirement.name)
        assert name in pins and requirement.specifier.contains(pins[name]), f"{requirement} is not pinned within range"
    page = (ROOT / "docs" / "getting-started.md").read_text()
    assert "-e '.[docs]'" in page and "mkdocs serve" in page, "getting started does not say how to build the site"


def test_the_site_copy_of_the_mt_comparison_plot_is_the_benchmarks():
    """mkdocs serves only docs/, so translation.md shows a copy of the plot benchmarks/mt_compare.py writes."""
    original = ROOT / "benchmarks" / "results" / "mt_compare-60min.png"
    assert (ROOT / "docs" / "mt_compare-60min.png").read_bytes() == original.read_bytes(), (
        f"docs/mt_compare-60min.png differs from {original.relative_to(ROOT)}: copy it again"
    )
