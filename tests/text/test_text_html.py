"""HTML: text translated, markup kept; the output parses (lxml's HTML parser, libxml2) to the
same element tree with the same tags; inline markup put back on the words it covered, by
cross-attention where an alignment is given; what must not be translated left alone."""

from __future__ import annotations

import random

import pytest

from qkv.text import Alignment, read_document, translate_document

lxml_html = pytest.importorskip("lxml.html")


def _shape(page: str) -> list[tuple[int, str, tuple]]:
    """Every element of ``page`` as lxml parses it: (depth, tag, attributes), in order."""
    root = lxml_html.document_fromstring(page)
    out = []

    def walk(el, depth):
        out.append((depth, el.tag, tuple(sorted(el.attrib.items()))))
        for c in el:
            if isinstance(c.tag, str):
                walk(c, depth + 1)

    walk(root, 0)
    return out


def _text(page: str) -> str:
    return " ".join(lxml_html.document_fromstring(page).text_content().split())


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>My page. Hello.</title>
<style>p { color: red; }</style><script>var s = "Do not. Translate.";</script></head>
<body>
  <h1>Welcome <em>home</em>.</h1>
  <p>I am <b>very</b> happy. He is <a href="/x" title="calm">calm and <em>quiet</em></a> today.</p>
  <pre>keep   this.
  As is.</pre>
  <p>Run <code>qkv demo</code> now.<br>Second line &amp; more.</p>
  <div translate="no">Do not translate.</div>
  <ul><li>One <span class="notranslate">Qkv</span> thing.</li><li>Three</ul>
  <!-- a comment. Kept. -->
</body></html>"""


def _shout(segments):
    return [s.upper() for s in segments]


def test_text_is_translated_and_the_tree_is_kept():
    doc = read_document(PAGE, "html", source="en", target="fr")
    out = doc.render(_shout(doc.segments)).decode()
    assert _shape(out) == _shape(PAGE)
    for kept in ('var s = "Do not. Translate.";', "p { color: red; }", "keep   this.\n  As is.",
                 "<code>qkv demo</code>", "Do not translate.", ">Qkv<", "<!-- a comment. Kept. -->",
                 'title="calm"'):  # fmt: skip
        assert kept in out
    assert "WELCOME <em>HOME</em>." in out and "SECOND LINE &amp; MORE." in out
    assert "I AM <b>VERY</b> HAPPY. HE IS <a" in out and "<em>QUIET</em></a> TODAY." in out
    assert "Do not" not in " ".join(doc.segments) and "keep" not in " ".join(doc.segments)


def _random_page(rng: random.Random) -> str:
    words = ["home", "calm", "very", "happy", "the", "red", "car", "is", "we", "go"]
    tags = ["b", "em", "i", "span", 'a href="/p?q=1&amp;r=2"', "strong"]

    def inline(depth: int) -> str:
        out = []
        for _ in range(rng.randint(1, 4)):
            if depth < 3 and rng.random() < 0.4:
                t = rng.choice(tags)
                out.append(f"<{t}>{inline(depth + 1)}</{t.split()[0]}>")
            elif rng.random() < 0.1:
                out.append('<img src="x.png" alt="x">')
            else:
                out.append(" ".join(rng.choices(words, k=rng.randint(1, 3))))
            if rng.random() < 0.3:
                out.append(". " + rng.choice(words).capitalize())
        return " ".join(out)

    blocks = [f"<p>{inline(0).capitalize()}.</p>" for _ in range(rng.randint(1, 4))]
    return "<html><body>" + "\n".join(blocks) + "</body></html>"


def test_random_nested_markup_keeps_its_tree_whatever_the_translation():
    """Fresh random pages of nested inline markup, translated into words of other lengths
    and order, with and without random alignments: the same tree and tags every time, and
    the text is the translations'."""
    rng = random.Random(39)
    for n in range(150):
        page = _random_page(rng)
        doc = read_document(page, "html", source="en", target="fr")
        trans = [
            " ".join(w[::-1] for w in reversed(s.split())) + rng.choice(["", " !"])
            for s in doc.segments
        ]
        alignments = None
        if n % 2:
            alignments = {}
            for i in doc.aligned:
                src, tgt = doc.segments[i].split(), trans[i].split()
                w = [[rng.random() for _ in src] for _ in tgt]
                alignments[i] = Alignment(tuple(src), tuple(tgt), tuple(map(tuple, w)))
        out = doc.render(trans, alignments).decode()
        assert _shape(out) == _shape(page), (page, out)
        want = read_document(page, "html", source="en", target="fr").plan.join(trans)
        assert _text(out) == " ".join(" ".join(want).split())


