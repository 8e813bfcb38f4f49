"""The built site in a real headless Chromium (Debian's, driven by Playwright) at a 1400 px wide window: on the home,
getting-started and fine-tuning pages no table is wider than the column it sits in (a table that is scrolls
sideways and hides its last columns). On every page, at 1400 px and on a 390 px phone, no table or figure is cut
without a visible way to see the rest: a table fits, or scrolls sideways in a box no taller than the window (so
its scrollbar is on screen with its top) with a shadow on the right edge beyond which its hidden columns lie
(docs/javascripts/tables.js, which moves it as the table scrolls); a figure shrunk to the column is a link to its
full-size file, or scrolls in a box of its own; nothing reaches past the window's right edge. At 1400 px every
table of every page fits its column, the key columns (the tutorial's "- constant per kind [95%]", the gallery's
"deciding number") with the rest. The site is the strict build of
tests/test_docs_site.py, served from a local
folder on a free port; any request that leaves that server is blocked and fails the test (the site reads offline).

A screenshot of each page is saved next to the test's temporary files (`pytest --basetemp DIR` keeps them)."""

from __future__ import annotations

import functools
import http.server
import threading

import pytest

from browser import chromium, launched, need
from test_docs_site import built_site

sync_api = need("playwright.sync_api")
need("mkdocs")
chromium()  # a missing browser skips (or, in CI, fails) the module here

WIDTH = 1400
PAGES = {"home": "", "getting-started": "getting-started/", "fine-tuning": "fine-tuning/"}
# every table of the page's content column: its own width and how wide its content is (a Material table scrolls
# inside itself when its content is wider), its right edge against the column's, and the heading above it
MEASURE = """() => {
  const column = document.querySelector("article.md-content__inner");
  const edge = column.getBoundingClientRect().right - parseFloat(getComputedStyle(column).paddingRight);
  return [...column.querySelectorAll("table")].map((table, index) => {
    let heading = table.closest(".md-typeset__scrollwrap") || table;
    while (heading && !/^H[1-6]$/.test(heading.tagName)) heading = heading.previousElementSibling;
    return {
      index,
      under: heading ? heading.textContent.replace("¶", "").trim() : "(top of the page)",
      scroll: table.scrollWidth,
      client: table.clientWidth,
      right: Math.round(table.getBoundingClientRect().right),
      edge: Math.round(edge),
    };
  });
}"""


# what on the page is cut without a way to see the rest, one line each (empty when nothing is); a table that hides
# columns to its right must show the cue that it scrolls: the shadow on its right edge (docs/stylesheets/extra.css,
# drawn while docs/javascripts/tables.js marks its box), opaque, at least 8 px wide, on the table's visible edge
CUT = """() => {
  const vw = document.documentElement.clientWidth, vh = window.innerHeight;
  const cueShown = (table) => {
    const holder = table.closest(".md-typeset__table");
    if (!holder || !holder.classList.contains("kqv-more-right")) return false;
    const shadow = getComputedStyle(holder, "::after");
    const right = table.getBoundingClientRect().right;
    const edge = holder.getBoundingClientRect().right - parseFloat(shadow.right);
    return shadow.content !== "none" && parseFloat(shadow.opacity) === 1 && parseFloat(shadow.width) >= 8
      && shadow.backgroundImage.includes("gradient") && Math.abs(edge - right) <= 2 && right <= vw + 1;
  };
  const column = document.querySelector("article.md-content__inner");
  const scrolls = (node) => ["auto", "scroll"].includes(getComputedStyle(node).overflowX);
  const found = [];
  [...column.querySelectorAll("table")].forEach((table, index) => {
    const box = table.getBoundingClientRect();
    const cut = table.scrollWidth > table.clientWidth + 1;
    const barOnScreen = table.offsetHeight <= vh;  // its sideways scrollbar: at its bottom
    if ((cut && !(scrolls(table) && barOnScreen)) || box.right > vw + 1 || box.left < -1)
      found.push(`table ${index}: ${table.scrollWidth} px of content in ${table.clientWidth} px, `
        + `${table.offsetHeight} px tall, right edge ${Math.round(box.right)}`);
    if (cut && !cueShown(table)) {
      const hidden = [...table.querySelectorAll("thead th")]
        .filter((th) => th.getBoundingClientRect().right > box.left + table.clientWidth + 1)
        .map((th) => th.textContent.trim());
      found.push(`table ${index}: columns ${JSON.stringify(hidden)} hidden to the right, with no shadow on its edge`);
    }
  });
  [...column.querySelectorAll("img")].forEach((img, index) => {
    const box = img.getBoundingClientRect();
    if (!box.width) return;  // not shown (a collapsed block)
    const link = img.closest("a");
    const opens = link && link.href === img.src;
    let holder = img.parentElement;  // the box that scrolls it sideways, if one does
    while (holder && holder !== column && !scrolls(holder)) holder = holder.parentElement;
    const held = holder && holder !== column
      && holder.getBoundingClientRect().right <= vw + 1 && holder.offsetHeight <= vh;
    if ((img.naturalWidth > box.width + 1 && !opens) || (box.right > vw + 1 && !held))
      found.push(`figure ${index} (${img.getAttribute("src").slice(0, 40)}): ${img.naturalWidth} px shown `
        + `in ${Math.round(box.width)} px${opens ? "" : " with no link to itself"}, `
        + `right edge ${Math.round(box.right)}`);
  });
  return found;
}"""
WINDOWS = {"desktop": (1400, 1000), "phone": (390, 844)}


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    built, site = built_site(tmp_path_factory)
    assert built.returncode == 0, f"the site does not build:\n{built.stderr[-3000:]}"
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    with launched(sync_api) as chromium_browser:
        yield chromium_browser


