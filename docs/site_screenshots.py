"""Screenshots of the documentation site for docs/screenshots/: build it, serve it on loopback, drive Debian's
Chromium (Playwright), save a PNG per page.

    python docs/site_screenshots.py                 # builds the site into a scratch folder first
    python docs/site_screenshots.py --site site/    # an already built site

Needs the test extra (mkdocs, playwright) and `apt-get install chromium`. Every request that is not to the local
server is blocked and reported, so a screenshot also shows that the page reads offline.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
# (page path on the site, file name, how much of the page: "viewport" or a pixel height)
SHOTS = [
    ("", "home.png", 1100),
    ("getting-started/", "getting-started.png", 1100),
    ("performance/", "performance.png", 1300),
    ("lecture/", "lecture-notebook.png", 1500),
    ("lecture/#look-at-its-attention", "lecture-notebook-attention.png", 1100),
    ("api/", "api.png", 1100),
]


def build(site: Path) -> None:
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--quiet", "-d", str(site)], cwd=ROOT, check=True)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no line per request
        pass


def serve(site: Path) -> http.server.ThreadingHTTPServer:
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def shoot(site: Path, out: Path, width: int = 1600) -> list[str]:
    """Save each page of SHOTS under `out`; returns the outside requests that were blocked."""
    server = serve(site)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    blocked: list[str] = []

    def route(request_route):
        if request_route.request.url.startswith(base):
            return request_route.continue_()
        blocked.append(request_route.request.url)
        return request_route.abort()

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        for path, name, height in SHOTS:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.route("**/*", route)
            page.goto(base + path, wait_until="load")
            page.wait_for_timeout(500)
            page.screenshot(path=str(out / name))
            page.close()
        browser.close()
    server.shutdown()
    return blocked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, help="an already built site (default: build one)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        site = args.site or Path(scratch) / "site"
        if args.site is None:
            build(site)
        blocked = shoot(site, args.out)
    for url in sorted(set(blocked)):
        print(f"blocked (outside the site): {url}")
    print(f"wrote {len(SHOTS)} screenshots to {args.out}")


if __name__ == "__main__":
    main()
