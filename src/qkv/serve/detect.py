"""Language detection as LibreTranslate's API answers it: ``POST /detect`` and ``source: "auto"``.

Detection is :mod:`qkv.data.languages`' (``py3langid``, its model inside its wheel: offline),
among the languages the server serves, as LibreTranslate detects among its installed languages.
A confidence is a percentage, 0 to 100, as LibreTranslate gives it: the probability of the
language among those served. Several texts are judged together: each language's probabilities
averaged over the texts, weighted by their length (LibreTranslate's batch rule).

>>> detect_answer(["Le chat dort sur le canapé."], ["en", "fr", "de"])[0]["language"]
'fr'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..data.languages import LANGUAGES, base_language, rank_languages

__all__ = ["DEFAULT_LANGUAGE", "detect_answer", "detected_language", "needs"]

#: what LibreTranslate answers, with confidence 0, when no text has a letter to judge
DEFAULT_LANGUAGE = "en"


def needs() -> list[str]:
    """The modules detection imports (for :func:`qkv._deps.require`)."""
    return ["py3langid"]


def _served_bases(languages: Sequence[str]) -> dict[str, str]:
    """ISO 639-1 language -> the served code it names (``zh`` -> ``zh-CN`` when only that is
    served); codes that are not ISO 639-1 ones (``x-custom``) cannot be detected."""
    out: dict[str, str] = {}
    for code in languages:
        try:
            base = base_language(code)
        except ValueError:
            continue
        if base in LANGUAGES and (base not in out or code.lower() == base):
            out[base] = code
    return out


def _fallback(languages: Sequence[str]) -> str:
    return DEFAULT_LANGUAGE if DEFAULT_LANGUAGE in languages else sorted(languages)[0]


def detect_answer(texts: Sequence[str], languages: Sequence[str]) -> list[dict[str, Any]]:
    """``POST /detect``'s answer for ``texts`` among the served ``languages``: a list of
    ``{"language", "confidence"}``, most likely first, confidences in percent (rounded to two
    decimals; languages at 0 left out). When no text has a letter (or no served language can be
    detected): ``[{"language": "en", "confidence": 0.0}]`` as LibreTranslate answers (the first
    served language when English is not served).

    Raises:
        MissingDependency: py3langid is not installed (``pip install 'qkv[langid]'``).
    """
    if not languages:
        raise ValueError("languages: expected the served language codes, got none")
    bases = _served_bases(languages)
    totals: dict[str, float] = {}
    weight = 0
    if bases:
        for text in texts:
            ranked = rank_languages(text, candidates=list(bases))
            if not ranked:
                continue
            n = len(text)
            weight += n
            for code, p in ranked:
                totals[code] = totals.get(code, 0.0) + p * n
    found = [
        {"language": bases[code], "confidence": round(100.0 * total / weight, 2)}
        for code, total in totals.items()
    ]
    found = [d for d in found if d["confidence"] > 0]
    found.sort(key=lambda d: (-d["confidence"], d["language"]))
    return found or [{"language": _fallback(languages), "confidence": 0.0}]


def detected_language(texts: Sequence[str], languages: Sequence[str]) -> dict[str, Any]:
    """The language of ``texts`` taken together (``source: "auto"``): the first of
    :func:`detect_answer`, ``{"language", "confidence"}`` (confidence 0: nothing to judge)."""
    return detect_answer(texts, languages)[0]
