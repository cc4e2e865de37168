"""Sentence boundaries of one paragraph, per source language.

:func:`sentence_spans` gives the ``(start, end)`` character offsets of each sentence of a
paragraph (a text without line breaks; :mod:`qkv.text.layout` cuts lines first). A span holds
its sentence's text and punctuation, never the whitespace around it, so what lies between two
spans is the whitespace the writer put there, which the layout keeps.

The segmenter is ``sentencex`` (Wikimedia's: rules for about 300 languages through fallback
chains, abbreviations and numbers handled, maintained, pure Python and the fastest of those
compared) where it is installed (``pip install 'qkv[text]'``), with qkv's corrections after it
(an abbreviation of the language's list it cut after, such as French ``M.``, joined back; a
quotation that a Japanese sentence goes on after, ``「行こう！」と``, joined back; a cut after
every full-width ``。！？`` it missed); the rules of :func:`rule_spans` where it is not.
``benchmarks/segmenters.py`` compares them with pysbd, blingfire and sentence-splitter on real
text in six languages (see docs/translating.md for the figures behind the choice).
"""

from __future__ import annotations

import functools
import itertools
import re
import unicodedata
from collections.abc import Callable

__all__ = ["SEGMENTERS", "rule_spans", "segmenter", "sentence_spans", "split_sentences"]

#: ends a sentence when whitespace or the end of the text follows
_STOPS = ".!?…‼⁇⁈⁉؟۔।॥።"
#: ends a sentence by itself (CJK full-width punctuation: no space follows in Chinese or Japanese)
_FULL_STOPS = "。！？｡︒﹒﹖﹗"
#: closing quotes and brackets that belong to the sentence they follow
_CLOSERS = "\"'”’»)]}」』】〕〉》›"

_END = re.compile(
    rf"[{re.escape(_STOPS)}]+[{re.escape(_CLOSERS)}]*(?=\s|$)"
    rf"|[{re.escape(_FULL_STOPS)}]+[{re.escape(_CLOSERS)}]*"
)
_WORD_BEFORE = re.compile(r"(\S+)$")

# abbreviations that end in a full stop but seldom end a sentence (lower case, inner dots kept)
_ABBREVIATIONS = {
    "en": "mr mrs ms dr prof sr jr st vs etc e.g i.e inc ltd co corp no fig approx dept est "
    "jan feb mar apr jun jul aug sep sept oct nov dec mt ave",
    "fr": "m mme mlle mm dr pr st ste etc cf p.ex ex env av bd nº no fig éd vol",
    "de": "z.b u.a bzw usw etc dr prof nr ca vgl s. d.h z.t evtl ggf inkl bspw hr fr str",
    "es": "sr sra srta dr dra ud uds etc pág núm av",
    "it": "sig sigra dott prof ecc pag",
    "pt": "sr sra dr dra etc pág av",
    "nl": "dhr mevr dr prof bijv enz ca nr",
}
_ABBREVIATIONS_OF = {k: frozenset(v.split()) for k, v in _ABBREVIATIONS.items()}


def _language(lang: str | None) -> str:
    """The language subtag of ``lang`` (``"zh-Hant"`` -> ``"zh"``), lower case; ``""`` for
    None."""
    return "" if not lang else re.split(r"[-_]", lang.strip(), maxsplit=1)[0].lower()


def _not_a_boundary(text: str, stop: re.Match[str], lang: str) -> bool:
    """Whether the full stop matched at ``stop`` belongs to an abbreviation, an initial or an
    ordinal rather than ending a sentence, or a lower-case word goes on after it."""
    after = text[stop.end() :].lstrip().lstrip(_CLOSERS).lstrip()  # « Arrête ! » dit-elle
    if after and after[0].islower():
        return True
    if stop.group(0).rstrip(_CLOSERS) != ".":
        return False
    m = _WORD_BEFORE.search(text, 0, stop.start())
    if m is None:
        return False
    word = m.group(1).lstrip("\"'“‘«([{¿¡").lower()
    if len(word) == 1 and word.isalpha():
        return True  # an initial: "J. Smith"
    if word in _ABBREVIATIONS_OF.get(lang, ()) or word in _ABBREVIATIONS_OF["en"]:
        return True
    # "am 3. Oktober", "le 1. " : an ordinal number in German and the Nordic languages
    return lang in ("de", "da", "no", "nb", "nn", "fi", "is", "cs", "sk", "hu") and word.isdigit()


def rule_spans(text: str, lang: str | None = None) -> list[tuple[int, int]]:
    """The sentences of ``text`` by qkv's own rules: a ``.!?…`` (with closing quotes and
    brackets) followed by whitespace and not by a lower-case word, unless it ends an
    abbreviation (a short list per language), an initial or an ordinal; a full-width
    ``。！？`` wherever it stands. Returns ``(start, end)`` offsets, stripped of whitespace."""
    lang = _language(lang)
    cuts = [0]
    for stop in _END.finditer(text):
        if stop.group(0)[0] in _FULL_STOPS:
            if not _quoted(text, stop):
                cuts.append(stop.end())
        elif not _not_a_boundary(text, stop, lang):
            cuts.append(stop.end())
    cuts.append(len(text))
    return _stripped(list(itertools.pairwise(cuts)), text)


