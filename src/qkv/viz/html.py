"""A self-contained HTML attention viewer: one file, inline CSS and JS, no network access.

The page draws the chosen ``(Lq, Lk)`` matrix on a ``<canvas>`` (one pixel per cell, scaled up
without smoothing), so it stays quick at 500 tokens.  Menus choose the attention kind, the layer
and the head (or the mean over heads); hovering a query token colours the keys by how much it
attends to each, hovering a key colours the queries that attend to it, hovering a cell does both.

Weights travel as compact JSON: each matrix is a flat row-major list of integers, the weights
times ``10**decimals`` rounded (``0.0123`` -> ``123`` at 4 decimals); the page divides back.
The JSON is pure ASCII (other characters as ``\\uXXXX`` escapes), so any token, even one holding
a lone surrogate, is written safely; the title, the one text outside it, has lone surrogates
replaced by U+FFFD.

One viewer serves every page that shows attention: the file :func:`attention_html` writes, and
the page of ``qkv serve`` (:mod:`qkv.serve`), which builds on :data:`VIEWER_CSS`,
:data:`VIEWER_JS`, :data:`VIEWER_CONTROLS` and :data:`VIEWER_PANELS` and hands the script the
data of :func:`attention_payload` (``qkvViewer.show(data)``). The script mounts the viewer on a
root element and finds its parts inside it by their ``qkv-`` classes: those pages mount it on
``<body>``; :func:`attention_fragment` (and :class:`AttentionViewer`, which a notebook displays)
embeds it in any page, inside one ``<div>`` with a unique id, its styles scoped to that id, so
that several viewers share a page and the host page's own styles do not change.

Pictures are bounded: the data of a long text grows with the square of its length (a 2,000-word
input made a 176 MB page), so :func:`attention_html` counts the weights it would embed
(:func:`attention_cells`), logs a warning above ``warn_cells`` (:data:`WARN_CELLS` by default)
and refuses, with a ValueError saying what to do, above ``max_cells`` (:data:`MAX_CELLS`).
"""

from __future__ import annotations

import html as _html
import json
import logging
import re
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import SettingError
from .data import AttentionKind, as_kinds

__all__ = [
    "MAX_CELLS",
    "VIEWER_CONTROLS",
    "VIEWER_CSS",
    "VIEWER_JS",
    "VIEWER_PANELS",
    "WARN_CELLS",
    "AttentionViewer",
    "attention_cells",
    "attention_fragment",
    "attention_html",
    "attention_payload",
    "payload_json",
    "save_attention",
    "save_attention_html",
    "scoped_css",
    "start_view",
]

log = logging.getLogger(__name__)

#: a viewer embedding more weights than this is refused (about 12 to 30 MB of page: a
#: Transformer of 2+2 layers and 4 heads reaches it near 500 tokens of source and target)
MAX_CELLS = 8_000_000
#: above this many weights the viewer is written with a warning (a page of several MB)
WARN_CELLS = 2_000_000

_PLACEHOLDER = re.compile(r"%%(TITLE|CSS|JS|DATA|CONTROLS|PANELS)%%")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _ints(w: np.ndarray, scale: int) -> list[int]:
    return np.rint(w * scale).astype(np.int64).ravel().tolist()


def attention_cells(kinds: AttentionKind | Sequence[AttentionKind]) -> int:
    """How many weights the viewer embeds for ``kinds``: per layer ``(H + 1) * Lq * Lk`` (the
    heads and their mean; ``Lq * Lk`` for a one-head layer, whose mean is that head). The query
    and key vectors of the neuron view, ``H * (Lq + Lk) * d`` per layer, grow linearly with the
    text and are not counted: at the lengths the bound is about they are a small part."""
    total = 0
    for k in as_kinds(kinds):
        Lq, Lk = k.shape
        for w in k.layers:  # (H, Lq, Lk)
            H = w.shape[0]
            total += (H + (1 if H > 1 else 0)) * Lq * Lk
    return total


def _check_decimals(decimals: object) -> int:
    if isinstance(decimals, bool) or not isinstance(decimals, int) or not 1 <= decimals <= 6:
        raise ValueError(f"decimals: expected an int in [1, 6], got {decimals!r}")
    return decimals


def _check_cells(kinds: list[AttentionKind], max_cells: int | None, warn_cells: int | None) -> None:
    for name, value in (("max_cells", max_cells), ("warn_cells", warn_cells)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name}: expected an int >= 1 or None, got {value!r}")
    cells = attention_cells(kinds)
    shapes = ", ".join(f"{k.name} {len(k.layers)}x{k.shape[0]}x{k.shape[1]}" for k in kinds)
    if max_cells is not None and cells > max_cells:
        raise SettingError(
            "kinds",
            f"the viewer would embed {cells:,} attention weights ({shapes}; about "
            f"{cells * 2 / 1e6:.0f} MB of page), over the limit of {max_cells:,} (max_cells): "
            "draw a shorter text, fewer kinds or layers, or a static figure (.png, .svg, .pdf)",
        )
    if warn_cells is not None and cells > warn_cells:
        log.warning(
            "the attention viewer embeds %s weights (%s; about %.0f MB of page): a browser "
            "may be slow to open it",
            f"{cells:,}",
            shapes,
            cells * 2 / 1e6,
        )


def attention_payload(
    kinds: AttentionKind | Sequence[AttentionKind],
    *,
    title: str = "qkv attention",
    decimals: int = 4,
    max_cells: int | None = MAX_CELLS,
    warn_cells: int | None = WARN_CELLS,
) -> dict[str, Any]:
    """The data the viewer draws, as a JSON-ready dict.

    ``{"title": str, "scale": 10**decimals, "start": {"kind", "layer"}, "kinds": [{"name", "q",
    "k", "layers": [{"heads", "mean"}], "vectors"}]}``: ``q``/``k`` the ``Lq`` query and ``Lk``
    key tokens; ``heads`` one flat row-major list of ``Lq * Lk`` integers per head (the weights
    times ``scale``, rounded); ``mean`` the same for the mean over the heads, or None for a
    one-head layer. ``start`` is what the viewer opens on (:func:`start_view`). ``vectors`` is
    None, or for a kind given its queries and keys ``{"d", "scale", "q": [[...] per head] per
    layer, "k": ..., "hidden"}``: each head's ``Lq * d`` (``Lk * d``) vector entries, row-major,
    to 6 decimals, and ``hidden`` the ``Lq * Lk`` flags (1: the key had weight exactly 0 in
    every head of the first layer, a masked key) that the neuron view's softmax leaves out.

    Args:
        kinds, title, decimals: as :func:`attention_html`.
        max_cells: refuse more weights than this (see :func:`attention_cells`); None: no limit.
        warn_cells: log a warning above this many weights; None: never.

    Raises:
        ValueError: more weights than ``max_cells`` (a :class:`~qkv._errors.SettingError` keyed
            ``kinds``), a bad ``decimals``; TypeError: bad kinds.
    """
    ks = as_kinds(kinds)
    if not isinstance(title, str):
        raise TypeError(f"title: expected a str, got {type(title).__name__}")
    scale = 10 ** _check_decimals(decimals)
    _check_cells(ks, max_cells, warn_cells)
    out = []
    for k in ks:
        layers = []
        for w in k.layers:  # (H, Lq, Lk)
            heads = [_ints(w[h], scale) for h in range(w.shape[0])]
            # one head: the mean is that head (null in the JSON, not a second copy)
            mean = None if w.shape[0] == 1 else _ints(w.mean(axis=0), scale)
            layers.append({"heads": heads, "mean": mean})
        out.append(
            {
                "name": k.name,
                "q": list(k.query_tokens),
                "k": list(k.key_tokens),
                "layers": layers,
                "vectors": _vectors(k),
            }
        )
    return {"title": title, "scale": scale, "start": start_view(ks), "kinds": out}


