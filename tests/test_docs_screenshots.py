"""The built site in a real headless Chromium (Debian's, driven by Playwright) at a 1400 px wide window: on the home,
getting-started and fine-tuning pages no table is wider than the column it sits in (a table that is scrolls
sideways and hides its last columns). On every page, at 1400 px and on a 390 px phone, no table or figure is cut
without a visible way to see the rest: a table fits, or scrolls sideways in a box no taller than the window (so
its scrollbar is on screen with its top); a figure shrunk to the column is a link to its full-size file, or scrolls
in a box of its own; nothing reaches past the window's right edge. The site is the strict build of
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


# what on the page is cut without a way to see the rest, one line each (empty when nothing is)
CUT = """() => {
  const vw = document.documentElement.clientWidth, vh = window.innerHeight;
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
