"""Text normalisation, applied identically at training and at translation time.

A :class:`Normalizer` is a small frozen config; ``to_dict``/``from_dict`` save it with a model
(tokenizers save theirs in ``tokenizer.json``), so the text a trained model sees at translation
time is normalised exactly as its training text was.

``Normalizer.book()`` is the d2l preprocessing of ``fra.txt``: narrow and ordinary non-breaking
spaces become spaces, text is lower-cased, and a space is inserted before ``, . ! ?`` when the
previous character is not a space (``"Go."`` -> ``"go ."``); unlike the book it also collapses
whitespace (a tab is a word boundary, not part of a word ``"a\tb"``). Every normaliser applies a Unicode
normal form first (NFC by default), so ``"e\\u0301"`` and ``"é"`` are the same word.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields

__all__ = ["Normalizer"]

_FORMS = ("NFC", "NFD", "NFKC", "NFKD")
# U+00A0 no-break space, U+202F narrow no-break space (French typography before ! ? : ;).
_NBSP = str.maketrans({"\u00a0": " ", "\u202f": " "})
_SPACE_RUN = re.compile(r"\s+")


@dataclass(frozen=True)
class Normalizer:
    """How raw text is normalised before tokenisation.

    Attributes:
        unicode_form: ``"NFC"`` (default), ``"NFD"``, ``"NFKC"``, ``"NFKD"`` or None.
        lowercase: lower-case the text.
        nbsp_to_space: replace U+00A0 and U+202F by an ordinary space.
        space_before_punct: characters that get a space inserted before them when the previous
            character is not a space (the book uses ``",.!?"``); empty for none.
        collapse_whitespace: strip the ends and turn every run of whitespace into one space.
    """

    unicode_form: str | None = "NFC"
    lowercase: bool = False
    nbsp_to_space: bool = False
    space_before_punct: str = ""
    collapse_whitespace: bool = True

    def __post_init__(self) -> None:
        if self.unicode_form is not None and self.unicode_form not in _FORMS:
            raise ValueError(
                f"unicode_form must be one of {_FORMS} or None, got {self.unicode_form!r}"
            )
        for name in ("lowercase", "nbsp_to_space", "collapse_whitespace"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.space_before_punct, str):
            raise TypeError(
                f"space_before_punct must be a str of characters, got {self.space_before_punct!r}"
            )
        if any(c.isspace() for c in self.space_before_punct):
            raise ValueError(
                f"space_before_punct must not contain whitespace, got {self.space_before_punct!r}"
            )
        pattern = None
        if self.space_before_punct:
            # A punctuation mark preceded by a non-space character gets a space before it;
            # lookbehind on the original text, exactly as the book's character loop.
            pattern = re.compile(r"(?<=[^ ])([" + re.escape(self.space_before_punct) + r"])")
        object.__setattr__(self, "_punct", pattern)

    @classmethod
    def book(cls) -> Normalizer:
        """The d2l ``preprocess_nmt`` normalisation, plus NFC and whitespace collapsing.

        The book splits words on single spaces only, so a tab or a newline stays inside a word
        (``"a\tb."`` is the one word ``"a\tb"``); here every run of whitespace becomes one space
        and the ends are stripped. Words come out as the book's wherever its words have no
        whitespace inside; text already normalised (the bundled corpus) is unchanged.
        """
        return cls(
            unicode_form="NFC",
            lowercase=True,
            nbsp_to_space=True,
            space_before_punct=",.!?",
            collapse_whitespace=True,
        )

    def __call__(self, text: str) -> str:
        """Normalise one string.

        Raises:
            TypeError: ``text`` is not a str.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if self.unicode_form is not None and not text.isascii():
            text = unicodedata.normalize(self.unicode_form, text)
        if self.nbsp_to_space:
            text = text.translate(_NBSP)
        if self.lowercase:
            text = text.lower()
        if self._punct is not None:  # type: ignore[attr-defined]
            text = self._punct.sub(r" \1", text)  # type: ignore[attr-defined]
        if self.collapse_whitespace:
            text = _SPACE_RUN.sub(" ", text).strip()
        return text

    def pairs(self, pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """Normalise both sides of every ``(source, target)`` pair."""
        return [(self(s), self(t)) for s, t in pairs]

    def to_dict(self) -> dict:
        """A JSON-serialisable dict; :meth:`from_dict` rebuilds an equal normaliser."""
        return {"type": "qkv.Normalizer", **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> Normalizer:
        """Rebuild a normaliser saved by :meth:`to_dict`.

        Raises:
            ValueError: ``d`` has keys a Normalizer does not know.
        """
        if not isinstance(d, dict):
            raise TypeError(f"d must be a dict, got {type(d).__name__}")
        d = {k: v for k, v in d.items() if k != "type"}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"d has unknown Normalizer keys {unknown}; known: {sorted(known)}")
        return cls(**d)