def start_view(kinds: Sequence[AttentionKind]) -> dict[str, int]:
    """What the viewer opens on: a translation's cross-attention (what a lesson on translation
    is about; the Bahdanau decoder's attention is its cross-attention), else the first kind
    (an encoder's self-attention), at its last layer."""
    names = [k.name.lower() for k in kinds]
    i = next((n for n, name in enumerate(names) if "cross" in name or "bahdanau" in name), 0)
    return {"kind": i, "layer": kinds[i].num_layers - 1}


def _vectors(k: AttentionKind) -> dict[str, Any] | None:
    """The neuron view's data of ``k`` (see :func:`attention_payload`), or None without vectors."""
    if k.queries is None:
        return None

    def flat(v: np.ndarray) -> list[list[float]]:  # (H, L, d) -> per head, row-major
        return [np.round(v[h], 6).ravel().tolist() for h in range(v.shape[0])]

    hidden = (k.layers[0] == 0).all(axis=0).astype(np.int8).ravel().tolist()
    return {
        "d": int(k.queries[0].shape[2]),
        "scale": k.scale,
        "q": [flat(v) for v in k.queries],
        "k": [flat(v) for v in k.keys],
        "hidden": hidden,
    }


def payload_json(payload: dict[str, Any]) -> str:
    """``payload`` as JSON safe to put inside a ``<script>`` element: pure ASCII (a token with a
    lone surrogate, which UTF-8 cannot encode, travels as an escape) and no ``<``."""
    data = json.dumps(payload, ensure_ascii=True, separators=(",", ":"))
    # inside <script> only "</" could end the element early; "<" never occurs outside strings
    return data.replace("<", "\\u003c")


def attention_html(
    kinds: AttentionKind | Sequence[AttentionKind],
    *,
    title: str = "qkv attention",
    decimals: int = 4,
    max_cells: int | None = MAX_CELLS,
    warn_cells: int | None = WARN_CELLS,
) -> str:
    """The viewer page for ``kinds`` as one self-contained HTML string.

    Args:
        kinds: an :class:`~qkv.viz.AttentionKind` or a list of them, each holding per-layer
            weights ``(H, Lq, Lk)`` and its query / key tokens (see
            :func:`~qkv.viz.translation_attention` for a translation's three kinds).
        title: the page's title and heading.
        decimals: weights are rounded to this many decimals (1 to 6) in the embedded data.
        max_cells: refuse a page embedding more weights than this (:func:`attention_cells`;
            default :data:`MAX_CELLS`); None: no limit.
        warn_cells: log a warning above this many weights (default :data:`WARN_CELLS`).

    Returns:
        The HTML text; it loads nothing from the network.

    Raises:
        ValueError: more weights than ``max_cells`` (a :class:`~qkv._errors.SettingError` keyed
            ``kinds``; the message says what to draw instead), a bad ``decimals``; TypeError:
            ``kinds`` or ``title`` of the wrong type.
    """
    payload = attention_payload(
        kinds, title=title, decimals=decimals, max_cells=max_cells, warn_cells=warn_cells
    )
    parts = {
        "TITLE": _SURROGATE.sub("\ufffd", _html.escape(title)),
        "CSS": VIEWER_CSS,
        "JS": VIEWER_JS,
        "DATA": payload_json(payload),
        "CONTROLS": VIEWER_CONTROLS,
        "PANELS": VIEWER_PANELS,
    }
    # one pass: text substituted for one placeholder is never searched for another, so a title
    # holding "%%JS%%" stays text
    return _PLACEHOLDER.sub(lambda m: parts[m.group(1)], _TEMPLATE)


def save_attention_html(
    path: str | Path,
    kinds: AttentionKind | Sequence[AttentionKind],
    *,
    title: str = "qkv attention",
    decimals: int = 4,
    max_cells: int | None = MAX_CELLS,
    warn_cells: int | None = WARN_CELLS,
) -> Path:
    """Write :func:`attention_html` to ``path`` (UTF-8; parent folder created); returns the path.

    Nothing is written when the page is refused (more weights than ``max_cells``)."""
    text = attention_html(
        kinds, title=title, decimals=decimals, max_cells=max_cells, warn_cells=warn_cells
    )
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p


def save_attention(
    path: str | Path,
    kinds: AttentionKind | Sequence[AttentionKind],
    *,
    title: str = "qkv attention",
    **kwargs: Any,
) -> Path:
    """Save ``kinds`` by the extension of ``path``: ``.html`` the viewer, ``.png``/``.svg``/``.pdf``
    the static :func:`~qkv.viz.plot_attention` grid (``kwargs`` go to the function chosen)."""
    p = Path(path)
    if p.suffix.lower() in (".html", ".htm"):
        return save_attention_html(p, kinds, title=title, **kwargs)
    from .heatmaps import FORMATS, plot_attention

    if p.suffix.lower() not in FORMATS:
        raise ValueError(
            f"path: expected a file name ending in .html, {', '.join(FORMATS)}, got {str(path)!r}"
        )
    plot_attention(kinds, path=p, **kwargs)
    return p


#: the viewer's menus (kind, layer, head, colours). The script finds every part by its
#: ``qkv-`` class inside its root; the ids are for the single-viewer pages (the file, the server
#: page) and are dropped from an embedded viewer (:func:`attention_fragment`)
VIEWER_CONTROLS = """<div id="controls" class="qkv-controls">
    <span class="qkv-tabs" role="tablist" aria-label="view">
      <button type="button" class="qkv-tab" role="tab" data-view="matrix"
        aria-selected="true">matrix</button>
      <button type="button" class="qkv-tab" role="tab" data-view="head">head view</button>
      <button type="button" class="qkv-tab" role="tab" data-view="model">model view</button>
      <button type="button" class="qkv-tab" role="tab" data-view="neuron">neuron view</button>
    </span>
    <label>kind <select id="kind" class="qkv-kind"></select></label>
    <label>layer <select id="layer" class="qkv-layer"></select></label>
    <label>head <select id="head" class="qkv-head-menu"></select></label>
    <label>colours <select id="norm" class="qkv-norm">
      <option value="matrix">scaled to the matrix maximum</option>
      <option value="row">scaled per query row</option>
      <option value="abs">absolute, 0 to 1</option>
    </select></label>
  </div>"""

