"""HTML (``.html``, ``.htm``): the text translated, the markup kept.

The page is read with Python's HTML tokenizer (:class:`html.parser.HTMLParser`, the parser
behind BeautifulSoup's ``html.parser``), every token kept as its source spells it: only text
changes. The text of one block (a paragraph, a heading, a list item, a cell: what lies between
two block tags or ``<br>``) is one text to translate, its inline markup (``<b>``, ``<a
href>``, ``<em>``, ``<span>``, ...) taken out and put back on the words it covered in the
translation: by the engine's cross-attention where it has it (an :class:`~qkv.text.Alignment`
per sentence: a target word goes inside an element when the source token it attends to most
is inside it), else by position (the element covers the same share of its sentence). Elements
keep their order and nesting, so the page parses to the same tree with the same tags.

Left as they are: ``<script>``, ``<style>``, ``<code>``, ``<pre>``, ``<textarea>``, anything
with ``translate="no"`` or the class ``notranslate`` (inline, as ``<code>`` in a sentence:
kept whole where its position maps to), comments, the doctype, attribute values.
"""

from __future__ import annotations

import html as _html
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser

from ..documents import Alignment, Document
from ..layout import DEFAULT_SPLIT, NO_SPACES, Joined
from .plain import decode_text

__all__ = ["EXTENSIONS", "NAME", "HtmlDocument", "fragment", "placed", "read", "wrap"]

NAME = "html"
EXTENSIONS = (".html", ".htm", ".xhtml")

#: elements inside a sentence: their tags are put back on the words they covered
INLINE = frozenset(
    {
        *("a", "abbr", "acronym", "b", "bdi", "bdo", "big", "cite", "code", "data", "del"),
        *("dfn", "em", "font", "i", "img", "ins", "kbd", "label", "mark", "q", "ruby", "rp"),
        *("rt", "s", "samp", "small", "span", "strike", "strong", "sub", "sup", "time", "tt"),
        *("u", "var", "wbr"),
    }
)
#: elements whose content is never translated
KEPT = frozenset({"script", "style", "code", "pre", "textarea", "template", "svg", "math"})
#: elements without content (no end tag)
VOID = frozenset(
    {
        *("area", "base", "br", "col", "embed", "hr", "img", "input", "keygen", "link"),
        *("meta", "param", "source", "track", "wbr"),
    }
)
_SPACES = re.compile(r"[ \t\n\r\f]+")


@dataclass
class _Token:
    """One token of the page: ``raw`` as the source spells it; ``text`` the decoded text of a
    data token (None for markup)."""

    kind: str  # "start", "end", "void", "data", "other"
    tag: str
    raw: str
    text: str | None = None
    keep: bool = False  # opens an element whose content is kept as it is


class _Tokens(HTMLParser):
    """The page as :class:`_Token` s whose ``raw`` strings concatenate to the page."""

    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=True)
        self.source = source
        self.starts = [0]
        for m in re.finditer("\n", source):
            self.starts.append(m.end())
        self.found: list[tuple[int, str, str, str | None, bool]] = []
        self.feed(source)
        self.close()

    def _at(self) -> int:
        line, col = self.getpos()
        return self.starts[line - 1] + col

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        keep = (
            tag in KEPT
            or (a.get("translate") or "").lower() == "no"
            or "notranslate" in (a.get("class") or "").split()
        )
        self.found.append((self._at(), "void" if tag in VOID else "start", tag, None, keep))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((self._at(), "void", tag, None, False))

    def handle_endtag(self, tag: str) -> None:
        self.found.append((self._at(), "end", tag, None, False))

    def handle_data(self, data: str) -> None:
        self.found.append((self._at(), "data", "", data, False))

    def _other(self, *_: object) -> None:
        self.found.append((self._at(), "other", "", None, False))

    handle_comment = handle_decl = handle_pi = unknown_decl = _other

    def tokens(self) -> list[_Token]:
        out, ends = [], [f[0] for f in self.found[1:]] + [len(self.source)]
        if self.found and self.found[0][0] > 0:  # nothing the parser reports comes first
            out.append(_Token("other", "", self.source[: self.found[0][0]]))
        for (at, kind, tag, text, keep), end in zip(self.found, ends):
            out.append(_Token(kind, tag, self.source[at:end], text, keep))
        return out


