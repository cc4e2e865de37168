"""Running the app under uvicorn, with a clean stop and the edges of a careful server.

SIGTERM or Ctrl-C (SIGINT): the server stops accepting connections, answers every request in
flight (the batch worker finishes what is queued), and :func:`run` returns normally, so
``qkv serve`` exits 0. A second Ctrl-C stops at once. (uvicorn itself re-raises the signal after
its graceful stop, which would end the process with the signal's status instead.) When the
shutdown timeout runs out first, each request still waiting is answered 503 (JSON, saying so),
one log line says how many, and :func:`run` says so too (``qkv serve`` then exits 1).

Each connection (:class:`_Protocol`, uvicorn's h11 protocol with these additions):

* must send a request's headers within ``header_timeout`` seconds of opening (on a kept-alive
  connection, of the next request's first byte), else it is closed (a 408 when it had sent
  part of them): slowloris clients cannot hold the server's sockets. An idle kept-alive
  connection is closed by uvicorn's keep-alive timeout (5 s), not this one: a client that
  reuses it at the moment the header timeout ran out would have its request reset;
* must send a request's body at a steady pace once its headers are in (nginx's
  ``client_body_timeout``, Apache's ``mod_reqtimeout``): no more than ``body_timeout``
  seconds between two reads, and on the whole no slower than ``min_body_rate`` bytes a second
  after a first ``body_timeout`` seconds of grace (the deadline is ``body_timeout +
  received / min_body_rate`` seconds after the headers). Else the request is answered 408 and
  the connection closed, whatever the route, before the app sees the rest: a client that
  trickles a body a byte a second frees its connection within the timeout. The clock stops
  while the server itself is not reading (its buffer full, or a ``100 Continue`` not sent yet);
* beyond ``max_connections`` open ones, a new connection first makes room: of the connections
  slow to send their request (its headers or body still arriving, or kept alive idle, for
  :data:`EVICT_AFTER` seconds and more, under ``min_body_rate`` on the whole), the oldest is
  closed, with a 408 when it had sent part of one, so that slow clients that hold every
  connection give way to the next one, and a request arriving at a good pace is never cut;
  when none is that slow, the new one is answered 503 and closed, so the process never runs
  out of file descriptors; so is one beyond ``max_connections_per_client``
  from one address, when given, so that one client cannot take every connection. What a
  refused client sends is read and dropped for :data:`REFUSAL_LINGER_SECONDS` before the close
  (:data:`REFUSAL_LINGERING` of them at once at most), so that it reads its 503 rather than a
  connection reset;
* when the server answers before a request's body has all arrived (a 413 on its
  ``Content-Length``) and closes, the rest of the body is read and dropped, up to
  :data:`LINGER_BYTES` and :data:`LINGER_SECONDS` (a "lingering close", as nginx and Apache
  do): a client that writes its whole body before reading (Python's urllib) gets the answer
  rather than a connection reset.

Events that clients cause in numbers (header and body timeouts, refused connections, malformed
requests, ``accept()`` out of file descriptors) are logged one line per kind at most once a
minute, with the count since: never a traceback per socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .._errors import SettingError

__all__ = [
    "BODY_TIMEOUT",
    "HEADER_TIMEOUT",
    "LINGER_BYTES",
    "LINGER_SECONDS",
    "LISTEN_BACKLOG",
    "MIN_BODY_RATE",
    "Stopped",
    "bind",
    "check_limits",
    "default_max_connections",
    "make_server",
    "run",
]

log = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: seconds a connection has to send a request's headers (Go's servers are often given 10 s)
HEADER_TIMEOUT = 10.0
#: seconds a request's body may go without a byte, and the grace before its rate is checked
#: (Apache's mod_reqtimeout gives a body 20 s; nginx's client_body_timeout is 60 s)
BODY_TIMEOUT = 20.0
#: bytes a second a request's body must average after the grace (mod_reqtimeout's MinRate)
MIN_BODY_RATE = 500.0
#: a connection is closed to make room for a new one only when it has been receiving its
#: request this many seconds at least, under the minimum body rate
EVICT_AFTER = 1.0
#: seconds a client may take none of its answer before its connection is closed when no
#: body timeout is set (nginx's ``send_timeout`` is 60 s)
SEND_TIMEOUT = 60.0
#: after a body timeout's 408: the most seconds the rest is read and dropped before closing
#: (short: the client is the slow one; long enough that the 408 is read, not reset)
BODY_LINGER_SECONDS = 2.0
#: after an answer that leaves a request's body unread: the most bytes read and dropped, and
#: the most seconds spent, before the connection is closed anyway
LINGER_BYTES = 64 * 2**20
LINGER_SECONDS = 10.0
#: after a refusal's 503: the most seconds, and bytes, what the client sends is read and
#: dropped before closing (closing with its request unread resets the connection, and the
#: client may lose the 503 or fail its send), and the most refused connections lingering at
#: once (beyond them a refusal closes at once: their descriptors come out of the margin
#: :func:`default_max_connections` leaves under the open-file limit, with a burst of accepts)
REFUSAL_LINGER_SECONDS = 2.0
REFUSAL_LINGER_BYTES = 64 * 2**10
REFUSAL_LINGERING = 16
#: how often a kind of event is logged at most, seconds
LOG_EVERY = 60.0
#: uvicorn's warnings that clients cause one per request (how they begin): rate-limited like the
#: others
_CLIENT_WARNINGS = (
    "Invalid HTTP request received.",
    "Exceeded concurrency limit.",
    "Unsupported upgrade request.",
    "No supported WebSocket library detected.",
)


#: the listening socket's backlog, and so the most connections asyncio accepts at once (uvicorn's
#: default, 2,048, let a burst take 2,048 file descriptors before any refused one was closed)
LISTEN_BACKLOG = 128


def default_max_connections() -> int:
    """The connection cap when none is given: the open-file limit (``ulimit -n``) less 200 (a
    burst of :data:`LISTEN_BACKLOG` accepted at once, and the process's own files), between 8
    and 10,000."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 10_000
    return max(8, min(10_000, soft - 200))


def _answer(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 answer ``{"error": message}`` that closes the connection, written
    outside h11 (no request was read)."""
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class _Events:
    """Counts events by kind; logs the first of a kind at once, then at most one line per
    ``every`` seconds, with how many there were since."""

    def __init__(self, every: float = LOG_EVERY) -> None:
        self.every = every
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def due(self, kind: str) -> str | None:
        """Count one event of ``kind``; the suffix of its log line when one is due, else None."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        now = time.monotonic()
        since = self._since.get(kind, 0)
        if kind in self._last and now - self._last[kind] < self.every:
            self._since[kind] = since + 1
            return None
        self._last[kind], self._since[kind] = now, 0
        return f" ({since:,} more in the last {self.every:g} s)" if since else ""

    def note(self, kind: str, message: str) -> None:
        """Count one event; log ``qkv serve: message`` when one is due."""
        suffix = self.due(kind)
        if suffix is not None:
            log.warning("qkv serve: %s%s", message, suffix)

    def filter(self, record: logging.LogRecord) -> bool:
        """A :class:`logging.Filter`'s test for uvicorn's log: its per-request warnings that
        clients cause, rate-limited like the others."""
        if str(record.msg).startswith("Cancel %s running task(s)"):
            return False  # the shutdown timeout: _Server.shutdown says it, with the 503s
        kind = next((w for w in _CLIENT_WARNINGS if str(record.msg).startswith(w)), None)
        if kind is None:
            return True
        suffix = self.due(f"uvicorn: {kind}")
        if suffix is None:
            return False
        record.msg = f"{record.msg}{suffix}"
        return True


@dataclass(frozen=True)
class _Limits:
    header_timeout: float | None
    max_connections: int
    events: _Events
    body_timeout: float | None = BODY_TIMEOUT
    min_body_rate: float | None = MIN_BODY_RATE
    per_client: int | None = None
    #: the connections open per client address (with ``per_client``)
    by_client: dict[str, int] = field(default_factory=dict)
    #: the refused connections in their lingering close now
    refused_lingering: set[Any] = field(default_factory=set)


def _seconds(key: str, value: object, *, zero: bool) -> None:
    """Refuse ``value`` unless it is None or a finite number of seconds > 0 (``zero``: >= 0)."""
    if value is None:
        return
    ok = (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and (value >= 0 if zero else value > 0)
        and value < math.inf
    )
    if not ok:
        raise SettingError(key, f"expected seconds {'>=' if zero else '>'} 0, got {value!r}")


def _limits(
    header_timeout: float | None,
    max_connections: int | None,
    shutdown_timeout: float | None,
    body_timeout: float | None = BODY_TIMEOUT,
    min_body_rate: float | None = MIN_BODY_RATE,
    max_connections_per_client: int | None = None,
) -> _Limits:
    """The connection limits, checked.

    Raises:
        SettingError: keyed ``header_timeout``, ``max_connections``, ``shutdown_timeout``,
            ``body_timeout``, ``min_body_rate`` or ``max_connections_per_client``, naming what
            came.
    """
    _seconds("header_timeout", header_timeout, zero=False)
    _seconds("shutdown_timeout", shutdown_timeout, zero=True)
    _seconds("body_timeout", body_timeout, zero=False)
    rate_ok = min_body_rate is None or (
        not isinstance(min_body_rate, bool)
        and isinstance(min_body_rate, (int, float))
        and 0 <= min_body_rate < math.inf
    )
    if not rate_ok:
        raise SettingError(
            "min_body_rate", f"expected bytes a second >= 0 (0: no rate), got {min_body_rate!r}"
        )
    if max_connections is None:
        max_connections = default_max_connections()
    per_client = max_connections_per_client
    for key, n in (
        ("max_connections", max_connections),
        ("max_connections_per_client", per_client),
    ):
        if key != "max_connections" and n is None:
            continue
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SettingError(key, f"expected an int >= 1, got {n!r}")
    return _Limits(
        header_timeout, max_connections, _Events(), body_timeout, min_body_rate or None, per_client
    )


class _Transport:
    """A connection's transport as uvicorn's request cycle sees it: ``close()`` lingers while
    the request's body is still arriving (see :meth:`_Protocol.close`)."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport, self._protocol = transport, protocol

    def close(self) -> None:
        self._protocol.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header timeout, a connection cap and a lingering close
    (the module's docstring). ``limits`` is set on the subclass each server makes."""

    limits: _Limits

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._raw = transport
        self._refused = False
        self._lingering = False
        self._dropped = 0
        self._heard = 0  # bytes received since the last answer
        self._header_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._linger_since: float | None = None  # when its lingering close began
        self._stalled_since: float | None = None  # when its client stopped taking its answer
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_start = self._body_last = 0.0  # when the body's clock started, last byte
        self._body_bytes = 0  # bytes of the body received since its clock started
        self._since = self.loop.time()  # when it began waiting for its current request
        peer = transport.get_extra_info("peername")
        self._peer: str | None = str(peer[0]) if isinstance(peer, tuple) and peer else None
        refusal = self._refusal()
        if refusal is not None:
            self._refuse(refusal)
            return
        if self._peer is not None and self.limits.per_client is not None:
            held = self.limits.by_client
            held[self._peer] = held.get(self._peer, 0) + 1
        super().connection_made(transport)
        self.transport = _Transport(transport, self)  # type: ignore[assignment]
        self._await_headers()

    def _refuse(self, refusal: str) -> None:
        """Answer a refused connection 503; read and drop what its client sends for
        :data:`REFUSAL_LINGER_SECONDS` (or until it closes), so that it reads the 503 rather
        than a reset; at once when :data:`REFUSAL_LINGERING` refused ones linger already."""
        self._refused = True
        self._raw.write(_answer(503, "Service Unavailable", refusal))
        lingering = self.limits.refused_lingering
        if len(lingering) >= REFUSAL_LINGERING:
            self._raw.close()
            return
        lingering.add(self)
        self._linger(REFUSAL_LINGER_SECONDS)

    def _refusal(self) -> str | None:
        """Why a new connection is refused (logged), or None: its client's address holds
        ``per_client`` connections (checked first: a client over its share closes no other's
        connection), or the server holds ``max_connections`` and none is slow enough to close
        to make room."""
        cap, events = self.limits.max_connections, self.limits.events
        per = self.limits.per_client
        held = self.limits.by_client.get(self._peer, 0) if self._peer is not None else 0
        if per is not None and held >= per:  # before any other connection is closed for room
            events.note(
                "per_client",
                f"refused connections beyond --max-connections-per-client ({per:,}) with 503",
            )
            return f"connections: your address holds {per:,} already; try again shortly"
        if len(self.server_state.connections) >= cap:
            victim = _slowest(self.server_state.connections)
            if victim is None:  # every one is being answered
                events.note(
                    "cap", f"refused connections beyond --max-connections ({cap:,}) with 503"
                )
                return f"connections: the server holds {cap:,} already; try again shortly"
            victim.evict()
            events.note(
                "evict",
                f"closed the connections slowest to send their request to make room under "
                f"--max-connections ({cap:,}) (a 408 to those that had sent part of one)",
            )
        return None

    def slow_since(self) -> float | None:
        """Since when (loop time) this connection has been receiving its request (or waiting
        for its next one, kept alive), when it is slow at it: for :data:`EVICT_AFTER` seconds
        at least, and under the minimum body rate on the whole (a request that arrives at a
        good pace is never closed to make room); or since when it has been in its lingering
        close, or its client has taken none of its answer, for as long. None otherwise: its
        request is being answered, it is closing, or it is sending at a good pace."""
        if self._refused or self._raw.is_closing():
            return None
        now = self.loop.time()
        # answered already, the rest of its request dropped; or its client takes none of its
        # answer: either for EVICT_AFTER seconds at least
        for since in (self._linger_since, self._stalled_since):
            if since is not None and now - since >= EVICT_AFTER:
                return since
        if self._lingering:
            return None
        cycle = self.cycle
        receiving = cycle is None or cycle.response_complete  # headers, or nothing yet
        receiving = receiving or (self._reading_body() and not cycle.response_started)
        took = self.loop.time() - self._since
        rate = self.limits.min_body_rate or MIN_BODY_RATE
        if self.flow.read_paused:  # the server is not reading it: not its slowness
            return None
        if not receiving or took < EVICT_AFTER or self._heard >= rate * took:
            return None
        return self._since

    def evict(self) -> None:
        """Close this connection, still receiving its request, to make room for a new one: a
        408 when it sent part of a request, the app told the client left."""
        cycle = self.cycle
        answering = cycle is not None and not cycle.response_complete
        if self._lingering or self._stalled_since is not None:
            self._raw.abort()  # answered, or not reading what it is sent: nothing to say
            return
        if self._heard and not (answering and cycle.response_started):
            message = (
                "connections: the server is full and this request was the slowest to arrive; "
                "send it again"
            )
            self._raw.write(_answer(408, "Request Timeout", message))
        if answering:
            cycle.scope["qkv.body_late"] = True
            cycle.disconnected = True
            cycle.message_event.set()
        self._raw.close()

    def _await_headers(self) -> None:
        timeout = self.limits.header_timeout
        if timeout is not None:
            self._cancel_timer("_header_timer")
            self._header_timer = self.loop.call_later(timeout, self._headers_late)

    def _cancel_timer(self, name: str) -> None:
        timer = getattr(self, name)
        if timer is not None:
            timer.cancel()
            setattr(self, name, None)

    def _headers_late(self) -> None:
        """The header timeout ran out: close a connection still waiting for a request's
        headers (a 408 when it sent part of them; an idle one is closed in silence)."""
        self._header_timer = None
        if self._raw.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
            return  # closed, or its request arrived and is being answered
        if self._heard:
            timeout = self.limits.header_timeout
            self.limits.events.note(
                "headers",
                f"closed connections that sent no whole request headers within "
                f"--header-timeout ({timeout:g} s) with 408",
            )
            message = f"headers: not all received within {timeout:g} s"
            self._raw.write(_answer(408, "Request Timeout", message))
        self._raw.close()

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # the rest of a body already answered, or a refused request: dropped
            self._dropped += len(data)
            if self._dropped > (REFUSAL_LINGER_BYTES if self._refused else LINGER_BYTES):
                self._raw.close()
            return
        if self._heard == 0:
            self._since = self.loop.time()
            if self._header_timer is None:
                self._await_headers()  # a kept-alive connection's next request starts arriving
        self._heard += len(data)
        super().data_received(data)
        self._watch_body(len(data))

    def _reading_body(self) -> bool:
        """Whether a request's body is arriving that its answer still waits for."""
        cycle = self.cycle
        return (
            cycle is not None
            and not cycle.response_complete
            and not self._raw.is_closing()
            and self.conn.their_state is h11.SEND_BODY
        )

    def _watch_body(self, received: int) -> None:
        """Time the request's body (the module's docstring): its clock starts when the headers
        are in and stops once the body has all arrived."""
        if self.limits.body_timeout is None:
            return
        if not self._reading_body():
            self._cancel_timer("_body_timer")
            return
        now = self.loop.time()
        if self._body_timer is None:  # the headers are in: ``received`` held them
            self._body_start, self._body_bytes = now, 0
            self._body_timer = self.loop.call_at(now, self._check_body)
        else:
            self._body_bytes += received
        self._body_last = now

    def _body_due(self) -> float:
        """When the body is late: ``body_timeout`` after its last byte, or its rate's
        deadline, whichever is first."""
        timeout = self.limits.body_timeout
        assert timeout is not None
        due = self._body_last + timeout
        rate = self.limits.min_body_rate
        if rate:
            due = min(due, self._body_start + timeout + self._body_bytes / rate)
        return due

    def _check_body(self) -> None:
        self._body_timer = None
        if not self._reading_body():
            return
        now = self.loop.time()
        cycle = self.cycle
        if self.flow.read_paused or cycle.waiting_for_100_continue:
            # the server is not reading: its wait, not the client's; the clock starts again
            self._body_start = self._body_last = now
            self._body_bytes = 0
        elif now >= self._body_due() - 0.001:
            self._body_late(now)
            return
        self._body_timer = self.loop.call_at(self._body_due(), self._check_body)

    def _body_late(self, now: float) -> None:
        """The body came too slowly: a 408 (unless an answer has begun), the app told the
        client is gone, and the connection closed after a short lingering read."""
        timeout, rate = self.limits.body_timeout, self.limits.min_body_rate
        assert timeout is not None
        rule = f"--body-timeout ({timeout:g} s)" + (f", --min-body-rate ({rate:g})" if rate else "")
        self.limits.events.note(
            "body", f"closed connections whose request body came too slowly ({rule}) with 408"
        )
        if now - self._body_last >= timeout - 0.001:
            why = f"nothing for {timeout:g} s"
        else:
            took = now - self._body_start
            why = f"{self._body_bytes:,} bytes in {took:.1f} s, under {rate:g} bytes a second"
        cycle = self.cycle
        if not cycle.response_started:
            message = f"body: arriving too slowly ({why}); the request was not read"
            self._raw.write(_answer(408, "Request Timeout", message))
        cycle.scope["qkv.body_late"] = True  # what the app reads is a 408, not a hang-up
        cycle.disconnected = True  # its receive() says the client left; its answer is dropped
        cycle.message_event.set()
        self._linger(BODY_LINGER_SECONDS)

    def eof_received(self) -> bool | None:
        if self._lingering:
            self._raw.close()
        return None

    def on_response_complete(self) -> None:
        # an idle kept-alive connection is uvicorn's to close (its keep-alive timeout); the
        # header timeout starts again with the next request's first byte
        self._heard = 0
        self._since = self.loop.time()
        self._cancel_timer("_header_timer")
        self._cancel_timer("_body_timer")
        super().on_response_complete()

    def close(self) -> None:
        """Close the connection; while the request's body is still arriving (the server
        answered first), stop writing, read and drop the rest, up to :data:`LINGER_BYTES` and
        :data:`LINGER_SECONDS`, then close: closing with unread data makes the kernel reset
        the connection, and the client may lose the answer."""
        if self._lingering or self._raw.is_closing():
            return
        if self.conn.their_state is not h11.SEND_BODY:
            self._raw.close()
            return
        self._linger(LINGER_SECONDS, evictable=True)

    def _linger(self, seconds: float, *, evictable: bool = False) -> None:
        """Stop writing; read and drop what still comes for ``seconds`` at most, then close;
        ``evictable``: sooner when a new connection needs its place (:meth:`slow_since`): a
        request refused before its body, whose linger is long. A 408's short linger is left to
        end, so that a client still sending reads its 408 rather than a reset."""
        self._lingering = True
        if evictable:
            self._linger_since = self.loop.time()
        self._cancel_timer("_header_timer")
        self._cancel_timer("_body_timer")
        self._unset_keepalive_if_required()
        self._linger_timer = self.loop.call_later(seconds, self._raw.close)
        self._raw.resume_reading()
        if self._raw.can_write_eof():
            self._raw.write_eof()

    def pause_writing(self) -> None:
        """The client stopped taking its answer (the transport's buffer is full): it gets
        :data:`SEND_TIMEOUT` seconds (the body timeout when set) to take some again, as
        nginx's ``send_timeout``, and may be closed sooner to make room."""
        super().pause_writing()
        self._stalled_since = self.loop.time()
        timeout = self.limits.body_timeout or SEND_TIMEOUT
        self._cancel_timer("_send_timer")
        self._send_timer = self.loop.call_later(timeout, self._send_late)

    def resume_writing(self) -> None:
        self._stalled_since = None
        self._cancel_timer("_send_timer")
        super().resume_writing()

    def _send_late(self) -> None:
        """The client took nothing of its answer for the send timeout: closed."""
        self._send_timer = None
        self.limits.events.note(
            "send", "closed connections whose clients took nothing of their answer in time"
        )
        self._raw.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer("_header_timer")
        self._cancel_timer("_body_timer")
        self._cancel_timer("_linger_timer")
        self._cancel_timer("_send_timer")
        if self._refused:
            self.limits.refused_lingering.discard(self)
            return
        held = self.limits.by_client
        if self._peer in held:
            held[self._peer] -= 1
            if held[self._peer] <= 0:
                del held[self._peer]
        super().connection_lost(exc)


def _slowest(connections: Iterable[Any]) -> _Protocol | None:
    """The connection slow to send its request (:meth:`_Protocol.slow_since`) for the longest,
    which makes room when the server is full; None when none is slow."""
    waiting = [
        (since, c)
        for c in connections
        if isinstance(c, _Protocol) and (since := c.slow_since()) is not None
    ]
    return min(waiting, key=lambda x: x[0])[1] if waiting else None


@dataclass(frozen=True)
class Stopped:
    """How :func:`run` ended: whether the server started (False: the app's startup failed),
    and how many requests were cut off (answered 503) when the shutdown timeout ran out."""

    started: bool
    cut_off: int = 0


class _CutOff:
    """ASGI wrapper: a request cancelled when the shutdown timeout runs out is answered 503
    (JSON, saying why) rather than uvicorn's 500 with a traceback, and counted."""

    def __init__(self, app: Any, timeout: float | None) -> None:
        self.app, self.timeout = app, timeout
        self.server: _Server | None = None
        self.count = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except asyncio.CancelledError:
            if self.server is None or not self.server.should_exit:
                raise
            self.count += 1  # the server is stopping: answered, counted, logged once
            if not started:
                within = "" if self.timeout is None else f" within {self.timeout:g} s"
                message = (
                    f"server: shutting down; this request was not answered{within} (the shutdown "
                    "timeout), send it again"
                )
                body = json.dumps({"error": message}).encode()
                headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
                await send({"type": "http.response.start", "status": 503, "headers": headers})
                await send({"type": "http.response.body", "body": body})


class _Server(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        on_ready: Callable[[], None] | None,
        cut_off: _CutOff,
        limits: _Limits,
    ) -> None:
        super().__init__(config)
        self._on_ready = on_ready
        self.cut_off = cut_off
        self.limits = limits
        cut_off.server = self

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

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        uvicorn_log = logging.getLogger("uvicorn.error")
        uvicorn_log.addFilter(self.limits.events.filter)
        asyncio.get_running_loop().set_exception_handler(self._loop_error)
        try:
            await super().serve(sockets=sockets)
        finally:
            uvicorn_log.removeFilter(self.limits.events.filter)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """``accept()`` out of file descriptors (asyncio retries it a second later): one line
        a minute, not a traceback each time; anything else as asyncio reports it."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and "accept" in str(context.get("message", "")):
            self.limits.events.note(
                "accept",
                f"cannot accept connections: {exc.strerror or exc} (the open-file limit, "
                "ulimit -n, or --max-connections)",
            )
            return
        loop.default_exception_handler(context)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit and self._on_ready is not None:
            self._on_ready()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets=sockets)
        # the requests cut off answer at once: let them finish before the loop ends
        deadline = time.monotonic() + 2.0
        while self.server_state.tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self.cut_off.count:
            log.warning(
                "qkv serve: the shutdown timeout (%g s) ran out: %d request(s) still waiting "
                "were answered 503",
                self.config.timeout_graceful_shutdown,
                self.cut_off.count,
            )


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
    header_timeout: float | None = HEADER_TIMEOUT,
    max_connections: int | None = None,
    on_ready: Callable[[], None] | None = None,
    body_timeout: float | None = BODY_TIMEOUT,
    min_body_rate: float | None = MIN_BODY_RATE,
    max_connections_per_client: int | None = None,
) -> uvicorn.Server:
    """A uvicorn server for ``app`` that stops cleanly on SIGTERM or Ctrl-C (in the main thread;
    elsewhere set its ``should_exit``); run it with ``server.run(sockets=[sock])``.

    ``shutdown_timeout``: seconds the graceful stop waits for requests in flight; then each
    still waiting is answered 503 (None: no limit; the server's ``cut_off.count`` says how many).
    ``header_timeout``: seconds a connection has to send a request's headers (None: no limit).
    ``max_connections``: the most connections open at once (None:
    :func:`default_max_connections`). ``on_ready()`` is called once the server accepts requests.
    ``body_timeout``: seconds a request's body may go without a byte, and its grace before
    ``min_body_rate`` (bytes a second; 0 or None: no rate) applies; None: the body is not timed.
    ``max_connections_per_client``: the most connections one client address may hold (None: no
    such cap; behind a reverse proxy every client has the proxy's address).

    Raises:
        SettingError: (a ``ValueError``) keyed ``header_timeout``, ``max_connections``,
            ``shutdown_timeout``, ``body_timeout``, ``min_body_rate`` or
            ``max_connections_per_client``.
    """
    limits = _limits(
        header_timeout,
        max_connections,
        shutdown_timeout,
        body_timeout,
        min_body_rate,
        max_connections_per_client,
    )
    protocol = type("_ServerProtocol", (_Protocol,), {"limits": limits})
    cut_off = _CutOff(app, shutdown_timeout)
    config = uvicorn.Config(
        cut_off,
        log_level=log_level,
        access_log=access_log,
        lifespan="on",
        loop="asyncio",
        http=protocol,
        ws="none",
        interface="asgi3",
        timeout_graceful_shutdown=shutdown_timeout,
        server_header=False,
        backlog=LISTEN_BACKLOG,
    )
    return _Server(config, on_ready, cut_off, limits)


def check_limits(
    header_timeout: float | None,
    max_connections: int | None,
    shutdown_timeout: float | None = 60.0,
    **more: float | None,
) -> None:
    """Check :func:`make_server`'s limits before serving (``more``: its ``body_timeout``,
    ``min_body_rate`` and ``max_connections_per_client``, by name).

    Raises:
        SettingError: (a ``ValueError``) keyed as :func:`make_server` says.
        TypeError: a name in ``more`` that is none of those.
    """
    _limits(header_timeout, max_connections, shutdown_timeout, **more)  # type: ignore[arg-type]


def run(app: Any, sock: socket.socket, **options: Any) -> Stopped:
    """Serve ``app`` on the bound ``sock`` until SIGTERM or Ctrl-C (``options``: those of
    :func:`make_server`); says whether it started and how many requests the shutdown timeout
    cut off (answered 503)."""
    server = make_server(app, **options)
    server.run(sockets=[sock])
    return Stopped(bool(server.started), server.cut_off.count)  # type: ignore[attr-defined]
