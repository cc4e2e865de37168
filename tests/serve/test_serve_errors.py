"""Bad input through a real server: every refusal a 4xx with a JSON ``{"error": "field: ..."}``,
never a crash or a hang; limits settable; the API key compared in constant time."""

from __future__ import annotations

import hmac
import threading

import pytest
from _serve_helpers import SOURCES, live_server, wait_until

import qkv.serve.app


def error(r, status: int, field: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}, body
    assert body["error"].startswith(f"{field}: "), body
    return body["error"]


@pytest.mark.parametrize(
    "body",
    [b"{bad", b"", b"   ", b'{"q": "go .",}', b"[1, 2", b"\xff\xfe\x00garbage", b'{"q": NaN'],
)
def test_malformed_json_is_400(live, body):
    r = live.post("/translate", content=body, headers={"Content-Type": "application/json"})
    err = error(r, 400, "body")
    assert "JSON" in err or "empty" in err


@pytest.mark.parametrize(
    ("payload", "field", "says"),
    [
        ({}, "q", "missing"),
        ({"q": None}, "q", "missing"),
        ({"source": "en"}, "q", "missing"),
        ({"q": 3}, "q", "the number 3"),
        ({"q": {"a": 1}}, "q", "an object"),
        ({"q": ["go .", 7]}, "q[1]", "the number 7"),
        ({"q": [["go ."]]}, "q[0]", "a list"),
        ({"q": "go .", "alternatives": "x"}, "alternatives", "'x'"),
        ({"q": "go .", "alternatives": 99}, "alternatives", "got 99"),
        ({"q": "go .", "alternatives": -1}, "alternatives", "got -1"),
        ({"q": "go .", "alternatives": True}, "alternatives", "a boolean"),
        ({"q": "go .", "beam": 0}, "beam", "got 0"),
        ({"q": "go .", "beam": 2.5}, "beam", "2.5"),
        ({"q": "go .", "beam": 2, "alternatives": 3}, "beam", "at least 4"),
        ({"q": "go .", "source": 5}, "source", "the number 5"),
        ({"q": "go .", "target": ["fr"]}, "target", "a list"),
        ({"q": "go .", "format": 1}, "format", "the number 1"),
        ({"q": "go \ud800 ."}, "q", "lone surrogate"),
    ],
)
def test_wrong_types_and_missing_q_are_422_naming_the_field(live, payload, field, says):
    import json

    body = json.dumps(payload)  # ASCII escapes: a lone surrogate travels as \ud800
    r = live.post("/translate", content=body, headers={"Content-Type": "application/json"})
    assert says in error(r, 422, field)


def test_a_json_body_that_is_not_an_object_is_422(live):
    assert "a list of 1" in error(live.post("/translate", json=["go ."]), 422, "body")
    assert "the string" in error(live.post("/translate", json="go ."), 422, "body")


def test_attention_takes_one_sentence(live):
    error(live.post("/attention", json={"q": ["a", "b"]}), 422, "q")
    error(live.post("/attention", json={"q": "go .", "choice": 1}), 422, "choice")


def test_bodies_not_read_are_415(live):
    r = live.post("/translate", content=b"<q>go</q>", headers={"Content-Type": "application/xml"})
    assert "multipart/form-data" in error(r, 415, "Content-Type")
    r = live.post("/translate", content=b"q=go", headers={"Content-Type": "text/plain"})
    error(r, 415, "Content-Type")


def test_unknown_route_404_and_wrong_method_405(live):
    assert "/translate" in error(live.get("/no/such/route"), 404, "path")
    error(live.post("/languages"), 405, "method")
    error(live.get("/translate"), 405, "method")


