"""Seeing attention: heatmaps (matplotlib, Agg) and a self-contained HTML viewer.

Everything here takes plain data: arrays or tensors of weights and lists of tokens.

* :func:`show_heatmaps` — the book's grid of heatmaps ``(rows, cols, Lq, Lk)`` with a colour bar;
* :class:`AttentionKind` — one kind of attention (per-layer weights ``(H, Lq, Lk)`` plus query and
  key tokens); :func:`translation_attention` builds a translation's encoder / decoder / cross kinds;
* :func:`plot_attention` — those kinds as a static grid (PNG, SVG, PDF);
* :func:`attention_html` / :func:`save_attention_html` — the interactive viewer, one HTML file
  (bounded: :func:`attention_cells` counts the weights it embeds, :data:`MAX_CELLS` caps them);
  :func:`attention_payload` is its data, which the page of ``qkv serve`` draws in the same viewer;
  :func:`attention_fragment` / :class:`AttentionViewer` embed it in a notebook's output or any page
  (several per page, styles scoped to their own box);
* :func:`save_attention` — either of the two, chosen by the file's extension.

matplotlib is needed only by the static figures (``pip install 'qkv[viz]'``).
"""

from .data import AttentionKind, translation_attention
from .heatmaps import new_figure, plot_attention, save_figure, show_heatmaps
from .html import (
    MAX_CELLS,
    WARN_CELLS,
    AttentionViewer,
    attention_cells,
    attention_fragment,
    attention_html,
    attention_payload,
    save_attention,
    save_attention_html,
)

__all__ = [
    "MAX_CELLS",
    "WARN_CELLS",
    "AttentionKind",
    "AttentionViewer",
    "attention_cells",
    "attention_fragment",
    "attention_html",
    "attention_payload",
    "new_figure",
    "plot_attention",
    "save_attention",
    "save_attention_html",
    "save_figure",
    "show_heatmaps",
    "translation_attention",
]