@dataclass
class _Element:
    """An inline element of a block: its tags' ``open``/``close`` source, its span in the
    block's text (``start``, ``end``) and its children; an atom (``close is None``) is a
    piece kept whole (``open``: a void tag, a comment, an element kept as it is)."""

    open: str
    close: str | None
    start: int
    end: int = -1
    children: list[_Element] = field(default_factory=list)
    #: an atom between two spaces of the source: a space put after it too
    space_after: bool = False


@dataclass
class _Block:
    """One block's text (its runs of whitespace one space each) and its inline elements (a
    root holding them); ``lead``/``trail``: the whitespace at its ends as the source spells
    it (None: a space, or none)."""

    lead: str | None
    text: str
    trail: str | None
    root: _Element
    #: the lines its translation is written on (a subtitle's; HTML's: one)
    lines: int = 1


def _blocks(tokens: list[_Token]) -> list[str | _Block]:
    """The page as kept strings and blocks to translate."""
    out: list[str | _Block] = []
    run: list[_Token] = []
    kept_depth, stack = 0, []  # open elements kept as they are, and which
    for tok in tokens:
        if kept_depth:
            out.append(tok.raw)
            if tok.kind == "start":
                stack.append(tok.tag)
            elif tok.kind == "end" and tok.tag in stack:
                while stack.pop() != tok.tag:
                    pass
                kept_depth = len(stack)
            continue
        inline = tok.kind in ("data", "other") or tok.tag in INLINE
        if tok.keep and tok.tag not in INLINE:  # a block kept as it is: <pre>, <script>
            out += _flush(run)
            run = []
            out.append(tok.raw)
            stack, kept_depth = [tok.tag], 1
            continue
        if inline and tok.tag != "br":
            run.append(tok)
            continue
        out += _flush(run)
        run = []
        out.append(tok.raw)
    return out + _flush(run)


def _flush(run: list[_Token]) -> list[str | _Block]:
    """A run of inline tokens as a block (or kept as it is when it holds no text)."""
    if not run:
        return []
    root = _Element("", "", 0)
    path = [root]
    text = ""
    i = 0
    while i < len(run):
        tok = run[i]
        if tok.kind == "data":
            data = _SPACES.sub(" ", tok.text or "")
            if text.endswith(" ") and data.startswith(" "):  # "Run <code>x</code> now"
                data = data[1:]
                last = path[-1].children[-1] if path[-1].children else None
                if last is not None and last.close is None and last.start == len(text):
                    last.space_after = True
            text += data
        elif tok.kind == "start" and tok.keep:  # inline content kept whole: one atom
            j, depth, raw = i + 1, 1, tok.raw
            while j < len(run) and depth:
                depth += {"start": 1, "end": -1}.get(run[j].kind, 0) if run[j].tag == tok.tag else 0
                raw += run[j].raw
                j += 1
            path[-1].children.append(_Element(raw, None, len(text)))
            i = j
            continue
        elif tok.kind == "start":
            el = _Element(tok.raw, "", len(text))
            path[-1].children.append(el)
            path.append(el)
        elif tok.kind == "end" and any(e.open and _tag(e.open) == tok.tag for e in path[1:]):
            while True:
                el = path.pop()
                el.end = len(text)
                if _tag(el.open) == tok.tag:
                    el.close = tok.raw
                    break
        else:  # a void tag, a comment, an end tag that closes nothing here
            path[-1].children.append(_Element(tok.raw, None, len(text)))
        i += 1
    for el in path[1:]:  # elements left open at the block's end: closed by what follows
        el.end = len(text)
    if not text.strip():
        return ["".join(t.raw for t in run)]
    return [_Block(_edge(run[0], True), text, _edge(run[-1], False), root)]