def test_limits_are_413_and_settable(translator):
    settings = {"max_body_bytes": 300, "max_sentences": 3, "max_chars": 40, "char_limit": 60}
    with live_server(translator, **settings) as s:
        big = {"q": "x" * 400}
        assert "--max-body-bytes" in error(s.post("/translate", json=big), 413, "body")

        def chunks():  # no Content-Length: counted while read
            for _ in range(10):
                yield b'{"q": "' + b"y" * 50

        r = s.post("/translate", content=chunks(), headers={"Content-Type": "application/json"})
        error(r, 413, "body")
        r = s.post("/translate", json={"q": ["go ."] * 4})
        assert "--max-sentences" in error(r, 413, "q")
        # the sentences of one text count: four in one text are over three
        r = s.post("/translate", json={"q": "Go. Run. Stop. Hide."})
        assert "4 sentences" in error(r, 413, "q")
        r = s.post("/translate", json={"q": ["go .", "z" * 41]})
        assert "41 characters" in error(r, 413, "q")
        error(s.post("/attention", json={"q": "z" * 41}), 413, "q")
        # a text over --char-limit is LibreTranslate's 400
        r = s.post("/translate", json={"q": ["go .", "Go home. " * 7]})
        assert "--char-limit" in error(r, 400, "q[1]")
        # at the limits: fine
        r = s.post("/translate", json={"q": ["go .", "i lost .", "z" * 40]})
        assert r.status_code == 200, r.text
        # the server still answers after each refusal
        assert s.get("/health").status_code == 200


def test_api_key(translator, monkeypatch):
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(qkv.serve.app.hmac, "compare_digest", spy)
    with live_server(translator, api_key="s3cret-key") as s:
        ok = {"q": SOURCES[0], "source": "en", "target": "fr"}
        assert "missing" in error(s.post("/translate", json=ok), 401, "api_key")
        r = s.post("/translate", json={**ok, "api_key": "wrong"})
        assert "wrong" in error(r, 401, "api_key")
        assert r.headers["www-authenticate"].startswith("Bearer")
        error(s.post("/attention", json={**ok, "api_key": "s3cret-ke"}), 401, "api_key")
        error(s.post("/translate", json={**ok, "api_key": 123}), 401, "api_key")
        assert calls and all(isinstance(a, bytes) for a, _ in calls)  # compare_digest, on bytes
        # the key in the body (LibreTranslate's way), as a bearer token, as X-API-Key
        assert s.post("/translate", json={**ok, "api_key": "s3cret-key"}).status_code == 200
        r = s.post("/translate", json=ok, headers={"Authorization": "Bearer s3cret-key"})
        assert r.status_code == 200
        assert s.post("/translate", json=ok, headers={"X-API-Key": "s3cret-key"}).status_code == 200
        r = s.post("/translate", data={**ok, "api_key": "s3cret-key"})  # a form
        assert r.status_code == 200
        # reading needs no key
        for path in ("/health", "/languages", "/metrics", "/", "/openapi.json"):
            assert s.get(path).status_code == 200, path


def test_a_full_queue_is_503_and_the_server_recovers(translator):
    with live_server(translator, max_queue=2, max_wait_ms=0) as s:
        gate, entered = threading.Event(), threading.Event()
        real = s.lane.batcher.decode

        def blocked(texts, decoding):
            entered.set()
            gate.wait(30)
            return real(texts, decoding)

        s.lane.batcher.decode = blocked
        results = {}

        def ask(i, q):
            results[i] = s.post("/translate", json={"q": q})

        first = threading.Thread(target=ask, args=(0, "go ."))
        first.start()
        entered.wait(30)  # decoding, so the queue is empty
        second = threading.Thread(target=ask, args=(1, ["i lost .", "hello ."]))
        second.start()
        wait_until(lambda: s.lane.batcher.queue_depth == 2, what="two queued sentences")
        r = s.post("/translate", json={"q": "thank you ."})
        assert "try again" in error(r, 503, "queue")
        assert r.headers["retry-after"] == "1"
        gate.set()
        first.join(30)
        second.join(30)
        assert results[0].status_code == 200 and results[1].status_code == 200
        assert s.post("/translate", json={"q": "thank you ."}).status_code == 200


def test_a_sentence_that_fails_fails_only_its_request(translator):
    """One request's sentence makes the batch fail: the batch is decoded again job by job, so the
    other requests of that batch get their translations."""
    with live_server(translator, max_wait_ms=0) as s:
        real = s.lane.batcher.decode
        calls, gate, entered = [], threading.Event(), threading.Event()

        def fragile(texts, decoding):
            calls.append(sorted(texts))
            if texts == ["warm ."]:  # held while the four requests queue up behind it
                entered.set()
                gate.wait(30)
            if "poison ." in texts:
                raise ValueError("max_len: this text cannot be decoded")
            return real(texts, decoding)

        s.lane.batcher.decode = fragile
        texts = ["go .", "poison .", "i lost .", "hello ."]
        results = {}

        def ask(t):
            results[t] = s.post("/translate", json={"q": t})

        threads = [threading.Thread(target=ask, args=(t,)) for t in ["warm .", *texts]]
        threads[0].start()
        assert entered.wait(30)
        for t in threads[1:]:
            t.start()
        wait_until(lambda: s.lane.batcher.queue_depth == 4, what="four queued requests")
        gate.set()
        for t in threads:
            t.join(60)
        assert calls[1] == sorted(texts)  # the four requests were one batch
        assert "cannot be translated" in error(results["poison ."], 422, "q")
        for t in ("go .", "i lost .", "hello .", "warm ."):
            assert results[t].json() == {"translatedText": translator.translate(t)}
        assert sorted(map(len, calls[2:])) == [1, 1, 1, 1]  # then each job alone


