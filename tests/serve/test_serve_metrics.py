"""GET /metrics: Prometheus' text format, parsed strictly, counting what was asked."""

from __future__ import annotations

import math
import re

from _serve_helpers import SOURCES, live_server

from qkv.serve.metrics import Histogram

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(\{{(.*)\}})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def parse(text: str) -> tuple[dict[str, str], list[tuple[str, dict[str, str], float]]]:
    """``(types, samples)`` of the exposition format; any line out of shape fails the test."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    samples = []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram"), line
            assert name not in types, f"{name} typed twice"
            types[name] = kind
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, _, body, value = m.groups()
        labels = {}
        if body:
            pos = 0
            while pos < len(body):
                lm = _LABEL.match(body, pos)
                assert lm, f"bad labels in {line!r}"
                labels[lm.group(1)] = lm.group(2)
                pos = lm.end()
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in types or base in types, f"{name} has no TYPE line"
        samples.append((name, labels, float(value)))
    return types, samples


def value(samples, name: str, **labels: str) -> float:
    found = [
        v for n, ls, v in samples if n == name and all(ls.get(k) == x for k, x in labels.items())
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_counts_by_route_and_status_latency_batches_and_queue(translator):
    with live_server(translator, max_wait_ms=0) as s:
        for _ in range(3):
            assert s.post("/translate", json={"q": SOURCES[0]}).status_code == 200
        assert s.post("/translate", json={"q": SOURCES[1:5]}).status_code == 200
        assert s.post("/translate", content=b"{").status_code == 400
        assert s.post("/translate", json={}).status_code == 422
        assert s.get("/nowhere").status_code == 404
        assert s.get("/health").status_code == 200
        r = s.get("/metrics")
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        types, samples = parse(r.text)
    assert types["qkv_requests_total"] == "counter"
    assert types["qkv_request_duration_seconds"] == "histogram"
    assert types["qkv_batch_sentences"] == "histogram"
    assert types["qkv_queue_depth"] == "gauge"
    req = "qkv_requests_total"
    assert value(samples, req, route="/translate", method="POST", status="200") == 4
    assert value(samples, req, route="/translate", method="POST", status="400") == 1
    assert value(samples, req, route="/translate", method="POST", status="422") == 1
    assert value(samples, req, route="other", method="GET", status="404") == 1
    assert value(samples, req, route="/health", method="GET", status="200") == 1
    # the latency histogram of /translate: 6 requests, cumulative buckets ending at +Inf
    lat = "qkv_request_duration_seconds"
    buckets = [
        (ls["le"], v)
        for n, ls, v in samples
        if n == lat + "_bucket" and ls["route"] == "/translate"
    ]
    assert buckets[-1] == ("+Inf", 6)
    counts = [v for _, v in buckets]
    assert counts == sorted(counts)
    assert value(samples, lat + "_count", route="/translate") == 6
    assert value(samples, lat + "_sum", route="/translate") > 0
    # batch sizes: one decode per request (no wait, one client): 1, 1, 1 and 4 sentences
    assert value(samples, "qkv_batch_sentences_count") == 4
    assert value(samples, "qkv_batch_sentences_sum") == 7
    assert value(samples, "qkv_batch_sentences_bucket", le="1") == 3
    assert value(samples, "qkv_batch_sentences_bucket", le="4") == 4
    assert value(samples, "qkv_sentences_translated_total") == 7
    assert value(samples, "qkv_queue_depth") == 0
    assert value(samples, "qkv_requests_in_flight") == 1  # the scrape itself


def test_histogram_buckets_are_inclusive_upper_bounds():
    h = Histogram((1, 2, 4))
    for v in (1, 2, 3, 4, 5, 0.5):
        h.observe(v)
    lines = h.lines("x", {"a": 'q"\\\n'})
    assert lines[0] == 'x_bucket{a="q\\"\\\\\\n",le="1"} 2'
    got = [float(line.rsplit(" ", 1)[1]) for line in lines[:4]]
    assert got == [2, 3, 5, 6]
    assert lines[-2].endswith(" 15.5") and lines[-1].endswith(" 6")
    assert not math.isnan(h.sum)


def test_methods_are_a_fixed_set_whatever_clients_send(translator):
    """Any method a client sends was a label of its own (3,000 made /metrics 66 MB, for good);
    those outside the usual few count as "other"."""
    with live_server(translator) as s:
        for i in range(200):
            assert s.client.request(f"X{i}LONGMETHOD", s.url + "/metrics").status_code == 405
            assert s.client.request(f"Y{i}", s.url + f"/nowhere/{i}").status_code == 404
        assert s.client.request("PATCH", s.url + "/health").status_code == 405
        _, samples = parse(s.get("/metrics").text)
    methods = {ls["method"] for n, ls, _ in samples if n == "qkv_requests_total"}
    assert methods == {"PATCH", "other"}  # (the scrape is counted once answered)
    routes = {ls["route"] for n, ls, _ in samples if n == "qkv_requests_total"}
    assert routes == {"/metrics", "/health", "other"}
    req = "qkv_requests_total"
    assert value(samples, req, route="/metrics", method="other", status="405") == 200
    assert value(samples, req, route="other", method="other", status="404") == 200
    assert value(samples, req, route="/health", method="PATCH", status="405") == 1
    assert len(samples) < 200
