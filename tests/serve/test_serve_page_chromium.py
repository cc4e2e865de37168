"""The page at / in real headless Chromium: type a text, translate, read the translation from
the second pane, open a sentence's attention in the viewer; a paragraph's sentences each open
their own; the character counter, swap, copy and the file tab (a file sent as LibreTranslate's
page sends it, downloaded back); a sentence of HTML shows as text, running nothing; with
several models, the menus and the title name every pair, and the page says the language
detected and the pivot taken."""

from __future__ import annotations

import base64
import json

import pytest
from _serve_documents import SAMPLES, contents, readable
from _serve_helpers import PAIRS, SOURCES, live_app, live_server, tiny_model_folder

from qkv.serve import ServeConfig, create_app
from qkv.serve.registry import ModelRegistry, inspect_folder
from qkv.text import format_of, translate_document
from qkv.translate import Translator

PIXELS = """(() => {
  const c = document.getElementById('heat');
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let ink = 0;
  for (let i = 0; i < d.length; i += 4)
    if (d[i + 3] > 0 && (d[i] < 245 || d[i + 1] < 235 || d[i + 2] < 235)) ink++;
  return {ink: ink, w: c.width, h: c.height};
})()"""

PARAGRAPH = "I am home. He is calm.\n\n  Go on."


@pytest.fixture(scope="module")
def site(translator):
    with live_server(translator, max_wait_ms=0) as s:
        yield s


def ready(browser, url: str) -> None:
    browser.goto(url + "/", ready="document.body.dataset.page === 'ready'")


def submit(browser, text: str, alternatives: int = 0) -> None:
    n = int(browser.eval("Number(document.body.dataset.translated || 0)"))
    browser.eval("document.getElementById('q').value = ''")
    browser.click_on("#q")  # focus the box, as a user does
    browser.type_text(text)
    choose(browser, "alternatives", str(alternatives))
    browser.click_on("#go")
    browser.wait_for(f"Number(document.body.dataset.translated || 0) > {n}", what="a translation")


def output(browser) -> str:
    return browser.eval("document.getElementById('output').textContent")


def sentences(browser) -> list[dict]:
    return browser.eval(
        "Array.from(document.querySelectorAll('#output .sentence'))"
        ".map(s => ({source: s.title, translation: s.textContent}))"
    )


def alternatives(browser) -> list[str]:
    return browser.eval(
        "Array.from(document.querySelectorAll('#alts .translation')).map(b => b.textContent)"
    )


def click_first_line(browser, selector: str, index: int) -> None:
    """Click the middle of the first line of the ``index``-th element matching ``selector`` (a
    sentence that wraps is two boxes: the middle of its bounds may be neither)."""
    x, y = browser.eval(
        f"(() => {{ const e = document.querySelectorAll({selector!r})[{index}];"
        " e.scrollIntoView({block: 'center'}); const r = e.getClientRects()[0];"
        " return [r.x + Math.min(r.width / 2, 20), r.y + r.height / 2]; })()"
    )
    browser.click(x, y)


def open_attention(browser, selector: str, index: int) -> None:
    n = int(browser.eval("Number(document.body.dataset.attention || 0)"))
    click_first_line(browser, selector, index)
    browser.wait_for(f"Number(document.body.dataset.attention || 0) > {n}", what="the attention")


def choose(browser, select: str, value: str) -> None:
    browser.eval(
        f"(() => {{ const s = document.getElementById('{select}'); s.value = '{value}';"
        " s.dispatchEvent(new Event('change')); })()"
    )


def options(browser, select: str) -> list[str]:
    return browser.eval(
        f"Array.from(document.getElementById('{select}').options).map(o => o.value)"
    )


def test_type_translate_and_see_the_attention(browser, site, translator):
    ready(browser, site.url)
    assert browser.eval("document.getElementById('pair').textContent") == "(en \u2192 fr)"
    assert browser.eval("document.title") == "qkv translate: en \u2192 fr"
    assert browser.eval("document.getElementById('viewer').hidden") is True
    text = SOURCES[4]
    submit(browser, text)
    assert output(browser) == translator.translate(text)
    open_attention(browser, "#output .sentence", 0)
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
    choose(browser, "kind", "0")  # another kind from the menu, as in the file's viewer
    assert browser.eval("document.querySelectorAll('#qtokens .tok').length") == len(ref.src_tokens)
    # nothing came from anywhere but this server
    origins = browser.eval(
        "performance.getEntriesByType('resource').map(e => new URL(e.name).origin)"
    )
    assert set(origins) <= {site.url}, origins


