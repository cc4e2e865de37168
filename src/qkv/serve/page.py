"""The page at ``/``: a text box, the translation and its alternatives, and a click on one opens
its attention in the viewer of :mod:`qkv.viz.html` (the same CSS, markup and script as the file
``qkv translate --attention x.html`` writes; the page hands it ``/attention``'s data).

The source and target menus come from ``GET /languages``: with several models every pair
served (and "Detect language"), with one its pair. The answer says the language detected and
the language a pivoted translation went through.

Offline: everything inline, nothing loaded from elsewhere (no CDN, no web font); the scripts and
the style sheet carry the response's CSP nonce. Every text a user or the model wrote is put in the
page with ``textContent``, never parsed as HTML.
"""

from __future__ import annotations

import html as _html
import re

from ..viz.html import VIEWER_CONTROLS, VIEWER_CSS, VIEWER_JS, VIEWER_PANELS, payload_json

__all__ = ["page_html"]

_PLACEHOLDER = re.compile(r"%%(NONCE|CSS|PAGE_CSS|VIEWER_JS|PAGE_JS|CONFIG|CONTROLS|PANELS)%%")


def page_html(
    *,
    nonce: str,
    source: str | None,
    target: str | None,
    key_required: bool = False,
    max_alternatives: int = 5,
    max_chars: int = 2000,
    detect: bool = False,
) -> str:
    """The page's HTML; ``nonce`` marks its scripts and style sheet for the CSP header.

    The source and target menus are filled from ``GET /languages`` (each source with the
    targets it reaches); ``source``/``target`` are the pair chosen first (None: the first
    listed), ``detect`` offers "Detect language" (``source: "auto"``) among the sources.
    """
    if not re.fullmatch(r"[A-Za-z0-9_\-]{8,}", nonce):
        raise ValueError(f"nonce: expected 8 or more URL-safe characters, got {nonce!r}")
    config = {
        "source": source,
        "target": target,
        "detect": bool(detect),
        "keyRequired": bool(key_required),
        "maxAlternatives": int(max_alternatives),
        "maxChars": int(max_chars),
    }
    parts = {
        "NONCE": _html.escape(nonce),
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
<title>qkv translate</title>
<style nonce="%%NONCE%%">%%CSS%%%%PAGE_CSS%%</style>
</head>
<body>
<header class="qkv-head">
  <h1>qkv translate <span id="pair"></span></h1>
</header>
<section id="translate-panel">
  <form id="form" autocomplete="off">
    <textarea id="q" rows="3" placeholder="Type a sentence" spellcheck="false"></textarea>
    <div id="options">
      <label>from <select id="source"></select></label>
      <label>to <select id="target"></select></label>
      <label>alternatives <select id="alternatives"></select></label>
      <label id="key-label" hidden>API key <input id="api-key" type="password"></label>
      <button type="submit" id="go">Translate</button>
      <span id="status" role="status"></span>
    </div>
  </form>
  <p id="route" hidden></p>
  <ol id="results"></ol>
  <p id="hint" hidden>Click a translation to see its attention.</p>
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
#translate-panel { padding: 12px 16px; max-width: 900px; }
#q { width: 100%; box-sizing: border-box; font: inherit; padding: 6px; }
#options { display: flex; gap: 14px; align-items: center; margin-top: 6px; flex-wrap: wrap; }
#status { color: #666; }
#status.error { color: #b00; }
#results { padding-left: 1.6em; }
#results li { margin: 4px 0; }
.translation { font: inherit; text-align: left; background: #f4f7fb; border: 1px solid #ccd;
  border-radius: 4px; padding: 4px 8px; cursor: pointer; white-space: pre-wrap; }
.translation:hover { border-color: #1f77b4; }
.translation.active { border-color: #1f77b4; box-shadow: 0 0 0 1px #1f77b4; }
#viewer-title { font-size: 16px; margin: 0 0 6px; white-space: pre-wrap; }
#hint { color: #666; font-size: 13px; }
#route { color: #444; font-size: 13px; margin: 6px 0 0; }
"""

_PAGE_JS = r"""
(function () {
  "use strict";
  var CFG = JSON.parse(document.getElementById("qkv-page").textContent);
  var $ = function (id) { return document.getElementById(id); };
  var last = null, busy = 0, LANGS = [], NAMES = {};

  function option(select, value, text) {
    var o = document.createElement("option"); o.value = value; o.textContent = text;
    select.appendChild(o);
  }
  function named(code) { return NAMES[code] ? NAMES[code] + " (" + code + ")" : code; }
  function showPair() {
    var s = $("source").value, t = $("target").value;
    $("pair").textContent = "(" + (s === "auto" ? "auto" : s) + " \u2192 " + t + ")";
  }
  function fillTargets(preferred) {
    var s = $("source").value, seen = {}, list = [];
    LANGS.forEach(function (l) {
      if (s !== "auto" && l.code !== s) return;
      l.targets.forEach(function (t) { if (!seen[t]) { seen[t] = 1; list.push(t); } });
    });
    list.sort();
    var keep = preferred || $("target").value;
    $("target").textContent = "";
    list.forEach(function (t) { option($("target"), t, named(t)); });
    var other = list.filter(function (t) { return t !== s; });
    $("target").value = list.indexOf(keep) >= 0 && (keep !== s || !other.length) ? keep
                      : (other[0] || list[0] || "");
    showPair();
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
  $("source").addEventListener("change", function () { fillTargets(null); });
  $("target").addEventListener("change", showPair);

  $("q").maxLength = CFG.maxChars;
  for (var i = 0; i <= CFG.maxAlternatives; i++) {
    var o = document.createElement("option"); o.value = String(i); o.textContent = String(i);
    $("alternatives").appendChild(o);
  }
  if (CFG.keyRequired) $("key-label").hidden = false;

  function status(text, isError) {
    $("status").textContent = text;
    $("status").className = isError ? "error" : "";
    if (isError) document.body.dataset.error = text;
  }
  function post(path, body) {
    var key = $("api-key").value;
    if (key) body.api_key = key;
    return fetch(path, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body)
    }).then(function (r) {
      return r.json().then(function (j) {
        if (!r.ok) throw new Error(j && j.error ? j.error : "HTTP " + r.status);
        return j;
      });
    });
  }
  function count(name) {
    document.body.dataset[name] = String(Number(document.body.dataset[name] || 0) + 1);
  }

  function render(q, alternatives, req, res) {
    var texts = [res.translatedText].concat(res.alternatives || []);
    var box = $("results");
    box.textContent = "";
    texts.forEach(function (t, i) {
      var li = document.createElement("li"), b = document.createElement("button");
      b.type = "button"; b.className = "translation"; b.textContent = t;
      b.dataset.choice = String(i);
      b.title = i === 0 ? "the translation: click to see its attention"
                        : "alternative " + i + ": click to see its attention";
      li.appendChild(b); box.appendChild(li);
    });
    var d = res.detectedLanguage, src = req.source, notes = [];
    if (d && !Array.isArray(d)) {
      src = d.language;
      notes.push("detected " + named(d.language) + ", " + d.confidence + "% sure");
    }
    if (res.pivot) notes.push("through " + named(res.pivot) + ": no model translates "
                              + src + " to " + req.target + " directly");
    $("route").textContent = notes.join("; ");
    $("route").hidden = !notes.length;
    var one = !res.pivot && src !== req.target;  // one model: its attention can be shown
    last = one ? { q: q, alternatives: alternatives, source: src, target: req.target } : null;
    $("hint").hidden = !one;
    count("translated");
  }

  $("form").addEventListener("submit", function (e) {
    e.preventDefault();
    var q = $("q").value, alternatives = Number($("alternatives").value);
    busy++; status("translating\u2026", false);
    var req = { q: q, source: $("source").value, target: $("target").value,
                alternatives: alternatives };
    post("/translate", req)
      .then(function (res) { render(q, alternatives, req, res); status("", false); })
      .catch(function (err) { status("error: " + err.message, true); })
      .then(function () { busy--; });
  });
  $("q").addEventListener("keydown", function (e) {  // Enter translates, Shift+Enter a new line
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); }
  });

  $("results").addEventListener("click", function (e) {
    var b = e.target.closest ? e.target.closest(".translation") : null;
    if (!b || !last) return;
    Array.prototype.forEach.call(document.querySelectorAll(".translation"), function (x) {
      x.classList.toggle("active", x === b);
    });
    status("computing the attention\u2026", false);
    post("/attention", { q: last.q, source: last.source, target: last.target,
                         alternatives: last.alternatives, choice: Number(b.dataset.choice) })
      .then(function (res) {
        $("viewer").hidden = false;
        window.qkvViewer.show(res.attention);
        status("", false);
        count("attention");
      })
      .catch(function (err) { status("error: " + err.message, true); });
  });
  fetch("/languages").then(function (r) { return r.json(); })
    .then(function (langs) { fillLanguages(langs); document.body.dataset.page = "ready"; })
    .catch(function (err) { status("error: /languages: " + err.message, true); });
})();
"""
