"""The page at / in real headless Chromium: type a sentence, submit, read the translation from
the DOM, open its attention in the viewer, and a sentence of HTML shows as text, running
nothing."""

from __future__ import annotations

import pytest
from _serve_helpers import SOURCES, live_server

PIXELS = """(() => {
  const c = document.getElementById('heat');
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let ink = 0;
  for (let i = 0; i < d.length; i += 4)
    if (d[i + 3] > 0 && (d[i] < 245 || d[i + 1] < 235 || d[i + 2] < 235)) ink++;
  return {ink: ink, w: c.width, h: c.height};
})()"""


@pytest.fixture(scope="module")
def site(translator):
    with live_server(translator, max_wait_ms=0) as s:
        yield s


def submit(browser, text: str, alternatives: int = 0) -> None:
    n = int(browser.eval("Number(document.body.dataset.translated || 0)"))
    browser.eval("document.getElementById('q').value = ''")
    browser.click_on("#q")  # focus the box, as a user does
    browser.type_text(text)
    browser.eval(
        "(() => { const s = document.getElementById('alternatives');"
        f" s.value = '{alternatives}'; s.dispatchEvent(new Event('change')); }})()"
    )
    browser.click_on("#go")
    browser.wait_for(f"Number(document.body.dataset.translated || 0) > {n}", what="a translation")


def translations(browser) -> list[str]:
    return browser.eval(
        "Array.from(document.querySelectorAll('#results .translation')).map(b => b.textContent)"
    )


def open_attention(browser, index: int) -> None:
    n = int(browser.eval("Number(document.body.dataset.attention || 0)"))
    browser.click_on("#results .translation", index)
    browser.wait_for(f"Number(document.body.dataset.attention || 0) > {n}", what="the attention")


def test_type_translate_and_see_the_attention(browser, site, translator):
    browser.goto(site.url + "/", ready="document.body.dataset.page === 'ready'")
    assert browser.eval("document.getElementById('pair').textContent") == "(en \u2192 fr)"
    assert browser.eval("document.getElementById('viewer').hidden") is True
    text = SOURCES[4]
    submit(browser, text)
    assert translations(browser) == [translator.translate(text)]
    open_attention(browser, 0)
    assert browser.eval("document.getElementById('viewer').hidden") is False
    ref = translator.attention(text)
    assert browser.eval("document.getElementById('viewer-title').textContent") == (
        f"{text}  \u2192  {ref.translation}"
    )
    # the viewer of qkv translate --attention: its menus, tokens and picture
    names = browser.eval("qkvViewer.data.kinds.map(k => k.name)")
    assert names == ["encoder self-attention", "decoder self-attention", "cross-attention"]
    assert browser.eval("document.getElementById('kind').options.length") == 3
    assert browser.eval("document.querySelectorAll('#qtokens .tok').length") == len(ref.src_tokens)
    px = browser.eval(PIXELS)
    assert px["w"] > 50 and px["ink"] > 500, px
    # another kind from the menu, as in the file's viewer
    browser.eval(
        "(() => { const s = document.getElementById('kind'); s.value = '2';"
        " s.dispatchEvent(new Event('change')); })()"
    )
    assert browser.eval("document.querySelectorAll('#qtokens .tok').length") == len(ref.tgt_tokens)
    # nothing came from anywhere but this server
    origins = browser.eval(
        "performance.getEntriesByType('resource').map(e => new URL(e.name).origin)"
    )
    assert set(origins) <= {site.url}, origins


def test_alternatives_each_open_their_own_attention(browser, site, translator):
    browser.goto(site.url + "/", ready="document.body.dataset.page === 'ready'")
    text = SOURCES[6]
    submit(browser, text, alternatives=2)
    hyps = translator.translate(text, beam_size=3, n_best=3)
    assert translations(browser) == [t for t, _ in hyps]
    open_attention(browser, 2)
    want = translator.attention(
        text, ids=translator.generate([text], beam_size=3, n_best=3)[0][2][0]
    )
    assert browser.eval("qkvViewer.data.kinds[2].q") == want.tgt_tokens
    assert browser.eval("document.querySelector('.translation.active').textContent") == hyps[2][0]


def test_html_in_a_sentence_is_shown_as_text_and_runs_nothing(browser, site, translator):
    browser.goto(site.url + "/", ready="document.body.dataset.page === 'ready'")
    evil = "<img src=x onerror=\"document.body.dataset.pwned='1'\"> <b>go</b> ."
    submit(browser, evil)
    assert translations(browser) == [translator.translate(evil)]
    open_attention(browser, 0)
    title = browser.eval("document.getElementById('viewer-title').textContent")
    assert title.startswith(evil)  # the very characters, as text
    assert browser.eval("document.querySelectorAll('img, b').length") == 0  # no element made
    assert browser.eval("document.body.dataset.pwned") is None
    toks = browser.eval(
        "Array.from(document.querySelectorAll('#qtokens .tok')).map(s => s.textContent)"
    )
    assert toks == translator.attention(evil).src_tokens
    assert any("<" in t for t in toks)  # markup-like tokens (e.g. <unk>) shown as text
    # an error answer is shown as text too
    browser.eval(
        "document.getElementById('q').maxLength = 100000;"
        "document.getElementById('q').value = '<i>' + 'x'.repeat(3000);"
    )
    browser.click_on("#go")
    browser.wait_for("!!document.body.dataset.error", what="the error")
    err = browser.eval("document.getElementById('status').textContent")
    assert err.startswith("error: q: 3,003 characters, over the limit")
    assert browser.eval("document.querySelectorAll('i').length") == 0
