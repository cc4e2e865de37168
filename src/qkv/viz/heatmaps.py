"""Static pictures with matplotlib's Agg backend: the book's ``show_heatmaps`` and attention grids.

Figures are built as :class:`matplotlib.figure.Figure` objects attached to an Agg canvas, never
through ``pyplot``: nothing needs a display, and no global figure list keeps them alive.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from .data import AttentionKind, as_kinds, to_numpy

__all__ = ["FORMATS", "new_figure", "plot_attention", "save_figure", "show_heatmaps"]

#: file extensions :func:`save_figure` writes, and matplotlib's name for each
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}

# plot_attention's sizes, in inches: a token gets CELL until a panel reaches PANEL_MAX (then the
# cells shrink), panels are at least PANEL_MIN, and the whole figure stays within FIGURE_MAX on
# each side (panels shrink below PANEL_MIN if needed) -- far inside Agg's 2**16-pixel limit.
CELL = 0.22
PANEL_MIN = 2.0
PANEL_MAX = 4.0
FIGURE_MAX = 48.0
# a tick label of fontsize 8 needs about this much room (inches) along its axis
_LABEL_ROOM = 0.13

# Tokens and names are data, not mathtext: "$5" must be drawn as "$5", not parsed (and fail).
_LITERAL = {"parse_math": False}


#: fonts tried first for the characters the default font lacks (CJK, then broad Unicode fonts)
FALLBACK_FONTS = (
    "Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans CJK KR", "Noto Sans CJK TC",
    "Noto Sans", "Noto Sans Arabic", "Noto Sans Hebrew", "Noto Sans Devanagari",
    "Noto Sans Thai", "WenQuanYi Zen Hei", "Droid Sans Fallback", "Arial Unicode MS",
)  # fmt: skip
#: the Debian package that brings the glyphs of each script qkv is used with
FONT_PACKAGES = {"CJK": "fonts-noto-cjk", "other": "fonts-noto-core"}
_warned: set[str] = set()


@cache
def _coverage(path: str) -> frozenset[int]:
    """The code points a font file has glyphs for (its first face)."""
    from matplotlib.ft2font import FT2Font

    try:
        return frozenset(FT2Font(path).get_charmap())
    except (OSError, RuntimeError, ValueError):  # an unreadable font: it covers nothing
        return frozenset()


_scanned: list[bool] = []


def _add_system_fonts() -> bool:
    """Add the system's fonts that matplotlib's cached list lacks (a font package installed
    after matplotlib built its cache, as ``make test`` installs fonts-noto-cjk), once per
    process; whether any was added."""
    if _scanned:
        return False
    _scanned.append(True)
    from matplotlib import font_manager

    known = {f.fname for f in font_manager.fontManager.ttflist}
    added = False
    for path in font_manager.findSystemFonts():
        if path not in known and path.lower().endswith((".ttf", ".otf", ".ttc")):
            try:
                font_manager.fontManager.addfont(path)
                added = True
            except (OSError, RuntimeError, ValueError):  # a font matplotlib cannot read
                continue
    return added


def _is_cjk(c: str) -> bool:
    o = ord(c)
    return (
        0x2E80 <= o <= 0x9FFF  # radicals, kana, CJK symbols and ideographs
        or 0xAC00 <= o <= 0xD7AF  # Hangul syllables
        or 0xF900 <= o <= 0xFAFF
        or 0xFF00 <= o <= 0xFFEF  # full-width forms
        or 0x20000 <= o <= 0x3FFFF
    )


def font_family(texts: Iterable[str]) -> list[str]:
    """The font families to draw ``texts`` with: matplotlib's default sans-serif font, then,
    for the characters it has no glyph for (Chinese, Japanese, Korean, ...), installed fonts
    that have them (:data:`FALLBACK_FONTS` first), as matplotlib's font fallback takes a list.

    When no installed font has some of the characters, a warning (once per process) names the
    Debian package that brings them (``fonts-noto-cjk`` for CJK); they draw as boxes.
    """
    from matplotlib import font_manager

    chars = {c for t in texts for c in t if not c.isspace() and c.isprintable()}
    default = font_manager.findfont(font_manager.FontProperties(family=["sans-serif"]))
    families = [font_manager.FontProperties(fname=default).get_name()]
    missing = {c for c in chars if ord(c) not in _coverage(default)}
    if not missing:
        return families
    for scan in (False, True):
        if scan and not _add_system_fonts():
            break
        # "Last Resort" maps every character to a placeholder box: no glyph at all
        fonts = {
            f.name: f.fname
            for f in font_manager.fontManager.ttflist
            if not f.name.startswith("Last Resort")
        }
        order = [n for n in FALLBACK_FONTS if n in fonts]
        order += sorted(set(fonts) - set(FALLBACK_FONTS))
        for name in order:
            has = {c for c in missing if ord(c) in _coverage(fonts[name])}
            if has and name not in families:
                families.append(name)
                missing -= has
            if not missing:
                return families
    if missing:
        kind = "CJK" if any(_is_cjk(c) for c in missing) else "other"
        if kind not in _warned:
            _warned.add(kind)
            sample = "".join(sorted(missing)[:8])
            warnings.warn(
                f"no installed font has glyphs for {sample!r} (they are drawn as boxes): "
                f"install Debian's {FONT_PACKAGES[kind]} (apt-get install {FONT_PACKAGES[kind]}) "
                "or another font with them",
                UserWarning,
                stacklevel=3,
            )
    return families


def _font(*texts: Iterable[str] | None) -> dict[str, Any]:
    """Text keywords drawing ``texts`` (tick labels, titles) with fonts that have their glyphs:
    nothing when the default font has every glyph (matplotlib's default font is kept)."""
    fam = font_family(t for group in texts if group for t in group)
    return {"fontfamily": fam} if len(fam) > 1 else {}


def _mpl() -> Any:
    try:
        import matplotlib
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "qkv.viz needs matplotlib: pip install 'qkv[viz]' (or pip install matplotlib)"
        ) from e
    return matplotlib


