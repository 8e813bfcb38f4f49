"""Screenshots of `kqv explore` for the docs: serve a run, drive Debian's Chromium (Playwright), save a PNG.

    python docs/explorer_screenshots.py runs/lm --text "ROMEO:\nBut soft, what light" --token 20 --cell 3.2 \
        --continue --out docs/explorer-lm.png
    python docs/explorer_screenshots.py runs/lm --text "ROMEO:\nBut soft, what light" --sort previous \
        --element "#overview" --out docs/explorer-lm-model.png
    python docs/explorer_screenshots.py runs/mt --text "Im Anfang war das Wort." --beam 4 --cell 3.1 \
        --out docs/explorer-mt.png

Needs the test extra (playwright) and `apt-get install chromium`. Every request that is not to the app is blocked,
as in the browser tests. `--cell L.H` opens layer L, head H (1-based) in the detail view; `--token` picks the
query token of the head view (0-based; default the last); `--element CSS` saves only that part of the page
(`#overview`: the model view and the statistics); `--sort KEY` sorts the statistics by a column (largest first).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from kqv.explore.app import BackgroundServer, create_app  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run")
    parser.add_argument("--text", required=True, help="the input; \\n stands for a line break")
    parser.add_argument("--out", required=True)
    parser.add_argument("--beam", help="MT: beam size")
    parser.add_argument("--token", type=int, help="query token of the head view (0-based)")
    parser.add_argument("--cell", help="layer.head to open, 1-based, e.g. 2.3")
    parser.add_argument("--continue", dest="continue_", action="store_true", help="LM: run 'continue' first")
    parser.add_argument("--sort", help="sort the per-head statistics by this column (entropy, previous, ...)")
    parser.add_argument("--element", help="CSS selector: save only this part of the page")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--full-page", action="store_true")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with BackgroundServer(create_app(args.run, max_tokens=256)) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=shutil.which("chromium") or "/usr/bin/chromium", args=FLAGS
        )
        page = browser.new_page(viewport={"width": args.width, "height": args.height})
        blocked = []
        page.route(
            "**/*",
            lambda route: (
                route.continue_()
                if route.request.url.startswith(server.url)
                else (blocked.append(route.request.url), route.abort())
            ),
        )
        page.goto(server.url + "/")
        page.wait_for_selector("#run:not(:empty)")
        if args.beam:
            page.select_option("#beam", label=args.beam)
        page.fill("#text", args.text.replace("\\n", "\n"))  # after the beam, whose change analyses at once
        page.click("#analyze")
        page.wait_for_selector("#head-view line.attn", state="attached", timeout=120_000)
        if args.token is not None:
            page.click(f'#head-view text.query[data-index="{args.token}"]')
        if args.cell:
            layer, head = (int(x) - 1 for x in args.cell.split("."))
            page.click(f'#model-view canvas[data-layer="{layer}"][data-head="{head}"]')
        if args.continue_:
            page.click("#continue")
            page.wait_for_selector('#continuation[data-done="1"]', timeout=300_000)
        if args.sort:
            page.click(f'#stats th[data-key="{args.sort}"]')
        page.mouse.move(0, 0)
        page.evaluate("window.scrollTo(0, 0)")
        if args.element:
            page.locator(args.element).first.screenshot(path=args.out)
        else:
            page.screenshot(path=args.out, full_page=args.full_page)
        browser.close()
    if blocked:
        raise SystemExit(f"the page tried to reach {blocked}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
