"""Markdown: prose translated, code blocks, fences, front matter and structure untouched; the
output parsed by markdown-it-py to the same blocks and inline markup."""

from __future__ import annotations

import random

import pytest

from qkv.text import read_document

markdown_it = pytest.importorskip("markdown_it")

PAGE = """---
title: A page. Kept.
---
# Title *here*

Some **bold** and [a link](http://x.org "t") with `code`.
Second line of it.

    indented code. Kept.

```python
print("Kept. As is.")
```

> Quoted text.
> More.

- Item one.
- Item ![img](a.png) two <http://auto.link>.
  1. Nested *item*.

| A | B |
|---|---|
| one | two & three |

Setext heading
==============
"""


def _structure(text: str) -> list[tuple[str, str]]:
    """The token types of ``text`` as markdown-it parses it, with the code kept verbatim."""
    md = markdown_it.MarkdownIt("commonmark").enable("table")
    out = []
    for tok in md.parse(text):
        out.append((tok.type, tok.content if tok.type in ("fence", "code_block") else ""))
        for c in tok.children or []:
            if c.type not in ("text", "softbreak"):
                out.append((c.type, c.content if c.type == "code_inline" else ""))
    return out


def _shout(segments):
    return [s.upper() for s in segments]


def test_prose_is_translated_and_code_is_not():
    doc = read_document(PAGE, "md", source="en", target="fr")
    joined = " ".join(doc.segments)
    assert "Kept" not in joined and "print" not in joined and "code" not in joined
    out = doc.render(_shout(doc.segments)).decode()
    assert _structure(out) == [t for t in _structure(PAGE) if t[0] != "softbreak"]
    for kept in ("---\ntitle: A page. Kept.\n---\n", "    indented code. Kept.\n",
                 '```python\nprint("Kept. As is.")\n```', "`code`", "![img](a.png)",
                 "<http://auto.link>", '](http://x.org "t")', "|---|---|"):  # fmt: skip
        assert kept in out
    assert "# TITLE *HERE*" in out and "> QUOTED TEXT. MORE." in out
    assert "  1. NESTED *ITEM*." in out and "| ONE | TWO & THREE |" in out
    assert "SETEXT HEADING\n==============" in out


def test_random_documents_keep_their_blocks():
    rng = random.Random(39)
    words = ["home", "calm", "we", "go", "the", "red", "car", "very"]

    def prose() -> str:
        out = []
        for _ in range(rng.randint(1, 6)):
            w = " ".join(rng.choices(words, k=rng.randint(1, 3)))
            out.append(rng.choice([w, f"*{w}*", f"**{w}**", f"[{w}](http://x/{w})", "`x = 1`"]))
        return " ".join(out).capitalize() + "."

    for _ in range(40):
        blocks = []
        for _ in range(rng.randint(1, 8)):
            kind = rng.choice(["p", "h", "list", "quote", "fence", "code"])
            blocks.append({
                "p": lambda: prose() + "\n" + prose(),
                "h": lambda: "#" * rng.randint(1, 3) + " " + prose(),
                "list": lambda: "\n".join(f"- {prose()}" for _ in range(rng.randint(1, 3))),
                "quote": lambda: "> " + prose(),
                "fence": lambda: "```\n" + prose() + "\n```",
                "code": lambda: "    " + prose(),
            }[kind]())  # fmt: skip
        page = "\n\n".join(blocks) + "\n"
        doc = read_document(page, "md", source="en", target="fr")
        out = doc.render(_shout(doc.segments)).decode()
        assert _structure(out) == [t for t in _structure(page) if t[0] != "softbreak"], page