def test_a_paragraphs_sentences_each_open_their_own_attention(browser, site, translator):
    ready(browser, site.url)
    submit(browser, PARAGRAPH)
    assert output(browser) == translator.translate(PARAGRAPH)  # blank line, indent kept
    found = sentences(browser)
    assert [s["source"] for s in found] == ["I am home.", "He is calm.", "Go on."]
    alone = translator.translate_segments([s["source"] for s in found])
    assert [s["translation"] for s in found] == [t or s["source"] for t, s in zip(alone, found)]
    open_attention(browser, "#output .sentence", 1)
    want = translator.attention("He is calm.")
    assert browser.eval("qkvViewer.data.kinds[2].k") == want.src_tokens
    assert (
        browser.eval("document.querySelector('.sentence.active').textContent")
        == (found[1]["translation"])
    )


def test_alternatives_each_open_their_own_attention(browser, site, translator):
    ready(browser, site.url)
    text = SOURCES[6]
    submit(browser, text, alternatives=2)
    hyps = translator.translate(text, beam_size=3, n_best=3)
    assert [output(browser), *alternatives(browser)] == [t for t, _ in hyps]
    open_attention(browser, "#alts .translation", 1)
    want = translator.attention(
        text, ids=translator.generate([text], beam_size=3, n_best=3)[0][2][0]
    )
    assert browser.eval("qkvViewer.data.kinds[2].q") == want.tgt_tokens
    assert browser.eval("document.querySelector('.translation.active').textContent") == hyps[2][0]


def test_the_counter_counts_against_the_char_limit_and_copy_copies(browser, site, translator):
    ready(browser, site.url)
    assert browser.eval("document.getElementById('count').textContent") == "0 / 5,000 characters"
    assert browser.eval("document.getElementById('q').maxLength") == 5000
    submit(browser, PARAGRAPH)
    n = len(PARAGRAPH)
    assert browser.eval("document.getElementById('count').textContent") == (
        f"{n} / 5,000 characters"
    )
    browser.eval(
        "(() => { const q = document.getElementById('q'); q.maxLength = 100000;"
        " q.value = 'x'.repeat(5001); q.dispatchEvent(new Event('input')); })()"
    )
    assert browser.eval("document.getElementById('count').classList.contains('over')") is True
    # copy: the translation is on the clipboard
    browser.call("Browser.grantPermissions", permissions=["clipboardReadWrite"], origin=site.url)
    n = int(browser.eval("Number(document.body.dataset.copied || 0)"))
    browser.click_on("#copy")
    browser.wait_for(f"Number(document.body.dataset.copied || 0) > {n}", what="the copy")
    assert browser.eval("navigator.clipboard.readText()") == translator.translate(PARAGRAPH)
    # one model, en to fr: nothing to swap to
    assert browser.eval("document.getElementById('swap').disabled") is True


def test_html_in_a_sentence_is_shown_as_text_and_runs_nothing(browser, site, translator):
    ready(browser, site.url)
    evil = "<img src=x onerror=\"document.body.dataset.pwned='1'\"> <b>go</b> ."
    submit(browser, evil)
    assert output(browser) == translator.translate(evil)
    open_attention(browser, "#output .sentence", 0)
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


# ---------------------------------------------------------------------------- files
def set_file(browser, path) -> None:
    """Choose ``path`` in the file input, as a user's file dialog does."""
    root = browser.call("DOM.getDocument")["root"]["nodeId"]
    node = browser.call("DOM.querySelector", nodeId=root, selector="#file")["nodeId"]
    browser.call("DOM.setFileInputFiles", files=[str(path)], nodeId=node)


def test_the_file_tab_translates_a_file_and_links_its_download(browser, site, translator, tmp_path):
    ready(browser, site.url)
    assert browser.eval("document.getElementById('files-panel').hidden") is True
    browser.click_on("#tab-files")
    assert browser.eval("document.getElementById('files-panel').hidden") is False
    assert browser.eval("document.getElementById('form').hidden") is True
    assert ".txt" in browser.eval("document.getElementById('file').accept").split(",")
    data = (PARAGRAPH + "\n").encode()
    (tmp_path / "notes.txt").write_bytes(data)
    set_file(browser, tmp_path / "notes.txt")
    browser.wait_for("!document.getElementById('file-go').disabled", what="the file chosen")
    browser.click_on("#file-go")
    browser.wait_for("Number(document.body.dataset.files || 0) > 0", what="the file translated")
    link = browser.eval("document.getElementById('file-link').href")
    assert browser.eval("document.getElementById('file-link').textContent") == (
        "Download notes_fr.txt"
    )
    got = site.client.get(link)
    assert got.status_code == 200
    assert got.content == translate_document(data, translator, "txt")


