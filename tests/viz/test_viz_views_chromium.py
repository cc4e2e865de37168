"""The viewer's head, model and neuron views in headless Chromium, driven as a reader does:
the tabs, the pointer over the head view's tokens, a click on a head's colour and on a
thumbnail; the neuron view recomputes the model's weight from its query and key vectors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _viz_translation import sentence_attention

from qkv import viz

INK = """(() => {
  const c = document.querySelector(%r);
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let ink = 0;
  for (let i = 3; i < d.length; i += 4) if (d[i] > 0) ink++;
  return ink;
})()"""


@pytest.fixture(scope="module")
def att():
    return sentence_attention()


@pytest.fixture
def page(att, browser, tmp_path):
    path = viz.save_attention_html(tmp_path / "views.html", att.kinds(), title="views")
    browser.open(path)
    return browser


def _click_tab(browser, view: str) -> None:
    browser.click_on(f'.qkv-tab[data-view="{view}"]')
    assert browser.eval("document.body.dataset.mode") == view


def test_opens_on_the_cross_attention_of_the_last_layer(page):
    assert page.eval("qkvViewer.state.kind") == 2 and page.eval("qkvViewer.state.layer") == 1
    assert page.eval("document.getElementById('kind').selectedOptions[0].textContent") == (
        "cross-attention"
    )
    assert page.eval("qkvViewer.geometry().cell") >= 40  # 5 x 4 tokens: large cells


def test_head_view_lines_focus_and_head_choice(page, att):
    _click_tab(page, "head")
    assert page.eval("document.querySelector('.qkv-panels').hidden") is True
    full = page.eval(INK % ".qkv-lines")
    drawn = page.eval("qkvViewer.headView()")
    assert drawn["heads"] == [0, 1, 2, 3] and full > 500
    # the pointer over query 1 (a real mouse move): only that row's lines remain
    box = page.eval(
        "(() => { const r = document.querySelector('.qkv-lines').getBoundingClientRect();"
        " return [r.x, r.y, r.height]; })()"
    )
    Lq = len(att.tgt_tokens)  # the longer side: its rows fill the canvas between 8 px margins
    page.hover(box[0] + 10, box[1] + 8 + 1.5 * (box[2] - 16) / Lq)
    drawn = page.eval("qkvViewer.headView()")
    assert drawn["focus"] == {"axis": "q", "i": 1}
    Lk = len(att.src_tokens)
    for h in range(4):
        w = np.array(drawn["weights"][str(h)]).reshape(Lq, Lk)
        assert (w[[0, 2, 3, 4]] == 0).all() and w[1].sum() == pytest.approx(1, abs=1e-3)
    assert page.eval(INK % ".qkv-lines") < full
    assert "query 1 \u201cest\u201d" in page.eval(
        "document.querySelector('.qkv-head-readout').textContent"
    )
    # a click on head 2's colour hides it; a double-click shows head 3 alone
    page.click_on(".qkv-swatch", 2)
    assert page.eval("qkvViewer.headView().heads") == [0, 1, 3]
    page.eval(
        "document.querySelectorAll('.qkv-swatch')[3]"
        ".dispatchEvent(new MouseEvent('dblclick', {bubbles: true}))"
    )
    assert page.eval("qkvViewer.headView().heads") == [3]


def test_model_view_thumbnails_open_in_the_matrix(page):
    _click_tab(page, "model")
    assert page.eval("qkvViewer.modelView().thumbs") == 8  # 2 layers x 4 heads
    assert page.eval("document.querySelectorAll('.qkv-thumb').length") == 8
    assert page.eval(INK % ".qkv-thumb") > 0
    page.click_on(".qkv-thumb", 6)  # layer 1, head 2
    assert page.eval("document.body.dataset.mode") == "matrix"
    assert page.eval("document.body.dataset.view") == "2:1:2:matrix"
    assert page.eval("document.querySelector('.qkv-panels').hidden") is False


@pytest.mark.parametrize("kind", [0, 1, 2])
def test_neuron_view_recomputes_every_weight(page, att, kind):
    """For every query and key of one head: the dot product of the vectors shown, times the
    scale, through a softmax over the keys the query sees, is the model's weight (decoder
    self-attention: the later keys are masked)."""
    page.eval(f"qkvViewer.select({kind}, 1, 3)")
    _click_tab(page, "neuron")
    Lq, Lk = page.eval(
        f"[qkvViewer.data.kinds[{kind}].q.length, qkvViewer.data.kinds[{kind}].k.length]"
    )
    for i in range(Lq):
        for j in range(Lk):
            n = page.eval(f"(qkvViewer.pick({i}, {j}), qkvViewer.neuron())")
            assert n["query"] == i and n["key"] == j and n["head"] == 3 and n["layer"] == 1
            assert n["dot"] == pytest.approx(sum(n["prod"]), abs=1e-9)
            assert n["prod"] == pytest.approx([a * b for a, b in zip(n["q"], n["k"])])
            assert n["scale"] == pytest.approx(1 / math.sqrt(n["d"]))
            assert n["score"] == pytest.approx(n["dot"] * n["scale"])
            assert n["softmax"] == pytest.approx(n["weight"], abs=1e-4), (kind, i, j)
            if kind == 1 and j > i:
                assert n["weight"] == 0 and n["softmax"] == 0
    text = page.eval("document.querySelector('.qkv-neuron').textContent")
    assert "q \u00b7 k = \u03a3 (q \u00d7 k)" in text and "the model's weight" in text


def test_neuron_view_without_vectors_says_so(browser, tmp_path):
    w = np.full((1, 2, 3, 3), 1 / 3)
    path = viz.save_attention_html(tmp_path / "plain.html", viz.AttentionKind("self", w))
    browser.open(path)
    _click_tab(browser, "neuron")
    assert "no query and key vectors" in browser.eval(
        "document.querySelector('.qkv-neuron').textContent"
    )
    assert browser.eval("qkvViewer.neuron()") is None