def new_figure(figsize: tuple[float, float], *, layout: str | None = None) -> Any:
    """A :class:`matplotlib.figure.Figure` on an Agg canvas (headless; no pyplot state) that a
    notebook shows inline without ``%matplotlib inline`` (it has ``_repr_png_``).

    ``layout`` is matplotlib's layout engine name (e.g. ``"constrained"``) or None.
    """
    _mpl()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from ._figure import DisplayFigure

    if (
        not isinstance(figsize, Sequence)
        or len(figsize) != 2
        or not all(isinstance(v, (int, float)) and v > 0 for v in figsize)
    ):
        raise ValueError(f"figsize: expected (width, height) in inches > 0, got {figsize!r}")
    fig = DisplayFigure(figsize=tuple(float(v) for v in figsize), layout=layout)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Any, path: str | Path, *, dpi: int = 150) -> Path:
    """Write ``fig`` to ``path`` as PNG, SVG or PDF, chosen by the extension; returns the path.

    The parent folder is created when missing.
    """
    p = Path(path)
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise ValueError(
            f"path: expected a file name ending in {', '.join(FORMATS)}, got {str(path)!r}"
        )
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, format=fmt, dpi=dpi, bbox_inches="tight")
    return p


def _labels(labels: Sequence[str] | None, n: int, name: str) -> list[str] | None:
    if labels is None:
        return None
    if isinstance(labels, (str, bytes)) or not isinstance(labels, Sequence):
        raise TypeError(f"{name}: expected a sequence of {n} labels, got {type(labels).__name__}")
    if len(labels) != n:
        raise ValueError(f"{name}: expected {n} labels (one per position), got {len(labels)}")
    return [str(x) for x in labels]


def _tick_step(n: int, most: int = 40) -> int:
    return max(1, math.ceil(n / most))


