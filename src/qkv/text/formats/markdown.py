"""Markdown (``.md``), parsed by markdown-it-py (CommonMark, with tables): the text of every
heading, paragraph, list item, quotation and table cell translated, everything else kept line
for line (code blocks and fences, HTML blocks, front matter, rules, blank lines, the markers
and indentation of lists and quotations).

A paragraph's lines are one text (a soft line break is a space), written back on the first
of its lines. Inline markup (``*em*``, ``**strong**``, ``[links](url)``) is put back on the
words it covered, as HTML's is (:mod:`qkv.text.formats.html`); inline code, images,
autolinks and inline HTML are kept whole where their position maps to. A link is written in
its inline form (``[text](url "title")``).
"""

from __future__ import annotations

import re
from typing import Any

from ..layout import DEFAULT_SPLIT
from .html import HtmlDocument, _Block, _Element
from .plain import decode_text

__all__ = ["read_md"]

_FRONT_MATTER = re.compile(r"\A(---|\+\+\+)\r?\n.*?\r?\n\1[ \t]*(\r?\n|\Z)", re.S)


def _link_close(open_tok: Any) -> str:
    href = open_tok.attrs.get("href", "")
    title = open_tok.attrs.get("title")
    return f"]({href}" + (f' "{title}"' if title else "") + ")"


def _block(children: list[Any]) -> _Block | None:
    """An inline token's children as a block: its text, its elements and atoms."""
    root = _Element("", "", 0)
    path, opened = [root], []
    text = ""
    skip = 0
    for tok in children:
        if skip:  # the text of an autolink, kept in its atom
            skip -= tok.type != "link_close"
            continue
        kind = tok.type
        if kind in ("text", "softbreak"):
            piece = tok.content if kind == "text" else " "
            if text.endswith(" ") and piece.startswith(" "):  # "a `code` b": one space
                piece = piece[1:]
                last = path[-1].children[-1] if path[-1].children else None
                if last is not None and last.close is None and last.start == len(text):
                    last.space_after = True
            text += piece
        elif kind.endswith("_open") and kind in ("em_open", "strong_open", "link_open"):
            if kind == "link_open" and tok.markup == "autolink":
                path[-1].children.append(
                    _Element(f"<{tok.attrs.get('href', '')}>", None, len(text))
                )
                skip = 1
                continue
            el = _Element(tok.markup or "[", "", len(text))
            path[-1].children.append(el)
            path.append(el)
            opened.append(tok)
        elif kind in ("em_close", "strong_close", "link_close") and len(path) > 1:
            el = path.pop()
            start = opened.pop()
            el.close = _link_close(start) if kind == "link_close" else tok.markup
            el.end = len(text)
        else:
            path[-1].children.append(_Element(_atom(tok), None, len(text)))
    if not text.strip():
        return None
    for el in path[1:]:
        el.end = len(text)
    return _Block(None, text, None, root)


def _atom(tok: Any) -> str:
    """The source of an inline token kept whole."""
    if tok.type == "code_inline":
        fence = tok.markup or "`"
        pad = " " if tok.content.startswith("`") or tok.content.endswith("`") else ""
        return f"{fence}{pad}{tok.content}{pad}{fence}"
    if tok.type == "image":
        title = tok.attrs.get("title")
        return (
            f"![{tok.content}]({tok.attrs.get('src', '')}" + (f' "{title}"' if title else "") + ")"
        )
    if tok.type == "hardbreak":
        return "\\\n"
    return tok.content  # inline HTML


def _cells(line: str, inlines: list[Any]) -> list[str | _Block] | None:
    """A table row's pieces: its pipes and spaces kept, each cell's text a block."""
    out: list[str | _Block] = []
    at = 0
    for inline in inlines:
        content = inline.content.strip()
        if not content:
            continue
        i = line.find(content, at)
        block = _block(inline.children or [])
        if i < 0 or block is None:
            return None
        out += [line[at:i], block]
        at = i + len(content)
    out.append(line[at:])
    return out


def _pieces(text: str) -> list[str | _Block]:
    from markdown_it import MarkdownIt

    lines = text.splitlines(keepends=True)
    front = _FRONT_MATTER.match(text)
    start = front.group(0).count("\n") if front else 0
    md = MarkdownIt("commonmark").enable("table")
    tokens = md.parse("".join(lines[start:]))
    # line -> what replaces it: None keeps it, a list of pieces rewrites it, [] drops it
    rewrite: dict[int, list[str | _Block]] = {}
    rows: dict[int, list[Any]] = {}
    for k, tok in enumerate(tokens):
        if tok.type != "inline" or tok.map is None:
            continue
        if k and tokens[k - 1].type in ("th_open", "td_open"):
            rows.setdefault(tok.map[0] + start, []).append(tok)
            continue
        first = tok.map[0] + start
        parts = tok.content.split("\n")
        line = lines[first]
        i = line.find(parts[0].strip())
        block = _block(tok.children or [])
        if i < 0 or block is None:
            continue
        body = line.rstrip("\r\n")
        end = line[len(body) :]
        tail = body[i + len(parts[0].strip()) :] if len(parts) == 1 else ""
        rewrite[first] = [line[:i], block, tail + end]
        for n in range(1, len(parts)):
            rewrite[first + n] = []
    for n, inlines in rows.items():
        cells = _cells(lines[n], inlines)
        if cells is not None:
            rewrite[n] = cells
    out: list[str | _Block] = []
    for n, line in enumerate(lines):
        out += rewrite.get(n, [line])
    return out


def read_md(
    data: bytes,
    *,
    source: str | None = None,
    target: str | None = None,
    split: str = DEFAULT_SPLIT,
) -> HtmlDocument:
    """A Markdown file (UTF-8): its prose to translate (see the module)."""
    text, bom = decode_text(data)
    plan = {"source": source, "target": target, "split": split}
    return HtmlDocument(_pieces(text), bom, fmt="md", escape=str, **plan)