LT_PAGE_UPLOAD = """new Promise((done) => {
  // LibreTranslate's page (templates/app.js.template, translateFile): XMLHttpRequest, FormData
  const bytes = Uint8Array.from(atob(%s), (c) => c.charCodeAt(0));
  const data = new FormData();
  data.append("file", new File([bytes], %s));
  data.append("source", "en");
  data.append("target", "fr");
  data.append("api_key", "");
  const xhr = new XMLHttpRequest();
  xhr.open("POST", "/translate_file", true);
  xhr.onload = () => done({status: xhr.status, body: JSON.parse(xhr.response)});
  xhr.send(data);
})"""


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_libretranslates_page_request_round_trips_each_format(browser, site, translator, name):
    if not readable(name):
        pytest.skip(f"the text layer reads no {name.rsplit('.', 1)[1]} file yet")
    ready(browser, site.url)
    data = SAMPLES[name]()
    b64 = base64.b64encode(data).decode()
    got = browser.eval(LT_PAGE_UPLOAD % (json.dumps(b64), json.dumps(name)))
    assert got["status"] == 200, got
    url = got["body"]["translatedFileUrl"]
    assert url.startswith(site.url + "/download_file/")
    got, want = site.client.get(url).content, translate_document(data, translator, format_of(name))
    assert contents(got) == contents(want)


LT_PAGE_TRANSLATE = """new Promise((done) => {
  // LibreTranslate's page (templates/app.js.template, handleInput): a FormData of q, source,
  // target, format, alternatives 3 and api_key
  const data = new FormData();
  data.append("q", %s);
  data.append("source", "en");
  data.append("target", "fr");
  data.append("format", %s);
  data.append("alternatives", 3);
  data.append("api_key", "");
  const xhr = new XMLHttpRequest();
  xhr.open("POST", "/translate", true);
  xhr.onload = () => done({status: xhr.status, body: JSON.parse(xhr.response)});
  xhr.send(data);
})"""


def test_libretranslates_page_request_translates_text_and_html(browser, site, translator):
    ready(browser, site.url)
    got = browser.eval(LT_PAGE_TRANSLATE % (json.dumps(PARAGRAPH), json.dumps("text")))
    assert got["status"] == 200, got
    want = translator.translate(PARAGRAPH, beam_size=4, n_best=4)
    assert got["body"]["translatedText"] == want[0][0]
    assert got["body"]["alternatives"] == [t for t, score in want[1:] if score > -1e30]
    page = "<p>I am <b>very</b> happy. He is calm.</p>"
    got = browser.eval(LT_PAGE_TRANSLATE % (json.dumps(page), json.dumps("html")))
    assert got["status"] == 200, got
    assert got["body"] == {
        "translatedText": translate_document(page, translator, "html").decode(),
        "alternatives": [],
    }


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


def test_the_menus_come_from_languages_and_a_pivot_is_said(browser, pairs_site):
    site, ref = pairs_site
    ready(browser, site.url)
    assert browser.eval("document.title") == (
        "qkv translate: en \u2192 fr, fr \u2192 en, en \u2192 de"
    )
    assert options(browser, "source") == ["auto", "en", "fr"]  # de reaches only itself
    assert options(browser, "target") == ["de", "en", "fr"]
    assert browser.eval("document.getElementById('pair').textContent") == "(en \u2192 de)"
    choose(browser, "source", "fr")
    assert browser.eval("document.getElementById('target').value") == "de"
    text = PAIRS[3][1]
    submit(browser, text)
    want = ref["en-de"].translate(ref["fr-en"].translate(text), split="none")
    assert output(browser) == want
    route = browser.eval("document.getElementById('route').textContent")
    assert route.startswith("through English (en): no model translates fr to de"), route
    assert browser.eval("document.getElementById('hint').hidden") is True  # two models


def test_swap_turns_the_pair_and_the_texts_around(browser, pairs_site):
    site, ref = pairs_site
    ready(browser, site.url)
    choose(browser, "source", "en")
    choose(browser, "target", "fr")
    text = "I am home. He is calm."
    submit(browser, text)
    first = output(browser)
    assert first == ref["en-fr"].translate(text)
    n = int(browser.eval("Number(document.body.dataset.translated || 0)"))
    browser.click_on("#swap")
    browser.wait_for(f"Number(document.body.dataset.translated || 0) > {n}", what="the swap")
    assert browser.eval("[source.value, target.value]") == ["fr", "en"]
    assert browser.eval("document.getElementById('q').value") == first
    assert output(browser) == ref["fr-en"].translate(first)


def test_detect_language_says_what_it_found_and_shows_that_models_attention(browser, pairs_site):
    site, ref = pairs_site
    pytest.importorskip("py3langid")
    ready(browser, site.url)
    choose(browser, "source", "auto")
    choose(browser, "target", "en")
    text = "Le médecin lui a conseillé de se reposer quelques jours."
    submit(browser, text)
    assert output(browser) == ref["fr-en"].translate(text)
    route = browser.eval("document.getElementById('route').textContent")
    assert route.startswith("detected French (fr), ") and route.endswith("% sure"), route
    open_attention(browser, "#output .sentence", 0)
    assert browser.eval("qkvViewer.data.kinds[0].q") == ref["fr-en"].attention(text).src_tokens
