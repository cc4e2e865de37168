"""The page at / in real headless Chromium: type a sentence, submit, read the translation from
the DOM, open its attention in the viewer, and a sentence of HTML shows as text, running
nothing; with several models, the source and target menus come from /languages, and the page
says the language detected and the pivot taken."""

from __future__ import annotations

import pytest
from _serve_helpers import PAIRS, SOURCES, live_app, live_server, tiny_model_folder

from qkv.serve import ServeConfig, create_app
from qkv.serve.registry import ModelRegistry, inspect_folder
from qkv.translate import Translator

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
    # it opens on the cross-attention (target rows), as the file's viewer does
    assert browser.eval("document.querySelectorAll('#qtokens .tok').length") == len(ref.tgt_tokens)
    px = browser.eval(PIXELS)
    assert px["w"] > 50 and px["ink"] > 500, px
    # another kind from the menu, as in the file's viewer
    browser.eval(
        "(() => { const s = document.getElementById('kind'); s.value = '0';"
        " s.dispatchEvent(new Event('change')); })()"
    )
    assert browser.eval("document.querySelectorAll('#qtokens .tok').length") == len(ref.src_tokens)
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
        "Array.from(document.querySelectorAll('#ktokens .tok')).map(s => s.textContent)"
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
    assert err.startswith("error: q: a sentence of 3,003 characters")
    assert browser.eval("document.querySelectorAll('i').length") == 0


# ---------------------------------------------------------------------------- several models
@pytest.fixture(scope="module")
def pairs_site(tmp_path_factory):
    """A server of en-fr, fr-en and en-de, and each model loaded alone (the references)."""
    root = tmp_path_factory.mktemp("page-pairs")
    folders = {
        pair: tiny_model_folder(root / pair, (pair[:2], pair[3:]), seed=i, reverse=pair == "fr-en")
        for i, pair in enumerate(("en-fr", "fr-en", "en-de"), 1)
    }
    reg = ModelRegistry.from_folders([inspect_folder(f) for f in folders.values()])
    with live_app(create_app(reg, ServeConfig(max_wait_ms=0))) as s:
        yield s, {pair: Translator.load(f) for pair, f in folders.items()}


def choose(browser, select: str, value: str) -> None:
    browser.eval(
        f"(() => {{ const s = document.getElementById('{select}'); s.value = '{value}';"
        " s.dispatchEvent(new Event('change')); })()"
    )


def options(browser, select: str) -> list[str]:
    return browser.eval(
        f"Array.from(document.getElementById('{select}').options).map(o => o.value)"
    )


def test_the_menus_come_from_languages_and_a_pivot_is_said(browser, pairs_site):
    site, ref = pairs_site
    browser.goto(site.url + "/", ready="document.body.dataset.page === 'ready'")
    assert options(browser, "source") == ["auto", "en", "fr"]  # de reaches only itself
    assert options(browser, "target") == ["de", "en", "fr"]
    assert browser.eval("document.getElementById('pair').textContent") == "(en \u2192 de)"
    choose(browser, "source", "fr")
    assert browser.eval("document.getElementById('target').value") == "de"
    text = PAIRS[3][1]
    submit(browser, text)
    want = ref["en-de"].translate(ref["fr-en"].translate(text))
    assert translations(browser) == [want]
    route = browser.eval("document.getElementById('route').textContent")
    assert route.startswith("through English (en): no model translates fr to de"), route
    assert browser.eval("document.getElementById('hint').hidden") is True  # two models


def test_detect_language_says_what_it_found_and_shows_that_models_attention(browser, pairs_site):
    site, ref = pairs_site
    pytest.importorskip("py3langid")
    browser.goto(site.url + "/", ready="document.body.dataset.page === 'ready'")
    choose(browser, "source", "auto")
    choose(browser, "target", "en")
    text = "Le médecin lui a conseillé de se reposer quelques jours."
    submit(browser, text)
    assert translations(browser) == [ref["fr-en"].translate(text)]
    route = browser.eval("document.getElementById('route').textContent")
    assert route.startswith("detected French (fr), ") and route.endswith("% sure"), route
    open_attention(browser, 0)
    assert browser.eval("qkvViewer.data.kinds[0].q") == ref["fr-en"].attention(text).src_tokens