def _edge(tok: _Token, first: bool) -> str | None:
    """The whitespace at a block's start (``first``) or end as the source spells it, when a
    text token holds it there (the block's text holds one space for it)."""
    if tok.kind != "data":
        return None
    m = re.match(r"[ \t\n\r\f]+", tok.raw) if first else re.search(r"[ \t\n\r\f]+$", tok.raw)
    return m.group(0) if m else None


def _tag(open_raw: str) -> str:
    m = re.match(r"<\s*([A-Za-z][^\s/>]*)", open_raw)
    return m.group(1).lower() if m else ""


# ---------------------------------------------------------------------------- placement
def _token_spans(text: str, tokens: Sequence[str]) -> list[tuple[int, int] | None]:
    """Where each token (a word, a subword piece ``▁Hel``) lies in ``text``, in order, found
    case-insensitively; None for one not found (a special token, a rewritten piece)."""
    low, at, out = text.lower(), 0, []
    for tok in tokens:
        piece = tok.replace("\u2581", "").replace("@@", "").strip().lower()
        if not piece or piece.startswith("<"):
            out.append(None)
            continue
        i = low.find(piece, at)
        if i < 0 or i - at > 40:
            out.append(None)
            continue
        out.append((i, i + len(piece)))
        at = i + len(piece)
    return _unknowns(text, tokens, out)


def _unknowns(
    text: str, tokens: Sequence[str], spans: list[tuple[int, int] | None]
) -> list[tuple[int, int] | None]:
    """``spans`` with each ``<unk>`` token given the text between its neighbours' spans (a
    word the vocabulary lacks still covers its word)."""
    out = list(spans)
    for k, tok in enumerate(tokens):
        if out[k] is not None or tok.replace("\u2581", "") != "<unk>":
            continue
        a = max((sp[1] for sp in out[:k] if sp is not None), default=0)
        b = min((sp[0] for sp in spans[k + 1 :] if sp is not None), default=len(text))
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        if a < b:
            out[k] = (a, b)
    return out


