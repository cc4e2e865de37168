"""``qkv serve``: one-line errors before serving, the serve extra checked up front, and a real
process that stops on SIGTERM or Ctrl-C after answering what was in flight, exiting 0."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from qkv.cli import main

ROOT = Path(__file__).resolve().parents[2]


def one_line_error(capsys, flag: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"qkv serve: error: {flag}: ") and err.count("\n") == 1, err
    return err


def test_a_missing_model_dir(tmp_path, capsys):
    rc = main(["serve", "--model-dir", str(tmp_path / "none"), "--quiet"])
    assert "does not exist" in one_line_error(capsys, "model dir")
    # the status qkv translate gives the same folder
    assert rc == main(["translate", "--model-dir", str(tmp_path / "none"), "go ."]) != 0


def test_languages_the_model_does_not_record_must_be_given(model_dir, capsys):
    assert main(["serve", "--model-dir", str(model_dir), "--quiet"]) == 2
    err = one_line_error(capsys, "--source-lang")
    assert "--target-lang" in err


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--max-chars", "0"], "--max-chars"),
        (["--max-batch-tokens", "-3"], "--max-batch-tokens"),
        (["--max-wait-ms", "-1"], "--max-wait-ms"),
        (["--max-alternatives", "9"], "--max-alternatives"),
        (["--beam", "0"], "--beam"),
        (["--port", "70000"], "--port"),
        (["--threads", "-1"], "--threads"),
        (["--api-key", ""], "--api-key"),
        (["--quantize", "int8", "--device", "cuda"], "--quantize"),
        (["--allowed-hosts", "translate.example.org:8000"], "--allowed-hosts"),
        (["--header-timeout", "0"], "--header-timeout"),
        (["--max-connections", "0"], "--max-connections"),
        (["--shutdown-timeout", "nan"], "--shutdown-timeout"),
    ],
)
def test_bad_flags_are_one_line(model_dir, capsys, args, flag):
    argv = ["serve", "--model-dir", str(model_dir), "--source-lang", "en", "--target-lang", "fr"]
    assert main([*argv, *args, "--quiet"]) == 2
    one_line_error(capsys, flag)


def test_a_port_in_use(model_dir, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["serve", "--model-dir", str(model_dir), "--source-lang", "en"]
        argv += ["--target-lang", "fr", "--port", str(port), "--quiet"]
        assert main(argv) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in one_line_error(capsys, "--host")


#: a base install in a subprocess: starlette and uvicorn cannot be found (as tests/test_deps.py)
BLOCKER = """
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("starlette", "uvicorn"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Blocker())
from qkv.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def test_without_the_serve_extra_one_line_before_loading(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    res = subprocess.run(
        [sys.executable, "-c", BLOCKER, "serve", "--model-dir", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip() == ("qkv serve needs starlette, uvicorn: pip install 'qkv[serve]'")


def test_allowed_hosts_comma_separated_repeated_and_the_host_name():
    import argparse

    from qkv.cli.serve import add_parser, serve_config

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    argv = ["serve", "--allowed-hosts", "a.example,*.b.example", "--allowed-hosts", "C.example"]
    args = parser.parse_args(argv)
    assert serve_config(args, None).allowed_hosts == ("a.example", "*.b.example", "c.example")
    args = parser.parse_args([*argv, "--host", "myhost.lan"])  # a name to listen on: allowed
    assert serve_config(args, None).allowed_hosts[-1] == "myhost.lan"
    args = parser.parse_args(["serve", "--host", "0.0.0.0"])  # an address: as reached
    assert serve_config(args, None).allowed_hosts == ()


# ---------------------------------------------------------------------------- a real process
def start(model_dir: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """``qkv serve`` of ``model_dir`` (en -> fr) in a process: it and its URL once ready."""
    more = ("--source-lang", "en", "--target-lang", "fr", *extra)
    return start_process("--model-dir", str(model_dir), *more)


def start_process(*argv: str, open_files: int | None = None) -> tuple[subprocess.Popen, str]:
    """``qkv serve ARGV --port 0 --quiet`` in a process: it and its URL once ready.
    ``open_files``: its open-file limit (``ulimit -n``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])

    def limit() -> None:
        import resource

        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, hard))

    proc = subprocess.Popen(
        [sys.executable, "-m", "qkv.cli", "serve", *argv, "--port", "0", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=None if open_files is None else limit,
    )
    lines = []
    deadline = time.monotonic() + 90
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r" on (http://127\.0\.0\.1:\d+/)$", line.strip())
        if m:
            return proc, m.group(1)
    proc.kill()
    raise AssertionError("the server did not start: " + "".join(lines))


def post(url: str, body: dict, timeout: float = 60) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def refused(url: str) -> bool:
    host, port = url.split("//")[1].rstrip("/").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return False
    except OSError:
        return True


@pytest.mark.parametrize(
    "sig",
    [
        pytest.param(signal.SIGTERM, id="SIGTERM"),
        pytest.param(signal.SIGINT, id="SIGINT", marks=pytest.mark.slow),
    ],
)
def test_a_signal_finishes_the_requests_in_flight_then_exits_0(model_dir, translator, sig):
    """Two requests in flight when the signal comes: one half-received (its body still coming),
    one queued (the batcher waits for the first's company, up to 5 s). The server stops
    accepting connections, answers both, and exits 0."""
    proc, url = start(model_dir, "--max-wait-ms", "5000")
    try:
        assert post(url + "translate", {"q": "go ."})[0] == 200  # the server works
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        slow = socket.create_connection(("127.0.0.1", port), timeout=60)
        body = json.dumps({"q": "hello ."}).encode()
        slow.sendall(
            b"POST /translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:5]
        )
        out: dict = {}
        t = threading.Thread(
            target=lambda: out.update(r=post(url + "translate", {"q": "i lost ."}))
        )
        t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # "i lost ." waits in the batcher for "hello ."
            with urllib.request.urlopen(url + "health", timeout=10) as r:
                if json.loads(r.read())["queue_depth"] == 1:
                    break
            time.sleep(0.02)
        else:
            raise AssertionError("the request never reached the queue")
        proc.send_signal(sig)
        deadline = time.monotonic() + 30
        while not refused(url):  # it stops accepting new connections
            assert time.monotonic() < deadline, "still accepting connections after the signal"
            time.sleep(0.05)
        slow.sendall(body[5:])  # the rest of the half-received request
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            chunk = slow.recv(65536)
            if not chunk:
                break
            answer += chunk
        slow.close()
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), answer
        assert json.loads(payload) == {"translatedText": translator.translate("hello .")}
        t.join(60)
        assert out["r"] == (200, {"translatedText": translator.translate("i lost .")})
        assert proc.wait(60) == 0
        err = proc.stderr.read()
        assert "qkv serve: stopped" in err and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_the_shutdown_timeout_answers_503_and_exits_1(model_dir):
    """When --shutdown-timeout ran out, each request still waiting got uvicorn's 500 with a
    traceback in the log, and the exit status was 0. Now: a 503 saying why, one log line
    counting them, exit 1. (The queued request waits up to 5 s for the company of the one
    whose body is still coming; the timeout is 0.5 s.)"""
    proc, url = start(model_dir, "--max-wait-ms", "5000", "--shutdown-timeout", "0.5")
    try:
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        slow = socket.create_connection(("127.0.0.1", port), timeout=60)
        slow.sendall(
            b"POST /translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b'Content-Length: 20\r\n\r\n{"q": '
        )
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(r=post(url + "translate", {"q": "go ."})))
        t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with urllib.request.urlopen(url + "health", timeout=10) as r:
                if json.loads(r.read())["queue_depth"] == 1:
                    break
            time.sleep(0.02)
        else:
            raise AssertionError("the request never reached the queue")
        proc.send_signal(signal.SIGTERM)
        t.join(60)
        status, body = out["r"]
        assert status == 503, body
        assert body["error"].startswith("server: shutting down; this request was not answered")
        answer = b""
        while chunk := slow.recv(65536):
            answer += chunk
        slow.close()
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert proc.wait(60) == 1
        err = proc.stderr.read()
        assert "Traceback" not in err, err
        assert "ran out: 2 request(s) still waiting were answered 503" in err, err
        assert err.rstrip().endswith("ran out, and each got a 503"), err
        assert "Cancel 2 running task(s)" not in err  # said once, by qkv
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.slow
def test_more_slow_connections_than_open_files(model_dir):
    """The issue's case: more half-open sockets than the open-file limit blocked /health and
    /translate, and the log grew by a traceback per socket. Now the connections over the cap
    are refused, the slow ones are cut at --header-timeout, the server answers again, and the
    log holds a line per kind of event."""
    more = ("--model-dir", str(model_dir), "--source-lang", "en", "--target-lang", "fr")
    proc, url = start_process(*more, "--header-timeout", "1", open_files=300)  # a cap of 100
    try:
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        slow = []
        for _ in range(400):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            with contextlib.suppress(OSError):  # refused beyond the cap: closed at once
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Wait: ")
            slow.append(sock)
        deadline = time.monotonic() + 30
        while True:  # the slow ones are cut within a second: the server answers again
            with contextlib.suppress(urllib.error.HTTPError, OSError):
                if post(url + "translate", {"q": "go ."}, timeout=5)[0] == 200:
                    break
            assert time.monotonic() < deadline, "the server never answered again"
            time.sleep(0.1)
        for sock in slow:
            sock.close()
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        err = proc.stderr.read()
        assert "Traceback" not in err and len(err.splitlines()) <= 4, err
        assert "qkv serve: stopped" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
