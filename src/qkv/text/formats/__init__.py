"""The reader and writer of every file format: each module names its format (``NAME``), the
file extensions that choose it (``EXTENSIONS``) and its reader ``read(data: bytes, *, source,
target, split) -> Document``."""

from __future__ import annotations

from collections.abc import Callable

from ..documents import Document
from . import catalogs, html, markdown, office, plain, subtitles

__all__ = ["EXTENSIONS", "FORMATS"]

_MODULES = (plain, html)

#: format name -> reader
FORMATS: dict[str, Callable[..., Document]] = {
    **{m.NAME: m.read for m in _MODULES},
    "srt": subtitles.read_srt,
    "vtt": subtitles.read_vtt,
    "po": catalogs.read_po,
    "xliff": catalogs.read_xliff,
    "docx": office.read_docx,
    "odt": office.read_odt,
    "md": markdown.read_md,
}
#: file extension (lower case, with the dot) -> format name
EXTENSIONS: dict[str, str] = {
    **{ext: m.NAME for m in _MODULES for ext in m.EXTENSIONS},
    ".srt": "srt",
    ".vtt": "vtt",
    ".po": "po",
    ".pot": "po",
    ".xliff": "xliff",
    ".xlf": "xliff",
    ".docx": "docx",
    ".odt": "odt",
    ".md": "md",
    ".markdown": "md",
}
