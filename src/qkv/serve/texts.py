"""What the server does to a request's text around its models, through :mod:`qkv.text`: texts
cut into sentences (their layout kept) and put back, HTML pages and files read into segments
and written back; the segments of every text of a request go to the batching queue as one
job, so the sentences of many requests are decoded together.

The functions here are the plain parts (no waiting): the app (:mod:`qkv.serve.app`) sends
the segments through its models and calls them before and after.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import SettingError
from ..data.languages import check_language
from ..text import Alignment, Document, Limits, Plan, check_split, plan_texts, read_document
from ..text.formats import EXTENSIONS
from .config import ServeConfig
from .requests import ApiError, check_sentences, describe

__all__ = [
    "FORMATS_ASKED",
    "Documents",
    "Hypotheses",
    "answer_texts",
    "check_segments",
    "layout_pieces",
    "plan_for",
    "read_file",
    "request_format",
    "request_split",
    "supported_extensions",
]

#: per segment its translations, best first, each ``(text, score)``
Hypotheses = list[list[tuple[str, float]]]

#: what ``/translate``'s ``format`` takes (LibreTranslate's two)
FORMATS_ASKED = ("text", "html")


def supported_extensions() -> list[str]:
    """The file extensions ``/translate_file`` reads (``".txt"``, ...), sorted."""
    return sorted(EXTENSIONS)


def request_format(data: dict[str, Any]) -> str:
    """A request's ``format``: ``"text"`` (the default) or ``"html"``."""
    fmt = data.get("format")
    if fmt is None or fmt == "":
        return "text"
    if not isinstance(fmt, str):
        raise ApiError(422, f"format: expected 'text' or 'html', got {describe(fmt)}")
    if fmt.strip().lower() not in FORMATS_ASKED:
        raise ApiError(400, f"format: expected 'text' or 'html', got {fmt[:40]!r}")
    return fmt.strip().lower()


def request_split(data: dict[str, Any]) -> str:
    """A request's ``split`` (qkv's own field): ``"sentences"`` (the default: each line cut
    into sentences) or ``"none"`` (each line one sentence, for text cut already)."""
    split = data.get("split")
    if split is None or split == "":
        return "sentences"
    try:
        return check_split(split.strip().lower() if isinstance(split, str) else split)
    except SettingError as e:
        raise ApiError(422, f"split: {e.problem}") from None


def _language(code: str | None) -> str | None:
    """``code`` when :mod:`qkv.text` knows it as a language, else None (a model served as
    ``x-custom`` is cut by the rules every language shares)."""
    if code is None:
        return None
    try:
        return check_language(code)
    except SettingError:
        return None


def plan_for(texts: Sequence[str], source: str | None, target: str | None, split: str) -> Plan:
    """The :class:`~qkv.text.Plan` of ``texts`` from ``source`` into ``target``."""
    return plan_texts(texts, source=_language(source), target=_language(target), split=split)


def check_segments(segments: Sequence[str], cfg: ServeConfig, name: str = "q") -> None:
    """413 for more sentences than ``max_sentences``, or one longer than ``max_chars``."""
    if len(segments) > cfg.max_sentences:
        raise ApiError(
            413,
            f"{name}: {len(segments):,} sentences, over the limit of {cfg.max_sentences:,} per "
            "request (--max-sentences)",
        )
    check_sentences(name, segments, cfg.max_chars)


def answer_texts(
    plan: Plan, found: Hypotheses, alternatives: int
) -> tuple[list[str], list[list[str]] | None]:
    """Each text's translation and, when ``alternatives`` are asked, its others, best first
    (a text's ``k``-th: its sentences' ``k``-th translations, :meth:`Plan.join_hypotheses`)."""
    if not alternatives:
        return plan.join([h[0][0] for h in found]), None
    joined = plan.join_hypotheses(found)
    best = [alts[0][0] for alts in joined]
    others = [[t for t, score in alts[1:] if score != -math.inf] for alts in joined]
    return best, others


def layout_pieces(plan: Plan, translations: Sequence[str]) -> list[list[Any]]:
    """Per text, its translation in pieces, for the page: a string is layout kept as it was
    (line breaks, spaces), ``{"source": s, "translation": t}`` one sentence and its
    translation; the pieces of a text joined are its ``translatedText``."""
    out = []
    for joined in plan.joined(translations):
        pieces: list[Any] = []
        at = 0
        for slot, (a, b) in zip(joined.slots, joined.places):
            if a > at:
                pieces.append(joined.text[at:a])
            pieces.append({"source": plan.segments[slot.segment], "translation": joined.text[a:b]})
            at = b
        if at < len(joined.text):
            pieces.append(joined.text[at:])
        out.append(pieces)
    return out


@dataclass(frozen=True)
class Documents:
    """Several documents (the HTML texts of one request) translated as one list of segments."""

    docs: tuple[Document, ...]

    @property
    def segments(self) -> list[str]:
        """Every document's segments, one after the other."""
        return [s for d in self.docs for s in d.segments]

    def aligned(self) -> list[int]:
        """The indices (in :attr:`segments`) of those whose inline markup an alignment
        places."""
        out, start = [], 0
        for d in self.docs:
            out += [start + i for i in d.aligned]
            start += len(d.segments)
        return out

    def render(
        self, translations: Sequence[str], alignments: Mapping[int, Alignment | None]
    ) -> list[bytes]:
        """Each document written back with its segments' translations (``alignments`` by
        index in :attr:`segments`)."""
        out, start = [], 0
        for d in self.docs:
            n = len(d.segments)
            own = {i - start: a for i, a in alignments.items() if start <= i < start + n}
            out.append(d.render(list(translations[start : start + n]), own or None))
            start += n
        return out


def read_file(
    data: bytes,
    fmt: str,
    source: str | None,
    target: str | None,
    split: str,
    cfg: ServeConfig,
    name: str = "file",
) -> Document:
    """A file of format ``fmt`` read into a :class:`~qkv.text.Document`, within the file
    limits.

    Raises:
        ApiError: 413 over ``max_file_bytes`` or ``max_file_chars``; 400 a file its format's
            reader cannot read, naming ``name``.
    """
    limits = Limits(max_bytes=cfg.max_file_bytes, max_chars=cfg.max_file_chars)
    flags = {"max_bytes": "--max-file-bytes", "max_chars": "--max-file-chars"}
    try:
        return read_document(
            data, fmt, source=_language(source), target=_language(target), split=split,
            limits=limits,
        )  # fmt: skip
    except SettingError as e:
        if e.key in flags:
            raise ApiError(413, f"{name}: {e.problem} ({flags[e.key]})") from None
        raise ApiError(400, f"{name}: {e.problem}") from None