def _stripped(spans: list[tuple[int, int]], text: str) -> list[tuple[int, int]]:
    """``spans`` without the whitespace at their ends; the empty ones dropped."""
    out = []
    for a, b in spans:
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        if a < b:
            out.append((a, b))
    return out


def _located(pieces: list[str], text: str) -> list[tuple[int, int]]:
    """Spans of ``pieces`` (a segmenter's sentences, in order, possibly stripped) found in
    ``text`` one after another; a piece that cannot be found (a segmenter that rewrote it)
    ends the search: the rest of the text is one span."""
    spans, at = [], 0
    for piece in pieces:
        piece = piece.strip()
        if not piece:
            continue
        i = text.find(piece, at)
        if i < 0:
            break
        spans.append((i, i + len(piece)))
        at = i + len(piece)
    if at < len(text) and text[at:].strip():
        spans.append((at, len(text)))
    return _stripped(spans, text)


def _sentencex() -> Callable[[str, str], list[tuple[int, int]]] | None:
    try:
        from sentencex import segment
    except ImportError:
        return None

    def spans(text: str, lang: str) -> list[tuple[int, int]]:
        return _located(list(segment(lang or "en", text)), text)

    return spans


#: the segmenters qkv knows, best first: name -> a factory giving ``spans(text, lang)`` or None
#: when its package is not installed
SEGMENTERS: dict[str, Callable[[], Callable[[str, str], list[tuple[int, int]]] | None]] = {
    "sentencex": _sentencex,
    "rules": lambda: lambda text, lang: rule_spans(text, lang),
}


@functools.cache
def segmenter() -> tuple[str, Callable[[str, str], list[tuple[int, int]]]]:
    """``(name, spans(text, lang))`` of the segmenter in use: the first of
    :data:`SEGMENTERS` whose package is installed."""
    for name, make in SEGMENTERS.items():
        found = make()
        if found is not None:
            return name, found
    raise AssertionError("the rules need no package")  # pragma: no cover


def sentence_spans(text: str, lang: str | None = None) -> list[tuple[int, int]]:
    """The ``(start, end)`` offsets of the sentences of one paragraph ``text`` in language
    ``lang`` (a BCP-47 code such as ``"en"``, ``"zh-Hant"``; None: English's rules), in order,
    without the whitespace between them. A boundary the segmenter misses after a full-width
    ``。！？`` is added (some segmenters keep a Chinese paragraph whole)."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected a str, got {type(text).__name__}")
    if not text.strip():
        return []
    code = _language(lang)
    _, spans = segmenter()
    out: list[tuple[int, int]] = []
    for a, b in _merged(spans(text, code), text, code):
        out += [(a + x, a + y) for x, y in _full_width_cuts(text[a:b])]
    return out


def _merged(spans: list[tuple[int, int]], text: str, lang: str) -> list[tuple[int, int]]:
    """``spans`` with two neighbours joined where the first ends in an abbreviation of the
    language's list (``M.`` in French) or in a quotation the sentence goes on after
    (``「行こう！」と``)."""
    out: list[tuple[int, int]] = []
    for a, b in spans:
        if out:
            pa, pb = out[-1]
            word = _WORD_BEFORE.search(text, pa, pb)
            abbreviation = (
                word is not None
                and text[pb - 1] == "."
                and word.group(1)[:-1].lstrip("\"'“‘«([{¿¡").lower()
                in _ABBREVIATIONS_OF.get(lang, ())
            )
            quoted = a == pb and text[pb - 1] in _CLOSERS and ("\u3041" <= text[a] <= "\u309f")
            if abbreviation or quoted:
                out[-1] = (pa, b)
                continue
        out.append((a, b))
    return out


def _quoted(text: str, stop: re.Match[str]) -> bool:
    """Whether the full-width stop at ``stop`` ends a quotation the sentence goes on after
    (``「行こう！」と彼は言った。``, ``本当？と聞いた``): a particle (hiragana) or a comma
    follows a closing quote, or ``と`` follows a ``！？``."""
    after = text[stop.end() : stop.end() + 1]
    if not after:
        return False
    if stop.group(0)[-1] in _CLOSERS:
        return "\u3041" <= after <= "\u309f" or after in "、，,"
    return after == "と" and stop.group(0)[-1] in "！？"


def _full_width_cuts(sentence: str) -> list[tuple[int, int]]:
    """Spans of ``sentence`` cut after every full-width sentence stop inside it (not one
    inside a quotation the sentence goes on after)."""
    cuts = [0]
    for m in re.finditer(rf"[{re.escape(_FULL_STOPS)}]+[{re.escape(_CLOSERS)}]*", sentence):
        if m.end() < len(sentence) and not _quoted(sentence, m):
            cuts.append(m.end())
    cuts.append(len(sentence))
    return _stripped(list(itertools.pairwise(cuts)), sentence)


def split_sentences(text: str, lang: str | None = None) -> list[str]:
    """The sentences of one paragraph (see :func:`sentence_spans`) as strings."""
    return [text[a:b] for a, b in sentence_spans(text, lang)]


def is_wide(ch: str) -> bool:
    """Whether ``ch`` is a wide (CJK) character, written without spaces around it."""
    return unicodedata.east_asian_width(ch) in ("W", "F")
