"""Running the app under uvicorn, with a clean stop.

SIGTERM or Ctrl-C (SIGINT): the server stops accepting connections, answers every request in
flight (the batch worker finishes what is queued), and :func:`run` returns normally, so
``qkv serve`` exits 0. A second Ctrl-C stops at once. (uvicorn itself re-raises the signal after
its graceful stop, which would end the process with the signal's status instead.)
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

from .._errors import SettingError

__all__ = ["bind", "make_server", "run"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None] | None) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        # the stop was graceful: unlike uvicorn, do not re-raise the signal

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit and self._on_ready is not None:
            self._on_ready()


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: one the system picks).

    Raises:
        SettingError: (a ``ValueError``) keyed ``port``: a port out of range; keyed ``host``: the
            address cannot be listened on (in use, not this machine's, no rights), naming it.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise SettingError("port", f"expected an int in [0, 65535], got {port!r}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto given: asyncio sets TCP_NODELAY on each accepted connection only for a socket whose
    # proto is IPPROTO_TCP; with proto 0 every answer written in two parts (uvicorn writes the
    # head, then the body) waited for the client's delayed ACK, about 40 ms
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except (OSError, OverflowError) as e:
        sock.close()
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise SettingError("host", f"cannot listen on {host}:{port}: {why}") from None
    sock.set_inheritable(True)
    return sock


def make_server(
    app: Any,
    *,
    log_level: str = "info",
    access_log: bool = False,
    shutdown_timeout: float | None = 60.0,
    on_ready: Callable[[], None] | None = None,
) -> uvicorn.Server:
    """A uvicorn server for ``app`` that stops cleanly on SIGTERM or Ctrl-C (in the main thread;
    elsewhere set its ``should_exit``); run it with ``server.run(sockets=[sock])``.

    ``shutdown_timeout``: seconds the graceful stop waits for requests in flight before
    cancelling them (None: no limit). ``on_ready()`` is called once the server accepts requests.
    """
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=access_log,
        lifespan="on",
        loop="asyncio",
        http="h11",
        ws="none",
        interface="asgi3",
        timeout_graceful_shutdown=shutdown_timeout,
        server_header=False,
    )
    return _Server(config, on_ready)


def run(app: Any, sock: socket.socket, **options: Any) -> bool:
    """Serve ``app`` on the bound ``sock`` until SIGTERM or Ctrl-C (``options``: those of
    :func:`make_server`); returns whether it started (False: the app's startup failed)."""
    server = make_server(app, **options)
    server.run(sockets=[sock])
    return bool(server.started)
