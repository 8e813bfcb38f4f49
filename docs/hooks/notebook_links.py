"""A MkDocs hook: links from the notebook to the guide's pages work on the site as they do in Jupyter.

mkdocs-jupyter renders docs/lecture.ipynb to HTML that MkDocs does not rewrite, so the notebook's `experiments.md#x`
(right in Jupyter and on GitHub) would point to `lecture/experiments.md` on the site. This hook rewrites a relative
link to a page of the guide into that page's address, as MkDocs does for Markdown pages."""

from __future__ import annotations

import posixpath
import re

LINK = re.compile(r'href="(?P<page>[\w./-]+)\.md(?P<anchor>#[^"]*)?"')


def on_post_page(output: str, page, config) -> str:
    """The rendered notebook with each `PAGE.md#anchor` link made the address of PAGE on the site."""
    if not page.file.src_uri.endswith(".ipynb"):
        return output
    here = posixpath.dirname(page.file.src_uri)

    def address(match: re.Match) -> str:
        target = posixpath.normpath(posixpath.join(here, match["page"]))  # e.g. experiments
        if config.use_directory_urls:
            url = "" if target == "index" else target + "/"
            relative = posixpath.relpath(url or ".", page.url or ".") + "/"
        else:
            relative = posixpath.relpath(target + ".html", posixpath.dirname(page.url) or ".")
        return f'href="{relative}{match["anchor"] or ""}"'

    return LINK.sub(address, output)
