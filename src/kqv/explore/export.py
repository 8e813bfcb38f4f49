"""The explorer's page as one self-contained HTML file: its style, its script and one input's data inlined, so it
opens from disk without a server (for sharing; `kqv explore RUN --html out.html --text "..."`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..train.files import write_text
from ..train.metrics import strict_json

STATIC = Path(__file__).parent / "static"
STYLE_TAG = '<link rel="stylesheet" href="/static/explore.css">'
SCRIPT_TAG = '<script src="/static/explore.js"></script>'
# the interventions ask the model (intervene.js): a saved file leaves them out
SERVED_ONLY = ('<link rel="stylesheet" href="/static/intervene.css">', '<script src="/static/intervene.js"></script>')


def inline_safe(text: str) -> str:
    """Text that can sit inside a <script> or <style> element: no `</` that could close it early."""
    return text.replace("</", "<\\/")


def inline_json(data: str) -> str:
    """JSON that can sit inside a <script> element whatever its strings hold: `<`, `>` and `&` as the escapes
    \\u003c, \\u003e and \\u0026, which JSON.parse reads back. Escaping `</` alone is not enough: a text holding
    `<!--<script>` would put the HTML parser in the script's escaped state, where the block's own `</script>` no
    longer closes it and the page's script is swallowed (HTML's restrictions for the contents of script elements)."""
    return data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def standalone_page(info: dict[str, Any], analysis: dict[str, Any], request: dict[str, Any], view: str = "") -> str:
    """The page with the analysis of one request built in; its script draws the views from the inlined data, as
    `view` sets them (the page's URL settings, e.g. "layer=1&cell=1.0&palette=viridis"; each checked by the page)."""
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    if STYLE_TAG not in page or SCRIPT_TAG not in page:
        raise RuntimeError("static/index.html no longer links explore.css and explore.js as export.py expects")
    script = (STATIC / "explore.js").read_text(encoding="utf-8")
    if "</" in script or "<!--" in script or "<script" in script.lower():
        raise RuntimeError("explore.js contains '</', '<!--' or '<script', which would break an inlined <script>")
    # strict JSON (a diverged run's NaN probabilities as null): the page's JSON.parse refuses NaN
    data = strict_json({"info": info, "analysis": analysis, "request": request, "view": view}, separators=(",", ":"))
    style = (STATIC / "explore.css").read_text(encoding="utf-8")
    for tag in SERVED_ONLY:
        page = page.replace(tag + "\n", "")
    return page.replace(STYLE_TAG, f"<style>\n{inline_safe(style)}</style>").replace(
        SCRIPT_TAG,
        f'<script id="kqv-data" type="application/json">{inline_json(data)}</script>\n<script>\n{script}</script>',
    )


def write_standalone(subject: Any, text: str, path: str | Path, view: str = "", **options: Any) -> Path:
    """Analyze `text` with the subject and write the self-contained page to `path` (`view`: standalone_page's)."""
    request = {"text": text, **options}
    page = standalone_page(subject.info(), subject.analyze(request), request, view)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, page)  # atomically, through a temporary file of its own; a full disk leaves nothing
    return path