#: the viewer's four views: the matrix and token panels, the head view, the model view and the
#: neuron view (one shown at a time)
VIEWER_PANELS = """<div class="qkv-panels qkv-view" data-for="matrix">
  <section id="matrix-panel" class="qkv-matrix-panel">
    <div id="stage" class="qkv-stage"><canvas id="heat" class="qkv-heat"></canvas><canvas
      id="overlay" class="qkv-overlay"></canvas></div>
    <div id="legend" class="qkv-legend"><span id="lo" class="qkv-lo">0</span><canvas id="ramp"
      class="qkv-ramp" width="160" height="12"></canvas><span id="hi" class="qkv-hi">1</span></div>
    <p id="readout" class="qkv-readout">Hover a token or a cell.</p>
  </section>
  <section id="tokens-panel" class="qkv-tokens-panel">
    <h2>queries <small>(rows) — hover one: where it attends</small></h2>
    <div id="qtokens" class="tokens qkv-qtokens"></div>
    <h2>keys <small>(columns) — hover one: where it is attended from</small></h2>
    <div id="ktokens" class="tokens qkv-ktokens"></div>
  </section>
</div>
<div class="qkv-headview qkv-view" data-for="head" hidden>
  <p class="qkv-help">Each query (left) is joined to every key (right) by one line per head, in
    the head's colour, as opaque as its weight. Hover a token: its lines alone. Click a head's
    colour to hide or show it; double-click it to show that head alone.</p>
  <div class="qkv-swatches"></div>
  <canvas class="qkv-lines"></canvas>
  <p class="qkv-head-readout">Hover a token.</p>
</div>
<div class="qkv-modelview qkv-view" data-for="model" hidden>
  <p class="qkv-help">Every layer (rows) and head (columns) of this kind at once, each scaled to
    its own maximum. Click one to open it in the matrix.</p>
  <div class="qkv-grid"></div>
</div>
<div class="qkv-neuronview qkv-view" data-for="neuron" hidden>
  <p class="qkv-help">How one weight is computed, as seed 001 does it by hand: the query vector,
    the key vector, their elementwise product, its sum (the dot product), the scale, and the
    softmax over every key the query sees.</p>
  <div class="qkv-neuron-pick"><label>query <select class="qkv-nq"></select></label>
    <label>key <select class="qkv-nk"></select></label></div>
  <div class="qkv-neuron"></div>
</div>"""

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>%%TITLE%%</title>
<style>%%CSS%%</style>
</head>
<body>
<header class="qkv-head">
  <h1>%%TITLE%%</h1>
  %%CONTROLS%%
</header>
<main>
%%PANELS%%
</main>
<script type="application/json" id="qkv-data">%%DATA%%</script>
<script>%%JS%%</script>
</body>
</html>
"""

#: the styles of the viewer's own parts, by their ``qkv-`` classes (and ``.tok``, ``.tokens``
#: inside them); an embedded viewer gets each selector prefixed with its root's id
_PARTS_CSS = """
.qkv-controls label { margin-right: 14px; }
.qkv-controls select { font: inherit; }
.qkv-panels { display: flex; flex-wrap: wrap; gap: 20px; padding: 12px 16px;
  align-items: flex-start; }
