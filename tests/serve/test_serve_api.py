"""The API through a real server: LibreTranslate's request and answer shapes, checked against
the library's own translations of each sentence, and a real LibreTranslate client."""

from __future__ import annotations

import math
import re
import socket
import urllib.parse
from pathlib import Path

import pytest
from _serve_helpers import SOURCES

from qkv.serve.app import ROUTES


def alone(translator, text, **kw):
    """The library's translation of ``text`` on its own: the reference."""
    return translator.translate(text, **kw)


def test_a_string_gives_a_string(live, translator):
    r = live.post("/translate", json={"q": SOURCES[0], "source": "en", "target": "fr"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {"translatedText": alone(translator, SOURCES[0])}


def test_a_list_gives_a_list_in_order(live, translator):
    texts = [SOURCES[5], "", SOURCES[1], SOURCES[5]]
    r = live.post("/translate", json={"q": texts, "source": "en", "target": "fr"})
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": [alone(translator, t) for t in texts]}
    r = live.post("/translate", json={"q": [], "source": "en", "target": "fr"})
    assert r.json() == {"translatedText": []}


def test_alternatives_are_the_beams_n_best(live, translator):
    text = SOURCES[3]
    r = live.post("/translate", json={"q": text, "source": "en", "target": "fr", "alternatives": 2})
    assert r.status_code == 200, r.text
    ref = [t for t, score in translator.translate(text, beam_size=3, n_best=3) if score > -math.inf]
    assert r.json()["translatedText"] == ref[0]
    assert r.json()["alternatives"] == ref[1:]
    # a list: one list of alternatives per text; an explicit wider beam is used as given
    r = live.post("/translate", json={"q": [text, SOURCES[4]], "alternatives": 1, "beam": 4})
    refs = [translator.translate(t, beam_size=4, n_best=2) for t in (text, SOURCES[4])]
    assert r.json()["translatedText"] == [h[0][0] for h in refs]
    assert r.json()["alternatives"] == [[h[1][0]] for h in refs]


def test_beam_is_honoured(live, translator):
    # sentences each translated differently by beams 1 and 3: a server that decodes with one
    # beam whatever the request asks (its default, or any other) cannot give both answers
    texts = SOURCES[6:9]
    by_beam = {b: [alone(translator, t, beam_size=b) for t in texts] for b in (1, 3)}
    assert all(a != b for a, b in zip(by_beam[1], by_beam[3]))  # the beams can be told apart
    for beam, want in by_beam.items():
        r = live.post("/translate", json={"q": texts, "beam": beam})
        assert r.status_code == 200, r.text
        assert r.json()["translatedText"] == want, f"beam {beam}"


def test_a_form_as_libretranslate_clients_send_it(live, translator):
    body = urllib.parse.urlencode({"q": SOURCES[2], "source": "en", "target": "fr"})
    r = live.post(
        "/translate",
        content=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": alone(translator, SOURCES[2])}
    # numbers in a form are strings; a repeated q is a list
    body = urllib.parse.urlencode(
        [("q", SOURCES[2]), ("q", SOURCES[3]), ("alternatives", "1"), ("source", "en")]
    )
    r = live.post(
        "/translate", content=body, headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert r.status_code == 200, r.text
    assert r.json()["translatedText"] == [
        translator.translate(t, beam_size=2, n_best=2)[0][0] for t in SOURCES[2:4]
    ]


def test_the_libretranslatepy_client_works_unchanged(live, translator):
    lt_api = pytest.importorskip("libretranslatepy")
    lt = lt_api.LibreTranslateAPI(live.url)
    assert lt.translate(SOURCES[9], "en", "fr") == alone(translator, SOURCES[9])
    assert {d["code"] for d in lt.languages()} == {"en", "fr"}


def test_auto_source_is_the_models_and_says_so(live, translator):
    r = live.post("/translate", json={"q": SOURCES[1], "source": "auto", "target": "fr"})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "translatedText": alone(translator, SOURCES[1]),
        "detectedLanguage": {"language": "en", "confidence": 0.0},
    }
    r = live.post("/translate", json={"q": [SOURCES[1]] * 2, "source": "AUTO", "target": "FR"})
    assert r.json()["detectedLanguage"] == [{"language": "en", "confidence": 0.0}] * 2


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"source": "de", "target": "fr"}, "source"),
        ({"source": "en", "target": "es"}, "target"),
        ({"source": "fr", "target": "en"}, "source"),
        ({"format": "markdown"}, "format"),
    ],
)
def test_a_pair_or_format_not_served_is_a_400_naming_it(live, fields, field):
    r = live.post("/translate", json={"q": "go .", **fields})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err.startswith(f"{field}: ")
    if field != "format":
        assert "this model translates en to fr" in err


