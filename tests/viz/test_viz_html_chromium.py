"""The HTML viewer in real headless Chromium: it renders, the head menu changes the picture,
hovering a token or a cell highlights where it attends."""

from __future__ import annotations

import pytest
import torch
from _folders import assert_not_blank_png

from qkv import viz

SRC = ["the", "cat", "drank", "the", "milk", "because", "it", "was", "sweet", "."]
TGT = ["le", "chat", "a", "bu", "le", "lait", "parce", "qu'", "il", "était", "sucré", "."]

PIXELS = """(() => {
  const c = document.getElementById(%r);
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let h = 0, ink = 0; const colours = new Set();
  for (let i = 0; i < d.length; i += 4) {
    h = (Math.imul(h, 31) + d[i] + 7 * d[i + 1] + 13 * d[i + 2] + 17 * d[i + 3]) >>> 0;
    if (d[i + 3] > 0 && (d[i] < 245 || d[i + 1] < 235 || d[i + 2] < 235)) ink++;
    colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
  }
  return {hash: h, ink: ink, colours: colours.size, w: c.width, h: c.height};
})()"""

CENTER = """(() => {
  const r = document.querySelectorAll(%r)[%d].getBoundingClientRect();
  return [r.x + r.width / 2, r.y + r.height / 2];
})()"""