class _Mapper:
    """Source positions of one block's text mapped to positions of its translation."""

    def __init__(
        self,
        joined: Joined,
        segments: Sequence[str],
        translations: Sequence[str],
        alignments: Mapping[int, Alignment | None],
        spaced: bool,
    ) -> None:
        self.j, self.segments, self.spaced = joined, segments, spaced
        self.translations, self.alignments = translations, alignments

    def _slot(self, p: int, end: bool) -> int | None:
        for k, s in enumerate(self.j.slots):
            if s.start < p < s.end or (p == s.start and not end) or (p == s.end and end):
                return k
        return None

    def point(self, p: int, end: bool) -> int:
        """Where source position ``p`` (an element's start, or its end with ``end``) goes."""
        k = self._slot(p, end)
        slots, places = self.j.slots, self.j.places
        if k is None:  # kept text around the sentences: the same offset from its edge
            before = [i for i, s in enumerate(slots) if s.end <= p]
            if not before:
                return min(p, places[0][0]) if places else p
            i = before[-1]
            limit = places[i + 1][0] if i + 1 < len(places) else len(self.j.text)
            return min(places[i][1] + p - slots[i].end, limit)
        s, (a, b) = slots[k], places[k]
        if p == s.start:
            return a
        if p == s.end:
            return b
        return self._snap(a + round((p - s.start) / (s.end - s.start) * (b - a)), a, b, end)

    def span(self, p0: int, p1: int) -> tuple[int, int]:
        """Where the source span ``[p0, p1)`` goes: by alignment inside one sentence, else by
        its ends."""
        k = self._slot(p0, False)
        if k is not None and k == self._slot(p1, True) and p1 > p0:
            s = self.j.slots[k]
            if not (p0 == s.start and p1 == s.end):
                got = self._aligned(k, p0 - s.start, p1 - s.start)
                if got is not None:
                    return got
        return self.point(p0, False), self.point(p1, True)

    def _aligned(self, k: int, a0: int, a1: int) -> tuple[int, int] | None:
        seg = self.j.slots[k].segment
        al = self.alignments.get(seg)
        if al is None:
            return None
        src = _token_spans(self.segments[seg], al.source_tokens)
        shown = self.j.text[self.j.places[k][0] : self.j.places[k][1]]
        tgt = _token_spans(shown, al.target_tokens)
        inside = {i for i, sp in enumerate(src) if sp is not None and sp[0] < a1 and sp[1] > a0}
        hit = [
            tgt[t]
            for t, row in enumerate(al.weights)
            if t < len(tgt) and tgt[t] is not None and row and _argmax(row) in inside
        ]
        if not hit:
            return None
        base, top = self.j.places[k]
        lo = min(h[0] for h in hit if h) + base
        hi = max(h[1] for h in hit if h) + base
        return self._snap(lo, base, top, False), self._snap(hi, base, top, True)

    def _snap(self, t: int, a: int, b: int, end: bool) -> int:
        """``t`` moved to a word's edge (in a target written with spaces)."""
        text = self.j.text
        if not self.spaced:
            return t
        if end:  # inside a word: to its end; after a space: back to the word before
            while a < t < b and text[t - 1].isalnum() and text[t].isalnum():
                t += 1
            while a < t and text[t - 1] == " ":
                t -= 1
        else:  # inside a word: to its start; on a space: on to the word after
            while a < t < b and text[t - 1].isalnum() and text[t].isalnum():
                t -= 1
            while t < b and text[t] == " ":
                t += 1
        return t


def _argmax(row: Sequence[float]) -> int:
    return max(range(len(row)), key=row.__getitem__)


def _place(el: _Element, mapper: _Mapper, lo: int, hi: int) -> list[tuple[_Element, int, int]]:
    """Each child of ``el`` (in order) with its target span inside ``[lo, hi]``: in source
    order, never overlapping (the tree's shape kept)."""
    out, at = [], lo
    for c in el.children:
        if c.close is None:
            t0 = t1 = mapper.point(c.start, False)
        else:
            t0, t1 = mapper.span(c.start, c.end)
        t0 = min(max(t0, at), hi)
        t1 = min(max(t1, t0), hi)
        out.append((c, t0, t1))
        at = t1
    return out


def placed(
    root: _Element,
    joined: Joined,
    segments: Sequence[str],
    translations: Sequence[str],
    alignments: Mapping[int, Alignment | None] | None,
    spaced: bool,
) -> dict[int, tuple[int, int]]:
    """Where every element under ``root`` (by ``id``) lies in the translation
    ``joined.text``: the placement HTML uses, for formats that write text back into their
    own tree (office files)."""
    mapper = _Mapper(joined, segments, translations, alignments or {}, spaced)
    out: dict[int, tuple[int, int]] = {id(root): (0, len(joined.text))}

    def walk(el: _Element, lo: int, hi: int) -> None:
        for c, t0, t1 in _place(el, mapper, lo, hi):
            out[id(c)] = (t0, t1)
            walk(c, t0, t1)

    walk(root, 0, len(joined.text))
    return out


def _escape(text: str) -> str:
    return _html.escape(text, quote=False)


def _render(
    el: _Element, text: str, mapper: _Mapper, lo: int, hi: int, escape: Callable[[str], str]
) -> str:
    """``text[lo:hi]`` (escaped) with the children of ``el`` put back."""
    parts, at = [], lo
    for c, t0, t1 in _place(el, mapper, lo, hi):
        parts.append(escape(text[at:t0]))
        if c.close is None:
            parts.append(c.open)
            between = t1 > lo and text[t1 - 1] == " " and t1 < hi and text[t1] != " "
            if c.space_after and between:  # "Lancez <code>x</code> maintenant"
                parts.append(" ")
        else:
            parts += [c.open, _render(c, text, mapper, t0, t1, escape), c.close]
        at = t1
    parts.append(escape(text[at:hi]))
    return "".join(parts)


