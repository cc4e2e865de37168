"""The page at ``/``: two panes (the text, its translation), swap, copy, a character counter
against the server's ``char_limit``, a tab that translates files, and a click on a sentence of
the translation opens its attention in the viewer of :mod:`qkv.viz.html` (the same CSS, markup
and script as the file ``qkv translate --attention x.html`` writes; the page hands it
``/attention``'s data).

The source and target menus come from ``GET /languages``: with several models every pair
served (and "Detect language"), with one its pair; the title names every pair served. The
answer says the language detected and the language a pivoted translation went through. The
text is translated as ``/translate`` answers any client (each line cut into sentences, its
layout kept), asked with ``layout`` so the page knows each sentence; a file goes to
``/translate_file`` as LibreTranslate's page sends it (a multipart form: ``file``, ``source``,
``target``, ``api_key``) and comes back as a download link.

Offline: everything inline, nothing loaded from elsewhere (no CDN, no web font); the scripts and
the style sheet carry the response's CSP nonce. Every text a user or the model wrote is put in the
page with ``textContent``, never parsed as HTML.
"""

from __future__ import annotations

import html as _html
import re
from collections.abc import Sequence

from ..viz.html import VIEWER_CONTROLS, VIEWER_CSS, VIEWER_JS, VIEWER_PANELS, payload_json

__all__ = ["page_html"]

_PLACEHOLDER = re.compile(
    r"%%(NONCE|TITLE|CSS|PAGE_CSS|VIEWER_JS|PAGE_JS|CONFIG|CONTROLS|PANELS)%%"
)


def page_html(
    *,
    nonce: str,
    source: str | None,
    target: str | None,
    key_required: bool = False,
    max_alternatives: int = 5,
    char_limit: int | None = 5000,
    detect: bool = False,
    pairs: Sequence[tuple[str, str]] = (),
    file_formats: Sequence[str] = (),
) -> str:
    """The page's HTML; ``nonce`` marks its scripts and style sheet for the CSP header.

    The source and target menus are filled from ``GET /languages`` (each source with the
    targets it reaches); ``source``/``target`` are the pair chosen first (None: the first
    listed), ``detect`` offers "Detect language" (``source: "auto"``) among the sources.
    ``pairs`` (the models' ``(source, target)``) are named in the title; ``file_formats``
    (extensions such as ``".txt"``) are what the file tab offers (none: no file tab);
    ``char_limit`` is what the counter counts against (None: no limit).
    """
    if not re.fullmatch(r"[A-Za-z0-9_\-]{8,}", nonce):
        raise ValueError(f"nonce: expected 8 or more URL-safe characters, got {nonce!r}")
    config = {
        "source": source,
        "target": target,
        "detect": bool(detect),
        "keyRequired": bool(key_required),
        "maxAlternatives": int(max_alternatives),
        "charLimit": None if char_limit is None else int(char_limit),
        "fileFormats": list(file_formats),
    }
    named = ", ".join(f"{a} \u2192 {b}" for a, b in pairs)
    parts = {
        "NONCE": _html.escape(nonce),
        "TITLE": _html.escape(f"qkv translate: {named}" if named else "qkv translate"),
        "CSS": VIEWER_CSS,
        "PAGE_CSS": _PAGE_CSS,
        "VIEWER_JS": VIEWER_JS,
        "PAGE_JS": _PAGE_JS,
        "CONFIG": payload_json(config),
        "CONTROLS": VIEWER_CONTROLS,
        "PANELS": VIEWER_PANELS,
    }
    return _PLACEHOLDER.sub(lambda m: parts[m.group(1)], _TEMPLATE)


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>%%TITLE%%</title>
<style nonce="%%NONCE%%">%%CSS%%%%PAGE_CSS%%</style>
</head>
<body>
<header class="qkv-head">
  <h1>qkv translate <span id="pair"></span></h1>
</header>
<section id="translate-panel">
  <div id="bar">
    <div id="tabs" role="tablist">
      <button type="button" role="tab" id="tab-text" aria-selected="true">Text</button>
      <button type="button" role="tab" id="tab-files" aria-selected="false" hidden>Files</button>
    </div>
    <label>from <select id="source"></select></label>
    <button type="button" id="swap" title="Swap the languages (and the texts)">&#8644;</button>
    <label>to <select id="target"></select></label>
    <label id="alt-label">alternatives <select id="alternatives"></select></label>
    <label id="key-label" hidden>API key <input id="api-key" type="password"></label>
  </div>
  <form id="form" autocomplete="off">
    <div id="panes">
      <div class="pane">
        <textarea id="q" rows="8" spellcheck="false"
          placeholder="Type or paste text: each line a paragraph (Ctrl+Enter translates)"></textarea>
        <div class="under"><span id="count"></span>
          <button type="submit" id="go">Translate</button></div>
      </div>
      <div class="pane">
        <div id="output" role="region" aria-label="translation" aria-live="polite"></div>
        <div class="under"><span id="status" role="status"></span>
          <button type="button" id="copy" disabled>Copy</button></div>
      </div>
    </div>
  </form>
  <div id="files-panel" hidden>
    <p>A file is translated whole, its format kept: <span id="formats"></span>.</p>
    <input type="file" id="file">
    <button type="button" id="file-go" disabled>Translate the file</button>
    <span id="file-status" role="status"></span>
    <p><a id="file-link" download hidden></a></p>
  </div>
  <p id="route" hidden></p>
  <ol id="alts" start="2"></ol>
  <p id="hint" hidden>Click a sentence of the translation to see its attention.</p>
