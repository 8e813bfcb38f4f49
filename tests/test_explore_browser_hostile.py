"""A saved explorer page whose text would break HTML (`<!--<script>`, `</script>`) opens in Debian's Chromium with
every view drawn and no console error (test_explore_browser.py's browser and page recorder)."""

from __future__ import annotations

import pytest

import kqv
import test_explore_browser as shared
from test_explore_browser import Page
from test_finetune import tiny_run

browser = shared.browser


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("hostile_page"), tokenizer="bpe", steps=1)


@pytest.mark.parametrize("text", ["<!--<script>", "</script><b>", "To <b>be</b> & -->"])
def test_a_saved_page_draws_its_views_whatever_its_text_holds(browser, bpe_run, tmp_path, text):
    path = kqv.explore.show(bpe_run, text).save(tmp_path / "page.html")
    run = kqv.load(bpe_run)
    tokens, heads = len(run.tokenizer.encode(text)), run.model.config.n_layers * run.model.config.n_heads
    p = Page(browser, path.as_uri())
    p.page.goto(path.as_uri())
    p.page.locator("#head-view line.attn").first.wait_for(state="attached", timeout=20_000)
    assert p.page.locator("#model-view canvas").count() == heads  # one map per head
    assert p.page.locator("#head-view text.query").count() == tokens
    assert p.page.input_value("#text") == text
    p.close()  # no request left the file, no console error
