"""Localisation catalogs: gettext (``.po``, ``.pot``) and XLIFF 1.2 (``.xliff``, ``.xlf``),
read and written by the Translate Toolkit (the library behind Pootle and Weblate).

As a translator expects a machine's first draft: every entry without a translation is filled
and marked for review (gettext's ``fuzzy`` flag; XLIFF's ``state="needs-review-translation"``
with ``state-qualifier="leveraged-mt"`` and ``approved="no"``), so ``msgfmt`` leaves it out
until a person has looked; an entry already translated (fuzzy or not), the header and the
obsolete entries are kept as they are, with every comment, reference and flag. A plural entry
gets its singular's translation in ``msgstr[0]`` and its plural's in every other form the
header's ``Plural-Forms`` asks for (a language of one form, as Chinese: the plural's). An
empty ``Language`` header is set to the target language.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..._errors import SettingError
from ..documents import Document
from ..layout import DEFAULT_SPLIT

__all__ = ["read_po", "read_xliff"]

_XLIFF_NS = "urn:oasis:names:tc:xliff:document:1.2"


def _parse(kind: str, data: bytes) -> Any:
    from translate.storage import pypo, xliff

    store = {"po": pypo.pofile, "xliff": xliff.xlifffile}[kind]
    try:
        return store.parsestring(data)
    except Exception as e:  # the toolkit's parsers raise many kinds
        raise SettingError(
            "file", f"expected a {kind} catalog, got one it cannot read: {e}"
        ) from None


def _plurals(store: Any) -> int:
    """How many forms the header's ``Plural-Forms`` asks for (2 when it does not say)."""
    try:
        n = int(store.getheaderplural()[0])
    except (TypeError, ValueError, AttributeError):
        return 2
    return n if n >= 1 else 2


def _todo(unit: Any) -> bool:
    """An entry to fill: not the header, not obsolete, with a source and no translation."""
    if unit.isheader() or unit.isobsolete() or not str(unit.source).strip():
        return False
    target = unit.target
    strings = getattr(target, "strings", None) or [target or ""]
    return not any(str(s).strip() for s in strings)


def _catalog(
    fmt: str, kind: str, data: bytes, mark: Callable[[Any], None], plan: dict[str, Any]
) -> Document:
    store = _parse(kind, data)
    units = [u for u in store.units if _todo(u)]
    texts: list[str] = []
    for u in units:
        texts += [str(s) for s in u.source.strings] if u.hasplural() else [str(u.source)]
    forms = _plurals(store) if kind == "po" else 2
    target = plan.get("target")

    def write(translated: list[str]) -> bytes:
        from translate.misc.multistring import multistring

        it = iter(translated)
        for u in units:
            if u.hasplural():
                got = [next(it) for _ in u.source.strings]
                filled = [got[0]] + [got[-1]] * (forms - 1) if forms > 1 else [got[-1]]
                u.target = multistring(filled)
            else:
                u.target = next(it)
            mark(u)
        if kind == "po" and target and not (store.parseheader().get("Language") or "").strip():
            store.updateheader(add=True, Language=target)
        return bytes(store)

    return Document(fmt, texts, write, **plan)


def _po_mark(unit: Any) -> None:
    unit.markfuzzy(True)


def _xliff_mark(unit: Any) -> None:
    unit.markfuzzy(True)
    el = unit.xmlelement.find(f"{{{_XLIFF_NS}}}target")
    if el is not None:
        el.set("state", "needs-review-translation")
        el.set("state-qualifier", "leveraged-mt")


def read_po(
    data: bytes,
    *,
    source: str | None = None,
    target: str | None = None,
    split: str = DEFAULT_SPLIT,
    fmt: str = "po",
) -> Document:
    """A gettext catalog (``.po`` or ``.pot``): its untranslated entries to fill."""
    plan = {"source": source, "target": target, "split": split}
    return _catalog(fmt, "po", data, _po_mark, plan)


def read_xliff(
    data: bytes,
    *,
    source: str | None = None,
    target: str | None = None,
    split: str = DEFAULT_SPLIT,
) -> Document:
    """An XLIFF 1.2 file: its units without a target to fill."""
    plan = {"source": source, "target": target, "split": split}
    return _catalog("xliff", "xliff", data, _xliff_mark, plan)
