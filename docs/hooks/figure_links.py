"""A MkDocs hook: every figure of a Markdown page opens at full size. A plot drawn 1,100 px wide shrinks to the content
column (358 px on a phone); wrapped in a link to its own file, a click shows it whole."""

from __future__ import annotations

import re

# an <img> of the page's content that no link holds yet (Markdown's `![alt](file)` renders as one)
IMAGE = re.compile(r'(<a\b[^>]*>\s*)?(<img\b[^>]*\bsrc="(?P<src>[^"]+)"[^>]*>)')


def on_page_content(html: str, page, config, files) -> str:
    """The page's HTML with each image not already inside a link wrapped in a link to the image itself."""

    def linked(match: re.Match) -> str:
        if match[1] or match["src"].startswith("data:"):  # already a link's content, or inline (a notebook's plot)
            return match[0]
        return f'<a class="kqv-figure" href="{match["src"]}" title="open at full size">{match[2]}</a>'

    return IMAGE.sub(linked, html)
