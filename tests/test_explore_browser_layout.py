"""What a newcomer sees first, in a real headless Chromium (the servers, runs and page recorder of
test_explore_browser.py): views on the first screen without a click, the text's start in sight, a head opened from
the model view in sight, at 1400 x 900 the detail drawn at once and the chosen token and the heads' switches one
click from the first screen, a phone-wide page that stays phone-wide, and the ablation table's columns explained."""

from __future__ import annotations

import httpx

import test_explore_browser as shared
from test_explore_browser import analyze_in_page

# the shared module's fixtures, used here by name: the tiny runs, their servers, Chromium and the page recorder
runs, servers, browser, page = shared.runs, shared.servers, shared.browser, shared.page

LONG = "To be, or not to be, that is"  # 28 characters: more rows than a short window's head view holds


def box(p, selector: str) -> dict:
    return p.page.eval_on_selector(selector, "e => { const r = e.getBoundingClientRect(); return {top: r.top, "
                                   "bottom: r.bottom, left: r.left, right: r.right}; }")  # fmt: skip


def test_the_first_screen_shows_the_views_of_the_example_without_a_click(page, servers):
    p = page("lm")
    p.page.goto(servers["lm"].url + "/")
    p.page.wait_for_selector("#head-view line.attn", state="attached")  # nothing clicked
    example = httpx.get(f"{servers['lm'].url}/api/info", timeout=30).json()["example"]
    assert p.page.input_value("#text") == example
    assert p.page.is_visible("#result") and p.page.locator("#model-view canvas").count() > 0
    queries = p.page.eval_on_selector_all("#head-view text.query", "ts => ts.length")
    assert queries == len(shared.api_analysis(servers["lm"], text=example)["attention"]["self"]["queries"])


def test_the_head_view_keeps_the_start_of_the_text_in_sight(page, servers):
    p = page("lm")
    p.page.set_viewport_size({"width": 1400, "height": 400})  # the head view's box: 75 % of 400 px, fewer rows
    analyze_in_page(p, servers["lm"], LONG)
    scroll = p.page.eval_on_selector("#head-view", "svg => [svg.parentElement.scrollTop, "
                                     "svg.parentElement.scrollHeight > svg.parentElement.clientHeight]")  # fmt: skip
    assert scroll == [0, True]  # it scrolls, and shows its top
    first, frame = box(p, "#head-view text.query[data-index='0']"), box(p, "#head-view-box .scroll")
    assert frame["top"] <= first["top"] and first["bottom"] <= frame["bottom"]


def test_a_head_opened_from_the_model_view_is_in_sight(page, servers):
    p = page("lm")
    p.page.set_viewport_size({"width": 1400, "height": 500})
    analyze_in_page(p, servers["lm"], LONG)
    p.page.click("#model-view canvas[data-layer='1'][data-head='0']")  # scrolled down to it, below the detail
    p.page.wait_for_selector("#detail rect, #detail image", state="attached")
    detail, height = box(p, "#detail-box"), p.page.evaluate("() => innerHeight")
    assert -1 <= detail["top"] < height and detail["bottom"] > 0  # a box taller than the window: its top, to a pixel


def test_at_390_pixels_the_page_is_as_wide_as_the_phone(page, servers):
    p = page("lm")
    p.page.set_viewport_size({"width": 390, "height": 844})
    analyze_in_page(p, servers["lm"], LONG)
    widths = p.page.evaluate("() => [document.documentElement.scrollWidth, innerWidth]")
    assert widths == [390, 390]
    table = p.page.eval_on_selector("#stats", "t => [t.scrollWidth, t.parentElement.clientWidth]")
    assert table[0] > table[1]  # the statistics are wider than the phone: they scroll in their own box


def test_the_ablation_columns_say_what_they_hold(page, servers):
    p = page("lm")
    analyze_in_page(p, servers["lm"], LONG)
    p.page.wait_for_selector("#intervene:not([hidden])")
    p.page.click("#ablate")
    p.page.wait_for_selector("#ablation tbody tr")
    title = p.page.get_attribute("#ablation th[data-key='p_top']", "title")
    assert "top-1 next token with every head on" in title
    assert "p(clean top-1): the probability" in p.page.inner_text("#ablate-summary")


def test_at_1400_by_900_the_chosen_token_and_the_head_switches_are_one_click_from_the_first_screen(browser, tmp_path):
    """A text as long as the newcomer's example: its chosen (last) token is at the foot of a head view taller than
    the window, and "Switch heads off" far below the model view; a button on the first screen brings each into the
    window, and the detail shows a head before any click. (A RoPE run: inputs longer than its training context.)"""
    text = LONG * 3
    with shared.Server(shared.create_app(shared.train_run("lm", tmp_path, position="rope"), max_tokens=96)) as server:
        p = shared.Page(browser, server.url)
        p.page.set_viewport_size({"width": 1400, "height": 900})
        analyze_in_page(p, server, text)
        p.page.wait_for_selector("#intervene:not([hidden])")
        in_window = "e => { const r = e.getBoundingClientRect(); return r.top >= 0 && r.bottom <= innerHeight; }"
        last = f"#head-view text.query[data-index='{len(text) - 1}']"
        assert p.page.eval_on_selector(last, "t => t.classList.contains('selected')")
        assert not p.page.eval_on_selector(last, in_window)  # as drawn: below the fold
        assert "layer 1, head 1, the head view's" in p.page.inner_text("#detail-title")
        assert p.page.eval_on_selector("#detail image.weights", "i => +i.dataset.rows") == len(text)  # 84 x 84
        for button in ("#to-token", "#to-ablate"):
            assert p.page.eval_on_selector(button, in_window), f"{button} is not on the first screen"
        p.page.click("#to-token")
        frame, chosen = box(p, "#head-view-box .scroll"), box(p, last)
        assert p.page.eval_on_selector(last, in_window)
        assert frame["top"] <= chosen["top"] <= chosen["bottom"] <= frame["bottom"]
        p.page.click("#to-ablate")
        assert p.page.eval_on_selector("#ablate-box h3", in_window) and p.page.is_visible("#ablate")
        p.close()