</section>
<section id="viewer" hidden>
  <div class="qkv-head">
    <h2 id="viewer-title"></h2>
    %%CONTROLS%%
  </div>
  %%PANELS%%
</section>
<script type="application/json" id="qkv-page">%%CONFIG%%</script>
<script nonce="%%NONCE%%">%%VIEWER_JS%%</script>
<script nonce="%%NONCE%%">%%PAGE_JS%%</script>
</body>
</html>
"""

_PAGE_CSS = """
#translate-panel { padding: 12px 16px; max-width: 1200px; }
#bar { display: flex; gap: 12px; align-items: center; flex-wrap: wrap; margin-bottom: 8px; }
#tabs { display: flex; gap: 2px; margin-right: 12px; }
#tabs button { font: inherit; padding: 4px 12px; border: 1px solid #ccd; background: #f4f7fb;
  cursor: pointer; }
#tabs button[aria-selected="true"] { background: #fff; border-color: #1f77b4; font-weight: 600; }
#swap { font: inherit; padding: 2px 10px; cursor: pointer; }
#panes { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
@media (max-width: 700px) { #panes { grid-template-columns: 1fr; } }
.pane { display: flex; flex-direction: column; min-width: 0; }
#q, #output { font: inherit; padding: 8px; min-height: 10em; box-sizing: border-box;
  border: 1px solid #ccd; border-radius: 4px; width: 100%; }
#q { resize: vertical; }
#output { white-space: pre-wrap; background: #f9fafc; overflow-wrap: anywhere; }
.under { display: flex; justify-content: space-between; align-items: center; gap: 8px;
  margin-top: 4px; min-height: 2em; }
#count { color: #666; font-size: 13px; font-variant-numeric: tabular-nums; }
#count.over { color: #b00; font-weight: 600; }
#status, #file-status { color: #666; }
#status.error, #file-status.error { color: #b00; }
.sentence { cursor: pointer; border-radius: 3px; }
.sentence:hover, .sentence:focus { background: #e3eefa; outline: none; }
.sentence.active { background: #cfe2f6; box-shadow: 0 0 0 1px #1f77b4; }
#alts { padding-left: 1.6em; }
#alts li { margin: 4px 0; }
.translation { font: inherit; text-align: left; background: #f4f7fb; border: 1px solid #ccd;
  border-radius: 4px; padding: 4px 8px; cursor: pointer; white-space: pre-wrap; }
.translation:hover { border-color: #1f77b4; }
.translation.active { border-color: #1f77b4; box-shadow: 0 0 0 1px #1f77b4; }
#files-panel { padding: 8px 0; }
#viewer-title { font-size: 16px; margin: 0 0 6px; white-space: pre-wrap; }
#hint { color: #666; font-size: 13px; }
#route { color: #444; font-size: 13px; margin: 6px 0 0; }
"""

_PAGE_JS = r"""
(function () {
  "use strict";
  var CFG = JSON.parse(document.getElementById("qkv-page").textContent);
  var $ = function (id) { return document.getElementById(id); };
  var last = null, LANGS = [], NAMES = {}, detected = null;

  function option(select, value, text) {
    var o = document.createElement("option"); o.value = value; o.textContent = text;
    select.appendChild(o);
  }
  function named(code) { return NAMES[code] ? NAMES[code] + " (" + code + ")" : code; }
  function count(name) {
    document.body.dataset[name] = String(Number(document.body.dataset[name] || 0) + 1);
  }
  function showPair() {
    var s = $("source").value, t = $("target").value;
    $("pair").textContent = "(" + (s === "auto" ? "auto" : s) + " \u2192 " + t + ")";
    $("swap").disabled = !canSwap();
  }
  function targetsOf(s) {
    var seen = {}, list = [];
    LANGS.forEach(function (l) {
      if (s !== "auto" && l.code !== s) return;
      l.targets.forEach(function (t) { if (!seen[t]) { seen[t] = 1; list.push(t); } });
    });
    return list.sort();
  }
  function fillTargets(preferred) {
    var s = $("source").value, list = targetsOf(s);
    var keep = preferred || $("target").value;
    $("target").textContent = "";
    list.forEach(function (t) { option($("target"), t, named(t)); });
    var other = list.filter(function (t) { return t !== s; });
    $("target").value = list.indexOf(keep) >= 0 && (keep !== s || !other.length) ? keep
                      : (other[0] || list[0] || "");
    showPair();
  }
  function isSource(code) {
    return Array.prototype.some.call($("source").options, function (o) {
      return o.value === code && code !== "auto";
    });
  }
  function canSwap() {
    var s = $("source").value === "auto" ? detected : $("source").value;
    return !!s && isSource($("target").value) && targetsOf($("target").value).indexOf(s) >= 0;
  }
  function fillLanguages(langs) {
    LANGS = langs;
    langs.forEach(function (l) { NAMES[l.code] = l.name; });
    if (CFG.detect) option($("source"), "auto", "Detect language");
    var sources = langs.filter(function (l) {
      return l.targets.some(function (t) { return t !== l.code; });
    });
    sources.forEach(function (l) { option($("source"), l.code, named(l.code)); });
    $("source").value = CFG.source || (sources[0] ? sources[0].code : "auto");
    fillTargets(CFG.target);
  }
  $("source").addEventListener("change", function () { detected = null; fillTargets(null); });
  $("target").addEventListener("change", showPair);

  // ---------------------------------------------------------------- the counter
  if (CFG.charLimit) $("q").maxLength = CFG.charLimit;
  function counted() {
    var n = $("q").value.length;
    $("count").textContent = n.toLocaleString("en") +
      (CFG.charLimit ? " / " + CFG.charLimit.toLocaleString("en") : "") + " characters";
    $("count").classList.toggle("over", !!CFG.charLimit && n > CFG.charLimit);
  }
  $("q").addEventListener("input", counted);
  counted();

  for (var i = 0; i <= CFG.maxAlternatives; i++) option($("alternatives"), String(i), String(i));
  if (CFG.keyRequired) $("key-label").hidden = false;

  function status(text, isError, where) {
    var el = $(where || "status");
    el.textContent = text;
    el.className = isError ? "error" : "";
    if (isError) document.body.dataset.error = text;
  }
  function answer(r) {
    return r.json().then(function (j) {
      if (!r.ok) throw new Error(j && j.error ? j.error : "HTTP " + r.status);
      return j;
    });
  }
  function post(path, body) {
    var key = $("api-key").value;
    if (key) body.api_key = key;
    return fetch(path, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body)
    }).then(answer);
  }

  // ---------------------------------------------------------------- the translation
  function sentenceSpan(piece, i) {
    var span = document.createElement("span");
    span.className = "sentence"; span.tabIndex = 0; span.textContent = piece.translation;
    span.dataset.index = String(i); span.title = piece.source;
    return span;
  }
  function render(req, res) {
    var out = $("output"), sentences = [];
    out.textContent = "";
    (res.layout || [res.translatedText]).forEach(function (piece) {
      if (typeof piece === "string") { out.appendChild(document.createTextNode(piece)); return; }
      out.appendChild(sentenceSpan(piece, sentences.length));
      sentences.push(piece.source);
    });
    $("copy").disabled = !res.translatedText;
    var box = $("alts");
    box.textContent = "";
    (res.alternatives || []).forEach(function (t, i) {
      var li = document.createElement("li"), b = document.createElement("button");
      b.type = "button"; b.className = "translation"; b.textContent = t;
      b.dataset.choice = String(i + 1);
      b.title = "alternative " + (i + 1) + (sentences.length === 1 ? ": click to see its attention" : "");
      li.appendChild(b); box.appendChild(li);
    });
    var d = res.detectedLanguage, src = req.source, notes = [];
    detected = null;
    if (d && !Array.isArray(d)) {
      src = d.language;
      if (d.confidence) { detected = d.language; notes.push("detected " + named(d.language) + ", " + d.confidence + "% sure"); }
    }
    if (res.pivot) notes.push("through " + named(res.pivot) + ": no model translates "
                              + src + " to " + req.target + " directly");
    $("route").textContent = notes.join("; ");
    $("route").hidden = !notes.length;
    var one = !res.pivot && src !== req.target;  // one model: its attention can be shown
    last = one ? { sentences: sentences, alternatives: req.alternatives, source: src,
                   target: req.target } : null;
    $("hint").hidden = !one || !sentences.length;
    showPair();
    count("translated");
  }
  function translate() {
    var q = $("q").value, alternatives = Number($("alternatives").value);
    status("translating\u2026", false);
    var req = { q: q, source: $("source").value, target: $("target").value,
                alternatives: alternatives, layout: true };
    return post("/translate", req)
      .then(function (res) { render(req, res); status("", false); })
      .catch(function (err) { status("error: " + err.message, true); });
  }
  $("form").addEventListener("submit", function (e) { e.preventDefault(); translate(); });
  $("q").addEventListener("keydown", function (e) {  // Ctrl+Enter translates; Enter: a new line
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); translate(); }
  });

  // ---------------------------------------------------------------- swap, copy
  $("swap").addEventListener("click", function () {
    if (!canSwap()) return;
    var s = $("source").value === "auto" ? detected : $("source").value, t = $("target").value;
    var text = $("output").textContent;
    $("source").value = t; detected = null; fillTargets(s);
    if (text) { $("q").value = text; counted(); translate(); }
    count("swapped");
  });
  function copied(ok) {
    status(ok ? "copied" : "error: the browser did not copy", !ok);
    if (ok) count("copied");
  }
  $("copy").addEventListener("click", function () {
    var text = $("output").textContent;
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(text).then(function () { copied(true); }, function () {
        copied(copyBySelection(text));
      });
    } else copied(copyBySelection(text));
  });
  function copyBySelection(text) {
    var t = document.createElement("textarea");
    t.value = text; t.readOnly = true; document.body.appendChild(t); t.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (err) { ok = false; }
    document.body.removeChild(t);
    return ok;
  }

  // ---------------------------------------------------------------- the attention
  function showAttention(body, what) {
    status("computing the attention\u2026", false);
    post("/attention", body).then(function (res) {
      $("viewer").hidden = false;
      window.qkvViewer.show(res.attention);
      status("", false);
      count("attention");
    }).catch(function (err) { status("error: " + err.message, true); });
  }
  function activate(el) {
    Array.prototype.forEach.call(document.querySelectorAll(".sentence, .translation"), function (x) {
      x.classList.toggle("active", x === el);
    });
  }
  function openSentence(span) {
    if (!last) return;
    activate(span);
    showAttention({ q: last.sentences[Number(span.dataset.index)], source: last.source,
                    target: last.target });
  }
  $("output").addEventListener("click", function (e) {
    var s = e.target.closest ? e.target.closest(".sentence") : null;
    if (s) openSentence(s);
  });
  $("output").addEventListener("keydown", function (e) {
    var s = e.target.closest ? e.target.closest(".sentence") : null;
    if (s && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); openSentence(s); }
  });
  $("alts").addEventListener("click", function (e) {
    var b = e.target.closest ? e.target.closest(".translation") : null;
    if (!b || !last || last.sentences.length !== 1) return;
    activate(b);
    showAttention({ q: last.sentences[0], source: last.source, target: last.target,
                    alternatives: last.alternatives, choice: Number(b.dataset.choice) });
  });

  // ---------------------------------------------------------------- the file tab
  function tab(files) {
    $("tab-text").setAttribute("aria-selected", String(!files));
    $("tab-files").setAttribute("aria-selected", String(files));
    $("form").hidden = files; $("files-panel").hidden = !files;
    $("alt-label").hidden = files; $("alts").hidden = files;
    $("hint").hidden = files || !last; $("route").hidden = files || !$("route").textContent;
    $("viewer").hidden = files || !document.body.dataset.attention;
  }
  if (CFG.fileFormats.length) {
    $("tab-files").hidden = false;
    $("file").accept = CFG.fileFormats.join(",");
    $("formats").textContent = CFG.fileFormats.join(", ");
  }
  $("tab-text").addEventListener("click", function () { tab(false); });
  $("tab-files").addEventListener("click", function () { tab(true); });
  $("file").addEventListener("change", function () {
    $("file-go").disabled = !$("file").files.length;
    $("file-link").hidden = true;
    status("", false, "file-status");
  });
  $("file-go").addEventListener("click", function () {
    var file = $("file").files[0];
    if (!file) return;
    // the form LibreTranslate's own page sends
    var data = new FormData();
    data.append("file", file);
    data.append("source", $("source").value);
    data.append("target", $("target").value);
    data.append("api_key", $("api-key").value);
    status("translating " + file.name + "\u2026", false, "file-status");
    $("file-go").disabled = true;
    fetch("/translate_file", { method: "POST", body: data }).then(answer).then(function (res) {
      var link = $("file-link"), name = res.translatedFileUrl.split("/").pop();
      link.href = res.translatedFileUrl;
      link.textContent = "Download " + decodeURIComponent(name.slice(name.indexOf(".") + 1));
      link.hidden = false;
      status("translated: the download is kept until it is done (once)", false, "file-status");
      count("files");
    }).catch(function (err) {
      status("error: " + err.message, true, "file-status");
    }).then(function () { $("file-go").disabled = !$("file").files.length; });
  });

  fetch("/languages").then(function (r) { return r.json(); })
    .then(function (langs) { fillLanguages(langs); document.body.dataset.page = "ready"; })
    .catch(function (err) { status("error: /languages: " + err.message, true); });
})();
"""