def _weights(L, H, Lq, Lk, *, causal=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = 3 * torch.randn(L, H, Lq, Lk, generator=g)
    if causal:
        s = s.masked_fill(torch.ones(Lq, Lk, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1)


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    d = tmp_path_factory.mktemp("viewer")
    S, T = len(SRC), len(TGT)
    kinds = viz.translation_attention(
        SRC,
        TGT,
        encoder=_weights(2, 4, S, S, seed=1),
        decoder=_weights(2, 4, T, T, causal=True, seed=2),
        cross=_weights(2, 4, T, S, seed=3),
    )
    small = viz.save_attention_html(d / "translation.html", kinds, title="a translation")
    toks = [f"w{i}" for i in range(500)]
    big = viz.save_attention_html(
        d / "long.html",
        viz.AttentionKind("self-attention", _weights(1, 2, 500, 500, seed=4), toks, toks),
    )
    return {"small": small, "big": big, "dir": d}


def _select(browser, menu: str, value: int) -> None:
    # as a user does: change the <select>'s value, which fires "change"
    browser.eval(
        f"(() => {{ const s = document.getElementById({menu!r}); s.value = {str(value)!r};"
        " s.dispatchEvent(new Event('change')); })()"
    )


def test_page_renders(browser, pages):
    browser.open(pages["small"])
    assert browser.eval("document.title") == "a translation"
    px = browser.eval(PIXELS % "heat")
    assert px["w"] > 100 and px["h"] > 100
    assert px["ink"] > 2000, px  # the heatmap and its labels are drawn
    assert px["colours"] > 20, px
    menus = browser.eval(
        "['kind', 'layer', 'head'].map(id => document.getElementById(id).options.length)"
    )
    assert menus == [3, 2, 5]  # 3 kinds, 2 layers, mean + 4 heads
    # a translation opens on its cross-attention (target rows, source columns), last layer
    assert browser.eval("document.body.dataset.view") == "2:1:-1:matrix"
    assert browser.eval("document.querySelectorAll('#qtokens .tok').length") == len(TGT)
    assert browser.eval("qkvViewer.geometry().cell") >= 28  # 10 keys: cells to read and hover
    # the screenshot itself is not blank
    img = assert_not_blank_png(browser.screenshot(pages["dir"] / "translation.png"))
    assert (img[..., 1] < 120).sum() > 500  # reds from the heatmap


def test_switching_head_changes_the_picture(browser, pages):
    browser.open(pages["small"])
    _select(browser, "kind", 0)  # the encoder's self-attention, at its first layer
    before = browser.eval(PIXELS % "heat")
    _select(browser, "head", 1)
    assert browser.eval("document.body.dataset.view") == "0:0:1:matrix"
    head1 = browser.eval(PIXELS % "heat")
    assert head1["hash"] != before["hash"]
    _select(browser, "head", 2)
    head2 = browser.eval(PIXELS % "heat")
    assert head2["hash"] not in (before["hash"], head1["hash"])
    _select(browser, "head", -1)  # back to the mean: the same picture as at first
    assert browser.eval(PIXELS % "heat")["hash"] == before["hash"]
    # layer and kind menus too; the cross-attention kind has 12 query rows
    _select(browser, "layer", 1)
    assert browser.eval(PIXELS % "heat")["hash"] != before["hash"]
    _select(browser, "kind", 2)
    assert browser.eval("document.querySelectorAll('#qtokens .tok').length") == len(TGT)
    assert browser.eval("document.body.dataset.view") == "2:0:-1:matrix"


def test_hovering_a_query_token_highlights_where_it_attends(browser, pages):
    browser.open(pages["small"])
    _select(browser, "kind", 0)
    assert browser.eval("document.body.dataset.hover || ''") == ""
    assert browser.eval(PIXELS % "overlay")["ink"] == 0
    browser.hover(*browser.eval(CENTER % ("#qtokens .tok", 6)))  # "it"
    assert browser.eval("document.body.dataset.hover") == "q:6"
    assert browser.eval("document.querySelector('#qtokens .tok.active').textContent") == "it"
    painted = browser.eval(
        "[...document.querySelectorAll('#ktokens .tok')].filter(s => s.style.background).length"
    )
    assert painted >= 3
    assert browser.eval(PIXELS % "overlay")["ink"] > 50  # the row is outlined
    assert "\u201cit\u201d attends to" in browser.eval(
        "document.getElementById('readout').textContent"
    )
    browser.screenshot(pages["dir"] / "hover-query.png")

    # a key token: the queries that attend to it light up
    browser.hover(*browser.eval(CENTER % ("#ktokens .tok", 4)))  # "milk"
    assert browser.eval("document.body.dataset.hover") == "k:4"
    painted = browser.eval(
        "[...document.querySelectorAll('#qtokens .tok')].filter(s => s.style.background).length"
    )
    assert painted >= 3
    assert "attended from" in browser.eval("document.getElementById('readout').textContent")


def test_hovering_a_cell(browser, pages):
    browser.open(pages["small"])
    _select(browser, "kind", 0)
    g = browser.eval("qkvViewer.geometry()")
    r = browser.eval("(() => { const r = heat.getBoundingClientRect(); return [r.x, r.y]; })()")
    x = r[0] + g["left"] + 4.5 * g["cell"]
    y = r[1] + g["top"] + 2.5 * g["cell"]
    browser.hover(x, y)
    assert browser.eval("document.body.dataset.hover") == "cell:2:4"
    text = browser.eval("document.getElementById('readout').textContent")
    assert "\u201cdrank\u201d \u2192 key 4 \u201cmilk\u201d" in text
    # the number shown is the weight embedded for that cell
    w = browser.eval("qkvViewer.data.kinds[0].layers[0].mean[2 * 10 + 4] / qkvViewer.data.scale")
    assert text.endswith(f"{w:.4f}")


def test_usable_at_500_tokens(browser, pages):
    browser.open(pages["big"])
    assert browser.eval("qkvViewer.state.norm") == "row"  # long input: per-row colours
    px = browser.eval(PIXELS % "heat")
    assert px["ink"] > 10000
    # a canvas, not 250k cells in the DOM
    assert browser.eval("document.getElementsByTagName('*').length") < 3000
    g = browser.eval("qkvViewer.geometry()")
    r = browser.eval("(() => { const r = heat.getBoundingClientRect(); return [r.x, r.y]; })()")
    browser.hover(r[0] + g["left"] + 120.5 * g["cell"], r[1] + g["top"] + 300.5 * g["cell"])
    assert browser.eval("document.body.dataset.hover") == "cell:300:120"
    _select(browser, "head", 1)
    assert browser.eval(PIXELS % "heat")["hash"] != px["hash"]
    browser.screenshot(pages["dir"] / "long.png")