@pytest.mark.parametrize(
    ("route", "field"),
    [
        ("/translate", "beam"),
        ("/translate", "alternatives"),
        ("/attention", "choice"),
        ("/attention", "decimals"),
    ],
)
def test_integers_are_ascii_digits_or_422(live, route, field):
    """``int()`` takes Unicode digits ("²" passed ``isdigit`` and failed ``int``: a 500 and a
    traceback); a field is an integer of ASCII digits, as JSON or as a form's text."""
    for value in ["²", "③", "+-1", "١", "1_0", " ٣ ", "9" * 5000]:
        said = error(live.post(route, json={"q": "go .", field: value}), 422, field)
        assert "expected an integer" in said, value
        r = live.post(route, data={"q": "go .", field: value})  # a form: every field a string
        assert "expected an integer" in error(r, 422, field), value


def test_an_internal_error_is_one_log_line_not_a_traceback(translator):
    """A 500 is answered as JSON and logged in one line: Starlette raised it on to uvicorn,
    which logged its traceback too."""
    import logging

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "qkv.serve.app", "asyncio")]
    with live_server(translator) as s:
        for logger in loggers:
            logger.addHandler(keep)
        try:

            def boom(**kw):
                raise RuntimeError("a bug")

            s.state.metrics.render = boom
            r = s.get("/metrics")
            assert r.status_code == 500 and r.json() == {"error": "internal error: RuntimeError"}
            assert s.get("/health").status_code == 200
        finally:
            for logger in loggers:
                logger.removeHandler(keep)
    assert [r.getMessage() for r in records] == [
        "qkv serve: GET /metrics failed: RuntimeError('a bug')"
    ]
    assert not any(r.exc_info for r in records)


def test_text_plain_is_not_json(live):
    """A body sent as text/plain (what a web page may send anywhere without a CORS preflight)
    was parsed as JSON; it is 415 like any type not read."""
    body = b'{"q": "go .", "source": "en", "target": "fr"}'
    for ctype in ("text/plain", "text/plain; charset=utf-8"):
        r = live.post("/translate", content=body, headers={"Content-Type": ctype})
        assert "'text/plain' is not read" in error(r, 415, "Content-Type")
    r = live.post("/translate", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


def test_a_form_that_is_not_utf8_is_400(live):
    """``q=caf%E9`` (Latin-1 escaped) was translated with U+FFFD in place of the é."""
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for body, field in (
        (b"q=caf%E9&source=en&target=fr", "q"),
        (b"q=go+.&source=e%FFn", "source"),
        (b"q=go+.&q=%C3%28", "q"),  # a repeated q: each checked
        (b"q=go+.&%FF=1", "body"),
    ):
        said = error(live.post("/translate", content=body, headers=form), 400, field)
        assert "not UTF-8" in said, body
    r = live.post("/translate", content=b"q=caf%C3%A9&source=en&target=fr", headers=form)
    assert r.status_code == 200, r.text


def test_an_empty_key_header_does_not_hide_the_key_in_the_body(translator):
    with live_server(translator, api_key="s3cret-key") as s:
        ok = {"q": SOURCES[0], "source": "en", "target": "fr", "api_key": "s3cret-key"}
        empty = {"X-API-Key": ""}  # (h11 sends no header value with spaces around it)
        assert s.post("/translate", json=ok, headers=empty).status_code == 200
        assert s.post("/translate", data=ok, headers=empty).status_code == 200  # a form
        r = s.post("/translate", json={**ok, "api_key": ""}, headers={"X-API-Key": ""})
        assert "missing" in error(r, 401, "api_key")
        r = s.post("/translate", json=ok, headers={"X-API-Key": "wrong"})  # a header first
        assert "wrong" in error(r, 401, "api_key")