.qkv-panels h2 { font-size: 14px; margin: 12px 0 4px; }
.qkv-panels h2 small { font-weight: normal; color: #666; }
.qkv-stage { position: relative; line-height: 0; }
.qkv-overlay { position: absolute; left: 0; top: 0; }
.qkv-heat { cursor: crosshair; }
.qkv-legend { display: flex; align-items: center; gap: 6px; margin-top: 6px; font-size: 12px; }
.qkv-matrix-panel { flex: none; }
.qkv-readout { min-height: 4.2em; margin: 6px 0; font-size: 13px; }
.qkv-tokens-panel { flex: 1 1 320px; min-width: 280px; max-width: 640px; }
.qkv-panels .tokens { max-height: 38vh; overflow: auto; border: 1px solid #ddd; padding: 6px;
  line-height: 1.9; }
.qkv-panels .tok { display: inline-block; padding: 0 4px; margin: 1px; border-radius: 3px;
  cursor: default; border: 1px solid transparent; white-space: pre; }
.qkv-panels .tok.active { border-color: #1f77b4; box-shadow: 0 0 0 1px #1f77b4; }
.qkv-panels .tok:hover { border-color: #888; }
.qkv-view[hidden] { display: none; }
.qkv-tabs { margin-right: 14px; }
.qkv-tab { font: inherit; border: 1px solid #bbb; background: #fff; padding: 2px 10px;
  margin: 0 -1px 0 0; cursor: pointer; }
.qkv-tab[aria-selected="true"] { background: #1f77b4; color: #fff; border-color: #1f77b4; }
.qkv-headview, .qkv-modelview, .qkv-neuronview { padding: 8px 16px; overflow-x: auto; }
.qkv-help { color: #555; font-size: 13px; margin: 4px 0 8px; max-width: 60em; }
.qkv-swatches { margin: 4px 0 8px; }
.qkv-swatch { display: inline-block; min-width: 22px; height: 20px; margin: 0 3px 3px 0;
  border: 2px solid transparent; color: #fff; font: 12px/16px sans-serif; text-align: center;
  cursor: pointer; padding: 0 3px; }
.qkv-swatch.off { opacity: 0.25; }
.qkv-lines { cursor: default; }
.qkv-head-readout { min-height: 2.8em; font-size: 13px; }
.qkv-grid-row { display: flex; align-items: center; gap: 6px; margin-bottom: 6px; }
.qkv-grid-label { width: 58px; flex: none; font-size: 12px; color: #555; }
.qkv-grid-head { flex: none; font-size: 12px; text-align: center; font-weight: 600; }
.qkv-thumb { image-rendering: pixelated; border: 2px solid #ddd; cursor: pointer; }
.qkv-thumb:hover { border-color: #222; }
.qkv-neuron table { border-collapse: collapse; margin: 6px 0; }
.qkv-neuron td, .qkv-neuron th { border: 1px solid #e4e4e4; padding: 1px 4px; font-size: 12px;
  text-align: right; white-space: nowrap; }
.qkv-neuron th { text-align: left; font-weight: 600; background: #fafafa; }
.qkv-neuron .qkv-sum { font-size: 14px; line-height: 1.8; margin: 6px 0; }
.qkv-neuron .qkv-keys td.sel { outline: 2px solid #1f77b4; }
.qkv-neuron .qkv-bar { display: inline-block; height: 10px; background: #cb181d; }
.qkv-neuron .qkv-keys tr { cursor: pointer; }
"""

#: the viewer's style sheet for a page of its own (the file, the server's page): the page's
#: font and header, then the viewer's parts
VIEWER_CSS = (
    """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
  color: #222; background: #fff; }
.qkv-head { padding: 10px 16px; border-bottom: 1px solid #ddd; background: #fafafa; }
.qkv-head h1 { font-size: 18px; margin: 0 0 6px; }
h2 { font-size: 14px; margin: 12px 0 4px; }
"""
    + _PARTS_CSS
)

#: an embedded viewer's own box (``%%ROOT%%`` is its id): the font, colours and header of the
#: page version, set on the root so that nothing outside it changes
_EMBED_ROOT_CSS = """
%%ROOT%% { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: #222; background: #fff; border: 1px solid #ddd; border-radius: 4px; margin: 4px 0;
  text-align: left; }
%%ROOT%% .qkv-embed-head { padding: 8px 16px; border-bottom: 1px solid #ddd;
  background: #fafafa; }
%%ROOT%% .qkv-title { font-size: 15px; font-weight: 600; margin: 0 0 6px; white-space: pre-wrap; }
%%ROOT%% .qkv-noscript { padding: 8px 16px; color: #666; }
%%ROOT%% canvas { max-width: none; border: 0; padding: 0; margin: 0; }
%%ROOT%% h2, %%ROOT%% label, %%ROOT%% p, %%ROOT%% .tok { color: inherit; font-family: inherit;
  line-height: inherit; }
%%ROOT%% h2 { font-weight: bold; border: 0; padding: 0; }
"""

_RULE = re.compile(r"([^{}]+)\{([^{}]*)\}")


def scoped_css(css: str, root: str) -> str:
    """``css`` (plain rules, no at-rules) with every selector prefixed by ``root`` (a selector
    such as ``#qkv-viewer-1a2b``), so that it styles nothing outside that element."""

    def rule(m: re.Match[str]) -> str:
        selectors = ", ".join(f"{root} {s.strip()}" for s in m.group(1).split(","))
        return f"{selectors} {{{m.group(2)}}}\n"

    return _RULE.sub(rule, css.strip())


#: the viewer itself: ``mount(root)`` wires the parts found inside ``root`` (by their ``qkv-``
#: classes) and returns its API; nothing in it refers to the document but through ``root``
_MOUNT_JS = r"""
  function mount(root) {
  var DATA = null, SCALE = 1;  // what show() was given last
  var $ = function (part) { return root.querySelector(".qkv-" + part); };
  var heat = $("heat"), overlay = $("overlay"), ctx = heat.getContext("2d"),
      octx = overlay.getContext("2d");
  var state = { kind: 0, layer: 0, head: -1, norm: "matrix", hover: null, view: "matrix",
                nq: 0, nk: 0 };
  var geo = null, qspans = [], kspans = [], current = null;

  // a "Reds"-like ramp: white -> dark red
  var hv = { focus: null, off: {}, drawn: null, geo: null }, mv = null, nv = null;
  var STOPS = [[255, 245, 240], [254, 224, 210], [252, 187, 161], [252, 146, 114],
               [251, 106, 74], [239, 59, 44], [203, 24, 29], [165, 15, 21], [103, 0, 13]];
  var LUT = new Uint8ClampedArray(256 * 3);
  (function () {
    for (var i = 0; i < 256; i++) {
      var t = i / 255 * (STOPS.length - 1), a = Math.floor(t), b = Math.min(a + 1, STOPS.length - 1),
          f = t - a;
      for (var c = 0; c < 3; c++) LUT[i * 3 + c] = STOPS[a][c] + (STOPS[b][c] - STOPS[a][c]) * f;
    }
  })();
  function level(t) { return Math.max(0, Math.min(255, Math.round(t * 255))); }
  function rgb(t) { var i = level(t) * 3; return "rgb(" + LUT[i] + "," + LUT[i + 1] + "," + LUT[i + 2] + ")"; }

  function kind() { return DATA.kinds[state.kind]; }
  function layerData() { return kind().layers[state.layer]; }
  function matrix() {
    var L = layerData();
    return state.head < 0 ? (L.mean || L.heads[0]) : L.heads[state.head];
  }
  function fmt(v) { return (v / SCALE).toFixed(Math.max(1, Math.round(Math.log10(SCALE)))); }

  function option(sel, value, text) {
    var o = document.createElement("option"); o.value = String(value); o.textContent = text;
    sel.appendChild(o);
  }
  function fillMenus() {
    var k = $("kind"), l = $("layer"), h = $("head-menu");
    if (!k.options.length) DATA.kinds.forEach(function (d, i) { option(k, i, d.name); });
    k.value = String(state.kind);
    l.textContent = "";
    kind().layers.forEach(function (_, i) { option(l, i, "layer " + i); });
    if (state.layer >= kind().layers.length) state.layer = 0;
    l.value = String(state.layer);
    h.textContent = "";
    var H = layerData().heads.length;
    option(h, -1, "all heads (mean)");
    for (var i = 0; i < H; i++) option(h, i, "head " + i);
    if (state.head >= H) state.head = -1;
    h.value = String(state.head);
  }

  function buildTokens() {
    var d = kind();
    function build(box, toks, axis) {
      box.textContent = "";
      var spans = [];
      toks.forEach(function (t, i) {
        var s = document.createElement("span");
        s.className = "tok"; s.textContent = t; s.dataset.axis = axis; s.dataset.i = String(i);
        s.title = axis + " " + i;
        box.appendChild(s); spans.push(s);
      });
      return spans;
    }
    qspans = build($("qtokens"), d.q, "q");
    kspans = build($("ktokens"), d.k, "k");
  }

  function textWidth(toks) {
    ctx.font = "12px sans-serif";
    var w = 0;
    for (var i = 0; i < toks.length; i++) w = Math.max(w, ctx.measureText(toks[i]).width);
    return Math.ceil(w);
  }
  function layout() {
    var d = kind(), Lq = d.q.length, Lk = d.k.length;
    // a page of its own fills the window; an embedded viewer its own box
    var width = root === document.body ? window.innerWidth : (root.clientWidth || window.innerWidth);
    var avail = Math.max(240, Math.min(760, width - 440));
    // short texts get large cells: easy to read and to hover
    var cell = Math.max(1, Math.min(56, Math.floor(avail / Math.max(Lq, Lk))));
    var labels = cell >= 10;
    var left = labels ? Math.min(140, textWidth(d.q) + 10) : 40;
    var top = labels ? Math.min(140, textWidth(d.k) + 10) : 22;
    var w = left + Lk * cell + 6, h = top + Lq * cell + 6;
    heat.width = overlay.width = w; heat.height = overlay.height = h;
    // a fixed-width panel: the readout's text must never push the token lists around
    $("matrix-panel").style.width = Math.max(w, 340) + "px";
    geo = { cell: cell, left: left, top: top, Lq: Lq, Lk: Lk, labels: labels };
  }

  function norms(M) {
    var Lq = geo.Lq, Lk = geo.Lk, out = new Float64Array(Lq), i, j, m;
    if (state.norm === "abs") { out.fill(SCALE); return out; }
    if (state.norm === "row") {
      for (i = 0; i < Lq; i++) {
        m = 0; for (j = 0; j < Lk; j++) m = Math.max(m, M[i * Lk + j]);
        out[i] = m > 0 ? m : 1;
      }
      return out;
    }
    m = 0; for (i = 0; i < M.length; i++) m = Math.max(m, M[i]);
    out.fill(m > 0 ? m : 1);
    return out;
  }

  // one pixel per cell: M (Lq * Lk scaled integers), row i divided by n[i]
  function matrixImage(M, Lq, Lk, n) {
    var off = document.createElement("canvas"); off.width = Lk; off.height = Lq;
    var c2 = off.getContext("2d"), img = c2.createImageData(Lk, Lq), px = img.data;
    for (var i = 0; i < Lq; i++) {
      for (var j = 0; j < Lk; j++) {
        var c = level(M[i * Lk + j] / n[i]) * 3, p = (i * Lk + j) * 4;
        px[p] = LUT[c]; px[p + 1] = LUT[c + 1]; px[p + 2] = LUT[c + 2]; px[p + 3] = 255;
      }
    }
    c2.putImageData(img, 0, 0);
    return off;
  }

  function draw() {
    var d = kind(), M = matrix(), Lq = geo.Lq, Lk = geo.Lk, cell = geo.cell;
    var n = norms(M);
    current = { M: M, n: n };
    var off = matrixImage(M, Lq, Lk, n);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, heat.width, heat.height);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, geo.left, geo.top, Lk * cell, Lq * cell);
    ctx.strokeStyle = "#999"; ctx.lineWidth = 1;
    ctx.strokeRect(geo.left - 0.5, geo.top - 0.5, Lk * cell + 1, Lq * cell + 1);
    ctx.fillStyle = "#333"; ctx.font = "12px sans-serif";
    if (geo.labels) {
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      for (var a = 0; a < Lq; a++)
        ctx.fillText(d.q[a], geo.left - 5, geo.top + (a + 0.5) * cell, geo.left - 8);
      ctx.save(); ctx.translate(geo.left, geo.top - 5); ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      for (var b = 0; b < Lk; b++) ctx.fillText(d.k[b], 0, (b + 0.5) * cell, geo.top - 8);
      ctx.restore();
    } else {
      var step = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000].find(function (s) {
        return s * cell >= 40;
      }) || 1000;
      ctx.textBaseline = "middle"; ctx.textAlign = "right";
      for (var r = 0; r < Lq; r += step) ctx.fillText(String(r), geo.left - 4, geo.top + (r + 0.5) * cell);
      ctx.textAlign = "center"; ctx.textBaseline = "bottom";
      for (var s = 0; s < Lk; s += step) ctx.fillText(String(s), geo.left + (s + 0.5) * cell, geo.top - 3);
    }
    var lo = $("lo"), hi = $("hi");
    lo.textContent = "0";
    hi.textContent = state.norm === "row" ? "row max" : fmt(n[0] || SCALE);
    root.dataset.view = [state.kind, state.layer, state.head, state.norm].join(":");
  }

  function drawRamp() {
    var r = $("ramp"), c = r.getContext("2d");
    for (var x = 0; x < r.width; x++) { c.fillStyle = rgb(x / (r.width - 1)); c.fillRect(x, 0, 1, r.height); }
  }

  function reveal(span) {  // scroll the token's own box (never the page) to show it
    var box = span.parentNode, top = span.offsetTop - box.offsetTop;
    if (top < box.scrollTop || top + span.offsetHeight > box.scrollTop + box.clientHeight)
      box.scrollTop = Math.max(0, top - box.clientHeight / 2);
  }
  function clearTokens() {
    qspans.forEach(function (s) { s.style.background = ""; s.style.color = ""; s.classList.remove("active"); });
    kspans.forEach(function (s) { s.style.background = ""; s.style.color = ""; s.classList.remove("active"); });
  }
  function paint(spans, vals) {
    var m = 0, i;
    for (i = 0; i < vals.length; i++) m = Math.max(m, vals[i]);
    for (i = 0; i < spans.length; i++) {
      var t = m > 0 ? vals[i] / m : 0;
      spans[i].style.background = t > 0.002 ? rgb(t) : "";
      spans[i].style.color = t > 0.6 ? "#fff" : "";
    }
  }
  function top5(vals, toks) {
    var idx = vals.map(function (_, i) { return i; });
    idx.sort(function (a, b) { return vals[b] - vals[a]; });
    return idx.slice(0, 5).map(function (i) { return "\u201c" + toks[i] + "\u201d " + fmt(vals[i]); }).join(" \u00b7 ");
  }
  function row(i) { var Lk = geo.Lk; return Array.prototype.slice.call(current.M, i * Lk, (i + 1) * Lk); }
  function col(j) { var out = [], Lk = geo.Lk; for (var i = 0; i < geo.Lq; i++) out.push(current.M[i * Lk + j]); return out; }

  function drawOverlay() {
    octx.clearRect(0, 0, overlay.width, overlay.height);
    var h = state.hover; if (!h) return;
    var c = geo.cell, pad = c < 4 ? 2 : 0;
    // thin rows need a band to be seen; wide ones only an outline, so the colours stay true
    octx.lineWidth = 2; octx.strokeStyle = "#1f77b4";
    octx.fillStyle = c < 6 ? "rgba(31,119,180,0.15)" : "rgba(0,0,0,0)";
    if (h.q != null) {
      var y = geo.top + h.q * c - pad;
      octx.fillRect(geo.left, y, geo.Lk * c, c + 2 * pad);
      octx.strokeRect(geo.left - 1, y - 1, geo.Lk * c + 2, c + 2 * pad + 2);
    }
    if (h.k != null) {
      var x = geo.left + h.k * c - pad;
      octx.fillRect(x, geo.top, c + 2 * pad, geo.Lq * c);
      octx.strokeRect(x - 1, geo.top - 1, c + 2 * pad + 2, geo.Lq * c + 2);
    }
  }

  function setHover(h) {
    if (!DATA) return;  // nothing shown yet
    state.hover = h;
    clearTokens();
    var d = kind(), out = $("readout");
    if (!h) {
      out.textContent = "Hover a token or a cell.";
      root.dataset.hover = "";
    } else if (h.q != null && h.k != null) {
      paint(kspans, row(h.q));
      qspans[h.q].classList.add("active"); kspans[h.k].classList.add("active");
      reveal(qspans[h.q]); reveal(kspans[h.k]);
      out.textContent = "query " + h.q + " \u201c" + d.q[h.q] + "\u201d \u2192 key " + h.k + " \u201c" +
        d.k[h.k] + "\u201d: " + fmt(current.M[h.q * geo.Lk + h.k]);
      root.dataset.hover = "cell:" + h.q + ":" + h.k;
    } else if (h.q != null) {
      var r = row(h.q);
      paint(kspans, r);
      qspans[h.q].classList.add("active");
      out.textContent = "query " + h.q + " \u201c" + d.q[h.q] + "\u201d attends to: " + top5(r, d.k);
      root.dataset.hover = "q:" + h.q;
    } else {
      var cc = col(h.k);
      paint(qspans, cc);
      kspans[h.k].classList.add("active");
      out.textContent = "key " + h.k + " \u201c" + d.k[h.k] + "\u201d is attended from: " + top5(cc, d.q);
      root.dataset.hover = "k:" + h.k;
    }
    drawOverlay();
  }

  function refresh(rebuild) {
    if (rebuild) { fillMenus(); buildTokens(); layout(); }
    draw();
    var h = state.hover;
    if (h && ((h.q != null && h.q >= geo.Lq) || (h.k != null && h.k >= geo.Lk))) h = null;
    setHover(h);
    drawView();
  }
  // ---- the other views: head (lines per head), model (every layer x head), neuron (q, k)
  var COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173",
    "#3182bd"];
  function colour(h) { return COLOURS[h % COLOURS.length]; }
  function resetViews() { hv.off = {}; hv.focus = null; state.nq = 0; state.nk = 0; }
  function setView(v) {
    state.view = v;
    root.querySelectorAll(".qkv-view").forEach(function (el) { el.hidden = el.dataset.for !== v; });
    root.querySelectorAll(".qkv-tab").forEach(function (b) {
      b.setAttribute("aria-selected", String(b.dataset.view === v));
    });
    if (v === "matrix" && DATA) { layout(); draw(); drawOverlay(); }
    drawView();
  }
  function drawView() {
    if (!DATA) return;
    if (state.view === "head") drawHeadView();
    else if (state.view === "model") drawModelView();
    else if (state.view === "neuron") drawNeuronView();
    root.dataset.mode = state.view;
  }
  function measure(c, toks) {
    var w = 0;
    for (var i = 0; i < toks.length; i++) w = Math.max(w, c.measureText(toks[i]).width);
    return Math.ceil(w);
  }

  function swatches(H) {
    var box = $("swatches");
    if (box.children.length !== H) {
      box.textContent = "";
      for (var h = 0; h < H; h++) {
        var b = document.createElement("span");
        b.className = "qkv-swatch"; b.dataset.h = String(h); b.textContent = String(h);
        b.title = "head " + h + ": click to hide or show, double-click to show it alone";
        b.style.background = colour(h);
        box.appendChild(b);
      }
    }
    for (var i = 0; i < box.children.length; i++) box.children[i].classList.toggle("off", !!hv.off[i]);
  }

  function drawHeadView() {
    var d = kind(), L = layerData(), H = L.heads.length, Lq = d.q.length, Lk = d.k.length;
    var cv = $("lines"), c = cv.getContext("2d"), row = Math.max(6, Math.min(22, Math.floor(900 / Math.max(Lq, Lk))));
    var font = Math.min(13, row - 2) + "px sans-serif";
    c.font = font;
    var lw = Math.min(220, measure(c, d.q) + 14), rw = Math.min(220, measure(c, d.k) + 14);
    var gap = Math.max(180, Math.min(360, 14 * Math.max(Lq, Lk))), top = 8;
    cv.width = lw + gap + rw; cv.height = 2 * top + Math.max(Lq, Lk) * row;
    hv.geo = { row: row, top: top, lw: lw, gap: gap, Lq: Lq, Lk: Lk };
    c.clearRect(0, 0, cv.width, cv.height);
    var f = hv.focus, shown = [], drawn = {};
    for (var h = 0; h < H; h++) if (!hv.off[h]) shown.push(h);
    c.lineWidth = 2;
    shown.forEach(function (h) {
      var M = L.heads[h], vals = [];
      c.strokeStyle = colour(h);
      for (var i = 0; i < Lq; i++) {
        for (var j = 0; j < Lk; j++) {
          var w = M[i * Lk + j] / SCALE, hit = !f || (f.axis === "q" ? f.i === i : f.i === j);
          vals.push(hit ? w : 0);
          if (!hit || w <= 0) continue;
          c.globalAlpha = Math.min(1, w / shown.length);  // as bertviz: ink shared by the heads shown
          c.beginPath();
          c.moveTo(lw, top + (i + 0.5) * row); c.lineTo(lw + gap, top + (j + 0.5) * row);
          c.stroke();
        }
      }
      drawn[h] = vals;
    });
    c.globalAlpha = 1; c.textBaseline = "middle"; c.fillStyle = "#222";
    function label(toks, axis, x, align) {
      c.textAlign = align;
      for (var a = 0; a < toks.length; a++) {
        c.font = (f && f.axis === axis && f.i === a ? "bold " : "") + font;
        c.fillText(toks[a], x, top + (a + 0.5) * row, (axis === "q" ? lw : rw) - 8);
      }
    }
    label(d.q, "q", lw - 6, "right");
    label(d.k, "k", lw + gap + 6, "left");
    hv.drawn = { kind: state.kind, layer: state.layer, heads: shown, weights: drawn, focus: f,
                 Lq: Lq, Lk: Lk };
    swatches(H);
    var out = $("head-readout");
    if (!f) { out.textContent = "Hover a token: its lines alone."; return; }
    var toks = f.axis === "q" ? d.q : d.k, parts = shown.map(function (h) {
      var vals = drawn[h], best = 0, at = 0;
      for (var x = 0; x < vals.length; x++) if (vals[x] > best) { best = vals[x]; at = x; }
      var other = f.axis === "q" ? d.k[at % Lk] : d.q[Math.floor(at / Lk)];
      return "head " + h + ": \u201c" + other + "\u201d " + best.toFixed(3);
    });
    out.textContent = (f.axis === "q" ? "query " : "key ") + f.i + " \u201c" + toks[f.i] +
      "\u201d, strongest " + (f.axis === "q" ? "key" : "query") + " per head: " + parts.join(" \u00b7 ");
  }

  function drawModelView() {
    var d = kind(), Lq = d.q.length, Lk = d.k.length, grid = $("grid"), thumbs = 0;
    grid.textContent = "";
    var maxH = Math.max.apply(null, d.layers.map(function (l) { return l.heads.length; }));
    var width = root === document.body ? window.innerWidth : (root.clientWidth || window.innerWidth);
    var size = Math.max(48, Math.min(140, Math.floor((width - 110) / maxH) - 10));
    var sx = size * Lk / Math.max(Lq, Lk), sy = size * Lq / Math.max(Lq, Lk);
    var heads = document.createElement("div");
    heads.className = "qkv-grid-row";
    heads.appendChild(document.createElement("span")).className = "qkv-grid-label";
    for (var h = 0; h < maxH; h++) {
      var t = document.createElement("span");
      t.className = "qkv-grid-head"; t.textContent = "head " + h; t.style.width = (sx + 4) + "px";
      t.style.color = colour(h); heads.appendChild(t);
    }
    grid.appendChild(heads);
    d.layers.forEach(function (L, l) {
      var line = document.createElement("div"), name = document.createElement("span");
      line.className = "qkv-grid-row"; name.className = "qkv-grid-label";
      name.textContent = "layer " + l; line.appendChild(name);
      L.heads.forEach(function (M, h) {
        var n = new Float64Array(Lq), m = 0, i;
        for (i = 0; i < M.length; i++) m = Math.max(m, M[i]);
        n.fill(m > 0 ? m : 1);
        var img = matrixImage(M, Lq, Lk, n), cv = document.createElement("canvas");
        cv.width = Lk; cv.height = Lq; cv.getContext("2d").drawImage(img, 0, 0);
        cv.className = "qkv-thumb"; cv.dataset.layer = String(l); cv.dataset.head = String(h);
        cv.style.width = sx + "px"; cv.style.height = sy + "px"; cv.style.borderColor = colour(h);
        cv.title = "layer " + l + ", head " + h + ": click to open it in the matrix";
        line.appendChild(cv); thumbs++;
      });
      grid.appendChild(line);
    });
    mv = { kind: state.kind, layers: d.layers.length, thumbs: thumbs, size: size };
  }

  function fillPick(sel, toks, value) {
    if (sel.dataset.kind !== String(state.kind) || sel.options.length !== toks.length) {
      sel.textContent = "";
      toks.forEach(function (t, i) { option(sel, i, i + " \u201c" + t + "\u201d"); });
      sel.dataset.kind = String(state.kind);
    }
    sel.value = String(value);
  }
  function cellOf(v, m) {  // a vector entry: blue below zero, red above, as strong as |v| / m
    var td = document.createElement("td"), a = m > 0 ? Math.min(1, Math.abs(v) / m) : 0;
    td.textContent = v.toFixed(3);
    td.style.background = v >= 0 ? "rgba(203,24,29," + a + ")" : "rgba(31,119,180," + a + ")";
    if (a > 0.6) td.style.color = "#fff";
    return td;
  }
  function tableRow(table, head, vals, m) {
    var tr = document.createElement("tr"), th = document.createElement("th");
    th.textContent = head; tr.appendChild(th);
    vals.forEach(function (v) { tr.appendChild(cellOf(v, m)); });
    table.appendChild(tr);
  }

  function neuronNumbers(V, L, h, Lk) {
    var dd = V.d, Q = V.q[state.layer][h], K = V.k[state.layer][h];
    var q = Q.slice(state.nq * dd, (state.nq + 1) * dd), scores = [], probs = [], big = -Infinity;
    for (var j = 0; j < Lk; j++) {
      var dot = 0;
      for (var x = 0; x < dd; x++) dot += q[x] * K[j * dd + x];
      scores.push(dot * V.scale);
      if (!V.hidden[state.nq * Lk + j]) big = Math.max(big, dot * V.scale);
    }
    var z = 0;
    for (j = 0; j < Lk; j++) { probs.push(V.hidden[state.nq * Lk + j] ? 0 : Math.exp(scores[j] - big)); z += probs[j]; }
    for (j = 0; j < Lk; j++) probs[j] = z > 0 ? probs[j] / z : 0;
    var k = K.slice(state.nk * dd, (state.nk + 1) * dd), prod = q.map(function (v, i) { return v * k[i]; });
    var sum = prod.reduce(function (a, b) { return a + b; }, 0);
    return { q: q, k: k, prod: prod, dot: sum, scale: V.scale, score: sum * V.scale, scores: scores,
             probs: probs, softmax: probs[state.nk], weight: L.heads[h][state.nq * Lk + state.nk] / SCALE,
             head: h, layer: state.layer, query: state.nq, key: state.nk, d: dd };
  }

  function drawNeuronView() {
    var d = kind(), V = d.vectors, box = $("neuron"), Lk = d.k.length;
    box.textContent = "";
    $("neuron-pick").hidden = !V;
    if (!V) {
      nv = null;
      box.textContent = "This kind carries no query and key vectors (Translator.attention records " +
        "them; AttentionKind takes them as queries=, keys=, scale=).";
      return;
    }
    state.nq = Math.min(state.nq, d.q.length - 1); state.nk = Math.min(state.nk, Lk - 1);
    fillPick($("nq"), d.q, state.nq); fillPick($("nk"), d.k, state.nk);
    var L = layerData(), h = state.head < 0 ? 0 : state.head;
    nv = neuronNumbers(V, L, h, Lk);
    var note = document.createElement("p");
    note.textContent = "layer " + state.layer + ", head " + h + (state.head < 0 ?
      " (the mean over heads has no vectors: choose a head above)" : "") + ", d = " + nv.d;
    box.appendChild(note);
    var m = 0;
    nv.q.concat(nv.k, nv.prod).forEach(function (v) { m = Math.max(m, Math.abs(v)); });
    var table = document.createElement("table");
    tableRow(table, "q: query " + state.nq + " \u201c" + d.q[state.nq] + "\u201d", nv.q, m);
    tableRow(table, "k: key " + state.nk + " \u201c" + d.k[state.nk] + "\u201d", nv.k, m);
    tableRow(table, "q \u00d7 k (elementwise)", nv.prod, m);
    box.appendChild(table);
    var sum = document.createElement("div");
    sum.className = "qkv-sum";
    var seen = V.hidden.slice(state.nq * Lk, (state.nq + 1) * Lk).filter(function (x) { return !x; }).length;
    sum.textContent = "q \u00b7 k = \u03a3 (q \u00d7 k) = " + nv.dot.toFixed(4) + "  \u2192  \u00d7 scale " +
      nv.scale.toFixed(4) + " = score " + nv.score.toFixed(4) + "  \u2192  softmax over the " + seen +
      " keys this query sees = " + nv.softmax.toFixed(4) + "  (the model's weight: " + nv.weight.toFixed(4) + ")";
    box.appendChild(sum);
    var keys = document.createElement("table");
    keys.className = "qkv-keys";
    var headRow = document.createElement("tr");
    ["key", "score", "softmax", ""].forEach(function (t) {
      var th = document.createElement("th"); th.textContent = t; headRow.appendChild(th);
    });
    keys.appendChild(headRow);
    for (var j = 0; j < Lk; j++) {
      var tr = document.createElement("tr"), hid = V.hidden[state.nq * Lk + j];
      tr.dataset.k = String(j);
      [j + " \u201c" + d.k[j] + "\u201d", hid ? "masked" : nv.scores[j].toFixed(4), nv.probs[j].toFixed(4)].forEach(function (t) {
        var td = document.createElement("td"); td.textContent = t;
        if (j === state.nk) td.className = "sel";
        tr.appendChild(td);
      });
      var bar = document.createElement("td"), span = document.createElement("span");
      span.className = "qkv-bar"; span.style.width = Math.round(120 * nv.probs[j]) + "px";
      bar.appendChild(span); tr.appendChild(bar); keys.appendChild(tr);
    }
    box.appendChild(keys);
  }

  function wireViews() {
    var lines = $("lines");
    lines.addEventListener("mousemove", function (e) {
      var g = hv.geo; if (!g) return;
      var b = lines.getBoundingClientRect(), x = e.clientX - b.left, y = e.clientY - b.top;
      var i = Math.floor((y - g.top) / g.row), f = null;
      if (x < g.lw && i >= 0 && i < g.Lq) f = { axis: "q", i: i };
      else if (x > g.lw + g.gap && i >= 0 && i < g.Lk) f = { axis: "k", i: i };
      var same = (f && hv.focus && f.axis === hv.focus.axis && f.i === hv.focus.i) || (!f && !hv.focus);
      if (!same) { hv.focus = f; drawHeadView(); }
    });
    lines.addEventListener("mouseleave", function () { if (hv.focus) { hv.focus = null; drawHeadView(); } });
    var sw = $("swatches");
    sw.addEventListener("click", function (e) {
      var h = e.target.dataset ? e.target.dataset.h : null; if (h == null) return;
      hv.off[h] = !hv.off[h]; drawHeadView();
    });
    sw.addEventListener("dblclick", function (e) {
      var h = e.target.dataset ? e.target.dataset.h : null; if (h == null) return;
      var H = layerData().heads.length; hv.off = {};
      for (var x = 0; x < H; x++) if (String(x) !== h) hv.off[x] = true;
      drawHeadView();
    });
    $("grid").addEventListener("click", function (e) {
      var t = e.target; if (!t.classList || !t.classList.contains("qkv-thumb")) return;
      state.layer = Number(t.dataset.layer); state.head = Number(t.dataset.head);
      fillMenus(); setView("matrix"); refresh(false);
    });
    $("nq").addEventListener("change", function (e) { state.nq = Number(e.target.value); drawNeuronView(); });
    $("nk").addEventListener("change", function (e) { state.nk = Number(e.target.value); drawNeuronView(); });
    $("neuron").addEventListener("click", function (e) {
      var tr = e.target.closest ? e.target.closest("tr[data-k]") : null;
      if (tr) { state.nk = Number(tr.dataset.k); drawNeuronView(); }
    });
  }


  function onTokens(e) {
    var s = e.target.closest ? e.target.closest(".tok") : null;
    if (!s) return;
    var i = Number(s.dataset.i);
    setHover(s.dataset.axis === "q" ? { q: i, k: null } : { q: null, k: i });
  }
  $("qtokens").addEventListener("mouseover", onTokens);
  $("ktokens").addEventListener("mouseover", onTokens);
  heat.parentNode.addEventListener("mousemove", function (e) {
    if (!geo) return;
    var b = heat.getBoundingClientRect();
    var j = Math.floor((e.clientX - b.left - geo.left) / geo.cell),
        i = Math.floor((e.clientY - b.top - geo.top) / geo.cell);
    if (i >= 0 && i < geo.Lq && j >= 0 && j < geo.Lk) {
      if (!state.hover || state.hover.q !== i || state.hover.k !== j) setHover({ q: i, k: j });
    }
  });
  heat.parentNode.addEventListener("mouseleave", function () { setHover(null); });
  $("kind").addEventListener("change", function (e) {
    state.kind = Number(e.target.value); state.layer = 0; state.head = -1; state.hover = null;
    resetViews(); refresh(true);
  });
  $("layer").addEventListener("change", function (e) {
    state.layer = Number(e.target.value); hv.off = {}; fillMenus(); refresh(false);
  });
  root.querySelectorAll(".qkv-tab").forEach(function (b) {
    b.addEventListener("click", function () { setView(b.dataset.view); });
  });
  wireViews();
  $("head-menu").addEventListener("change", function (e) { state.head = Number(e.target.value); refresh(false); });
  $("norm").addEventListener("change", function (e) { state.norm = e.target.value; refresh(false); });
  var resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () { if (DATA) { layout(); refresh(false); } }, 100);
  });

  var api = { state: state, data: null, setHover: setHover, setView: setView,
    geometry: function () { return Object.assign({}, geo); },
    headView: function () { return hv.drawn; },
    modelView: function () { return mv; },
    neuron: function () { return nv; },
    pick: function (q, k) { if (q != null) state.nq = q; if (k != null) state.nk = k; drawView(); },
    select: function (k, l, h) {
      if (k != null && k !== state.kind) { state.kind = k; state.layer = 0; state.head = -1; state.hover = null; resetViews(); refresh(true); }
      if (l != null) { state.layer = l; fillMenus(); }
      if (h != null) state.head = h;
      fillMenus(); refresh(false);
    } };

  // draw new data (attention_payload's shape): menus, tokens and picture start over
  api.show = function (data) {
    DATA = data; SCALE = data.scale;
    // a translation opens on its cross-attention, at the last layer (attention_payload's start)
    var start = data.start || { kind: 0, layer: 0 };
    state.kind = start.kind; state.layer = start.layer; state.head = -1; state.hover = null;
    resetViews();
    $("kind").textContent = "";
    // long sequences: one weight of 1 (say a causal first row) would wash out the rest
    state.norm = Math.max(kind().q.length, kind().k.length) > 64 ? "row" : "matrix";
    $("norm").value = state.norm;
    var t = root.querySelector(".qkv-title, #viewer-title");
    if (t) t.textContent = data.title;  // a page that shows several: the title as text
    refresh(true);
    api.data = DATA;
    root.dataset.shown = String(Number(root.dataset.shown || 0) + 1);
    root.dataset.ready = "1";
  };

  drawRamp();
  return api;
  }
"""

#: the viewer's script for a page of its own (the file, the server's page): the viewer mounted
#: on ``<body>`` as ``window.qkvViewer``; ``qkvViewer.show(data)`` draws
#: :func:`attention_payload` data, and on load it shows the data of a ``<script
#: type="application/json" id="qkv-data">`` element, if any
VIEWER_JS = (
    """
(function () {
  "use strict";
"""
    + _MOUNT_JS
    + """
  window.qkvViewer = mount(document.body);
  var embedded = document.getElementById("qkv-data");
  if (embedded) window.qkvViewer.show(JSON.parse(embedded.textContent));
})();
"""
)

# an embedded viewer's start: find the root by its id (a notebook may run the script before
# its output is attached to the document: look again a little later, for a minute at most),
# mount once, draw the data written into the script
_EMBED_BOOT_JS = """
  var id = %%ID%%, data = %%DATA%%, tries = 0;
  (function start() {
    var root = document.getElementById(id);
    if (!root) { if (tries++ < 1200) setTimeout(start, 50); return; }
    if (root.qkvViewer) return;
    var note = root.querySelector(".qkv-noscript");
    if (note) note.parentNode.removeChild(note);
    root.qkvViewer = mount(root);
    root.qkvViewer.show(data);
  })();
"""

_EMBED_TEMPLATE = """<div id="%%ID%%" class="qkv-viewer">
<style>%%CSS%%</style>
<div class="qkv-embed-head">
  <div class="qkv-title">%%TITLE%%</div>
  %%CONTROLS%%
</div>
<p class="qkv-noscript">The attention viewer needs JavaScript: in Jupyter, trust the notebook
(File &rarr; Trust Notebook) and run the cell again.</p>
%%PANELS%%
<script>(function () {
  "use strict";
%%JS%%
})();</script>
</div>"""

_IDS = re.compile(r'\sid="[a-z-]+"')


def attention_fragment(
    kinds: AttentionKind | Sequence[AttentionKind],
    *,
    title: str = "qkv attention",
    decimals: int = 4,
    max_cells: int | None = MAX_CELLS,
    warn_cells: int | None = WARN_CELLS,
    viewer_id: str | None = None,
) -> str:
    """The viewer as an HTML fragment to embed in a page that has other content: a notebook's
    output (JupyterLab, VS Code, classic Jupyter), a report, several viewers on one page.

    Everything is inside one ``<div id="qkv-viewer-...">``: its style sheet applies only inside
    that element (every selector starts with its id; the host page's fonts and margins are
    untouched), its parts carry classes, not ids, and its script finds its root by that one
    unique id (never through ``document.currentScript``, which sandboxed notebook outputs do not
    set), waiting for it if a notebook runs the script before attaching the output. Nothing is
    loaded from elsewhere. The API of a mounted viewer is the root element's ``qkvViewer``
    (``state``, ``data``, ``show``, ``select``, ``setHover``, ``geometry``), and the root's
    ``data-ready``, ``data-view``, ``data-hover`` say what it shows, as ``<body>``'s do on the
    page of :func:`attention_html`.

    Args:
        kinds, title, decimals, max_cells, warn_cells: as :func:`attention_html`.
        viewer_id: the root element's id (letters, digits, ``-``, ``_``); None: a new random
            one, so that every call gives a viewer that can share a page with any other.

    Raises:
        as :func:`attention_html`; ValueError: a bad ``viewer_id``.
    """
    if viewer_id is None:
        viewer_id = f"qkv-viewer-{secrets.token_hex(6)}"
    elif not isinstance(viewer_id, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", viewer_id):
        raise ValueError(
            f"viewer_id: expected letters, digits, '-' or '_', starting with a letter, got "
            f"{viewer_id!r}"
        )
    payload = attention_payload(
        kinds, title=title, decimals=decimals, max_cells=max_cells, warn_cells=warn_cells
    )
    root = f"#{viewer_id}"
    css = _EMBED_ROOT_CSS.replace("%%ROOT%%", root) + scoped_css(_PARTS_CSS, root)
    boot = _EMBED_BOOT_JS.replace("%%ID%%", json.dumps(viewer_id)).replace(
        "%%DATA%%", payload_json(payload)
    )
    parts = {
        "ID": viewer_id,
        "CSS": css,
        "TITLE": _SURROGATE.sub("\ufffd", _html.escape(title)),
        "CONTROLS": _IDS.sub("", VIEWER_CONTROLS),
        "PANELS": _IDS.sub("", VIEWER_PANELS),
        "JS": _MOUNT_JS + boot,
    }
    return _FRAGMENT_PLACEHOLDER.sub(lambda m: parts[m.group(1)], _EMBED_TEMPLATE)


_FRAGMENT_PLACEHOLDER = re.compile(r"%%(ID|CSS|TITLE|CONTROLS|PANELS|JS)%%")


class AttentionViewer:
    """The interactive viewer of ``kinds`` as an object a notebook displays: in Jupyter
    (JupyterLab, VS Code, classic) ``AttentionViewer(kinds)`` at the end of a cell shows the
    viewer inline (:meth:`_repr_html_`, a new :func:`attention_fragment` each time, so the same
    object may be shown twice); :meth:`save` writes the page of :func:`attention_html`.

    Args: as :func:`attention_html` (checked here, so a bad argument fails at once).
    """

    def __init__(
        self,
        kinds: AttentionKind | Sequence[AttentionKind],
        *,
        title: str = "qkv attention",
        decimals: int = 4,
        max_cells: int | None = MAX_CELLS,
        warn_cells: int | None = WARN_CELLS,
    ) -> None:
        self.kinds = as_kinds(kinds)
        self.options: dict[str, Any] = {
            "title": title,
            "decimals": decimals,
            "max_cells": max_cells,
            "warn_cells": None,  # warned once, here
        }
        attention_payload(self.kinds, **{**self.options, "warn_cells": warn_cells})

    def _repr_html_(self) -> str:
        return attention_fragment(self.kinds, **self.options)

    def save(self, path: str | Path) -> Path:
        """Write the viewer's page (:func:`save_attention_html`) to ``path``."""
        return save_attention_html(path, self.kinds, **self.options)

    def __repr__(self) -> str:
        shapes = ", ".join(
            f"{k.name!r} {k.num_layers} layer{'s' if k.num_layers != 1 else ''} "
            f"{k.shape[0]}x{k.shape[1]}"
            for k in self.kinds
        )
        return f"AttentionViewer({shapes})"
