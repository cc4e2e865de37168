"""A request limit per client per minute, as LibreTranslate's ``--req-limit`` sets one.

LibreTranslate counts requests in a moving window of one minute (Flask-Limiter's
``moving-window`` strategy): a request is refused with 429 while the client's requests of the
last 60 seconds already add up to the limit, and each request admitted adds its cost (one, a
list of ``n`` texts ``n``, a file one per ``char_limit`` bytes). The answer is LibreTranslate's,
``{"error": "Slowdown: 30 per 1 minute"}``, with a ``Retry-After`` header saying when the
oldest request counted leaves the window.

A client is a key (its API key, or its address): :class:`RateLimiter` keeps, per key, the
times and costs of the last minute's requests, and forgets a key once they are all older.
"""

from __future__ import annotations

import collections
import hashlib
import math
import threading
import time
from collections.abc import Callable

from .._errors import SettingError

__all__ = ["WINDOW_S", "RateLimiter", "Slowdown", "retry_header"]

#: the window LibreTranslate's ``--req-limit`` counts in, seconds
WINDOW_S = 60.0


class Slowdown(Exception):
    """A request over its client's limit; ``retry_after`` seconds until one more fits."""

    def __init__(self, limit: int, retry_after: float) -> None:
        super().__init__(f"Slowdown: {limit} per 1 minute")
        self.limit = limit
        self.retry_after = retry_after


class RateLimiter:
    """At most ``per_minute`` requests (by cost) per client in any window of a minute.

    Args:
        per_minute: the limit, an int >= 1.
        clock: seconds, monotonic (tests pass their own).

    Raises:
        SettingError: keyed ``req_limit``: not an int >= 1.
    """

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(per_minute, bool) or not isinstance(per_minute, int) or per_minute < 1:
            raise SettingError("req_limit", f"expected an int >= 1, got {per_minute!r}")
        self.limit = per_minute
        self.clock = clock
        self._seen: dict[str, collections.deque[tuple[float, int]]] = {}
        self._used: dict[str, int] = {}
        self._lock = threading.Lock()
        self._next_sweep = 0.0

    @staticmethod
    def client(api_key: str | None, address: str | None) -> str:
        """The key a request is counted under: its API key (hashed: the limiter keeps no
        key in the clear) when given, else its address."""
        if api_key:
            return "key:" + hashlib.sha256(api_key.encode("utf-8", "surrogatepass")).hexdigest()
        return f"addr:{address or '-'}"

    def admit(self, client: str, cost: int = 1) -> None:
        """Count a request of ``cost`` (>= 1) for ``client``, or refuse it.

        Raises:
            Slowdown: the client's requests of the last minute add up to the limit already.
        """
        now = self.clock()
        with self._lock:
            self._sweep(now)
            seen = self._seen.get(client)
            if seen is not None:
                self._expire(client, seen, now)
            used = self._used.get(client, 0)
            if used >= self.limit:
                assert seen  # used > 0
                raise Slowdown(self.limit, max(0.0, seen[0][0] + WINDOW_S - now))
            if seen is None:
                seen = self._seen[client] = collections.deque()
            seen.append((now, max(1, int(cost))))
            self._used[client] = used + max(1, int(cost))

    @property
    def clients(self) -> int:
        """How many clients are counted now (those with a request in the last minute)."""
        return len(self._seen)

    def _expire(self, client: str, seen: collections.deque[tuple[float, int]], now: float) -> None:
        used = self._used.get(client, 0)
        while seen and seen[0][0] <= now - WINDOW_S:
            used -= seen.popleft()[1]
        if seen:
            self._used[client] = used
        else:
            self._seen.pop(client, None)
            self._used.pop(client, None)

    def _sweep(self, now: float) -> None:
        """Forget the clients whose requests are all older than the window (at most once a
        window), so that a stream of new addresses does not grow the table for ever."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + WINDOW_S
        for client, seen in list(self._seen.items()):
            self._expire(client, seen, now)


def retry_header(seconds: float) -> dict[str, str]:
    """The ``Retry-After`` header of a 429: whole seconds, at least 1."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}
