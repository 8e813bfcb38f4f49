"""The explorer's page in a real headless Chromium (Debian's, driven by Playwright), served by the real app on a
free port with tiny trained runs. Every request that is not to the app is blocked and recorded, and any console
error or uncaught exception fails the test: the page must work offline and cleanly."""

from __future__ import annotations

import json

import pytest

from browser import chromium, launched, need

need("uvicorn")
sync_api = need("playwright.sync_api")
chromium()  # a missing browser skips (or, in CI, fails) the module here

import httpx  # noqa: E402
import torch  # noqa: E402

from explore_runs import train_run  # noqa: E402
from kqv.explore.app import BackgroundServer as Server  # noqa: E402
from kqv.explore.app import create_app  # noqa: E402
from kqv.jobs.lm import load_run  # noqa: E402
from kqv.jobs.sampling import generate_text  # noqa: E402

TEXT = "To be, or not"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    return {"lm": train_run("lm", root), "mt": train_run("mt", root)}


@pytest.fixture(scope="module")
def servers(runs):
    with Server(create_app(runs["lm"], max_tokens=32)) as lm, Server(create_app(runs["mt"], max_tokens=32)) as mt:
        yield {"lm": lm, "mt": mt}


@pytest.fixture(scope="module")
def browser():
    with launched(sync_api) as chromium_browser:
        yield chromium_browser


class Page:
    """A fresh page whose requests may only go to `allowed` (others are aborted and recorded), and which records
    console errors and uncaught exceptions."""

    def __init__(self, browser, allowed: str):
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        self.blocked, self.errors = [], []
        self.context.route("**/*", self.route(allowed))
        self.page = self.context.new_page()
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def route(self, allowed: str):
        def handle(route):
            url = route.request.url
            if url.startswith(allowed):
                return route.continue_()
            self.blocked.append(url)
            return route.abort()

        return handle

    def close(self, expected_errors: int = 0) -> None:
        self.context.close()
        assert not self.blocked, f"the page tried to reach {self.blocked}"
        assert len(self.errors) == expected_errors, f"console errors: {self.errors}"


@pytest.fixture
def page(browser, servers):
    opened = []

    def open_page(kind: str = "lm", allowed: str | None = None) -> Page:
        opened.append(Page(browser, allowed or servers[kind].url))
        return opened[-1]

    yield open_page
    for p in opened:
        p.close(getattr(p, "expected_errors", 0))


def api_analysis(server: Server, **body) -> dict:
    return httpx.post(f"{server.url}/api/analyze", json=body, timeout=30).json()


def line_weights(page) -> dict[int, float]:
    """{key index: weight} of the head view's lines (one head shown)."""
    return {
        int(k): float(w)
        for k, w in page.eval_on_selector_all(
            "#head-view line.attn", "ls => ls.map(l => [l.dataset.key, l.dataset.weight])"
        )
    }


def analyze_in_page(p: Page, server: Server, text: str, beam: str | None = None) -> None:
    p.page.goto(server.url + "/")
    p.page.wait_for_selector("#run:not(:empty)")
    if beam is not None:
        p.page.select_option("#beam", label=beam)
    p.page.fill("#text", text)  # after the beam: a beam change with text in the box analyses at once
    p.page.click("#analyze")
    p.page.wait_for_selector("#head-view line.attn", state="attached")


def show_only_head(page, head: int) -> None:
    for other in range(page.eval_on_selector_all("#heads input", "boxes => boxes.length")):
        page.set_checked(f"#head-{other}", other == head)