@pytest.mark.parametrize("name", PAGES)
def test_no_table_is_wider_than_its_column_at_1400_px(name, server, browser, tmp_path):
    context = browser.new_context(viewport={"width": WIDTH, "height": 1000})
    blocked = []

    def route(request_route):
        if request_route.request.url.startswith(server):
            return request_route.continue_()
        blocked.append(request_route.request.url)
        return request_route.abort()

    context.route("**/*", route)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.goto(server + PAGES[name], wait_until="load")
        page.wait_for_selector("article.md-content__inner table")
        tables = page.evaluate(MEASURE)
        page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    finally:
        context.close()
    assert tables, f"the {name} page has no table to check"
    wide = [t for t in tables if t["scroll"] > t["client"] + 1 or t["right"] > t["edge"] + 1]
    described = "\n".join(
        f"  table {t['index']} under {t['under']!r}: {t['scroll']} px of content in {t['client']} px, "
        f"right edge {t['right']} px, column's {t['edge']} px"
        for t in wide
    )
    assert not wide, f"{len(wide)} of the {name} page's {len(tables)} tables are wider than their column:\n{described}"
    assert not blocked, f"the page tried to reach {blocked}"
    assert not errors, f"the page raised {errors}"


@pytest.fixture(scope="module")
def pages(server, tmp_path_factory):
    """The address of every page of the built site (the experiments' reports too), relative to the server."""
    _, site = built_site(tmp_path_factory)
    found = sorted(path.parent.relative_to(site).as_posix() for path in site.rglob("index.html"))
    return ["" if page == "." else page + "/" for page in found if not page.startswith("search")]


@pytest.mark.parametrize("window", WINDOWS)
def test_no_table_or_figure_is_cut_without_a_way_to_see_the_rest(window, server, pages, browser, tmp_path):
    width, height = WINDOWS[window]
    context = browser.new_context(viewport={"width": width, "height": height})
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(server) else route.abort())
    page = context.new_page()
    cut = []
    try:
        for address in pages:
            page.goto(server + address, wait_until="load")
            cut += [f"/{address}: {line}" for line in page.evaluate(CUT)]
        page.goto(server + "fine-tuning/", wait_until="load")
        page.screenshot(path=str(tmp_path / f"fine-tuning-{width}.png"), full_page=True)
    finally:
        context.close()
    assert len(pages) > 20, f"the site has only {pages}"
    assert not cut, f"at {width} px, {len(cut)} tables or figures are cut with no way to see the rest:\n" + "\n".join(
        cut
    )


def test_at_1400_px_every_table_of_every_page_shows_all_its_columns(server, pages, browser):
    """At 1400 px nothing scrolls: the key columns (the tutorial's "- constant per kind [95%]", the gallery's
    "deciding number") and every other are on screen with the table's top."""
    context = browser.new_context(viewport={"width": WIDTH, "height": 900})
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(server) else route.abort())
    page = context.new_page()
    wide, seen = [], {}
    try:
        for address in pages:
            page.goto(server + address, wait_until="load")
            tables = page.evaluate(MEASURE)
            seen[address] = page.evaluate(HEADERS)
            wide += [
                f"/{address} table {t['index']} under {t['under']!r}: {t['scroll']} px of content in {t['client']} px"
                for t in tables
                if t["scroll"] > t["client"] + 1 or t["right"] > t["edge"] + 1
            ]
    finally:
        context.close()
    assert any("- constant per kind [95%]" in h for h in seen["pretrain-to-answers/"]), seen["pretrain-to-answers/"]
    assert "the deciding number" in seen["experiments/"], seen["experiments/"]
    assert not wide, f"{len(wide)} tables are wider than their column at {WIDTH} px:\n" + "\n".join(wide)


# the text of every table header of the page's content column
HEADERS = """() => [...document.querySelectorAll("article.md-content__inner thead th")]
  .map((th) => th.textContent.trim())"""
# the first table of the page that scrolls sideways, scrolled to `to` (its left or right end); its box's cue classes
SCROLLED = """(to) => {
  const table = [...document.querySelectorAll("article.md-content__inner table")]
    .find((t) => t.scrollWidth > t.clientWidth + 1);
  table.scrollLeft = to === "right" ? table.scrollWidth : 0;
  return table.closest(".md-typeset__table").className;
}"""


def test_on_a_phone_the_shadow_follows_the_columns_a_table_hides(server, browser):
    """At 390 px the tutorial's first table hides its columns to the right: its right edge has the shadow; scrolled
    to its end, the shadow moves to the left edge, and back."""
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    holder = "document.querySelector('article.md-content__inner .md-typeset__table')"
    try:
        page.goto(server + "pretrain-to-answers/", wait_until="load")
        assert "kqv-more-right" in page.evaluate(f"{holder}.className")
        assert "kqv-more-left" not in page.evaluate(f"{holder}.className")
        page.evaluate(SCROLLED, "right")
        page.wait_for_function(f"{holder}.classList.contains('kqv-more-left')", timeout=5000)
        assert "kqv-more-right" not in page.evaluate(f"{holder}.className")
        page.evaluate(SCROLLED, "left")
        page.wait_for_function(f"!{holder}.classList.contains('kqv-more-left')", timeout=5000)
        assert "kqv-more-right" in page.evaluate(f"{holder}.className")
    finally:
        context.close()
