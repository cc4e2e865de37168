"""Small HTML pieces a notebook shows for qkv's objects: a card of labelled rows.

Styles are inline attributes, never a style sheet, so nothing leaks into the host page.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

__all__ = ["CardDisplay", "card_html"]

_CELL = "border:1px solid #ccc;padding:2px 8px;text-align:left;vertical-align:top"


def card_html(title: str, rows: Sequence[tuple[str, str]]) -> str:
    """``title`` over a two-column table of ``(label, value)`` rows, every text escaped."""
    body = "".join(
        f'<tr><th style="{_CELL};font-weight:600">{html.escape(label)}</th>'
        f'<td style="{_CELL}">{html.escape(value)}</td></tr>'
        for label, value in rows
    )
    return (
        f'<div><b>{html.escape(title)}</b><table style="border-collapse:collapse;'
        f'margin:4px 0">{body}</table></div>'
    )


class CardDisplay:
    """Mixed into an object that lists its card as ``card_rows()`` (``(label, value)`` pairs):
    a notebook shows it as a card titled with the class's name (every qkv translation engine)."""

    def card_rows(self) -> list[tuple[str, str]]:
        raise NotImplementedError

    def _repr_html_(self) -> str:
        return card_html(type(self).__name__, self.card_rows())
