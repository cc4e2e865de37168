"""show_heatmaps, plot_attention and save_attention: files written, not blank, errors named."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from qkv import viz


def _ink(path) -> float:
    return float(np.asarray(Image.open(path).convert("L"), dtype=float).std())


def test_show_heatmaps_grid_shared_colour_bar(tmp_path):
    m = torch.rand(2, 3, 5, 7)
    m[1, 2] *= 3  # one panel with a larger range
    fig = viz.show_heatmaps(
        m, "keys", "queries", titles=["a", "b", "c"], figsize=(6, 4), path=tmp_path / "g.png"
    )
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 6 and len(fig.axes) == 7  # 6 heatmaps + the colour bar
    clims = {ax.images[0].get_clim() for ax in panels}
    assert len(clims) == 1  # one colour scale for all panels
    lo, hi = clims.pop()
    assert lo == pytest.approx(float(m.min())) and hi == pytest.approx(float(m.max()))
    assert [ax.get_title() for ax in panels[:3]] == ["a", "b", "c"]
    assert panels[3].get_xlabel() == "keys" and panels[0].get_ylabel() == "queries"
    assert (tmp_path / "g.png").stat().st_size > 1000
    assert _ink(tmp_path / "g.png") > 5


@pytest.mark.parametrize(
    ("suffix", "magic"), [(".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF")]
)
def test_show_heatmaps_saves_by_extension(tmp_path, suffix, magic):
    path = tmp_path / "sub" / f"h{suffix}"
    viz.show_heatmaps(np.eye(4)[None, None], "x", "y", path=path)
    assert path.read_bytes()[:5].startswith(magic)


def test_show_heatmaps_token_labels_and_lower_rank_inputs():
    toks = ["the", "cat", "sat"]
    fig = viz.show_heatmaps(
        [[0.2, 0.3, 0.5], [0.1, 0.1, 0.8], [1, 0, 0]], "k", "q", xticklabels=toks, yticklabels=toks
    )
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == toks
    assert [t.get_text() for t in ax.get_yticklabels()] == toks
    fig = viz.show_heatmaps(torch.rand(4, 3, 3), "k", "q")  # (cols, Lq, Lk): one row
    assert sum(1 for ax in fig.axes if ax.images) == 4 and len(fig.axes) == 5


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"matrices": np.zeros((1, 1, 1, 2, 2))}, ValueError, "matrices"),
        ({"matrices": "abc"}, TypeError, "matrices"),
        ({"matrices": np.full((2, 2), np.nan)}, ValueError, "finite"),
        ({"titles": ["a", "b"]}, ValueError, "titles"),
        ({"xticklabels": ["a"]}, ValueError, "xticklabels"),
        ({"yticklabels": ["a", "b", "c"]}, ValueError, "yticklabels"),
        ({"cmap": "NoSuchMap"}, ValueError, "cmap"),
        ({"figsize": (0, 2)}, ValueError, "figsize"),
        ({"path": "out.jpg"}, ValueError, "path"),
    ],
)
def test_show_heatmaps_errors_name_the_argument(kwargs, exc, words):
    args = {"matrices": np.ones((1, 1, 2, 2)), "xlabel": "x", "ylabel": "y", **kwargs}
    with pytest.raises(exc, match=words):
        viz.show_heatmaps(**args)


def _kinds():
    src, tgt = ["a", "b", "c"], ["x", "y"]
    w = lambda *s: torch.rand(*s).softmax(-1)  # noqa: E731
    return viz.translation_attention(
        src, tgt, encoder=w(2, 4, 3, 3), decoder=w(2, 4, 2, 2), cross=[w(4, 2, 3), w(4, 2, 3)]
    )


def test_plot_attention_grid(tmp_path):
    fig = viz.plot_attention(_kinds(), head=1, path=tmp_path / "att.svg")
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 3 * 2 and len(fig.axes) == 3 * 2 + 1  # and a colour bar
    assert "cross-attention" in panels[4].get_title() and "head 1" in panels[4].get_title()
    assert [t.get_text() for t in panels[4].get_xticklabels()] == ["a", "b", "c"]
    assert [t.get_text() for t in panels[4].get_yticklabels()] == ["x", "y"]
    assert (tmp_path / "att.svg").read_text().count("<svg") == 1


def test_save_attention_dispatches_on_the_extension(tmp_path):
    kinds = _kinds()
    png = viz.save_attention(tmp_path / "a.png", kinds, layers=[-1])
    assert png.read_bytes()[:4] == b"\x89PNG" and _ink(png) > 5
    page = viz.save_attention(tmp_path / "a.html", kinds, title="t")
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    with pytest.raises(ValueError, match="path"):
        viz.save_attention(tmp_path / "a.txt", kinds)
    with pytest.raises(ValueError, match="layers"):
        viz.plot_attention(kinds, layers=[5])


def test_plot_attention_size_is_bounded_at_500_tokens(tmp_path):
    # 3 kinds x 6 layers x 500 tokens used to ask for a 667 x 333 inch figure
    from qkv.viz.heatmaps import FIGURE_MAX, PANEL_MAX

    n = 500
    w = torch.rand(2, n, n).softmax(-1)
    toks = [f"t{i}" for i in range(n)]
    kinds = [viz.AttentionKind(f"kind {i}", [w] * 6, toks, toks) for i in range(3)]
    fig = viz.plot_attention(kinds)
    width, height = fig.get_size_inches()
    assert width <= FIGURE_MAX and height <= FIGURE_MAX
    assert width <= 6 * (PANEL_MAX + 1.0) + 1.2 and height <= 3 * (PANEL_MAX + 1.0)
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 18
    assert all(len(ax.get_xticklabels()) <= 40 for ax in panels)  # labels thinned to fit
    assert all(len(ax.get_yticklabels()) <= 40 for ax in panels)
    # many layers: the panels shrink so that the figure stays within FIGURE_MAX
    many = viz.plot_attention([viz.AttentionKind("k", [w[:1, :50, :50]] * 40)])
    assert max(many.get_size_inches()) <= FIGURE_MAX


def test_plot_attention_small_inputs_keep_their_size():
    fig = viz.plot_attention(_kinds())
    width, height = fig.get_size_inches()
    assert 3 * 2.0 <= height <= 3 * 5.0 and 2 * 2.0 <= width <= 2 * 5.0 + 1.2


def test_dollar_signs_in_tokens_and_titles_are_text(tmp_path):
    # "$x_{$" is broken mathtext: drawing it used to raise
    toks = ["$x_{$", "5$", "$a$"]
    w = torch.rand(1, 3, 3).softmax(-1)
    kind = viz.AttentionKind("cost $", [w], toks, toks)
    fig = viz.plot_attention(kind, path=tmp_path / "d.png")
    assert _ink(tmp_path / "d.png") > 5
    panel = next(ax for ax in fig.axes if ax.images)
    assert [t.get_text() for t in panel.get_xticklabels()] == toks
    assert "cost $" in panel.get_title()
    viz.show_heatmaps(
        w, "keys", "queries", titles=["$bad{"], xticklabels=toks, yticklabels=toks,
        path=tmp_path / "h.png",
    )  # fmt: skip
    assert _ink(tmp_path / "h.png") > 5
