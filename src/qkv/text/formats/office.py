"""Office files: Word (``.docx``, read and written by python-docx) and OpenDocument text
(``.odt``, by odfdo): every paragraph's text translated, its runs' formatting kept.

A paragraph (headings, list items, table cells, headers and footers included) is one text; its
runs (Word's ``w:r``; OpenDocument's ``text:span``, links ``w:hyperlink``/``text:a``) are put
back on the words they covered, as HTML's inline markup is (:func:`qkv.text.formats.html.
placed`: by the engine's cross-attention where it has it, else by position), each run keeping
its properties (bold, italics, fonts, styles). Only text changes: images, fields, bookmarks,
notes, tables and styles are the file's own.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ..._errors import SettingError
from ..documents import Alignment, Document
from ..layout import DEFAULT_SPLIT, NO_SPACES
from .html import _Element, placed

__all__ = ["read_docx", "read_odt"]


class _Paragraph:
    """One paragraph: its text, its runs as a tree of :class:`_Element` (``root``) and
    ``write(text, spans)``, which puts a translation back (``spans``: each element's span in
    it, by ``id``)."""

    def __init__(
        self,
        text: str,
        root: _Element,
        write: Callable[[str, dict[int, tuple[int, int]]], None],
    ) -> None:
        self.text, self.root, self.write = text, root, write


class TreeDocument(Document):
    """A file whose paragraphs are written back into its own tree, then saved (``save``)."""

    def __init__(
        self, fmt: str, paragraphs: list[_Paragraph], save: Callable[[], bytes], **plan: Any
    ) -> None:
        self._paragraphs, self._save = paragraphs, save
        super().__init__(fmt, [p.text for p in paragraphs], **plan)
        self._spaced = self.plan.target not in NO_SPACES

    @property
    def aligned(self) -> tuple[int, ...]:
        """The segments of paragraphs of more than one run."""
        return self._segments_of(
            i
            for i, p in enumerate(self._paragraphs)
            if len(p.root.children) > 1 or any(c.children for c in p.root.children)
        )

    def render(
        self,
        translations: Sequence[str],
        alignments: Mapping[int, Alignment | None] | None = None,
    ) -> bytes:
        for p, j in zip(self._paragraphs, self.plan.joined(translations)):
            spans = placed(p.root, j, self.plan.segments, translations, alignments, self._spaced)
            p.write(j.text, spans)
        return self._save()


def _saver(doc: Any) -> Callable[[], bytes]:
    """``save()``: the bytes of ``doc`` (python-docx's or odfdo's document) as it is now."""

    def save() -> bytes:
        buf = io.BytesIO()
        doc.save(buf)
        return buf.getvalue()

    return save


# ---------------------------------------------------------------------------- Word
def _docx_paragraph(p: Any, qn: Callable[[str], str]) -> _Paragraph | None:
    """A ``w:p`` element as a :class:`_Paragraph` (None: no text in it)."""
    R, T, LINK = qn("w:r"), qn("w:t"), qn("w:hyperlink")
    root = _Element("", "", 0)
    text = ""
    runs: dict[int, list[Any]] = {}  # id(element) -> the run's w:t elements

    def walk(node: Any, parent: _Element) -> None:
        nonlocal text
        for child in node:
            if child.tag == R:
                ts = [t for t in child.iter(T)]
                piece = "".join(t.text or "" for t in ts)
                el = _Element("r", "" if piece else None, len(text))
                text += piece
                el.end = len(text)
                parent.children.append(el)
                runs[id(el)] = ts
            elif child.tag == LINK:
                el = _Element("a", "", len(text))
                parent.children.append(el)
                walk(child, el)
                el.end = len(text)

    walk(p, root)
    if not text.strip():
        return None

    def write(out: str, spans: dict[int, tuple[int, int]]) -> None:
        # a run's text reaches to the next run's: no space between two is lost
        keys = [k for k, ts in runs.items() if ts]
        starts = [0] + [spans[k][0] for k in keys[1:]] + [len(out)]
        for n, key in enumerate(keys):
            ts = runs[key]
            ts[0].text = out[starts[n] : max(starts[n], starts[n + 1])]
            ts[0].set("{http://www.w3.org/XML/1998/namespace}space", "preserve")
            for t in ts[1:]:
                t.text = ""

    return _Paragraph(text, root, write)


def _docx_parts(doc: Any) -> Iterator[Any]:
    """The XML trees of a Word file that hold text: the body, then every header and footer."""
    yield doc.element.body
    seen = set()
    for section in doc.sections:
        for part in (section.header, section.footer, section.first_page_header,
                     section.first_page_footer, section.even_page_header,
                     section.even_page_footer):  # fmt: skip
            if not part.is_linked_to_previous and id(part._element) not in seen:
                seen.add(id(part._element))
                yield part._element


def read_docx(
    data: bytes,
    *,
    source: str | None = None,
    target: str | None = None,
    split: str = DEFAULT_SPLIT,
) -> TreeDocument:
    """A Word file: its paragraphs to translate (see the module)."""
    import docx
    from docx.oxml.ns import qn

    try:
        doc = docx.Document(io.BytesIO(data))
    except Exception as e:  # python-docx raises several kinds for a file that is not one
        raise SettingError(
            "file", f"expected a .docx file, got one python-docx cannot read: {e}"
        ) from None
    paragraphs = [
        found
        for part in _docx_parts(doc)
        for p in part.iter(qn("w:p"))
        if (found := _docx_paragraph(p, qn)) is not None
    ]

    return TreeDocument("docx", paragraphs, _saver(doc), source=source, target=target, split=split)


# ---------------------------------------------------------------------------- OpenDocument
#: elements of a paragraph whose text is part of it (a span of formatting, a link)
_ODT_INLINE = frozenset({"text:span", "text:a", "text:ruby-base", "text:meta"})
#: elements that stand for whitespace: the model reads a space
_ODT_SPACES = frozenset({"text:tab", "text:line-break"})
#: ``text:s``, spaces (odfdo writes one for a space at a text's end): read and written as spaces
_ODT_S = "text:s"


def _odt_paragraph(p: Any) -> _Paragraph | None:
    """A ``text:p``/``text:h`` element (odfdo) as a :class:`_Paragraph` (None: no text)."""
    text = ""
    nodes: dict[int, Any] = {}
    spaces: set[int] = set()
    dropped: list[Any] = []  # the text:s elements, whose spaces the text holds

    def walk(node: Any, el: _Element) -> None:
        nonlocal text
        text += node.text or ""
        for child in node.children:
            if child.tag == _ODT_S:
                text += " " * int(child.get_attribute("text:c") or 1) + (child.tail or "")
                dropped.append(child)
                continue
            if child.tag in _ODT_INLINE:
                c = _Element(child.tag, "", len(text))
                walk(child, c)
                c.end = len(text)
            else:  # a space, a tab, a frame, a note, a bookmark: kept where it maps to
                c = _Element(child.tag, None, len(text))
                if child.tag in _ODT_SPACES:
                    spaces.add(id(c))
                    text += " "
            el.children.append(c)
            nodes[id(c)] = child
            text += child.tail or ""

    root = _Element("", "", 0)
    walk(p, root)
    nodes[id(root)] = p
    if not text.strip():
        return None

    def write(out: str, spans: dict[int, tuple[int, int]]) -> None:
        def fill(el: _Element) -> None:
            node = nodes[id(el)]
            a, b = spans[id(el)]
            ends = [spans[id(c)] for c in el.children]
            node.text = out[a : ends[0][0] if ends else b]
            for k, c in enumerate(el.children):
                if c.close is not None:
                    fill(c)
                c1 = ends[k][1]
                if id(c) in spaces and c1 < len(out) and out[c1] == " ":
                    c1 += 1  # the space the element stands for
                nxt = ends[k + 1][0] if k + 1 < len(ends) else b
                nodes[id(c)].tail = out[c1 : max(c1, nxt)]

        for node in dropped:
            node.parent.delete(node, keep_tail=False)
        fill(root)

    return _Paragraph(text, root, write)


def read_odt(
    data: bytes,
    *,
    source: str | None = None,
    target: str | None = None,
    split: str = DEFAULT_SPLIT,
) -> TreeDocument:
    """An OpenDocument text file: its paragraphs and headings to translate (see the module)."""
    from odfdo import Document as OdfDocument

    try:
        doc = OdfDocument(io.BytesIO(data))
        found = doc.body.get_elements("//text:p | //text:h")
    except Exception as e:  # odfdo raises several kinds for a file that is not one
        raise SettingError(
            "file", f"expected an .odt file, got one odfdo cannot read: {e}"
        ) from None
    paragraphs = [para for p in found if (para := _odt_paragraph(p)) is not None]

    return TreeDocument("odt", paragraphs, _saver(doc), source=source, target=target, split=split)
