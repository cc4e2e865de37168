"""Three embedded viewers on one host page, in real headless Chromium: each draws its own data and
answers its own menus and pointer only, and the host page's own styles do not change.

The third viewer is put in the page as JupyterLab puts an output: its HTML set as the
``innerHTML`` of a detached element, its scripts re-created so that they run, and the element
attached to the document only later (the viewer's script must wait for its root)."""

from __future__ import annotations

import json

import pytest
import torch

from qkv import viz

HOST_CSS = """
body { font: 17px/1.9 Georgia, serif; margin: 31px; color: rgb(10, 60, 10);
  background: rgb(250, 250, 235); }
h2 { font-size: 29px; margin: 3px 0 21px; color: rgb(120, 0, 120); }
p { margin: 9px 2px; }
select { font-size: 19px; }
.tok, .tokens, .qkv-heat { color: rgb(0, 0, 200); }
canvas { border: 3px solid rgb(0, 128, 0); }
"""

HOST_BODY = """<h2 id="host-title">Host page</h2>
<p id="host-p">The host's own text, <span class="tok" id="host-tok">a host token</span>.</p>
<select id="host-select"><option>one</option></select>
<canvas id="host-canvas" width="20" height="20"></canvas>
<div class="tokens" id="host-tokens">tokens of the host</div>"""

#: every computed property the test compares on the host's own elements
STYLES = """(() => {
  const props = ['font-family', 'font-size', 'line-height', 'margin-top', 'margin-left',
                 'margin-bottom', 'color', 'background-color', 'border-top-width',
                 'border-top-color', 'padding-left', 'display', 'max-height', 'overflow-y'];
  const out = {};
  for (const id of ['host-title', 'host-p', 'host-tok', 'host-select', 'host-canvas',
                    'host-tokens']) {
    const s = getComputedStyle(document.getElementById(id));
    out[id] = props.map(p => s.getPropertyValue(p));
  }
  const b = getComputedStyle(document.body);
  out.body = props.map(p => b.getPropertyValue(p));
  return out;
})()"""

PIXELS = """(() => {
  const c = document.querySelectorAll('.qkv-viewer')[%d].querySelector('.qkv-heat');
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let h = 0, ink = 0;
  for (let i = 0; i < d.length; i += 4) {
    h = (Math.imul(h, 31) + d[i] + 7 * d[i + 1] + 13 * d[i + 2]) >>> 0;
    if (d[i] < 245 || d[i + 1] < 235 || d[i + 2] < 235) ink++;
  }
  return {hash: h, ink: ink};
})()"""

STATES = "[...document.querySelectorAll('.qkv-viewer')].map(r => [r.dataset.view, r.dataset.hover])"

# what JupyterLab does with an HTML output: innerHTML on a detached node, its scripts replaced by
# fresh ones (innerHTML's scripts never run), and the node attached afterwards
NOTEBOOK_WAY = """
(() => {
  const host = document.createElement('div');
  host.innerHTML = %s;
  for (const old of host.querySelectorAll('script')) {
    const s = document.createElement('script');
    s.textContent = old.textContent;
    old.parentNode.replaceChild(s, old);
  }
  setTimeout(() => document.getElementById('late').appendChild(host), 300);
})()
"""


def _kinds(seed: int, Lq: int, Lk: int, H: int) -> viz.AttentionKind:
    g = torch.Generator().manual_seed(seed)
    w = (3 * torch.randn(2, H, Lq, Lk, generator=g)).softmax(-1)
    return viz.AttentionKind(
        f"kind {seed}", w, [f"q{seed}_{i}" for i in range(Lq)], [f"k{seed}_{j}" for j in range(Lk)]
    )


def _page(body: str) -> str:
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>host</title>'
        f"<style>{HOST_CSS}</style></head><body>{body}</body></html>"
    )


def _center(browser, viewer: int, selector: str, index: int) -> list[float]:
    return browser.eval(
        f"(() => {{ const e = document.querySelectorAll('.qkv-viewer')[{viewer}]"
        f".querySelectorAll({selector!r})[{index}]; e.scrollIntoView({{block: 'center'}});"
        " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
    )


def _select(browser, viewer: int, menu: str, value: int) -> None:
    browser.eval(
        f"(() => {{ const s = document.querySelectorAll('.qkv-viewer')[{viewer}]"
        f".querySelector('.qkv-{menu}'); s.value = {str(value)!r};"
        " s.dispatchEvent(new Event('change')); })()"
    )


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    d = tmp_path_factory.mktemp("embed")
    first = viz.attention_fragment(_kinds(1, 7, 9, 4), title="first")
    second = viz.AttentionViewer(_kinds(2, 5, 5, 2), title="second")._repr_html_()
    third = viz.attention_fragment(_kinds(3, 11, 6, 3), title="third")
    alone = d / "host.html"
    alone.write_text(_page(HOST_BODY), encoding="utf-8")
    page = d / "three.html"
    page.write_text(
        _page(HOST_BODY + first + "<p>between</p>" + second + '<div id="late"></div>'),
        encoding="utf-8",
    )
    return {"alone": alone, "page": page, "third": third, "dir": d}


