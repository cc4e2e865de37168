"""Documents: a format's reader and writer around one "segments in, segments out" call.

A reader (one per format of :data:`qkv.text.files.FORMATS`) reads a file's bytes into a :class:`Document`:
the texts to translate (paragraphs, cues, catalog entries, runs of a paragraph), planned into
segments (:class:`qkv.text.layout.Plan`), and the writer that puts their translations back
into the same file: everything that is not text (markup, timings, catalog headers, styles)
kept as it was. Between the two, any engine translates :attr:`Document.segments` at once.

The limits (:class:`Limits`) are checked as the file is read, before anything is
translated; :mod:`qkv.text.files` reads files of every format and translates them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .._errors import SettingError
from .layout import DEFAULT_SPLIT, Plan, plan_texts

__all__ = ["Align", "Alignment", "Document", "Limits", "Translate"]

#: segments in, translations out: one per segment, in order
Translate = Callable[[Sequence[str]], Sequence[str]]


@dataclass(frozen=True)
class Alignment:
    """How a translation's tokens attend to its source's (an engine's cross-attention): what
    puts inline markup back on the words it covered.

    Attributes:
        source_tokens: the ``Ls`` source tokens as the tokenizer spells them (``"▁Hel"``).
        target_tokens: the ``Lt`` target tokens (the translation's).
        weights: ``(Lt, Ls)``: row ``t`` is how much target token ``t`` attends to each
            source token (averaged over layers and heads).
    """

    source_tokens: tuple[str, ...]
    target_tokens: tuple[str, ...]
    weights: tuple[tuple[float, ...], ...]


#: segments in, alignments out (None for a segment the engine cannot align)
Align = Callable[[Sequence[str], Sequence[str]], Sequence["Alignment | None"]]


@dataclass(frozen=True)
class Limits:
    """What one document may hold (None: no limit); checked as it is read, each a
    :class:`~qkv._errors.SettingError` named by the limit.

    Attributes:
        max_bytes: the file's size in bytes.
        max_chars: the characters of text to translate (LibreTranslate's ``char_limit``).
        max_segments: the segments (sentences) to translate.
    """

    max_bytes: int | None = None
    max_chars: int | None = None
    max_segments: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_chars", "max_segments"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise SettingError(name, f"expected an int >= 1 or None, got {v!r}")

    def check_bytes(self, n: int) -> None:
        if self.max_bytes is not None and n > self.max_bytes:
            raise SettingError(
                "max_bytes", f"the file has {n:,} bytes, more than the limit of {self.max_bytes:,}"
            )

    def check_plan(self, plan: Plan) -> None:
        chars = sum(len(s) for s in plan.segments)
        if self.max_chars is not None and chars > self.max_chars:
            raise SettingError(
                "max_chars",
                f"the text to translate has {chars:,} characters, more than the limit of "
                f"{self.max_chars:,}",
            )
        n = len(plan.segments)
        if self.max_segments is not None and n > self.max_segments:
            raise SettingError(
                "max_segments",
                f"the text to translate has {n:,} segments, more than the limit of "
                f"{self.max_segments:,}",
            )


class Document:
    """A file read for translation: :attr:`segments` to translate, :meth:`render` to write it
    back with their translations (a format's reader makes it; see :func:`read_document`).

    Args:
        fmt: the format's name (``"txt"``, ``"srt"``, ...).
        texts: the texts to translate, in the file's order (a text may hold line breaks).
        write: ``write(translated_texts) -> bytes``: the file with each text replaced (None:
            the subclass's :meth:`render` writes it).
        source, target, split: as :func:`qkv.text.plan_texts` takes them.
    """

    def __init__(
        self,
        fmt: str,
        texts: Sequence[str],
        write: Callable[[list[str]], bytes] | None = None,
        *,
        source: str | None = None,
        target: str | None = None,
        split: str = DEFAULT_SPLIT,
    ) -> None:
        self.format = fmt
        self.plan = plan_texts(texts, source=source, target=target, split=split)
        self._write = write

    @property
    def segments(self) -> tuple[str, ...]:
        """Every distinct segment to translate, in one list."""
        return self.plan.segments

    @property
    def aligned(self) -> tuple[int, ...]:
        """The indices of the segments whose inline markup is placed by an
        :class:`Alignment` (HTML); none for other formats."""
        return ()

    def render(
        self,
        translations: Sequence[str],
        alignments: Mapping[int, Alignment | None] | None = None,
    ) -> bytes:
        """The file with every segment replaced by its translation (one per segment of
        :attr:`segments`); ``alignments`` (segment index -> :class:`Alignment`, for those of
        :attr:`aligned`) place inline markup, a format's own rule placing it without them."""
        if self._write is None:
            raise NotImplementedError(f"{type(self).__name__}.render")
        return self._write(self.plan.join(translations))

    def _segments_of(self, texts: Iterable[int]) -> tuple[int, ...]:
        """The segments of the texts ``texts`` (indices), sorted."""
        return tuple(sorted({s.segment for i in texts for s in self.plan.slots(i)}))