class HtmlDocument(Document):
    """A page read for translation (see the module): ``pieces`` are kept strings and
    blocks (:func:`fragment`), written back as UTF-8 (with a byte-order mark: ``bom``), the
    translated text escaped by ``escape`` (HTML's ``&<>``; subtitles reuse the class)."""

    def __init__(
        self,
        pieces: list[str | _Block],
        bom: bool = False,
        *,
        fmt: str = NAME,
        escape: Callable[[str], str] = _escape,
        newline: str = "\n",
        **plan: str | None,
    ) -> None:
        self._pieces = pieces
        self._bom, self._escape, self._newline = bom, escape, newline
        blocks = [p for p in pieces if isinstance(p, _Block)]
        super().__init__(fmt, [b.text for b in blocks], **plan)  # type: ignore[arg-type]
        self._blocks = blocks
        self._spaced = self.plan.target not in NO_SPACES

    @property
    def aligned(self) -> tuple[int, ...]:
        """The segments of the blocks that hold inline markup."""
        return self._segments_of(i for i, b in enumerate(self._blocks) if b.root.children)

    def render(
        self,
        translations: Sequence[str],
        alignments: Mapping[int, Alignment | None] | None = None,
    ) -> bytes:
        joined = self.plan.joined(translations)
        shown = {id(b): j for b, j in zip(self._blocks, joined)}
        segs = self.plan.segments
        out = ["\ufeff" if self._bom else ""]
        for piece in self._pieces:
            if isinstance(piece, str):
                out.append(piece)
                continue
            j = shown[id(piece)]
            mapper = _Mapper(j, segs, translations, alignments or {}, self._spaced)
            body = _render(piece.root, j.text, mapper, 0, len(j.text), self._escape)
            if piece.lines > 1 and "<" not in body:
                body = wrap(body, piece.lines, self._spaced).replace("\n", self._newline)
            if piece.lead is not None and body.startswith(" "):
                body = piece.lead + body[1:]
            if piece.trail is not None and body.endswith(" "):
                body = body[:-1] + piece.trail
            out.append(body)
        return "".join(out).encode("utf-8")


def read(
    data: bytes,
    *,
    source: str | None = None,
    target: str | None = None,
    split: str = DEFAULT_SPLIT,
) -> HtmlDocument:
    """An HTML page (UTF-8; a byte-order mark kept) as an :class:`HtmlDocument`."""
    text, bom = decode_text(data)
    return HtmlDocument(fragment(text), bom, source=source, target=target, split=split)


def fragment(text: str) -> list[str | _Block]:
    """``text`` (a page, or a fragment with inline markup: a subtitle's cue) as kept strings
    and blocks to translate."""
    return _blocks(_Tokens(text).tokens())


def wrap(text: str, lines: int, spaced: bool = True) -> str:
    """``text`` on ``lines`` lines of lengths as even as its words allow: the ``k``-th cut
    between the words closest to ``k/lines`` of its length (a language written without
    spaces: between characters)."""
    units = text.split(" ") if spaced else list(text)
    glue = " " if spaced else ""
    ends, at = [], 0  # the length of the text up to the end of each unit
    for u in units:
        at += len(u) + (len(glue) if ends else 0)
        ends.append(at)
    cuts, last = [], 0
    for k in range(1, min(lines, len(units))):
        want = k * len(text) / lines
        best = min(range(last + 1, len(units)), key=lambda i: abs(ends[i - 1] - want), default=None)
        if best is None:
            break
        cuts.append(best)
        last = best
    rows = [units[a:b] for a, b in zip([0, *cuts], [*cuts, len(units)])]
    return "\n".join(glue.join(r) for r in rows if r)
