"""What a newcomer sees first, in a real headless Chromium (the servers, runs and page recorder of
test_explore_browser.py): views on the first screen without a click, the text's start in sight, a head opened from
the model view in sight, a phone-wide page that stays phone-wide, and the ablation table's columns explained."""

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
    assert 0 <= detail["top"] < height and detail["bottom"] > 0


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
