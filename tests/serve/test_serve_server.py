"""The server's edges (qkv.serve.server): a body answered before it all arrived, slow or
too many connections, the shutdown timeout; each a JSON answer and at most a log line, never a
reset, a hang or a traceback."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from _serve_helpers import live_app, wait_until

from qkv._errors import SettingError
from qkv.serve import ServeConfig, create_app
from qkv.serve.server import make_server


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def kept_logs() -> Iterator[Kept]:
    keep = Kept()
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "qkv.serve", "asyncio")]
    for logger in loggers:
        logger.addHandler(keep)
    try:
        yield keep
    finally:
        for logger in loggers:
            logger.removeHandler(keep)


logs = pytest.fixture(kept_logs)


def serve(translator, **server_options):
    cfg = ServeConfig(source_lang="en", target_lang="fr")
    return live_app(create_app(translator, cfg), **server_options)


def read_answer(sock: socket.socket) -> tuple[int, dict]:
    """A whole answer read until the server closes: its status and JSON body."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower(), head
    return int(head.split()[1]), json.loads(body)


def test_a_body_over_the_limit_sent_whole_gets_its_413(translator, logs):
    """urllib writes the whole body before reading: the server answered 413 on the
    Content-Length and closed with the body unread, so the kernel reset the connection and
    the client saw ConnectionResetError. Now the rest is read and dropped, then closed."""
    with serve(translator) as s:
        body = b'{"q": "' + b"a" * 10_000_000 + b'"}'
        for _ in range(2):
            req = urllib.request.Request(
                s.url + "/translate", data=body, headers={"Content-Type": "application/json"}
            )
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(req, timeout=60)
            assert caught.value.code == 413
            said = json.loads(caught.value.read())["error"]
            assert said.startswith("body: 10,000,") and "--max-body-bytes" in said
        assert s.get("/health").status_code == 200
    assert not any(r.exc_info for r in logs.records)


def test_headers_not_sent_in_time_close_the_connection(translator, logs):
    """Slowloris: connections that never finish their headers held the server's sockets for
    ever. Each now gets a 408 and is closed after the header timeout, logged in one line."""
    with serve(translator, header_timeout=0.5) as s:
        port = int(s.url.rsplit(":", 1)[1])
        slow = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(20)]
        for sock in slow:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Wait: ")
        silent = socket.create_connection(("127.0.0.1", port), timeout=30)
        assert s.get("/health").status_code == 200  # others are served meanwhile
        for sock in slow:
            status, body = read_answer(sock)
            assert status == 408 and body["error"].startswith("headers: not all received")
            sock.close()
        assert silent.recv(100) == b""  # a connection that sent nothing: closed in silence
        silent.close()
        assert s.get("/health").status_code == 200
    lines = [r.getMessage() for r in logs.records]
    assert len(lines) == 1 and "--header-timeout (0.5 s)" in lines[0], lines
    assert not any(r.exc_info for r in logs.records)


def test_a_kept_alive_connection_idle_past_the_header_timeout_stays_usable(translator, logs):
    """The header timer ran again from each answer, so a kept-alive connection idle for the
    header timeout was closed by the server just as a client reused it: the client's request
    was reset (httpcore ReadError, seen in CI). Idle kept-alive connections are now uvicorn's
    keep-alive timeout's (5 s); a slow next request still gets its 408."""
    with serve(translator, header_timeout=0.3) as s:
        port = int(s.url.rsplit(":", 1)[1])
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        request = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
        for _ in range(2):
            sock.sendall(request)
            data = b""
            while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
                data += chunk
            assert data.startswith(b"HTTP/1.1 200"), data  # b"": the server closed it
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(next(x for x in head.lower().split(b"\r\n")
                              if x.startswith(b"content-length:")).split(b":")[1])  # fmt: skip
            while len(body) < length and (chunk := sock.recv(65536)):
                body += chunk
            assert json.loads(body)["status"] == "ok"
            time.sleep(0.6)  # idle twice the header timeout: still open
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: lo")  # the next request, too slowly
        status, body = read_answer(sock)
        assert status == 408 and body["error"].startswith("headers: not all received")
        sock.close()


def test_connections_beyond_the_cap_get_503(tmp_path, logs):
    """Beyond --max-connections, when every connection is being answered, a new one is a
    503. (Those still receiving a request give way first: the next test.)"""
    import threading

    from _serve_helpers import tiny_model_folder

    from qkv.serve.registry import ModelRegistry, inspect_folder
    from qkv.translate import Translator

    release = threading.Event()

    def load(folder):  # the model loads once released: its requests wait, being answered
        release.wait(60)
        return Translator.load(folder.path)

    folder = inspect_folder(tiny_model_folder(tmp_path / "en-fr", ("en", "fr")))
    app = create_app(ModelRegistry.from_folders([folder], load), ServeConfig())
    body = json.dumps({"q": "go .", "source": "en", "target": "fr"}).encode()
    request = (
        f"POST /translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with live_app(app, max_connections=4) as s:
        port = int(s.url.rsplit(":", 1)[1])
        held = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(4)]
        for sock in held:
            sock.sendall(request)
        wait_until(lambda: len(s.server.server_state.tasks) == 4, what="4 requests in flight")
        for _ in range(3):
            extra = socket.create_connection(("127.0.0.1", port), timeout=30)
            status, answer = read_answer(extra)
            assert status == 503 and answer["error"].startswith("connections: the server holds 4")
            extra.close()
        release.set()
        for sock in held:
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            sock.close()
        wait_until(lambda: not s.server.server_state.connections, what="the connections closed")
        assert s.get("/health").status_code == 200
    lines = [r.getMessage() for r in logs.records]
    assert len(lines) == 1 and "--max-connections (4)" in lines[0], lines


