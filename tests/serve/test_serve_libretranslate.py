"""The rest of LibreTranslate's API, answered as LibreTranslate answers it: what its web page,
apps and browser extensions call first (``/frontend/settings``), ``/suggest`` with suggestions
off, ``/spec``, its ``char_limit`` and its request limit per client per minute (429
``Slowdown``). The field names and answers come from LibreTranslate's own app.py (read in its
repository: ``frontend_settings``, ``suggest``, ``translate``, the 429 handler)."""

from __future__ import annotations

import pytest
from _serve_helpers import live_app, live_server, tiny_model_folder

from qkv.cli import build_parser, main
from qkv.serve import ServeConfig, create_app
from qkv.serve.ratelimit import WINDOW_S, RateLimiter, Slowdown
from qkv.serve.registry import ModelRegistry, inspect_folder
from qkv.text.formats import EXTENSIONS

#: the fields of LibreTranslate's GET /frontend/settings, each with its JSON type
LT_SETTINGS = {
    "charLimit": int,
    "frontendTimeout": int,
    "apiKeys": bool,
    "keyRequired": bool,
    "suggestions": bool,
    "filesTranslation": bool,
    "supportedFilesFormat": list,
    "language": dict,
}


def test_frontend_settings_has_libretranslates_fields_and_this_servers_values(live):
    r = live.get("/frontend/settings")
    assert r.status_code == 200, r.text
    got = r.json()
    assert {k: type(v) for k, v in got.items()} == LT_SETTINGS
    assert got["charLimit"] == 5000 and got["frontendTimeout"] == 500
    assert (got["apiKeys"], got["keyRequired"], got["suggestions"]) == (False, False, False)
    assert got["filesTranslation"] is True
    assert got["supportedFilesFormat"] == sorted(EXTENSIONS) and ".txt" in EXTENSIONS
    assert all(ext.startswith(".") for ext in got["supportedFilesFormat"])  # as Argos lists them
    # one model: its pair is what the page chooses first
    assert got["language"] == {
        "source": {"code": "en", "name": "English"},
        "target": {"code": "fr", "name": "French"},
    }


def test_frontend_settings_says_the_key_limit_and_files(translator):
    with live_server(translator, api_key="k3y", char_limit=None, files=False) as s:
        got = s.get("/frontend/settings").json()  # no key needed, as LibreTranslate's
        assert (got["apiKeys"], got["keyRequired"]) == (True, True)
        assert got["charLimit"] == -1  # LibreTranslate's "no limit"
        assert (got["filesTranslation"], got["supportedFilesFormat"]) == (False, [])
        r = s.post("/translate_file", files={"file": ("a.txt", b"Hi.")}, data={"api_key": "k3y"})
        assert r.status_code == 403 and r.json()["error"].startswith("file: ")


def test_frontend_settings_of_several_models_start_on_auto(tmp_path):
    pytest.importorskip("py3langid")
    folders = [
        tiny_model_folder(tmp_path / "en-fr", ("en", "fr")),
        tiny_model_folder(tmp_path / "fr-en", ("fr", "en"), reverse=True),
    ]
    reg = ModelRegistry.from_folders([inspect_folder(f) for f in folders])
    with live_app(create_app(reg, ServeConfig())) as s:
        got = s.get("/frontend/settings").json()["language"]
        # LibreTranslate's default source is "auto", named "Auto Detect"
        assert got == {
            "source": {"code": "auto", "name": "Auto Detect"},
            "target": {"code": "fr", "name": "French"},
        }


def test_suggest_is_refused_as_libretranslate_refuses_it_when_off(live):
    for body in ({}, {"q": "Hello", "s": "Bonjour", "source": "en", "target": "fr"}):
        r = live.post("/suggest", json=body)
        assert r.status_code == 403
        assert r.json() == {"error": "Suggestions are disabled on this server."}


def test_spec_is_the_openapi_file_and_get_only(live):
    r = live.get("/spec")
    assert r.status_code == 200 and r.json() == live.get("/openapi.json").json()
    assert live.post("/spec").status_code == 405  # LibreTranslate's own test


