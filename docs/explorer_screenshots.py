"""Screenshots of `kqv explore` for the docs: serve a run, drive Debian's Chromium (Playwright), save a PNG.

    python docs/explorer_screenshots.py runs/lm --text "ROMEO:\nBut soft, what light" --token 20 --cell 3.2 \
        --continue --out docs/explorer-lm.png
    python docs/explorer_screenshots.py runs/lm --text "ROMEO:\nBut soft, what light" --sort previous \
        --element "#overview" --out docs/explorer-lm-model.png
    python docs/explorer_screenshots.py runs/mt --text "Im Anfang war das Wort." --beam 4 --cell 3.1 \
        --out docs/explorer-mt.png

    python docs/explorer_screenshots.py runs/lm --text-file passage.txt --cell 2.1 --point 700.690 \
        --element "#detail-box" --out docs/explorer-large.png
    python docs/explorer_screenshots.py runs/lm --text "ROMEO:\nBut soft, what light" --cell 2.3 \
        --export detail --out docs/explorer-export.png
    python docs/explorer_screenshots.py runs/lm --text "ROMEO:\nBut soft, what light" --notebook \
        --out docs/explorer-notebook.png

    python docs/explorer_screenshots.py runs/lm --text "ROMEO:\nBut soft, what light" --cell 1.2 --token 24 \
        --neuron --neuron-point 23.10 --element "#neuron-box" --width 1100 --out docs/explorer-neuron.png
    python docs/explorer_screenshots.py runs/lm --text "ROMEO:\nBut soft, what light" --cell 1.2 \
        --replace 26:e --element "#replace-box" --width 1200 --out docs/explorer-replace.png
    python docs/explorer_screenshots.py runs/lm --text "ROMEO:\nBut soft, what light" --ablate zero \
        --ablate-sort delta --ablate-heads 1.3,1.4 --element "#ablate-box" --width 1000 --out docs/explorer-ablate.png

Needs the test extra (playwright) and `apt-get install chromium`. Every request that is not to the app is blocked,
as in the browser tests. `--cell L.H` opens layer L, head H (1-based) in the detail view; `--token` picks the
query token of the head view (0-based; default the last); `--element CSS` saves only that part of the page
(`#overview`: the model view and the statistics); `--sort KEY` sorts the statistics by a column (largest first);
`--point Q.K` leaves the pointer on the detail map's cell (query Q, key K; 0-based), so that its tooltip shows;
`--export detail|head-view` saves the page's own PNG export of that view (with its title and colour legend)
instead of a screenshot; `--notebook` shows the page as `kqv.explore.show` puts it in a notebook cell (an iframe).
The "Look closer and intervene" panels (after `--cell` and `--token`, which choose their head and query):
`--neuron` waits for the neuron view of that head and query (`--neuron-point K.D` rests the pointer on key K's
product in dimension D, 0-based, so the line under it gives the numbers); `--replace POS:TOKEN` replaces token POS
(0-based) by TOKEN (`POS:` alone: the encoder's [MASK]); `--ablate zero|mean` switches each head off in turn,
`--ablate-sort KEY` sorts the table (largest first) and `--ablate-heads L.H,L.H` (1-based) switches those heads
off together. Crop to a panel with `--element`: `#neuron-box`, `#replace-box`, `#ablate-box`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from browser import FLAGS  # noqa: E402 - Chromium's offline flags, the browser tests' own
from kqv.explore.app import BackgroundServer, create_app  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run")
    text = parser.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", help="the input; \\n stands for a line break")
    text.add_argument("--text-file", help="the input, read from this file (UTF-8)")
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
    parser.add_argument("--max-tokens", type=int, help="the input limit (default: the model's context)")
    parser.add_argument("--point", help="query.key (0-based): leave the pointer on that cell of the detail map")
    parser.add_argument("--export", choices=["detail", "head-view"], help="save the page's PNG export of a view")
    parser.add_argument("--notebook", action="store_true", help="the page as kqv.explore.show shows it inline")
    parser.add_argument("--neuron", action="store_true", help="wait for the neuron view of the head and token")
    parser.add_argument("--neuron-point", help="key.dimension (0-based): rest the pointer on that product")
    parser.add_argument("--replace", help="position:token (0-based; 'position:' for [MASK]): replace a token")
    parser.add_argument("--ablate", choices=["zero", "mean"], help="switch each head off in turn")
    parser.add_argument("--ablate-sort", help="sort the ablation table by this column (loss, delta, kl, ...)")
    parser.add_argument("--ablate-heads", help="layer.head,... (1-based): switch these heads off together")
    args = parser.parse_args()
    text = Path(args.text_file).read_text(encoding="utf-8") if args.text_file else args.text.replace("\\n", "\n")
    if args.notebook:
        return notebook_screenshot(args, text)
    from playwright.sync_api import sync_playwright

    with BackgroundServer(create_app(args.run, args.max_tokens)) as server, sync_playwright() as playwright:
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
        page.fill("#text", text)  # after the beam, whose change analyses at once
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
        intervene(page, args)
        page.mouse.move(0, 0)
        page.evaluate("window.scrollTo(0, 0)")
        if args.point:
            point_at(page, *(int(x) for x in args.point.split(".")))
        if args.neuron_point:
            point_at_product(page, *(int(x) for x in args.neuron_point.split(".")))
        if args.export:
            with page.expect_download() as download:
                page.click(f'[data-export="{args.export}"][data-format="png"]')
            download.value.save_as(args.out)
        elif args.element:
            page.locator(args.element).first.screenshot(path=args.out)
        else:
            page.screenshot(path=args.out, full_page=args.full_page)
        browser.close()
    if blocked:
        raise SystemExit(f"the page tried to reach {blocked}")
    print(f"wrote {args.out}")


def point_at(page, query: int, key: int) -> None:
    """Scroll the detail map into view and rest the pointer on cell (query, key), where its tooltip appears."""
    page.eval_on_selector("#detail-box", "box => box.scrollIntoView()")
    page.evaluate("window.scrollBy(0, -8)")
    cells = page.locator("#detail image.weights, #detail g rect.weight").first.bounding_box()
    rows = page.eval_on_selector_all("#head-view text.query", "ts => ts.length")
    columns = page.eval_on_selector_all("#head-view text.key", "ts => ts.length")
    image = page.query_selector("#detail image.weights")
    width = image.bounding_box()["width"] if image else cells["width"] * columns
    height = image.bounding_box()["height"] if image else cells["height"] * rows
    page.mouse.move(cells["x"] + (key + 0.5) * width / columns, cells["y"] + (query + 0.5) * height / rows)


def intervene(page, args: argparse.Namespace) -> None:
    """Drive the "Look closer and intervene" panels: wait for the neuron view, replace a token, ablate heads."""
    if args.neuron or args.neuron_point:
        layer = page.eval_on_selector("#iv-layer", "s => +s.value + 1")
        head = page.eval_on_selector("#iv-head", "s => +s.value + 1")
        query = page.eval_on_selector_all("#head-view text.query", "ts => ts.length") - 1
        query = query if args.token is None else args.token
        label = f"neuron view of layer {layer}, head {head}, query {query + 1} "
        page.wait_for_selector(f'#neuron[aria-label^="{label}"] g.neuron-row', state="attached", timeout=120_000)
    if args.replace:
        position, replacement = args.replace.split(":", 1)
        page.select_option("#replace-position", value=position)
        page.fill("#replacement", replacement)
        page.click("#replace")
        page.wait_for_selector("#replace-predictions tbody tr", timeout=120_000)
    if args.ablate:
        page.select_option("#ablate-mode", value=args.ablate)
        page.click("#ablate")
        page.wait_for_selector("#ablation tbody tr", timeout=300_000)
        if args.ablate_sort:
            page.click(f'#ablation th[data-key="{args.ablate_sort}"]')
        for pair in args.ablate_heads.split(",") if args.ablate_heads else []:
            layer, head = (int(x) - 1 for x in pair.split("."))
            page.check(f'#ablation tr[data-layer="{layer}"][data-head="{head}"] input[type="checkbox"]')
        if args.ablate_heads:
            page.click("#ablate-chosen")
            page.wait_for_selector("#ablate-next caption", timeout=300_000)


def point_at_product(page, key: int, dimension: int) -> None:
    """Rest the pointer on key `key`'s product in `dimension` of the neuron view, whose numbers show below it.

    The view's column width depends on the head's size, which the page does not expose: step the pointer along the
    key's row, a pixel at a time, until the line under the view names that dimension.
    """
    page.eval_on_selector("#neuron-box", "box => box.scrollIntoView()")
    products = page.locator("#neuron image.products").bounding_box()
    rows = page.eval_on_selector_all("#neuron g.neuron-row", "rows => rows.length")
    y = products["y"] + (key + 0.5) * products["height"] / rows
    wanted = f"key {key + 1} "
    for x in range(int(products["width"])):
        page.mouse.move(products["x"] + x + 0.5, y)
        info = page.inner_text("#neuron-info")
        if info.startswith(wanted) and f", dimension {dimension + 1}:" in info:
            return
    raise SystemExit(f"the neuron view has no dimension {dimension} (0-based) for key {key}")


def notebook_screenshot(args: argparse.Namespace, text: str) -> None:
    """The page as `kqv.explore.show` displays it in a notebook cell: its `_repr_html_` (an iframe) in a page."""
    import tempfile

    from playwright.sync_api import sync_playwright

    import kqv.explore

    view = "cell={}.{}".format(*(int(x) - 1 for x in args.cell.split("."))) if args.cell else ""
    shown = kqv.explore.show(args.run, text, view=view, height=args.height - 120, max_tokens=args.max_tokens)
    cell = (
        '<!doctype html><html><body style="font: 14px sans-serif; margin: 16px">'
        '<pre style="background: #f5f5f5; padding: 8px">In [1]: import kqv.explore\n'
        f"        kqv.explore.show({str(args.run)!r}, {text[:40]!r})</pre>{shown._repr_html_()}</body></html>"
    )
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as playwright:
        host = Path(tmp) / "notebook.html"
        host.write_text(cell, encoding="utf-8")
        browser = playwright.chromium.launch(
            executable_path=shutil.which("chromium") or "/usr/bin/chromium", args=FLAGS
        )
        page = browser.new_page(viewport={"width": args.width, "height": args.height})
        page.goto(host.as_uri())
        page.frame_locator("iframe.kqv-explore").locator("#head-view line.attn").first.wait_for(state="attached")
        page.screenshot(path=args.out)
        browser.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
