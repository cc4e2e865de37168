"""MkDocs hooks of the documentation site (mkdocs.yml): notebook outputs, links across sides.

tools/docs_site.py writes each HTML output of a notebook (the attention viewer, a card, a table)
into the page's Markdown as one base64 attribute of an empty element, so that Markdown cannot
touch the viewer's script and styles; after Markdown has run, this hook replaces each element
with the HTML it carries, inside a box the site's search leaves out. A link to the other
language's start page is written ``qkv-side:LANG#anchor`` (MkDocs checks links within one side
only); this hook makes it relative, and tools/docs_site.py checks it after the build.
"""

from __future__ import annotations

import base64
import re
from typing import Any

_RAW = re.compile(r'<div class="qkv-nb-raw" data-raw="([A-Za-z0-9+/=]*)"></div>')


def _restore(m: re.Match[str]) -> str:
    markup = base64.b64decode(m.group(1)).decode("utf-8")
    return f"<div data-search-exclude>{markup}</div>"


def on_page_content(html: str, page: Any, config: Any, **kwargs: Any) -> str:
    """MkDocs' hook: the page's HTML with every notebook HTML output restored and the links
    to the other language's side made relative."""
    html = _RAW.sub(_restore, html)
    return _side_links(html, page.url, config["theme"]["language"])


def side_href(page_url: str, lang: str, link: str) -> str:
    """The relative link from the page at ``page_url`` (on side ``lang``) to ``link``
    (``SIDE/PAGE.html``) on the other side: the English side is the site's root, the Chinese
    side its ``zh/``."""
    side, _, path = link.partition("/")
    up = "../" * page_url.count("/")
    if side == lang:
        return up + path
    return f"{up}zh/{path}" if side == "zh" else f"{up}../{path}"


_SIDE = re.compile(r'href="qkv-side:((?:en|zh)/[^"#]*)(#[^"]*)?"')


def _side_links(html: str, page_url: str, lang: str) -> str:
    """``qkv-side:SIDE/PAGE.html#anchor`` links (to the other language's side) made relative."""
    return _SIDE.sub(
        lambda m: f'href="{side_href(page_url, lang, m.group(1))}{m.group(2) or ""}"', html
    )