def show_heatmaps(
    matrices: Any,
    xlabel: str,
    ylabel: str,
    titles: Sequence[str] | None = None,
    figsize: tuple[float, float] = (2.5, 2.5),
    cmap: str = "Reds",
    *,
    xticklabels: Sequence[str] | None = None,
    yticklabels: Sequence[str] | None = None,
    path: str | Path | None = None,
) -> Any:
    """Draw a grid of heatmaps with one shared colour bar, as the book's ``show_heatmaps``.

    Args:
        matrices: ``(rows, cols, Lq, Lk)`` — row ``r``, column ``c`` of the grid shows
            ``matrices[r, c]`` with queries down and keys across.  A ``(cols, Lq, Lk)`` or
            ``(Lq, Lk)`` input is read as one row / one picture.  Tensor, array or nested list.
        xlabel: label under the bottom row (the keys' axis).
        ylabel: label left of the first column (the queries' axis).
        titles: one title per column, or None. Titles and tick labels are drawn literally (a
            ``$`` is a dollar sign, not mathtext); ``xlabel``/``ylabel`` keep matplotlib's
            mathtext.
        figsize: the whole figure's size in inches (as in the book).
        cmap: a matplotlib colour map name.
        xticklabels: ``Lk`` key tokens for the x axis, or None for plain positions.
        yticklabels: ``Lq`` query tokens for the y axis, or None.
        path: where to save the figure (``.png``, ``.svg`` or ``.pdf``), or None.

    Returns:
        The :class:`matplotlib.figure.Figure`.

    Unlike the book, every panel shares one colour scale (the grid's minimum to maximum), so the
    colour bar is right for all of them, not only for the last one drawn.
    """
    m = to_numpy(matrices, "matrices")
    if m.ndim not in (2, 3, 4):
        raise ValueError(
            f"matrices: expected shape (rows, cols, Lq, Lk) (or (cols, Lq, Lk), (Lq, Lk)), "
            f"got {m.shape}"
        )
    while m.ndim < 4:
        m = m[None]
    rows, cols, Lq, Lk = m.shape
    if 0 in m.shape:
        raise ValueError(f"matrices: expected no empty axis, got shape {m.shape}")
    if not np.isfinite(m).all():
        raise ValueError("matrices: expected finite values, found NaN or inf")
    for name, v in (("xlabel", xlabel), ("ylabel", ylabel), ("cmap", cmap)):
        if not isinstance(v, str):
            raise TypeError(f"{name}: expected a str, got {type(v).__name__}")
    if titles is not None:
        if isinstance(titles, (str, bytes)) or not isinstance(titles, Sequence):
            raise TypeError(f"titles: expected a sequence of {cols} str, got {type(titles)}")
        if len(titles) != cols:
            raise ValueError(f"titles: expected {cols} titles (one per column), got {len(titles)}")
    xt = _labels(xticklabels, Lk, "xticklabels")
    yt = _labels(yticklabels, Lq, "yticklabels")
    from matplotlib import colormaps

    if cmap not in colormaps:
        raise ValueError(f"cmap: expected a matplotlib colour map name, got {cmap!r}")

    fig = new_figure(figsize, layout="constrained")
    text = {**_LITERAL, **_font(xt, yt, titles)}
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)
    vmin, vmax = float(m.min()), float(m.max())
    if vmax == vmin:
        vmax = vmin + 1.0
    image = None
    for r in range(rows):
        for c in range(cols):
            ax = axes[r, c]
            image = ax.imshow(m[r, c], cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
            if r == rows - 1:
                ax.set_xlabel(xlabel)
            if c == 0:
                ax.set_ylabel(ylabel)
            if titles is not None and r == 0:
                ax.set_title(titles[c], **text)
            if xt is not None:
                step = _tick_step(Lk)
                ax.set_xticks(range(0, Lk, step), xt[::step], rotation=90, **text)
            if yt is not None:
                step = _tick_step(Lq)
                ax.set_yticks(range(0, Lq, step), yt[::step], **text)
    fig.colorbar(image, ax=axes, shrink=0.6)
    if path is not None:
        save_figure(fig, path)
    return fig


def plot_attention(
    kinds: AttentionKind | Sequence[AttentionKind],
    *,
    layers: Sequence[int] | None = None,
    head: int | str = "mean",
    cmap: str = "Reds",
    path: str | Path | None = None,
) -> Any:
    """One heatmap per kind (rows) and layer (columns), tokens on the axes, shared colour bar.

    The static counterpart of :func:`qkv.viz.attention_html`, from the same data.

    Args:
        kinds: an :class:`AttentionKind` or a list of them (e.g. from
            :func:`qkv.viz.translation_attention`); each kind's weights are ``(H, Lq, Lk)``
            per layer, queries drawn down, keys across.
        layers: which layers to draw (indices; default all). A kind with fewer layers leaves
            its extra panels empty.
        head: a head index or ``"mean"`` (the average over heads).
        cmap: a matplotlib colour map name.
        path: where to save (``.png``, ``.svg`` or ``.pdf``), or None.

    Returns:
        The :class:`matplotlib.figure.Figure`.

    The figure's size is bounded whatever the lengths: a panel is ``CELL`` (0.22) inches a
    token up to ``PANEL_MAX`` (4) inches a side, and the whole figure at most ``FIGURE_MAX``
    (48) inches a side, panels shrinking to fit. Tick labels are thinned to what the panel has
    room for (every token up to about 30 tokens in a 4-inch panel); tokens and kind names are
    drawn literally (no mathtext).
    """
    ks = as_kinds(kinds)
    depth = max(k.num_layers for k in ks)
    if layers is None:
        chosen = list(range(depth))
    else:
        if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence) or not layers:
            raise TypeError(f"layers: expected a non-empty sequence of ints, got {layers!r}")
        chosen = list(layers)
        for i in chosen:
            if isinstance(i, bool) or not isinstance(i, int) or not -depth <= i < depth:
                raise ValueError(f"layers: expected indices in [{-depth}, {depth}), got {i!r}")
    mats = [
        [k.matrix(i, head) if -k.num_layers <= i < k.num_layers else None for i in chosen]
        for k in ks
    ]
    vmax = max(float(m.max()) for row in mats for m in row if m is not None) or 1.0
    # panel sizes (inches, margins for labels included), capped so that the figure stays small
    # and quick to draw at any length
    widths = [min(PANEL_MAX, max(PANEL_MIN, CELL * k.shape[1])) + 1.0 for k in ks]
    heights = [min(PANEL_MAX, max(PANEL_MIN, CELL * k.shape[0])) + 1.0 for k in ks]
    width, height = max(widths) * len(chosen) + 1.2, sum(heights)
    shrink = min(1.0, FIGURE_MAX / width, FIGURE_MAX / height)
    widths, heights = [w * shrink for w in widths], [h * shrink for h in heights]
    fig = new_figure((width * shrink, height * shrink), layout="constrained")
    text = {**_LITERAL, **_font(*(k.key_tokens for k in ks), *(k.query_tokens for k in ks))}
    axes = fig.subplots(len(ks), len(chosen), squeeze=False)
    image = None
    head_name = "mean of heads" if head == "mean" else f"head {head}"
    for r, k in enumerate(ks):
        Lq, Lk = k.shape
        # a row's panels share their query tokens: label them on the first drawn panel only
        labelled = next(c for c, m in enumerate(mats[r]) if m is not None)
        for c, li in enumerate(chosen):
            ax = axes[r, c]
            m = mats[r][c]
            if m is None:
                ax.set_axis_off()
                continue
            image = ax.imshow(m, cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto")
            layer_no = li % k.num_layers
            ax.set_title(f"{k.name}\nlayer {layer_no}, {head_name}", fontsize=9, **text)
            # as many labels as the panel has room for, 40 at most
            room_x = max(2, min(40, int((max(widths) - 1.0 * shrink) / _LABEL_ROOM)))
            room_y = max(2, min(40, int((heights[r] - 1.0 * shrink) / _LABEL_ROOM)))
            sx, sy = _tick_step(Lk, room_x), _tick_step(Lq, room_y)
            ax.set_xticks(range(0, Lk, sx), k.key_tokens[::sx], rotation=90, fontsize=8, **text)
            if c == labelled:
                ax.set_yticks(range(0, Lq, sy), k.query_tokens[::sy], fontsize=8, **text)
            else:
                ax.set_yticks(range(0, Lq, sy), [])
            if c == labelled:
                ax.set_ylabel("queries")
            ax.set_xlabel("keys")
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    if path is not None:
        save_figure(fig, path)
    return fig