def test_a_full_server_closes_the_connection_slowest_to_send_its_request(translator, logs):
    """Clients that opened every connection and sent their requests slowly shut every other
    client out until their timeouts ran out. A new connection now makes room: of those slow to
    send their request, the oldest is closed (a 408 when it had sent part of one)."""
    with serve(translator, max_connections=4) as s:
        port = int(s.url.rsplit(":", 1)[1])
        silent = socket.create_connection(("127.0.0.1", port), timeout=30)  # the oldest
        wait_until(lambda: len(s.server.server_state.connections) == 1, what="a connection")
        slow = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(3)]
        for sock in slow:
            sock.sendall(
                b"POST /translate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 99\r\n\r\n{"
            )
        wait_until(lambda: len(s.server.server_state.connections) == 4, what="4 connections")
        time.sleep(1.2)  # slow for a second: under the rate (a quick request is never cut)
        kept = []
        for _ in range(4):  # each new request is served; the oldest waiting one gives way
            r = socket.create_connection(("127.0.0.1", port), timeout=30)
            r.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert r.recv(65536).startswith(b"HTTP/1.1 200")
            kept.append(r)  # kept alive: it holds its connection
        assert silent.recv(100) == b""  # it had sent nothing: closed in silence
        for sock in slow:
            status, answer = read_answer(sock)
            assert status == 408 and answer["error"].startswith("connections: the server is full")
            sock.close()
        for sock in [silent, *kept]:
            sock.close()
    lines = [r.getMessage() for r in logs.records]
    assert (
        len(lines) == 1
        and "slowest to send their request to make room under --max-connections (4)" in lines[0]
    ), lines
    assert not any(r.exc_info for r in logs.records)


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"header_timeout": 0}, "header_timeout"),
        ({"header_timeout": float("inf")}, "header_timeout"),
        ({"max_connections": 0}, "max_connections"),
        ({"max_connections": 2.5}, "max_connections"),
        ({"shutdown_timeout": float("nan")}, "shutdown_timeout"),
        ({"shutdown_timeout": -1}, "shutdown_timeout"),
    ],
)
def test_limits_are_checked(translator, options, key):
    with pytest.raises(SettingError, match=f"^{key}: expected"):
        make_server(create_app(translator, ServeConfig("en", "fr")), **options)


def test_a_body_refused_early_closes_a_kept_alive_connection(translator):
    """Without ``Connection: close`` the connection stayed open after the 413 and took the
    rest of the body (any size, for as long as it came); now the answer closes it."""
    with serve(translator) as s:
        port = int(s.url.rsplit(":", 1)[1])
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(
            b"POST /translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 50000000\r\n\r\n" + b"a" * 100_000
        )
        data = b""
        while not data.endswith(b"}"):
            data += sock.recv(65536)
        sock.close()
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower(), head
        assert json.loads(body)["error"].startswith("body: 50,000,000 bytes")


def test_a_client_gone_before_its_body_is_not_a_server_error(translator, logs):
    """A client that closed before sending all its body was logged as a failure of the
    server, with uvicorn's traceback; it is the client's doing: nothing is logged."""
    with serve(translator) as s:
        port = int(s.url.rsplit(":", 1)[1])
        for _ in range(3):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(
                b"POST /translate HTTP/1.1\r\nHost: localhost\r\n"
                b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"q"'
            )
            time.sleep(0.2)  # the request is read, its body awaited
            sock.close()
        wait_until(lambda: s.state.in_flight == 0, what="the requests to end")
        assert s.get("/health").status_code == 200
    assert [r.getMessage() for r in logs.records] == []


def test_upgrades_and_malformed_requests_are_a_line_a_minute(translator):
    """uvicorn warned once per such request (two lines per upgrade asked)."""
    with serve(translator) as s:
        logs = contextlib.contextmanager(kept_logs)()  # once uvicorn configured its loggers
        with logs as kept:
            port = int(s.url.rsplit(":", 1)[1])
            for _ in range(5):
                for raw in (
                    b"\x00garbage\r\n\r\n",
                    b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade, close\r\n"
                    b"Upgrade: websocket\r\n\r\n",
                ):
                    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
                    sock.sendall(raw)
                    while sock.recv(65536):
                        pass
                    sock.close()
    lines = [r.getMessage() for r in kept.records]
    assert len(lines) == 3, lines  # invalid, an upgrade, no WebSocket library: once each
    assert not any(r.exc_info for r in kept.records)
