"""The explorer's page keeps its controls, URL and views in agreement with the last request, in a real headless
Chromium (the servers, runs and page recorder of test_explore_browser.py): replies that come back out of order, a
hand-edited URL, a refused input, keyboard use; and a Hugging Face GPT-2 directory opened like an LM run."""

from __future__ import annotations

import pytest

import test_explore_browser as shared
from test_explore_browser import (
    TEXT,
    Page,
    Server,
    analyze_in_page,
    api_analysis,
    create_app,
    line_weights,
    show_only_head,
)

# the shared module's fixtures, used here by name: the tiny runs, their servers, Chromium and the page recorder
runs, servers, browser, page = shared.runs, shared.servers, shared.browser, shared.page

SHORT = "To be"


class Held:
    """Holds the requests to `path` while `holding` is set (the server never sees them until `release`)."""

    def __init__(self, p: Page, path: str):
        self.holding, self.routes = True, []
        p.page.route(f"**{path}", self.handle)

    def handle(self, route):
        if self.holding:
            self.routes.append(route)
        else:
            route.continue_()

    def wait(self, p: Page, count: int = 1) -> None:
        """Let the page send its request and the route handler hold it (handlers run while Playwright waits)."""
        for _ in range(100):
            if len(self.routes) >= count:
                return
            p.page.wait_for_timeout(50)
        raise AssertionError(f"{count} request(s) expected to be held, got {len(self.routes)}")

    def release(self) -> None:
        self.holding = False
        for route in self.routes:
            try:
                route.continue_()  # the page has aborted it: the late reply, if any, must not be drawn
            except Exception:  # noqa: BLE001 -- an aborted request can no longer be continued
                pass


def queries(p: Page) -> list[str]:
    return p.page.eval_on_selector_all("#head-view text.query", "ts => ts.map(t => t.textContent)")


def test_a_late_reply_to_an_older_analysis_is_never_drawn(page, servers):
    p = page("lm")
    analyze_in_page(p, servers["lm"], SHORT)
    held = Held(p, "/api/analyze")
    p.page.fill("#text", TEXT)
    p.page.click("#analyze")
    held.wait(p)  # the long text's analysis waits
    held.holding = False
    p.page.fill("#text", "To")
    p.page.click("#analyze")
    p.page.wait_for_function("() => document.querySelectorAll('#head-view text.query').length === 2")
    held.release()
    p.page.wait_for_timeout(700)  # time for the late reply to arrive, were it not aborted
    assert queries(p) == ["T", "o"] and p.page.input_value("#text") == "To"
    assert "text=To&" in p.page.url and p.page.inner_text("#status") == ""


def test_switching_the_beam_quickly_keeps_the_dropdown_url_and_translation_on_the_last_choice(page, servers):
    p = page("mt")
    source = "eins zwei drei"
    analyze_in_page(p, servers["mt"], source, beam="1")
    held = Held(p, "/api/analyze")
    p.page.select_option("#beam", label="8")  # asks at once; its reply is held
    held.wait(p)
    held.holding = False
    p.page.select_option("#beam", label="2")
    p.page.wait_for_function("() => location.hash.includes('beam=2')")
    held.release()
    p.page.wait_for_timeout(700)
    assert p.page.input_value("#beam") == "2" and "beam=2" in p.page.url and "beam=8" not in p.page.url
    assert p.page.inner_text("#translation") == api_analysis(servers["mt"], text=source, beam=2)["translation"]


@pytest.mark.parametrize("fragment", ["token=-5", "token=1.5", "layer=-1", "cell=-1.0", "heads=-1"])
def test_a_hand_edited_url_is_repaired_not_trusted(page, servers, fragment):
    p = page("lm")
    url = f"{servers['lm'].url}/#text=To%20be%2C%20or%20not&{fragment}"
    for _ in range(2):  # as opened, then reloaded with the URL the page wrote back
        p.page.goto(url)
        p.page.wait_for_selector("#head-view line.attn", state="attached")
        assert p.page.eval_on_selector("#head-view text.query.selected", "t => +t.dataset.index") == len(TEXT) - 1
        assert p.page.input_value("#layer") == "0" and p.page.is_checked("#head-0") and p.page.is_checked("#head-1")
        assert "the head view's" in p.page.inner_text("#detail-title")  # no cell opened: the head view's head shown
        assert p.page.eval_on_selector_all("#model-view canvas.open", "cs => cs.length") == 0
        assert fragment not in p.page.url and "token=12" in p.page.url and "heads=0%2C1" in p.page.url
        url = p.page.url
    assert p.page.is_hidden("#error")


