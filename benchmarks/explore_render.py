#!/usr/bin/env python
"""How fast `kqv explore` redraws at 1,024 tokens: the time from a control change to the views drawn, in Chromium.

A random-initialised Hugging Face GPT-2 directory (n_positions 1,024, so the explorer's limit is 1,024 tokens; a
byte-level BPE tokenizer trained here; nothing downloaded) is served by the real app; Debian's Chromium, driven by
Playwright as tests/test_explore_browser.py drives it, analyses a 1,024-token text, then changes each control in
turn. A change is timed in the page from the event to the second animation frame after it (the handler has run,
and the browser has laid out and painted the result), `--rounds` times; the table shows the median and the
largest. Also measured: the analysis reply (bytes and seconds, with gzip and without, the weights as the API's
lists and as the millionths the page asks for) and the first drawing.
The target is under 0.5 s per change (issue 29).

    python benchmarks/explore_render.py                  # 2 layers x 4 heads; writes results/explore_render.json
    python benchmarks/explore_render.py --layers 1 --heads 2 --rounds 3
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from kqv_lab import benchmarking as harness

RESULTS = harness.results_path("explore_render")
TOKENS = 1024
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]

# each control change: what it is, and the page script that makes it (the handler runs at the dispatched event)
CHANGES = {
    "layer": "() => { const s = document.getElementById('layer'); s.selectedIndex = (s.selectedIndex + 1) % "
    "s.options.length; s.dispatchEvent(new Event('change')); }",
    "head on/off": "() => { const b = document.getElementById('head-0'); b.checked = !b.checked; "
    "b.dispatchEvent(new Event('change')); }",
    "average of heads": "() => { const b = document.getElementById('average'); b.checked = !b.checked; "
    "b.dispatchEvent(new Event('change')); }",
    "open a head (detail map)": "() => { const cs = [...document.querySelectorAll('#model-view canvas')]; "
    "const open = cs.findIndex(c => c.classList.contains('open')); cs[(open + 1) % cs.length].click(); }",
    "token": "() => { const ts = document.querySelectorAll('#head-view text.query'); "
    "ts[Math.floor(Math.random() * ts.length)].dispatchEvent(new MouseEvent('click', {bubbles: true})); }",
    "palette": "() => { const s = document.getElementById('palette'); s.selectedIndex = (s.selectedIndex + 1) % "
    "s.options.length; s.dispatchEvent(new Event('change')); }",
}
TIMED = "async (change) => { const t0 = performance.now(); (eval(change))(); " + (
    "await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r))); return performance.now() - t0; }"
)


def gpt2_directory(root: Path, layers: int, heads: int) -> tuple[Path, str]:
    """A random GPT-2 of 1,024 positions saved with its tokenizer, and a text of exactly 1,024 of its tokens."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from kqv.data import BPETokenizer

    corpus = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer. " * 40
    tokenizer = BPETokenizer.train(corpus, vocab_size=300)
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=tokenizer.vocab_size, n_positions=TOKENS, n_embd=32, n_layer=layers, n_head=heads, n_inner=64
    )
    GPT2LMHeadModel(config).save_pretrained(root)
    tokenizer.tokenizer.save(str(root / "tokenizer.json"))
    ids = tokenizer.encode(corpus * 4)[:TOKENS]
    text = tokenizer.decode(ids)
    while len(tokenizer.encode(text)) > TOKENS:  # decoding and encoding again may merge differently at the end
        text = text[:-1]
    return root, text


def reply_sizes(url: str, text: str) -> dict[str, float]:
    import httpx

    sizes = {}
    httpx.get(f"{url}/api/info", timeout=300)  # the model loads on the first request: not timed
    for weights in ("lists", "micros"):  # the API's default, and what the page asks for
        for encoding in ("gzip", "identity"):
            start = time.perf_counter()
            body = {"text": text, "weights": weights}
            headers = {"Accept-Encoding": encoding}
            with httpx.stream("POST", f"{url}/api/analyze", json=body, headers=headers, timeout=300) as response:
                sent = sum(len(chunk) for chunk in response.iter_raw())
            sizes[f"{weights}_{encoding}_bytes"] = sent
            sizes[f"{weights}_{encoding}_seconds"] = round(time.perf_counter() - start, 3)
    return sizes


def measure(url: str, text: str, rounds: int, chromium: str) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url + "/")
        page.wait_for_selector("#run:not(:empty)")
        page.fill("#text", text)
        start = time.perf_counter()
        page.click("#analyze")
        page.wait_for_selector("#head-view line.attn", state="attached", timeout=300_000)
        first = time.perf_counter() - start
        page.click("#model-view canvas")  # a detail map open, so that every change redraws it too
        drawn = {
            "queries": page.eval_on_selector_all("#head-view text.query", "ts => ts.length"),
            "svg_elements": page.eval_on_selector_all("svg *", "es => es.length"),
            "canvases": page.eval_on_selector_all("canvas", "cs => cs.length"),
        }
        times = {name: [page.evaluate(TIMED, change) / 1000 for _ in range(rounds)] for name, change in CHANGES.items()}
        browser.close()
    return {"first_draw_seconds": round(first, 3), "drawn": drawn, "changes": times, "console_errors": errors}


def main() -> None:
    parser = harness.arguments(harness.summary(__doc__), output=RESULTS)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5, help="timed changes of each control (default 5)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args()

    from kqv.explore import BackgroundServer, create_app

    with tempfile.TemporaryDirectory() as tmp:
        path, text = gpt2_directory(Path(tmp), args.layers, args.heads)
        with BackgroundServer(create_app(path), start_seconds=60) as server:
            sizes = reply_sizes(server.url, text)
            result = measure(server.url, text, args.rounds, args.chromium)
    print(
        f"{TOKENS} tokens, {args.layers} layers x {args.heads} heads; "
        f"first drawing {result['first_draw_seconds']:.2f} s"
    )
    for weights in ("lists", "micros"):
        print(
            f"reply, weights as {weights}: {sizes[f'{weights}_gzip_bytes'] / 1e6:.1f} MB gzip in "
            f"{sizes[f'{weights}_gzip_seconds']:.2f} s, {sizes[f'{weights}_identity_bytes'] / 1e6:.1f} MB plain in "
            f"{sizes[f'{weights}_identity_seconds']:.2f} s"
        )
    print(f"{'control change':26} {'median s':>9} {'max s':>7}")
    for name, times in result["changes"].items():
        print(f"{name:26} {statistics.median(times):9.3f} {max(times):7.3f}")
    slowest = max(statistics.median(t) for t in result["changes"].values())
    print(f"slowest median {slowest:.3f} s (target < 0.5 s); console errors: {len(result['console_errors'])}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "tokens": TOKENS,
        "layers": args.layers,
        "heads": args.heads,
        "rounds": args.rounds,
        "reply": sizes,
        **result,
        "slowest_median_seconds": round(slowest, 3),
    }
    harness.write_record(args.output, record)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
