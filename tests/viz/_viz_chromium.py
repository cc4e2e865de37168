"""Drive Debian's headless Chromium over the DevTools protocol, with the standard library only.

A minimal RFC 6455 websocket client (client frames masked, fragments joined, pings answered) is
enough for the DevTools protocol: JSON requests with an ``id``, answers with the same ``id``,
events in between.  Chromium listens on the loopback only, on a port it picks itself.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

CHROMIUM = os.environ.get("QKV_CHROMIUM") or "/usr/bin/chromium"
ENSURE_SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "ensure_chromium.sh"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--mute-audio",
    "--hide-scrollbars",
    "--disable-dev-shm-usage",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)
_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def find_chromium() -> tuple[str | None, str]:
    """``(path, "")`` when Chromium is there, else ``(None, why)``; never installs anything.

    Looked for at ``$QKV_CHROMIUM`` (default ``/usr/bin/chromium``), then as ``chromium`` on the
    PATH.  ``make test`` installs it when it can (tools/ensure_chromium.sh, as root).
    """
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM, ""
    found = shutil.which("chromium")
    if found:
        return found, ""
    return None, (
        f"no Chromium at {CHROMIUM} or on the PATH; `make test` installs it as root with apt-get "
        f"(tools/{ENSURE_SCRIPT.name}), or set QKV_CHROMIUM to where it is"
    )


class WebSocket:
    """A blocking websocket client, just enough for the DevTools protocol."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        m = re.fullmatch(r"ws://([^/:]+):(\d+)(/.*)", url)
        if not m:
            raise ValueError(f"url: expected ws://host:port/path, got {url!r}")
        host, port, path = m.group(1), int(m.group(2)), m.group(3)
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("websocket: connection closed during the handshake")
            head += chunk
        head, self._buf = head.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        if " 101 " not in lines[0] + " ":
            raise ConnectionError(f"websocket: handshake refused: {lines[0]}")
        want = base64.b64encode(hashlib.sha1((key + _GUID).encode()).digest()).decode()
        headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
        if headers.get("sec-websocket-accept") != want:
            raise ConnectionError("websocket: bad Sec-WebSocket-Accept in the handshake")

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise ConnectionError("websocket: connection closed")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        mask = os.urandom(4)
        body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + body)

    def send(self, text: str) -> None:
        self._send_frame(0x1, text.encode())

    def recv(self) -> str:
        parts: list[bytes] = []
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", self._read(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", self._read(8))
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x9:  # ping
                self._send_frame(0xA, payload)
                continue
            if opcode == 0xA:  # pong
                continue
            if opcode == 0x8:
                raise ConnectionError("websocket: closed by the server")
            parts.append(payload)
            if b0 & 0x80:  # FIN
                return b"".join(parts).decode()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._send_frame(0x8, b"")
        self.sock.close()


class Browser:
    """One headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self, chromium: str, width: int = 1280, height: int = 900) -> None:
        self.profile = tempfile.mkdtemp(prefix="qkv-chromium-")
        self.proc = subprocess.Popen(
            [
                chromium,
                *FLAGS,
                f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.ws: WebSocket | None = None
        self._id = 0
        try:
            port = self._port()
            targets = self._targets(port)
            page = next(t for t in targets if t.get("type") == "page")
            self.ws = WebSocket(page["webSocketDebuggerUrl"])
        except Exception:
            self.close()
            raise

    def _port(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        assert self.proc.stderr is not None
        seen = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                if self.proc.poll() is not None:
                    break
                continue
            seen.append(line.strip())
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if m:
                # keep draining stderr so a chatty browser never blocks on a full pipe
                threading.Thread(target=self._drain, daemon=True).start()
                return int(m.group(1))
        raise RuntimeError("chromium did not start its DevTools server: " + " | ".join(seen[-5:]))

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        try:
            for _ in self.proc.stderr:
                pass
        except (OSError, ValueError):
            pass

    @staticmethod
    def _targets(port: int) -> list[dict]:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                    targets = json.loads(r.read())
                if any(t.get("type") == "page" for t in targets):
                    return targets
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("chromium has no page target")
            time.sleep(0.2)

    def call(self, method: str, **params: object) -> dict:
        """Send one DevTools command and return its ``result``; events are skipped."""
        assert self.ws is not None
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expression: str) -> object:
        """Evaluate JS in the page and return its value (promises awaited)."""
        r = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in r:
            raise RuntimeError(f"JS error: {r['exceptionDetails']}")
        return r["result"].get("value")

    def open(self, path: Path, ready: str = "document.body.dataset.ready === '1'") -> None:
        """Load a local file and wait until ``ready`` is true in the page."""
        self.goto(path.resolve().as_uri(), ready)

    def goto(self, url: str, ready: str = "document.body.dataset.ready === '1'") -> None:
        """Load ``url`` (a file, or a server on the loopback) and wait until ``ready``."""
        self.call("Page.enable")
        self.call("Page.navigate", url=url)
        self.wait_for(ready, what=f"page {url} to become ready")

    def wait_for(self, condition: str, timeout: float = 30.0, what: str = "") -> None:
        """Wait until the JS expression ``condition`` is true in the page."""
        deadline = time.monotonic() + timeout
        while not self.eval(f"!!(document.body && ({condition}))"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:g} s for {what or condition}")
            time.sleep(0.05)

    def click(self, x: float, y: float) -> None:
        """A real left click at ``(x, y)`` CSS pixels (press and release)."""
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def click_on(self, selector: str, index: int = 0) -> None:
        """Click the middle of the ``index``-th element matching ``selector``."""
        box = self.eval(
            f"(() => {{ const e = document.querySelectorAll({selector!r})[{index}];"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        self.click(box[0], box[1])

    def type_text(self, text: str) -> None:
        """Type ``text`` into the focused element, as the keyboard would insert it."""
        self.call("Input.insertText", text=text)

    def hover(self, x: float, y: float) -> None:
        """Move the real mouse pointer to ``(x, y)`` CSS pixels."""
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()
            self.ws = None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)


# ---------------------------------------------------------------------------- fixtures' bodies
def chromium_or_skip() -> str:
    """Debian's Chromium, or a skip saying why not: no test installs it (`make test` does).
    With ``QKV_REQUIRE_CHROMIUM=1`` (CI) a missing browser is a failure, not a skip.  The
    ``chromium_path`` fixtures of tests/viz and tests/serve."""
    import pytest

    path, why = find_chromium()
    if path is None:
        if os.environ.get("QKV_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"headless Chromium unavailable and QKV_REQUIRE_CHROMIUM=1: {why}")
        pytest.skip(f"headless Chromium unavailable: {why}")
    return path


@contextlib.contextmanager
def opened_browser(path: str):
    """One headless Chromium page for a test module, closed after it (the ``browser`` fixtures)."""
    b = Browser(path)
    try:
        yield b
    finally:
        b.close()