def test_a_refused_input_clears_the_views_and_a_new_analysis_the_old_continuation(page, servers):
    p = page("lm")
    analyze_in_page(p, servers["lm"], TEXT)
    p.page.click('#model-view canvas[data-layer="1"][data-head="1"]')
    opened = float(p.page.get_attribute("#detail", "height"))
    assert opened > 100
    p.page.click("#continue")
    p.page.wait_for_selector('#continuation[data-done="1"]', timeout=20_000)
    p.page.fill("#text", SHORT)
    p.page.click("#analyze")
    p.page.wait_for_function("() => document.querySelectorAll('#head-view text.query').length === 5")
    assert p.page.inner_text("#continuation") == ""
    # the opened head is dropped: the detail draws the head view's head of the new text, a smaller map
    assert "layer 1, head 1, the head view's" in p.page.inner_text("#detail-title")
    assert 0 < float(p.page.get_attribute("#detail", "height")) < opened
    assert p.page.eval_on_selector_all("#model-view canvas.open", "cs => cs.length") == 0
    p.page.fill("#text", "To be \u2603")
    p.page.click("#analyze")
    p.page.wait_for_selector("#error:not([hidden])")
    assert p.page.is_hidden("#result")
    assert p.page.eval_on_selector_all("#head-view *, #model-view *, #stats *", "es => es.length") == 0
    assert "\u2603" in p.page.evaluate("decodeURIComponent(location.hash)") and "kind=" not in p.page.url
    p.expected_errors = 1  # Chromium logs the 400 response itself


def test_keyboard_top_k_stop_headings_and_the_export_buttons_names(page, servers):
    p = page("lm")
    analyze_in_page(p, servers["lm"], TEXT)
    headings = p.page.eval_on_selector_all("#head-view text.heading", "ts => ts.map(t => t.textContent)")
    assert headings == ["queries", "keys"]
    p.page.focus('#head-view text.query[data-index="3"]')
    p.page.keyboard.press("Enter")
    p.page.keyboard.press("ArrowDown")
    assert p.page.eval_on_selector("#head-view text.query.selected", "t => +t.dataset.index") == 4
    show_only_head(p.page, 0)
    assert sorted(line_weights(p.page)) == [0, 1, 2, 3, 4]
    p.page.focus('#model-view canvas[data-layer="1"][data-head="1"]')
    p.page.keyboard.press("Space")
    assert "layer 2, head 2" in p.page.inner_text("#detail-title")
    p.page.focus('#stats tbody tr[data-layer="0"][data-head="1"]')
    p.page.keyboard.press("Enter")
    assert "layer 1, head 2" in p.page.inner_text("#detail-title")
    names = ["Save head view as SVG", "Save head view as PNG", "Save detail map as SVG", "Save detail map as PNG"]
    assert all(p.page.get_by_role("button", name=name, exact=True).count() == 1 for name in names)

    p.page.select_option("#top-k", label="10")
    p.page.wait_for_function("() => document.querySelectorAll('#next li').length === 10")
    expected = api_analysis(servers["lm"], text=TEXT, top_k=10)["next_tokens"][4]
    shown = p.page.eval_on_selector_all("#next li > span:last-child", "s => s.map(x => +x.textContent)")
    assert len(shown) == 10 and all(abs(a - t["p"]) <= 5e-5 for a, t in zip(shown, expected))
    assert "k=10" in p.page.url and "token=4" in p.page.url  # the view kept across the new request

    Held(p, "/api/continue")  # a stream that never answers: only Stop ends it
    p.page.click("#continue")
    assert p.page.is_visible("#stop") and p.page.is_disabled("#continue")
    p.page.click("#stop")
    p.page.wait_for_selector('#continuation[data-stopped="1"]')
    assert p.page.is_hidden("#stop") and p.page.is_enabled("#continue") and p.page.is_hidden("#error")


@pytest.fixture(scope="module")
def gpt2_server(tmp_path_factory):
    import torch
    from transformers import GPT2LMHeadModel

    from kqv.data.tokenizers import BPETokenizer
    from test_interop import gpt2_config
    from test_pretrained_dirs import TEXT as CORPUS
    from test_pretrained_dirs import save

    tokenizer = BPETokenizer.train(CORPUS, vocab_size=300)
    torch.manual_seed(0)
    config = gpt2_config(vocab_size=tokenizer.vocab_size, n_positions=64)
    path = save(GPT2LMHeadModel(config).eval(), tokenizer, tmp_path_factory.mktemp("browser-gpt2"))
    with Server(create_app(path)) as server:
        yield server


def test_a_hugging_face_gpt2_directory_opens_like_an_lm_run(browser, gpt2_server):
    p = Page(browser, gpt2_server.url)
    text = "whether 'tis \u2603"
    analyze_in_page(p, gpt2_server, text)
    body = api_analysis(gpt2_server, text=text)
    assert p.page.inner_text("#run").startswith("lm:") and p.page.is_visible("#next-box")
    labels = queries(p)
    assert len(labels) == len(body["tokens"]) and "<0xE2>" in labels and not any("\ufffd" in t for t in labels)
    show_only_head(p.page, 2)
    p.page.click('#head-view text.query[data-index="3"]')
    assert line_weights(p.page) == dict(enumerate(body["attention"]["self"]["layers"][0][2][3][:4]))
    assert p.page.is_visible("#continue")
    p.close()