def test_languages_in_libretranslates_shape(live):
    r = live.get("/languages")
    assert r.status_code == 200
    assert r.json() == [
        {"code": "en", "name": "English", "targets": ["fr"]},
        {"code": "fr", "name": "French", "targets": []},
    ]


def test_health_names_the_model(live, model_dir):
    h = live.get("/health").json()
    assert h["status"] == "ok"
    assert h["model"]["loaded"] is True
    assert h["model"]["path"] == Path(model_dir).name  # no directory of the host's
    assert h["model"]["step"] == 0  # saved from Python: no training step
    assert (h["model"]["source"], h["model"]["target"]) == ("en", "fr")
    assert h["batching"]["enabled"] is True and h["batching"]["worker_running"] is True
    assert h["queue_depth"] == 0


def test_openapi_documents_every_route_and_field(live):
    schema = live.get("/openapi.json").json()
    assert schema["openapi"].startswith("3.")
    assert {p.removesuffix("/{name}") for p in schema["paths"]} == set(ROUTES)
    routes = {r.path: set(r.methods) - {"HEAD"} for r in live.app.routes}
    for path, item in schema["paths"].items():
        assert {m.upper() for m in item} == routes[path], path
    # every documented request field is accepted with a valid value
    props = schema["components"]["schemas"]["TranslateRequest"]["properties"]
    valid = {"q": "go .", "source": "en", "target": "fr", "format": "text"}
    valid |= {"alternatives": 1, "beam": 2, "api_key": "unused"}
    own = {"split": "none", "layout": True}
    assert set(props) == {*valid, *own}
    assert live.post("/translate", json=valid | own).status_code == 200
    props = schema["components"]["schemas"]["AttentionRequest"]["properties"]
    assert set(props) == {*valid, "choice", "decimals"}
    assert live.get("/spec").json() == schema  # where LibreTranslate serves its own
    r = live.post("/attention", json={**valid, "choice": 1, "decimals": 3})
    assert r.status_code == 200, r.text


def test_the_page_is_offline_and_safe(live):
    r = live.get("/")
    assert r.status_code == 200
    page = r.text
    assert r.headers["content-type"].startswith("text/html")
    assert not re.search(r"https?://|//cdn|<link|src=|@import|@font-face|url\(", page)
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page
    assert "document.write" not in page
    csp = r.headers["content-security-policy"]
    nonce = re.search(r"'nonce-([^']+)'", csp).group(1)
    scripts = re.findall(r"<script([^>]*)>", page)
    assert scripts and all(
        f'nonce="{nonce}"' in attrs or 'type="application/json"' in attrs for attrs in scripts
    )
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    # the one viewer: the page carries the viewer's own script and markup
    from qkv.viz.html import VIEWER_JS, VIEWER_PANELS

    assert VIEWER_JS in page and VIEWER_PANELS in page
    # a new nonce per answer
    assert live.get("/").headers["content-security-policy"] != csp


def test_accepted_connections_have_tcp_nodelay(live):
    """uvicorn writes an answer's head and body apart; without TCP_NODELAY on the accepted
    socket the body waited for the client's delayed ACK (~40 ms an answer). asyncio sets it
    only on a listening socket made with proto IPPROTO_TCP, which qkv.serve.server.bind makes."""
    assert live.get("/health").status_code == 200  # the client's connection is open
    conns = list(live.server.server_state.connections)
    assert conns
    for conn in conns:
        sock = conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