def test_char_limit_is_per_text_and_a_400(translator):
    with live_server(translator, char_limit=20) as s:
        r = s.post("/translate", json={"q": "A" * 21})
        assert r.status_code == 400
        assert r.json()["error"] == "q: 21 characters, over the limit of 20 per text (--char-limit)"
        r = s.post("/translate", data={"q": ["Hi.", "B" * 25], "source": "en", "target": "fr"})
        assert r.status_code == 400 and r.json()["error"].startswith("q[1]: 25 characters")
        assert s.post("/translate", json={"q": ["A" * 20, "B" * 20]}).status_code == 200


# ---------------------------------------------------------------------------- the request limit
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_limit_is_a_moving_window_of_a_minute_per_client():
    clock = Clock()
    rl = RateLimiter(3, clock=clock)
    a, b = rl.client(None, "10.0.0.1"), rl.client(None, "10.0.0.2")
    for _ in range(3):
        rl.admit(a)
        clock.now += 10
    with pytest.raises(Slowdown) as e:
        rl.admit(a)
    assert str(e.value) == "Slowdown: 3 per 1 minute"  # LibreTranslate's words
    assert e.value.retry_after == pytest.approx(WINDOW_S - 30)  # the first leaves then
    rl.admit(b)  # another client has its own minute
    clock.now = 1000.0 + WINDOW_S + 0.5  # the first request left the window
    rl.admit(a)
    with pytest.raises(Slowdown):
        rl.admit(a)


def test_a_request_costs_its_texts_and_an_empty_minute_is_forgotten():
    clock = Clock()
    rl = RateLimiter(5, clock=clock)
    c = rl.client("some key", "10.0.0.9")
    assert c.startswith("key:") and "some key" not in c  # the key is kept hashed
    rl.admit(c, cost=4)  # a list of four texts
    rl.admit(c)  # the fifth: admitted (the limit is checked before the cost is added)
    with pytest.raises(Slowdown):
        rl.admit(c)
    clock.now += 2 * WINDOW_S
    rl.admit(rl.client(None, "10.0.0.10"))  # the sweep forgets the clients of old minutes
    assert rl.clients == 1
    with pytest.raises(ValueError, match="req_limit: expected an int >= 1"):
        RateLimiter(0)


def test_a_client_over_the_limit_gets_libretranslates_429(translator):
    with live_server(translator, req_limit=3) as s:
        r = s.post("/translate", json={"q": ["Hi.", "Go."]})  # costs two
        assert r.status_code == 200
        assert s.post("/translate", json={"q": "Hi."}).status_code == 200
        r = s.post("/translate", json={"q": "Hi."})
        assert r.status_code == 429
        assert r.json() == {"error": "Slowdown: 3 per 1 minute"}
        assert 1 <= int(r.headers["retry-after"]) <= 60
        # /detect, /attention and /translate_file count too; the page, /languages, /health do not
        assert s.post("/translate_file", files={"file": ("a.txt", b"Hi.")}).status_code == 429
        assert s.post("/attention", json={"q": "Hi."}).status_code == 429
        assert s.post("/detect", json={"q": "Hi."}).status_code == 429
        for path in ("/", "/languages", "/health", "/frontend/settings", "/spec"):
            assert s.get(path).status_code == 200, path


def test_qkv_serve_flags_set_the_limits(model_dir, capsys):
    base = ["serve", "--model-dir", str(model_dir), "--source-lang", "en", "--target-lang", "fr"]
    assert main([*base, "--char-limit", "0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv serve: error: --char-limit: expected an int >= 1"), err
    assert main([*base, "--file-ttl", "0", "--quiet"]) == 2
    assert "--file-ttl: expected seconds" in capsys.readouterr().err
    from qkv.cli.serve import serve_config

    args = build_parser().parse_args(
        [*base, "--char-limit", "-1", "--req-limit", "30", "--disable-files-translation"]
    )
    cfg = serve_config(args, None)
    assert (cfg.char_limit, cfg.req_limit, cfg.files) == (None, 30, False)
