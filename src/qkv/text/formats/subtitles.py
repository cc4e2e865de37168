"""Subtitles: SubRip (``.srt``) and WebVTT (``.vtt``), every cue's text translated, the rest
kept byte for byte (numbers, timings, cue settings, the ``WEBVTT`` header, ``NOTE``,
``STYLE`` and ``REGION`` blocks, blank lines, line ends).

A cue's lines are one text (a sentence often runs over two lines), its translation written
back on as many lines as the cue had, as even as its words allow. Inline tags (``<i>``,
``<b>``, WebVTT's ``<v Speaker>``, ``<c.class>``) are kept and put back on the words they
covered, as in HTML (:mod:`qkv.text.formats.html`); a cue with tags inside keeps one line.
Each cue is translated by itself: its timing is the unit a viewer reads.
"""

from __future__ import annotations

from ..layout import DEFAULT_SPLIT
from .html import HtmlDocument, _Block, _escape, fragment
from .plain import decode_text

__all__ = ["read_srt", "read_vtt"]

#: blocks of a WebVTT file that hold no cue
_VTT_KEPT = ("WEBVTT", "NOTE", "STYLE", "REGION")


def _blocks(text: str) -> list[list[str]]:
    """``text``'s lines (with their ends) in blocks, each blank line a block of its own."""
    out: list[list[str]] = []
    block: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.strip():
            block.append(line)
            continue
        if block:
            out.append(block)
            block = []
        out.append([line])
    if block:
        out.append(block)
    return out


def _pieces(text: str, vtt: bool) -> tuple[list[str | _Block], str]:
    """The kept strings and cue texts of a subtitle file, and its line end."""
    newline = "\r\n" if "\r\n" in text else "\n"
    pieces: list[str | _Block] = []
    for block in _blocks(text):
        timing = next((k for k, line in enumerate(block) if "-->" in line), None)
        kept = vtt and block[0].lstrip("\ufeff").startswith(_VTT_KEPT)
        if timing is None or kept or timing == len(block) - 1:
            pieces.append("".join(block))
            continue
        pieces.append("".join(block[: timing + 1]))
        lines = block[timing + 1 :]
        end = lines[-1][len(lines[-1].rstrip("\r\n")) :]
        cue = [line.rstrip("\r\n") for line in lines]
        found = fragment("\n".join(cue))
        blocks = [p for p in found if isinstance(p, _Block)]
        if len(blocks) == 1 and len(found) == 1:
            blocks[0].lines = len(cue)
        pieces += found
        pieces.append(end)
    return pieces, newline


def _read(data: bytes, fmt: str, vtt: bool, **plan: str | None) -> HtmlDocument:
    text, bom = decode_text(data)
    pieces, newline = _pieces(text, vtt)
    escape = _escape if vtt else str
    return HtmlDocument(pieces, bom, fmt=fmt, escape=escape, newline=newline, **plan)


def read_srt(
    data: bytes,
    *,
    source: str | None = None,
    target: str | None = None,
    split: str = DEFAULT_SPLIT,
) -> HtmlDocument:
    """A SubRip file (UTF-8): its cues' text to translate (see the module)."""
    return _read(data, "srt", False, source=source, target=target, split=split)


def read_vtt(
    data: bytes,
    *,
    source: str | None = None,
    target: str | None = None,
    split: str = DEFAULT_SPLIT,
) -> HtmlDocument:
    """A WebVTT file: its cues' text to translate (see the module)."""
    return _read(data, "vtt", True, source=source, target=target, split=split)
