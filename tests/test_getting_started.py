"""docs/getting-started.md's commands, run as the page writes them (parsed from its bash blocks), in a fresh
directory: the page cannot drift from what kqv does. Only the install and the project's own checks are left out
(they need the network or run the whole suite), and each new training run gets `SHORTER` (5 updates, and a
validation split small enough that the final perplexity takes seconds) so the tour takes minutes, not the quick
config's ten per run; a resumed run continues with its own run.toml."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "getting-started.md"
# the parts of a line this test does not run: getting the code, installing it, the suite, building the site
NOT_RUN = (
    "git clone",
    "cd kqv",
    "python3.11 -m venv",
    ". .venv/bin/activate",
    "python -m pip",
    "python -m ruff",
    "python -m pytest",
    "mkdocs",
)
SHORTER = ["--steps", "5", "--set", "data.val_fraction=0.005"]


def commands() -> list[str]:
    """Each command of the page's bash blocks, in order (a line's `&&` parts apart, comments dropped), that the
    test runs."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL):
        for line in block.splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()  # the page's comments (no command holds " #")
            parts = [part.strip() for part in line.split("&&")] if line else []
            found += [part for part in parts if not part.startswith(NOT_RUN)]
    return found


def as_run(command: str) -> list[str]:
    """The command's words, with a new training run shortened by `SHORTER`."""
    words = shlex.split(command)
    if words[:3] == ["kqv", "train", "lm"] and "--resume" not in words:
        assert "--steps" not in words and "data.val_fraction" not in command, "the page sets what SHORTER would"
        words += SHORTER
    return words


def test_the_page_s_tour_is_what_this_test_runs():
    assert [c.split()[:3] for c in commands()] == [
        ["kqv", "train", "lm"],
        ["kqv", "generate", "runs/lm"],
        ["kqv", "eval", "runs/lm"],
        ["kqv", "attention", "runs/lm"],
        ["kqv", "explore", "runs/lm"],
        ["kqv", "train", "lm"],
        ["cat", "docs/*.md", ">"],
        ["kqv", "train", "lm"],
    ]


def test_getting_started_commands_run_as_written(tmp_path):
    (tmp_path / "docs").symlink_to(ROOT / "docs")  # the page's commands run in the clone's root
    env = {**os.environ, "BROWSER": "true", "PYTHONUNBUFFERED": "1"}  # --open hands the address to `true`
    for command in commands():
        words = as_run(command)
        if words[:2] == ["kqv", "explore"]:
            served(words, tmp_path, env)
            continue
        shell = words[0] == "cat"  # the page's one shell line: a glob and a redirection
        done = subprocess.run(
            command if shell else words, shell=shell, cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert (tmp_path / "attention.png").stat().st_size > 0
    assert (tmp_path / "my.txt").stat().st_size > 100_000
    for run in ("runs/lm", "runs/mine"):
        assert (tmp_path / run / "checkpoint").is_dir() and (tmp_path / run / "samples.txt").is_file()
    assert 'position = "alibi"' in (tmp_path / "runs/mine/run.toml").read_text()


def served(words: list[str], cwd: Path, env: dict[str, str]) -> None:
    """Run a `kqv explore` server until it says where it serves and that address answers, then stop it."""
    import urllib.error
    import urllib.request

    server = subprocess.Popen(words, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen, deadline = "", time.monotonic() + 120
        while time.monotonic() < deadline and not (address := re.search(r"http://(localhost|127\.0\.0\.1):\d+/", seen)):
            line = server.stdout.readline()
            assert line or server.poll() is None, f"{shlex.join(words)} ended: {seen[-2000:]}"
            seen += line
        assert address, f"{shlex.join(words)} named no address in 120 s: {seen[-2000:]}"
        while True:  # the address is printed before the server listens
            try:
                with urllib.request.urlopen(address.group(), timeout=30) as answer:
                    assert answer.status == 200
                    break
            except urllib.error.URLError:
                assert time.monotonic() < deadline and server.poll() is None, f"{shlex.join(words)} never answered"
                time.sleep(0.5)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_explore_without_its_packages_names_the_pinned_install(monkeypatch, capsys):
    from kqv.cli.main import main

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # `import uvicorn` raises ImportError
    assert main(["explore", "runs/lm"]) != 0
    assert "python -m pip install -c constraints.txt -e '.[explore]'" in capsys.readouterr().err