def test_three_viewers_each_answer_their_own_controls(browser, host):
    browser.open(host["alone"], ready="document.readyState === 'complete'")
    host_styles = browser.eval(STYLES)

    browser.open(host["page"], ready="document.readyState === 'complete'")
    browser.eval(NOTEBOOK_WAY % json.dumps(host["third"]))
    ready = "[...document.querySelectorAll('.qkv-viewer')].filter(r => r.dataset.ready === '1')"
    browser.wait_for(f"{ready}.length === 3", what="three viewers to draw")

    # the host's own elements look exactly as they did without the viewers
    assert browser.eval(STYLES) == host_styles
    ids = browser.eval("[...document.querySelectorAll('[id]')].map(e => e.id)")
    assert len(ids) == len(set(ids)), ids  # no id twice on the page
    assert browser.eval("document.querySelectorAll('.qkv-noscript').length") == 0

    # each viewer drew its own data: its tokens, its menus, its picture
    firsts = browser.eval(
        "[...document.querySelectorAll('.qkv-viewer')].map(r => "
        "[r.querySelector('.qkv-title').textContent, r.querySelectorAll('.qkv-qtokens .tok').length,"
        " r.querySelector('.qkv-head-menu').options.length])"
    )
    assert firsts == [["first", 7, 5], ["second", 5, 3], ["third", 11, 4]]
    before = [browser.eval(PIXELS % i) for i in range(3)]
    assert all(p["ink"] > 200 for p in before), before
    # each opens on its last layer (of two), the heads averaged
    assert browser.eval(STATES) == [["0:1:-1:matrix", ""]] * 3

    # a menu of the second viewer changes the second viewer only
    _select(browser, 1, "head-menu", 1)
    assert browser.eval(STATES) == [
        ["0:1:-1:matrix", ""],
        ["0:1:1:matrix", ""],
        ["0:1:-1:matrix", ""],
    ]
    after = [browser.eval(PIXELS % i) for i in range(3)]
    assert after[1]["hash"] != before[1]["hash"]
    assert [after[0]["hash"], after[2]["hash"]] == [before[0]["hash"], before[2]["hash"]]
    _select(browser, 2, "layer", 0)
    assert browser.eval(STATES)[2] == ["0:0:-1:matrix", ""]

    # the real pointer over a query token of the third viewer (attached late)
    browser.hover(*_center(browser, 2, ".qkv-qtokens .tok", 4))
    states = browser.eval(STATES)
    assert [s[1] for s in states] == ["", "", "q:4"]
    readout = browser.eval(
        "document.querySelectorAll('.qkv-viewer')[2].querySelector('.qkv-readout').textContent"
    )
    assert "\u201cq3_4\u201d attends to" in readout
    painted = browser.eval(
        "[...document.querySelectorAll('.qkv-viewer')[2].querySelectorAll('.qkv-ktokens .tok')]"
        ".filter(s => s.style.background).length"
    )
    assert painted >= 2
    # ... and over a cell of the first: its own readout, its own weight
    browser.hover(*_center(browser, 0, ".qkv-heat", 0))  # bring it into view
    g = browser.eval("document.querySelectorAll('.qkv-viewer')[0].qkvViewer.geometry()")
    r = browser.eval(
        "(() => { const r = document.querySelectorAll('.qkv-viewer')[0]"
        ".querySelector('.qkv-heat').getBoundingClientRect(); return [r.x, r.y]; })()"
    )
    browser.hover(r[0] + g["left"] + 3.5 * g["cell"], r[1] + g["top"] + 2.5 * g["cell"])
    assert [s[1] for s in browser.eval(STATES)] == ["cell:2:3", "", "q:4"]
    w = browser.eval(
        "(() => { const v = document.querySelectorAll('.qkv-viewer')[0].qkvViewer;"
        " return v.data.kinds[0].layers[1].mean[2 * 9 + 3] / v.data.scale; })()"
    )
    text = browser.eval(
        "document.querySelectorAll('.qkv-viewer')[0].querySelector('.qkv-readout').textContent"
    )
    assert text.endswith(f"{w:.4f}") and "\u201cq1_2\u201d \u2192 key 3 \u201ck1_3\u201d" in text
    # the host's styles still have not changed, and nothing leaked into the global scope
    assert browser.eval(STYLES) == host_styles
    assert browser.eval("typeof window.qkvViewer") == "undefined"
    browser.screenshot(host["dir"] / "three.png")
