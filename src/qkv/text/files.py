"""Files of every format read, translated and written: :func:`read_document`,
:func:`translate_document`, :func:`translate_file`.

>>> doc = read_document(b"Hi. Bye.\\n", "txt", source="en", target="fr")
>>> doc.segments
('Hi.', 'Bye.')
>>> doc.render(["Salut.", "Au revoir."])
b'Salut. Au revoir.\\n'

:func:`translate_document` does the three steps with a translator (an engine, or a function
from a list of segments to their translations); :func:`translate_file` reads and writes paths
(the output written whole or not at all).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._atomic import atomic_file
from .._errors import SettingError
from .documents import Align, Document, Limits, Translate
from .formats import EXTENSIONS, FORMATS
from .layout import DEFAULT_SPLIT

__all__ = ["FORMATS", "format_of", "read_document", "translate_document", "translate_file"]


def format_of(path: str | os.PathLike[str]) -> str:
    """The format of a file name by its extension (``"notes.txt"`` -> ``"txt"``).

    Raises:
        SettingError (``format``): an extension no reader takes."""
    ext = Path(path).suffix.lower()
    if ext not in EXTENSIONS:
        known = ", ".join(sorted(EXTENSIONS))
        raise SettingError("format", f"expected a file ending in one of {known}, got {str(path)!r}")
    return EXTENSIONS[ext]


def _check_format(fmt: object) -> str:
    if fmt not in FORMATS:
        raise SettingError("format", f"expected one of {', '.join(FORMATS)}, got {fmt!r}")
    return str(fmt)


def read_document(
    data: bytes | str | os.PathLike[str],
    fmt: str | None = None,
    *,
    source: str | None = None,
    target: str | None = None,
    split: str = DEFAULT_SPLIT,
    limits: Limits | None = None,
) -> Document:
    """Read a document: ``data`` is the file's bytes (or, as a ``str``, text: UTF-8), or a
    path (``os.PathLike``) read from disk; ``fmt`` one of :data:`FORMATS` (default: the
    path's extension). ``limits`` are checked before the document is returned.

    Raises:
        SettingError: a bad ``format``, ``split`` or language, a limit passed (named by the
            limit: ``max_bytes``, ``max_chars``, ``max_segments``), or a file its format's
            reader cannot read (``file``).
    """
    limits = limits or Limits()
    if isinstance(data, os.PathLike):
        path = Path(data)
        fmt = format_of(path) if fmt is None else fmt
        size = path.stat().st_size
        limits.check_bytes(size)
        data = path.read_bytes()
    elif isinstance(data, str):
        data = data.encode("utf-8")
    elif not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"data: expected bytes, str or a path, got {type(data).__name__}")
    if fmt is None:
        raise SettingError("format", "expected a format when data is not a path, got None")
    read = FORMATS[_check_format(fmt)]
    limits.check_bytes(len(data))
    doc = read(bytes(data), source=source, target=target, split=split)
    limits.check_plan(doc.plan)
    return doc


def _callables(translator: Any) -> tuple[Translate, Align | None]:
    """``(translate, align)`` of an engine (its ``translate_segments`` and, when it has
    attention, ``align_segments``) or of a plain function (no alignment)."""
    if hasattr(translator, "translate_segments"):
        aligns = getattr(translator, "aligns", getattr(translator, "has_attention", False))
        align = translator.align_segments if aligns else None
        return translator.translate_segments, align
    if callable(translator):
        return translator, None
    raise TypeError(
        "translator: expected an engine (qkv.inference.TextTranslator) or a function from a "
        f"list of segments to their translations, got {type(translator).__name__}"
    )


def translate_document(
    data: bytes | str | os.PathLike[str],
    translator: Any,
    fmt: str | None = None,
    *,
    source: str | None = None,
    target: str | None = None,
    split: str = DEFAULT_SPLIT,
    limits: Limits | None = None,
) -> bytes:
    """Read, translate and write one document: the translated file's bytes.

    ``translator`` is an engine (any :class:`qkv.inference.TextTranslator`: its segments
    translated in one call; inline HTML markup placed by its cross-attention where it has
    attention) or a function from a list of segments to their translations. ``source`` and
    ``target`` default to the engine's languages. See :func:`read_document` for the rest.
    """
    langs = getattr(translator, "languages", None) or (None, None)
    source = langs[0] if source is None else source
    target = langs[1] if target is None else target
    translate, align = _callables(translator)
    doc = read_document(data, fmt, source=source, target=target, split=split, limits=limits)
    segments = list(doc.segments)
    translations = list(translate(segments)) if segments else []
    alignments = None
    if align is not None and doc.aligned:
        picked = list(doc.aligned)
        found = align([segments[i] for i in picked], [translations[i] for i in picked])
        alignments = dict(zip(picked, found))
    return doc.render(translations, alignments)


def translate_file(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    translator: Any,
    fmt: str | None = None,
    **kwargs: Any,
) -> Path:
    """Translate the file ``src`` into ``out`` (written whole or not at all; never ``src``
    itself), the format by ``src``'s extension unless ``fmt`` says; the keywords of
    :func:`translate_document`. Returns ``out``."""
    src_p, out_p = Path(src), Path(out)
    if out_p.exists() and src_p.exists() and os.path.samefile(src_p, out_p):
        raise SettingError("out", f"{str(out)!r} is the source file; choose another")
    data = translate_document(src_p, translator, fmt, **kwargs)
    with atomic_file(out_p, "wb") as f:
        f.write(data)
    return out_p
