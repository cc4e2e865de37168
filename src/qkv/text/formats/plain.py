"""Plain text (``.txt``): every line a paragraph, its layout kept; UTF-8 (a byte-order mark
kept)."""

from __future__ import annotations

from ..._errors import SettingError
from ..documents import Document

__all__ = ["EXTENSIONS", "NAME", "decode_text", "decode_utf8", "read"]

NAME = "txt"
EXTENSIONS = (".txt", ".text")

_BOM = "\ufeff"


def decode_utf8(data: bytes, what: str = "file") -> str:
    """``data`` as UTF-8 text, else a :class:`SettingError` named ``what`` saying where."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SettingError(what, f"expected UTF-8 text, got {e.reason} at byte {e.start}") from None


def decode_text(data: bytes) -> tuple[str, bool]:
    """``(text, bom)``: ``data`` as UTF-8 text without its byte-order mark, and whether it had
    one (:func:`decode_utf8`'s error otherwise)."""
    text = decode_utf8(data)
    bom = text.startswith(_BOM)
    return (text[1:] if bom else text), bom


def read(data: bytes, **plan: str | None) -> Document:
    """A ``.txt`` file: one text, its lines paragraphs (``\\r\\n`` line ends kept)."""
    body, bom = decode_text(data)

    def write(texts: list[str]) -> bytes:
        return ((_BOM if bom else "") + texts[0]).encode("utf-8")

    return Document("txt", [body], write, **plan)  # type: ignore[arg-type]
