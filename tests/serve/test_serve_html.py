"""``format: "html"`` through ``/translate``: an HTML page with nested and inline markup comes
back valid, with the same elements in the same order and nesting, its text translated exactly
as the library translates the page (:func:`qkv.text.translate_document`: inline markup placed
on the words it covered by the model's cross-attention), for every engine the server runs."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from _serve_helpers import live_server

from qkv.text import translate_document

lxml_html = pytest.importorskip("lxml.html")

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>My page. Hello.</title>
<style>p { color: red; }</style><script>var s = "Do not. Translate.";</script></head>
<body>
  <h1>Welcome <em>home</em>.</h1>
  <p>I am <b>very</b> happy. He is <a href="/x" title="calm">calm and <em>quiet</em></a> today.</p>
  <ul><li>Go <i>on <b>now</b></i>.</li><li>Thank you.</li></ul>
  <pre>keep   this.</pre>
  <p translate="no">Do not translate.</p>
</body></html>"""

FRAGMENT = 'I lost <b>my <i>pen</i></b>. <a href="https://example.org">Help</a> me!'


def tags(page: str) -> list[tuple[str, str]]:
    """Every start and end tag, in order, with its attributes."""
    seen: list[tuple[str, str]] = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):
            seen.append(("start", f"{tag} {sorted(attrs)}"))

        def handle_endtag(self, tag):
            seen.append(("end", tag))

    p = Tags(convert_charrefs=True)
    p.feed(page)
    p.close()
    return seen


def shape(page: str) -> list[tuple[int, str]]:
    """The element tree as lxml (libxml2) parses it: depth and tag, in document order."""
    root = lxml_html.document_fromstring(page)
    return [
        (len(list(el.iterancestors())), el.tag) for el in root.iter() if isinstance(el.tag, str)
    ]


def text_of(page: str, tag: str) -> str:
    return lxml_html.document_fromstring(page).findtext(f".//{tag}") or ""


def test_a_page_comes_back_with_its_markup_and_its_text_translated(live, translator):
    r = live.post("/translate", json={"q": PAGE, "source": "en", "target": "fr", "format": "html"})
    assert r.status_code == 200, r.text
    got = r.json()["translatedText"]
    assert got == translate_document(PAGE, translator, "html").decode()
    assert tags(got) == tags(PAGE) and shape(got) == shape(PAGE)
    assert text_of(got, "pre") == "keep   this." and 'translate="no">Do not translate.<' in got
    assert 'var s = "Do not. Translate.";' in got and "p { color: red; }" in got
    # the sentences were translated, one by one
    assert " ".join(lxml_html.fromstring(got).text_content().split()) != " ".join(
        lxml_html.fromstring(PAGE).text_content().split()
    )


def test_fragments_in_a_list_and_a_form(live, translator):
    texts = [FRAGMENT, "<p>Good night.</p>", ""]
    r = live.post("/translate", json={"q": texts, "format": "html", "alternatives": 1})
    assert r.status_code == 200, r.text
    want = [translate_document(t, translator, "html").decode() for t in texts]
    assert r.json() == {"translatedText": want, "alternatives": [[], [], []]}
    for src, out in zip(texts, want):
        assert tags(out) == tags(src)
    # a form, as libretranslatepy and LibreTranslate's page send it
    r = live.post("/translate", data={"q": FRAGMENT, "format": "html"})
    assert r.json()["translatedText"] == want[0]


@pytest.mark.parametrize("engine", ["ct2", pytest.param("onnx", marks=pytest.mark.slow)])
def test_every_engine_serves_html_as_the_library_translates_it(engine, request):
    tr = request.getfixturevalue(engine)
    with live_server(tr, max_wait_ms=5) as s:
        r = s.post("/translate", json={"q": [PAGE, FRAGMENT], "format": "html"})
        assert r.status_code == 200, r.text
        want = [translate_document(t, tr, "html").decode() for t in (PAGE, FRAGMENT)]
        assert r.json()["translatedText"] == want
        assert tags(want[0]) == tags(PAGE)