def test_inline_markup_follows_the_cross_attention():
    """``the <b>red</b> car`` -> ``la voiture rouge``: the alignment says ``rouge`` attends to
    ``red``, so the bold moves with it; without one it stays at the same share."""
    page = "<p>I see the <b>red</b> car.</p>"
    doc = read_document(page, "html", source="en", target="fr")
    assert doc.segments == ("I see the red car.",) and doc.aligned == (0,)
    src = ("▁I", "▁see", "▁the", "▁red", "▁car", ".")
    tgt = ("▁Je", "▁vois", "▁la", "▁voiture", "▁rouge", ".")
    order = [0, 1, 2, 4, 3, 5]  # target token t attends to source token order[t]
    weights = tuple(tuple(0.9 if j == order[t] else 0.02 for j in range(6)) for t in range(6))
    al = {0: Alignment(src, tgt, weights)}
    fr = ["Je vois la voiture rouge."]
    assert doc.render(fr, al).decode() == "<p>Je vois la voiture <b>rouge</b>.</p>"
    assert doc.render(fr).decode() == "<p>Je vois la <b>voiture</b> rouge.</p>"


def test_markup_across_sentences_and_at_the_edges():
    page = "<p><b>One. Two</b> three. <i>Four.</i></p>"
    doc = read_document(page, "html", source="en", target="fr")
    assert doc.segments == ("One.", "Two three.", "Four.")
    out = doc.render(["Un.", "Deux trois.", "Quatre."]).decode()
    assert out == "<p><b>Un. Deux</b> trois. <i>Quatre.</i></p>"


def test_an_engine_translates_a_page_through_its_attention(monkeypatch):
    """translate_document with an engine asks its alignments for the blocks with markup."""

    class Engine:
        languages = ("en", "fr")
        has_attention = True

        def translate_segments(self, segments):
            return [s.upper() for s in segments]

        def align_segments(self, segments, translations):
            self.asked = list(segments)
            return [None] * len(segments)

    tr = Engine()
    out = translate_document(PAGE.encode(), tr, "html").decode()
    assert _shape(out) == _shape(PAGE)
    assert "I am very happy." in tr.asked and "My page." not in tr.asked


def test_a_page_with_a_byte_order_mark_and_nothing_to_translate():
    page = "\ufeff<html><body><pre>x. y.</pre></body></html>".encode()
    doc = read_document(page, "html")
    assert doc.segments == () and doc.render([]) == page


def test_a_word_the_vocabulary_lacks_still_carries_its_markup():
    """The demo's word vocabulary reads ``very`` as ``<unk>``; the target word attending to
    it is the one made bold."""
    doc = read_document("<p>I am <b>very</b> happy.</p>", "html", source="en", target="fr")
    src, tgt = ("i", "am", "<unk>", "happy", "."), ("je", "suis", "très", "heureux", ".")
    order = [0, 1, 2, 3, 4]
    weights = tuple(tuple(0.9 if j == order[t] else 0.02 for j in range(5)) for t in range(5))
    out = doc.render(["je suis très heureux ."], {0: Alignment(src, tgt, weights)}).decode()
    assert out == "<p>je suis <b>très</b> heureux .</p>"
