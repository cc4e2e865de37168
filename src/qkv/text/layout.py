"""Texts cut into the segments a model translates, and put back together with their layout.

A :class:`Plan` is made once for many texts (:func:`plan_texts`): every line of every text is
a paragraph, cut into sentences (``split="sentences"``) or kept whole (``split="none"``: one
line, one segment, for text already cut into sentences); the segments of all texts are one
list (:attr:`Plan.segments`, each distinct segment once), translated in one call of an engine,
and :meth:`Plan.join` rebuilds each text from their translations: line breaks, blank lines,
the whitespace at both ends of a line (indentation) and between sentences kept as they were.

Between two sentences of one line the source's whitespace is kept, except that a target
written without spaces (Chinese, Japanese, Thai, ...) gets none, and a source written without
them gets one space before a target that uses them.

>>> plan = plan_texts(["  Hi. How are you?\\n\\nBye."], source="en", target="fr")
>>> plan.segments
('Hi.', 'How are you?', 'Bye.')
>>> plan.join(["Salut.", "Comment vas-tu ?", "Au revoir."])
['  Salut. Comment vas-tu ?\\n\\nAu revoir.']
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from .._errors import SettingError
from .sentences import sentence_spans

__all__ = [
    "DEFAULT_SPLIT",
    "NO_SPACES",
    "SPLITS",
    "Joined",
    "Plan",
    "Slot",
    "Split",
    "check_split",
    "clean",
    "plan_texts",
]

Split = Literal["sentences", "none"]
#: what ``split=`` takes: ``"sentences"`` (a line cut into sentences) or ``"none"`` (a line is
#: one segment)
SPLITS: tuple[str, ...] = ("sentences", "none")
#: what ``split=`` is when not given
DEFAULT_SPLIT = "sentences"
#: languages written without spaces between sentences (and words)
NO_SPACES = frozenset({"zh", "ja", "th", "lo", "km", "my", "bo"})

_SPACES = re.compile(r"[^\S\n]+")


def check_split(split: object, key: str = "split") -> str:
    """``split`` when it is one of :data:`SPLITS`, else a :class:`SettingError` named ``key``."""
    if split not in SPLITS:
        raise SettingError(key, f"expected one of {', '.join(SPLITS)}, got {split!r}")
    return str(split)


def clean(text: str) -> str:
    """One translated segment as it is shown: runs of spaces (what subword pieces such as
    SentencePiece's ``▁`` leave) made one space, none at either end."""
    return _SPACES.sub(" ", text).strip()


def _base(lang: str | None, key: str) -> str | None:
    """The language subtag of ``lang``, checked (a :class:`SettingError` named ``key``)."""
    if lang is None:
        return None
    from ..data.languages import check_language  # qkv.data loads torch: not for --help

    return check_language(lang, key).split("-", 1)[0]


@dataclass(frozen=True)
class Slot:
    """Where one segment stands: ``segment`` (its index in :attr:`Plan.segments`) comes from
    ``source[start:end]`` of its text."""

    segment: int
    start: int
    end: int


@dataclass(frozen=True)
class Joined:
    """One text put back together: ``text``, and per slot of the text (in order) the
    ``(start, end)`` of its translation in ``text`` (``places``)."""

    text: str
    slots: tuple[Slot, ...]
    places: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Plan:
    """The segments of many texts and how to put their translations back (see the module).

    Attributes:
        segments: every distinct segment, in the order first met.
        texts: the source texts.
        target: the target language's subtag (``"fr"``), or None when not known.
    """

    segments: tuple[str, ...]
    texts: tuple[str, ...]
    target: str | None
    #: per text: its pieces in order, a kept string or a :class:`Slot`
    layouts: tuple[tuple[str | Slot, ...], ...]

    def slots(self, i: int) -> list[Slot]:
        """The slots of text ``i``, in order."""
        return [p for p in self.layouts[i] if isinstance(p, Slot)]

    def labels(self) -> list[str]:
        """How a message names each segment: the text it is in, 1-based (``"3"``), and in a
        text of several segments which one (``"3 (sentence 2)"``); a segment met in several
        texts, the first three (``"3, 7, 9, ..."``)."""
        where: list[list[str]] = [[] for _ in self.segments]
        for i in range(len(self.texts)):
            slots = self.slots(i)
            for k, s in enumerate(slots):
                where[s.segment].append(
                    f"{i + 1} (sentence {k + 1})" if len(slots) > 1 else str(i + 1)
                )
        return [", ".join(w[:3]) + (", ..." if len(w) > 3 else "") for w in where]

    def _check(self, translations: Sequence[object]) -> None:
        if len(translations) != len(self.segments):
            raise ValueError(
                f"translations: expected one per segment ({len(self.segments)}), got "
                f"{len(translations)}"
            )

    def joined(self, translations: Sequence[str]) -> list[Joined]:
        """Each text rebuilt from ``translations`` (one per segment, cleaned by
        :func:`clean`), with where each slot's translation landed."""
        self._check(translations)
        out = []
        for layout in self.layouts:
            text, places, slots = "", [], []
            for piece in layout:
                if isinstance(piece, str):
                    text += piece
                    continue
                got = clean(translations[piece.segment])
                places.append((len(text), len(text) + len(got)))
                slots.append(piece)
                text += got
            out.append(Joined(text, tuple(slots), tuple(places)))
        return out

    def join(self, translations: Sequence[str]) -> list[str]:
        """Each text rebuilt from ``translations``, one per segment (see :meth:`joined`)."""
        return [j.text for j in self.joined(translations)]

    def join_hypotheses(
        self, hypotheses: Sequence[Sequence[tuple[str, float]]], n: int | None = None
    ) -> list[list[tuple[str, float]]]:
        """Each text's ``n`` best (default: as many as the longest list) from its segments'
        n-best lists ``(translation, score)``, best first: its ``k``-th is every segment's
        ``k``-th translation joined (a segment with fewer, or whose ``k``-th scores ``-inf``,
        gives its last real one), scored by the sum of theirs; ``("", -inf)`` when no segment
        of the text has a ``k``-th (a blank text: its layout scored 0, then those)."""
        self._check(hypotheses)
        k = n if n is not None else max((len(h) for h in hypotheses), default=1)
        out = []
        for i in range(len(self.texts)):
            segs = [s.segment for s in self.slots(i)]
            alts: list[tuple[str, float]] = []
            for rank in range(k):
                picked, has_rank = [], False
                for j in segs:
                    real = [h for h in hypotheses[j] if h[1] != -math.inf] or [("", 0.0)]
                    has_rank |= rank < len(real)
                    picked.append(real[min(rank, len(real) - 1)])
                if rank and not has_rank:
                    alts.append(("", -math.inf))
                    continue
                joined = self._one(i, [t for t, _ in picked])
                alts.append((joined, math.fsum(s for _, s in picked)))
            out.append(alts)
        return out

    def _one(self, i: int, translations: Sequence[str]) -> str:
        """Text ``i`` rebuilt from the translations of its own slots, in order."""
        it = iter(translations)
        parts = []
        for piece in self.layouts[i]:
            if isinstance(piece, str):
                parts.append(piece)
            else:
                parts.append(clean(next(it)))
        return "".join(parts)


def _gap(gap: str, target: str | None) -> str:
    """What goes between the translations of two sentences of one line that were ``gap``
    apart (see the module)."""
    if target in NO_SPACES and not gap.strip():
        return ""
    if not gap and target is not None and target not in NO_SPACES:
        return " "
    return gap


def plan_texts(
    texts: Sequence[str],
    *,
    source: str | None = None,
    target: str | None = None,
    split: str = DEFAULT_SPLIT,
) -> Plan:
    """The :class:`Plan` of ``texts``: their lines cut into sentences of language ``source``
    (``split="sentences"``; see :func:`qkv.text.sentences.sentence_spans`) or kept whole
    (``split="none"``), to be joined in language ``target`` (None: the source's spacing
    kept as it is).

    Raises:
        SettingError: ``split`` not one of :data:`SPLITS`; ``source``/``target`` not a
            language code.
        TypeError: ``texts`` is not a sequence of str.
    """
    check_split(split)
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise TypeError(f"texts: expected a sequence of str, got {type(texts).__name__}")
    src, tgt = _base(source, "source"), _base(target, "target")
    index: dict[str, int] = {}
    layouts = []
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"texts: expected a sequence of str, got a {type(text).__name__}")
        layouts.append(tuple(_layout(text, src, tgt, split, index)))
    return Plan(tuple(index), tuple(texts), tgt, tuple(layouts))


def _layout(
    text: str, src: str | None, tgt: str | None, split: str, index: dict[str, int]
) -> list[str | Slot]:
    """The pieces of one text: kept strings and slots (each segment added to ``index``)."""
    pieces: list[str | Slot] = []
    at = 0
    for n, line in enumerate(text.split("\n")):
        if n:
            pieces.append("\n")
            at += 1
        spans = sentence_spans(line, src) if split == "sentences" else _whole(line)
        end = 0
        for k, (a, b) in enumerate(spans):
            gap = line[end:a]
            if k:
                gap = _gap(gap, tgt)
            if gap:
                pieces.append(gap)
            segment = line[a:b]
            pieces.append(Slot(index.setdefault(segment, len(index)), at + a, at + b))
            end = b
        if line[end:]:
            pieces.append(line[end:])
        at += len(line)
    return pieces


def _whole(line: str) -> list[tuple[int, int]]:
    """The span of ``line`` without the whitespace at its ends (none for a blank line)."""
    stripped = line.strip()
    if not stripped:
        return []
    a = len(line) - len(line.lstrip())
    return [(a, a + len(stripped))]