def test_lm_page_head_view_layers_model_view_continue_and_screenshot(page, servers, runs, tmp_path):
    p = page("lm")
    analyze_in_page(p, servers["lm"], TEXT)
    expected = api_analysis(servers["lm"], text=TEXT)["attention"]["self"]["layers"]
    show_only_head(p.page, 1)
    p.page.click('#head-view text.query[data-index="4"]')
    # token 4 of a causal model attends to tokens 0..4: one line each, with the API's weights for layer 1, head 2
    assert line_weights(p.page) == dict(enumerate(expected[0][1][4][:5]))
    assert (
        p.page.eval_on_selector_all("#head-view line.attn", "ls => ls.map(l => +l.getAttribute('stroke-opacity'))")
        == expected[0][1][4][:5]
    )

    run = load_run(runs["lm"])
    weights = run.model.attention_weights(torch.tensor([run.tokenizer.encode(TEXT)]))  # the model's own numbers
    torch.testing.assert_close(
        torch.tensor([w for _, w in sorted(line_weights(p.page).items())]), weights[0][0, 1, 4, :5], atol=1e-6, rtol=0
    )

    p.page.select_option("#layer", index=1)
    p.page.click('#head-view text.query[data-index="6"]')
    assert line_weights(p.page) == dict(enumerate(expected[1][1][6][:7]))
    torch.testing.assert_close(
        torch.tensor([w for _, w in sorted(line_weights(p.page).items())]), weights[1][0, 1, 6, :7], atol=1e-6, rtol=0
    )

    p.page.click('#model-view canvas[data-layer="1"][data-head="0"]')
    assert "layer 2, head 1" in p.page.inner_text("#detail-title")
    cells = p.page.eval_on_selector_all(
        "#detail rect.weight",
        "rs => rs.map(r => [+r.dataset.query, +r.dataset.key, +r.dataset.weight, r.classList.contains('masked')])",
    )
    assert len(cells) == len(TEXT) ** 2
    assert all(w == expected[1][0][i][j] and masked == (j > i) for i, j, w, masked in cells)

    p.page.click('#stats th[data-key="previous"]')  # sort by the weight on the previous token, largest first
    previous = [
        float(td)
        for td in p.page.eval_on_selector_all(
            "#stats tbody tr", "rows => rows.map(r => r.querySelector('td[data-key=previous]').textContent)"
        )
    ]
    assert previous == sorted(previous, reverse=True) and len(previous) == 4

    p.page.click("#continue")
    p.page.wait_for_selector('#continuation[data-done="1"]', timeout=20_000)
    new = p.page.eval_on_selector_all("#continuation span.new", "ss => ss.map(s => s.textContent)")
    sample = generate_text(
        run.model, run.tokenizer, TEXT, 8, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(0)
    )
    assert len(new) == 8 and TEXT + "".join(new) == sample

    shot = tmp_path / "lm.png"
    p.page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_the_view_is_kept_in_the_url(page, servers):
    p = page("lm")
    analyze_in_page(p, servers["lm"], TEXT)
    p.page.select_option("#layer", index=1)
    p.page.click('#model-view canvas[data-layer="0"][data-head="1"]')
    p.page.select_option("#palette", value="viridis")
    url = p.page.url
    assert "layer=1" in url and "cell=0.1" in url and "palette=viridis" in url
    fresh = page("lm")
    fresh.page.goto(url)
    fresh.page.wait_for_selector("#head-view line.attn", state="attached")
    assert fresh.page.input_value("#text") == TEXT and fresh.page.input_value("#layer") == "1"
    assert fresh.page.input_value("#palette") == "viridis"
    assert "layer 1, head 2" in fresh.page.inner_text("#detail-title")


def test_bad_input_shows_the_apis_message(page, servers):
    p = page("lm")
    p.page.goto(servers["lm"].url + "/")
    p.page.wait_for_selector("#run:not(:empty)")
    p.page.fill("#text", "To be \u2603")
    p.page.click("#analyze")
    p.page.wait_for_selector("#error:not([hidden])")
    assert "not in the vocabulary" in p.page.inner_text("#error")
    p.expected_errors = 1  # Chromium logs the 400 response itself


def test_mt_page_draws_the_cross_attention_of_the_translation(page, servers):
    p = page("mt")
    analyze_in_page(p, servers["mt"], "eins zwei drei", beam="1")
    body = api_analysis(servers["mt"], text="eins zwei drei", beam=1)
    assert p.page.inner_text("#translation") == body["translation"]
    assert p.page.input_value("#kind") == "cross"
    show_only_head(p.page, 0)
    p.page.click('#head-view text.query[data-index="0"]')
    cross = body["attention"]["cross"]
    assert line_weights(p.page) == {j: w for j, w in enumerate(cross["layers"][0][0][0]) if w > 0}
    assert len(line_weights(p.page)) == len(cross["keys"])  # every source token, no causal mask across languages
    p.page.select_option("#kind", value="decoder")
    assert p.page.is_visible("#mask-box")


def test_the_saved_html_file_draws_without_a_server(page, servers, tmp_path):
    path = tmp_path / "saved.html"
    path.write_bytes(httpx.post(f"{servers['lm'].url}/api/export", json={"text": TEXT}, timeout=30).content)
    p = page("lm", allowed=path.as_uri())
    p.page.goto(path.as_uri())
    p.page.wait_for_selector("#head-view line.attn", state="attached")
    assert p.page.input_value("#text") == TEXT and not p.page.is_visible("#continue")
    assert p.page.eval_on_selector_all("#model-view canvas", "cs => cs.length") == 4
    data = json.loads(path.read_text().split('type="application/json">')[1].split("</script>")[0])
    assert line_weights(p.page) and max(line_weights(p.page).values()) <= 1.0
    assert data["analysis"]["tokens"] == list(TEXT)


