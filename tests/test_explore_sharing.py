"""The explorer's views leaving the page, in Debian's Chromium (test_explore_browser.py's runs, servers and page
recorder): "Save as HTML" opens on the view that was shown, an exported SVG/PNG carries a title and a colour
legend, and `kqv.explore.show` displays the same page inline in a notebook (its `_repr_html_`, an iframe whose
srcdoc is the saved page) with every view drawn and no console error."""

from __future__ import annotations

import html

import httpx
import pytest

import kqv
import kqv.explore
import test_explore_browser as shared
from kqv.errors import ConfigTypeError
from test_explore_browser import TEXT, Page, analyze_in_page, api_analysis, line_weights

runs, servers, browser, page = shared.runs, shared.servers, shared.browser, shared.page


def test_save_as_html_opens_on_the_view_that_was_shown(page, servers, tmp_path):
    p = page("lm")
    analyze_in_page(p, servers["lm"], TEXT)
    p.page.select_option("#layer", index=1)
    p.page.click('#model-view canvas[data-layer="1"][data-head="0"]')
    p.page.select_option("#palette", value="viridis")
    p.page.click('#head-view text.query[data-index="6"]')
    with p.page.expect_download() as saved:
        p.page.click("#save-html")
    path = tmp_path / "saved.html"
    path.write_bytes(open(saved.value.path(), "rb").read())
    offline = page("lm", allowed=path.as_uri())
    offline.page.goto(path.as_uri())
    offline.page.wait_for_selector("#head-view line.attn", state="attached")
    assert offline.page.input_value("#layer") == "1" and offline.page.input_value("#palette") == "viridis"
    assert "layer 2, head 1" in offline.page.inner_text("#detail-title")
    assert offline.page.eval_on_selector("#head-view text.query.selected", "t => +t.dataset.index") == 6
    expected = api_analysis(servers["lm"], text=TEXT)["attention"]["self"]["layers"][1]
    assert set(line_weights(offline.page).values()) <= {w for head in expected for w in head[6]}


def test_a_saved_file_with_a_corrupted_view_opens_on_the_default_view(servers, page, tmp_path):
    body = {"text": TEXT, "view": "layer=-1&cell=9.9&token=1.5&palette=<script>"}
    path = tmp_path / "corrupt.html"
    path.write_bytes(httpx.post(f"{servers['lm'].url}/api/export", json=body, timeout=30).content)
    p = page("lm", allowed=path.as_uri())
    p.page.goto(path.as_uri())
    p.page.wait_for_selector("#head-view line.attn", state="attached")
    assert p.page.input_value("#layer") == "0" and p.page.input_value("#palette") == "cividis"
    assert p.page.eval_on_selector("#head-view text.query.selected", "t => +t.dataset.index") == len(TEXT) - 1
    refused = httpx.post(f"{servers['lm'].url}/api/export", json={"text": TEXT, "view": 3}, timeout=30)
    assert refused.status_code == 400 and "view must be" in refused.json()["error"]


def test_exported_figures_carry_a_title_and_a_colour_legend(page, servers):
    p = page("lm")
    analyze_in_page(p, servers["lm"], TEXT)
    p.page.click('#model-view canvas[data-layer="0"][data-head="1"]')
    with p.page.expect_download() as detail:
        p.page.click('[data-export="detail"][data-format="svg"]')
    svg = open(detail.value.path(), encoding="utf-8").read()
    assert svg.startswith("<svg") and 'class="title"' in svg and "layer 1, head 2" in svg
    assert 'id="legend-ramp"' in svg and svg.count("<stop") == 9 and "attention weight" in svg  # cividis' 9 stops
    assert svg.count('class="weight') == len(TEXT) ** 2  # the map itself, within
    with p.page.expect_download() as head_view:
        p.page.click('[data-export="head-view"][data-format="svg"]')
    svg = open(head_view.value.path(), encoding="utf-8").read()
    assert "head 1" in svg and "head 2" in svg and "line opacity = attention weight" in svg
    with p.page.expect_download() as png:
        p.page.click('[data-export="detail"][data-format="png"]')
    data = open(png.value.path(), "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    height = int.from_bytes(data[20:24], "big")  # the IHDR's height: the map, its title and its legend
    assert height == int(float(p.page.get_attribute("#detail", "height")) + 26 + 40)


def test_show_displays_the_page_inline_and_it_draws_in_chromium(browser, runs, tmp_path):
    shown = kqv.explore.show(runs["lm"], TEXT, view="layer=1&cell=0.1")
    frame = shown._repr_html_()
    assert frame.startswith('<iframe class="kqv-explore" srcdoc="') and "<script" not in frame  # all escaped
    assert 'sandbox="allow-scripts allow-downloads"' in frame
    assert html.unescape(frame.split('srcdoc="')[1].split('"')[0]) == shown.page
    notebook = tmp_path / "notebook.html"  # the cell's output, as a notebook page would hold it
    notebook.write_text(f"<!doctype html><html><body><h1>cell output</h1>{frame}</body></html>", encoding="utf-8")
    p = Page(browser, notebook.as_uri())
    p.page.goto(notebook.as_uri())
    inner = p.page.frame_locator("iframe.kqv-explore")
    inner.locator("#head-view line.attn").first.wait_for(state="attached")
    assert inner.locator("#model-view canvas").count() == 4
    assert inner.locator("#head-view text.query").count() == len(TEXT)
    assert "layer 1, head 2" in inner.locator("#detail-title").inner_text()
    assert inner.locator("#layer").input_value() == "1"
    p.close()  # no request left the file, no console error


def test_show_takes_a_loaded_run_and_refuses_anything_else(runs, tmp_path):
    shown = kqv.explore.show(kqv.load(runs["mt"]), "eins zwei drei", beam=1)
    assert '"translation"' in shown.page and shown.save(tmp_path / "mt.html").read_text() == shown.page
    with pytest.raises(ConfigTypeError, match="kqv.explore.show takes a run directory"):
        kqv.explore.show(42, "To be")
