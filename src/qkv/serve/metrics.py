"""The server's counters, rendered in Prometheus' text exposition format (version 0.0.4).

No client library: a few counters and histograms kept under a lock, written out by
:meth:`Metrics.render` for ``GET /metrics``.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Sequence

__all__ = ["BATCH_BUCKETS", "LATENCY_BUCKETS", "METHODS", "Histogram", "Metrics"]

#: the HTTP methods counted by name; any other a client sends counts as "other", so that no
#: client can grow the label set (and /metrics, and the server's memory) without bound
METHODS: tuple[str, ...] = ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH")

#: request latency, seconds
LATENCY_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
)
#: sentences per decode
BATCH_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def _number(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    esc = {
        k: v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
        for k, v in labels.items()
    }
    return "{" + ",".join(f'{k}="{v}"' for k, v in esc.items()) + "}"


class Histogram:
    """Cumulative buckets, a sum and a count (one label set)."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: dict[str, str]) -> list[str]:
        out, total = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts):
            total += n
            out.append(f"{name}_bucket{_labels({**labels, 'le': _number(bound)})} {total}")
        out.append(f"{name}_sum{_labels(labels)} {_number(self.sum)}")
        out.append(f"{name}_count{_labels(labels)} {self.count}")
        return out


class Metrics:
    """Requests by route and status, latency by route, batch sizes, sentences translated.

    The labels come from fixed sets, whatever clients send: ``routes`` (any other path counts
    as ``"other"``; None: the caller's routes are taken as they come), :data:`METHODS` (any
    other method: ``"other"``), and the status codes an HTTP answer may have (100 to 599).
    """

    def __init__(self, routes: Sequence[str] | None = None) -> None:
        self.routes = None if routes is None else frozenset(routes)
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, int], int] = {}
        self.latency: dict[str, Histogram] = {}
        self.batch_sentences = Histogram(BATCH_BUCKETS)
        self.batch_seconds = 0.0
        self.batch_tokens = 0
        self.sentences = 0

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count one answered request (``route`` and ``method`` outside their sets as
        ``"other"``, a status outside 100-599 as 0)."""
        if self.routes is not None and route not in self.routes:
            route = "other"
        if method not in METHODS:
            method = "other"
        status = int(status) if 100 <= status <= 599 else 0
        with self._lock:
            key = (route, method, status)
            self.requests[key] = self.requests.get(key, 0) + 1
            self.latency.setdefault(route, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def batch(self, sentences: int, tokens: int, seconds: float) -> None:
        """Count one decode of ``sentences`` (``tokens`` source tokens times ``beam_size``)."""
        with self._lock:
            self.batch_sentences.observe(sentences)
            self.batch_seconds += seconds
            self.batch_tokens += tokens
            self.sentences += sentences

    def render(self, *, queue_depth: int, in_progress: int, in_flight: int) -> str:
        """The exposition text (gauges given by the caller, read at the moment of the scrape)."""
        with self._lock:
            lines = [
                "# HELP qkv_requests_total HTTP requests answered, by route, method and status.",
                "# TYPE qkv_requests_total counter",
            ]
            for (route, method, status), n in sorted(self.requests.items()):
                labels = {"route": route, "method": method, "status": str(status)}
                lines.append(f"qkv_requests_total{_labels(labels)} {n}")
            lines += [
                "# HELP qkv_request_duration_seconds Time from a request's arrival to its answer.",
                "# TYPE qkv_request_duration_seconds histogram",
            ]
            for route, h in sorted(self.latency.items()):
                lines += h.lines("qkv_request_duration_seconds", {"route": route})
            lines += [
                "# HELP qkv_batch_sentences Sentences decoded together in one batch.",
                "# TYPE qkv_batch_sentences histogram",
                *self.batch_sentences.lines("qkv_batch_sentences", {}),
                "# HELP qkv_batch_tokens_total Source tokens (times the beam) decoded.",
                "# TYPE qkv_batch_tokens_total counter",
                f"qkv_batch_tokens_total {self.batch_tokens}",
                "# HELP qkv_decode_seconds_total Time the worker spent decoding batches.",
                "# TYPE qkv_decode_seconds_total counter",
                f"qkv_decode_seconds_total {_number(self.batch_seconds)}",
                "# HELP qkv_sentences_translated_total Sentences translated.",
                "# TYPE qkv_sentences_translated_total counter",
                f"qkv_sentences_translated_total {self.sentences}",
                "# HELP qkv_queue_depth Sentences waiting for the worker.",
                "# TYPE qkv_queue_depth gauge",
                f"qkv_queue_depth {queue_depth}",
                "# HELP qkv_decoding_sentences Sentences the worker is decoding now.",
                "# TYPE qkv_decoding_sentences gauge",
                f"qkv_decoding_sentences {in_progress}",
                "# HELP qkv_requests_in_flight HTTP requests being answered now.",
                "# TYPE qkv_requests_in_flight gauge",
                f"qkv_requests_in_flight {in_flight}",
            ]
        return "\n".join(lines) + "\n"
