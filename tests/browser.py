"""What the browser tests share: Debian's Chromium, driven by Playwright, with the flags that keep it offline, and
the rule for a missing browser or package. CI (.ci/run sets KQV_REQUIRE_BROWSER=1; CI services set CI) must run
these tests: there a missing browser or package is a failure, not a skip. Elsewhere a test module that needs one is
skipped, with the command that installs what is missing."""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
from collections.abc import Iterator

import pytest

REQUIRED = bool(os.environ.get("KQV_REQUIRE_BROWSER") or os.environ.get("CI"))
# headless, and no background connections: this machine's closed network refuses them, many at a time
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def missing(what: str, remedy: str) -> None:
    """Fail (in CI) or skip the calling test module: `what` is not installed, `remedy` installs it."""
    if REQUIRED:
        pytest.fail(f"CI must run the browser tests, but {what} is missing: {remedy}", pytrace=False)
    pytest.skip(f"{what} is missing ({remedy})", allow_module_level=True)


def need(module: str):
    """The imported `module`, or `missing` for its package."""
    try:
        return importlib.import_module(module)
    except ImportError:
        missing(f"the Python package {module.split('.')[0]}", "pip install -c constraints.txt -e '.[test]'")


def chromium() -> str:
    """The path of Debian's Chromium, or `missing` for it (Playwright's own browser download does not work here)."""
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(path):
        missing("Debian's chromium", "apt-get install -y chromium; .ci/run installs it")
    return path


@contextlib.contextmanager
def launched(sync_api) -> Iterator:
    """Debian's Chromium, headless and offline (`FLAGS`), driven by Playwright's `sync_api`, for the block."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=FLAGS)
        yield browser
        browser.close()