def test_the_views_export_as_svg_and_png(page, servers):
    p = page("lm")
    analyze_in_page(p, servers["lm"], TEXT)
    p.page.click('#model-view canvas[data-layer="0"][data-head="0"]')
    with p.page.expect_download() as svg_download:
        p.page.click('[data-export="head-view"][data-format="svg"]')
    svg = open(svg_download.value.path(), encoding="utf-8").read()
    assert svg.startswith("<svg") and svg.count('class="attn"') == 2 * len(TEXT)  # both heads, token 12 sees 13
    with p.page.expect_download() as png_download:
        p.page.click('[data-export="detail"][data-format="png"]')
    assert open(png_download.value.path(), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert png_download.value.suggested_filename == "kqv-detail.png"


@pytest.fixture(scope="module")
def vit_server(tmp_path_factory):
    from kqv.cli.main import main

    out = tmp_path_factory.mktemp("browser-vit") / "vit"
    overrides = ["model.d_model=16", "model.n_heads=2", "model.n_layers=2", "train.eval_every=3"]
    args = ["train", "vit", "--out", str(out), "--steps", "3", "--quiet", "--baseline", "none"]
    assert main(args + [item for o in overrides for item in ("--set", o)]) == 0
    with Server(create_app(out)) as server:
        yield server


def test_a_vit_run_opens_with_its_attention_over_the_patches_and_its_class_probabilities(browser, vit_server, tmp_path):
    p = Page(browser, vit_server.url)
    analyze_in_page(p, vit_server, "3")
    body = api_analysis(vit_server, text="3")
    queries = p.page.eval_on_selector_all("#head-view text.query", "ts => ts.map(t => t.textContent)")
    assert queries == body["tokens"] == ["[CLS]"] + [f"p{i}" for i in range(16)]
    show_only_head(p.page, 0)
    p.page.click('#head-view text.query[data-index="0"]')
    expected = body["attention"]["self"]["layers"][0][0][0]
    assert line_weights(p.page) == {j: w for j, w in enumerate(expected) if w > 0}  # [CLS] sees every patch
    assert p.page.is_visible("#classes-box")
    assert p.page.eval_on_selector_all("#classes *", "es => es.length") > 0
    p.page.screenshot(path=str(tmp_path / "vit.png"), full_page=True)
    p.close()


def largest_spread_weight(rows) -> float:
    """The largest weight of the rows that see two or more keys (a causal map's first row sees one: always 1)."""
    return max(max(row) for row in rows if sum(w > 0 for w in row) >= 2)


def pixel(page, selector: str, x: int, y: int) -> list[int]:
    return page.eval_on_selector(selector, f"c => Array.from(c.getContext('2d').getImageData({x}, {y}, 1, 1).data)")


def test_colours_scale_to_the_largest_weight_of_the_rows_that_see_two_keys(page, servers):
    """A causal map's first row holds one weight, 1.0, whatever the head does: scaling "up to each map's largest
    weight" ignores it, so the scale is below 1 and the largest weight of the other rows is drawn brightest."""
    p = page("lm")
    analyze_in_page(p, servers["lm"], TEXT)
    layers = api_analysis(servers["lm"], text=TEXT)["attention"]["self"]["layers"]
    rows = layers[0][1]
    assert rows[0][0] == 1.0  # the first query sees itself alone
    peak = largest_spread_weight(rows)
    assert peak < 1.0
    p.page.click('#model-view canvas[data-layer="0"][data-head="1"]')
    assert p.page.inner_text("#scale-info").startswith(f"colours from 0 to {peak:.3f}")
    i, j = next((i, j) for i, row in enumerate(rows[1:], 1) for j, w in enumerate(row) if w == peak)
    top = [254, 232, 56, 255]  # cividis' brightest, #fee838
    canvas = '#model-view canvas[data-layer="0"][data-head="1"]'
    assert pixel(p.page, canvas, j, i) == top and pixel(p.page, canvas, 0, 0) == top
    brightest = p.page.eval_on_selector_all(
        f'#detail rect.weight[data-query="{i}"][data-key="{j}"]', "rs => rs.map(r => r.getAttribute('fill'))"
    )
    assert brightest == ["rgb(254,232,56)"]
    p.page.uncheck("#scale")  # unscaled: colours up to 1
    assert p.page.inner_text("#scale-info").startswith("colours from 0 to 1.000")
    assert pixel(p.page, canvas, j, i) != top


def scroll_y(page) -> float:
    return page.eval_on_selector("html", "e => window.scrollY")


def test_the_first_screen_has_an_example_and_the_model_view_in_reach(page, servers):
    """At 1400 x 900 the page opens with a text the model reads in the box; once analysed, a button on the first
    screen takes the model view into sight, and another takes the detail back."""
    p = page("lm")
    p.page.set_viewport_size({"width": 1400, "height": 900})
    p.page.goto(servers["lm"].url + "/")
    p.page.wait_for_selector("#run:not(:empty)")
    example = httpx.get(f"{servers['lm'].url}/api/info", timeout=30).json()["example"]
    assert example and p.page.input_value("#text") == example
    p.page.click("#analyze")  # the example as it is
    p.page.wait_for_selector("#head-view line.attn", state="attached")
    assert p.page.is_hidden("#error")

    def in_sight(selector: str) -> bool:
        box = p.page.locator(selector).bounding_box()
        return box is not None and 0 <= box["y"] < 900 and box["height"] > 0

    assert in_sight("#to-model-view")  # on the first screen, before any scrolling
    assert scroll_y(p.page) == 0
    p.page.click("#to-model-view")
    p.page.wait_for_timeout(100)
    assert in_sight("#model-view") and scroll_y(p.page) > 0
    assert "overview" not in p.page.url  # the view kept in the URL is not replaced by an anchor
    p.page.click('#model-view canvas[data-layer="1"][data-head="0"]')
    p.page.click("#to-detail")
    p.page.wait_for_timeout(100)
    assert in_sight("#detail-box") and "layer 2, head 1" in p.page.inner_text("#detail-title")
