"""Dynamic batching: the queue merges what fits, a translation is the same alone or batched
(through the server), decoding never blocks the event loop, and a stop finishes the queue."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from _serve_helpers import SOURCES, live_server, wait_until

from qkv.inference import Decoding
from qkv.serve import Batcher, QueueFull

#: the decodings the queue's jobs are keyed by
GREEDY, BEAM_2 = Decoding(), Decoding(beam_size=2)


# ---------------------------------------------------------------------------- the queue alone
class Recorder:
    """A decode that records its batches and, while ``gate`` is clear, waits."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, texts, decoding):
        self.batches.append(list(texts))
        self.entered.set()
        self.gate.wait(30)
        return [f"{t}|b{decoding.beam_size}|n{decoding.n_best}" for t in texts]


def started(dec, **kw) -> Batcher:
    b = Batcher(dec, **kw)
    b.start()
    return b


def test_jobs_given_up_on_are_dropped_not_decoded():
    """A request cancelled while its job waits (the shutdown timeout ran out) cancels the job's
    future; the worker decoded it anyway, delaying the stop. Now it is dropped."""
    dec = Recorder()
    dec.gate.clear()
    b = started(dec, max_batch_tokens=100, max_wait_ms=0)
    try:
        first = b.submit(["a"], GREEDY, tokens=1)
        assert dec.entered.wait(10)
        gone = b.submit(["b", "c"], GREEDY, tokens=2)
        kept = b.submit(["d"], BEAM_2, tokens=1)
        assert b.queue_depth == 3 and gone.future.cancel()
        dec.gate.set()
        assert first.future.result(10) == ["a|b1|n1"]
        assert kept.future.result(10) == ["d|b2|n1"]
        assert dec.batches == [["a"], ["d"]]
        assert b.queue_depth == 0
    finally:
        dec.gate.set()
        b.stop()


def test_jobs_queued_during_a_decode_go_together_within_the_budget():
    dec = Recorder()
    b = started(dec, max_batch_tokens=10, max_wait_ms=0)
    try:
        dec.gate.clear()
        first = b.submit(["a"], GREEDY, tokens=2)
        dec.entered.wait(10)  # the worker is busy with "a"
        jobs = [b.submit([f"t{i}"], GREEDY, tokens=3) for i in range(4)]
        other = b.submit(["w"], BEAM_2, tokens=2)  # another decoding: its own batch
        assert b.queue_depth == 5
        dec.gate.set()
        assert first.future.result(10) == ["a|b1|n1"]
        assert [j.future.result(10) for j in jobs] == [[f"t{i}|b1|n1"] for i in range(4)]
        assert other.future.result(10) == ["w|b2|n1"]
        # 3 + 3 + 3 fit in 10 tokens, the fourth waits for the next batch
        assert dec.batches == [["a"], ["t0", "t1", "t2"], ["t3"], ["w"]]
        assert b.queue_depth == 0
    finally:
        b.stop(10)


def test_the_first_job_waits_for_company_on_its_way():
    """A request being read (``pending``) is waited for, up to max_wait."""
    dec = Recorder()
    coming = [1]
    b = started(dec, max_batch_tokens=100, max_wait_ms=10_000, pending=lambda: coming[0])
    try:
        j1 = b.submit(["x"], GREEDY, tokens=2)
        time.sleep(0.05)  # the worker holds "x", waiting: a request is on its way
        assert not dec.batches
        j2 = b.submit(["y", "z"], GREEDY, tokens=4)
        coming[0] = 0
        assert j1.future.result(10) == ["x|b1|n1"] and j2.future.result(10) == [
            "y|b1|n1",
            "z|b1|n1",
        ]
        assert dec.batches == [["x", "y", "z"]]
    finally:
        b.stop(10)


def test_a_lone_job_is_not_kept_waiting():
    """Nothing on its way and nothing arrived during the last decode: decoded at once, not
    after max_wait (10 s here; the result is asked within 5)."""
    dec = Recorder()
    b = started(dec, max_batch_tokens=100, max_wait_ms=10_000, pending=lambda: 0)
    try:
        assert b.submit(["x"], GREEDY, tokens=2).future.result(5) == ["x|b1|n1"]
        assert b.submit(["y"], GREEDY, tokens=2).future.result(5) == ["y|b1|n1"]
    finally:
        b.stop(10)


def test_jobs_that_arrive_during_a_decode_bring_a_wait_for_more():
    dec = Recorder()
    b = started(dec, max_batch_tokens=100, max_wait_ms=300, pending=lambda: 0)
    try:
        dec.gate.clear()
        b.submit(["a"], GREEDY, tokens=2)
        dec.entered.wait(10)
        j = b.submit(["b"], GREEDY, tokens=2)  # arrives while "a" decodes
        dec.gate.set()
        time.sleep(0.1)  # the next batch holds "b", waiting up to 300 ms for company
        k = b.submit(["c"], GREEDY, tokens=2)
        j.future.result(10), k.future.result(10)
        assert dec.batches == [["a"], ["b", "c"]]
    finally:
        b.stop(10)


def test_without_batching_each_job_is_decoded_alone():
    dec = Recorder()
    b = started(dec, batching=False, max_wait_ms=300)
    try:
        dec.gate.clear()
        jobs = [b.submit([f"t{i}"], GREEDY, tokens=2) for i in range(3)]
        dec.gate.set()
        for j in jobs:
            j.future.result(10)
        assert dec.batches == [["t0"], ["t1"], ["t2"]]
    finally:
        b.stop(10)


def test_stop_finishes_the_queue_then_refuses():
    dec = Recorder()
    b = started(dec, max_wait_ms=0)
    dec.gate.clear()
    jobs = [
        b.submit([f"t{i}"], Decoding(beam_size=i % 2 + 1, n_best=i % 2 + 1), tokens=2)
        for i in range(4)
    ]
    stopper = threading.Thread(target=b.stop)
    stopper.start()
    dec.gate.set()
    stopper.join(10)
    assert all(j.future.done() and j.future.exception() is None for j in jobs)
    with pytest.raises(RuntimeError, match="not running"):
        b.submit(["late"], GREEDY, tokens=2)


def test_a_bounded_queue():
    dec = Recorder()
    b = started(dec, max_queue=3, max_wait_ms=0)
    try:
        dec.gate.clear()
        b.submit(["busy"], GREEDY, tokens=1)
        dec.entered.wait(10)
        b.submit(["a", "b"], GREEDY, tokens=2)
        with pytest.raises(QueueFull, match="3"):
            b.submit(["c", "d"], GREEDY, tokens=2)
        b.submit(["c"], GREEDY, tokens=1)  # exactly full
    finally:
        dec.gate.set()
        b.stop(10)


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"max_batch_tokens": 0}, "max_batch_tokens"),
        ({"max_wait_ms": -1}, "max_wait_ms"),
        ({"max_wait_ms": "5"}, "max_wait_ms"),
        ({"max_queue": 0}, "max_queue"),
    ],
)
def test_bad_settings(kw, name):
    with pytest.raises((ValueError, TypeError), match=name):
        Batcher(Recorder(), **kw)


# ---------------------------------------------------------------------------- through the server
async def _concurrently(url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(*(client.post(url + "/translate", json=b) for b in bodies))


def test_a_translation_is_the_same_alone_or_batched(translator):
    """40 concurrent requests (mixed sentences, lengths and lists) decoded in a few batches give
    exactly what the library gives each sentence translated on its own."""
    texts = SOURCES[:40]
    refs = [translator.translate(t) for t in texts]
    assert len(set(refs)) > 15  # the outputs differ: a mix-up between sentences would show
    with live_server(translator, max_wait_ms=500) as s:
        bodies = [{"q": t} for t in texts[:30]] + [{"q": texts[30:35]}, {"q": texts[35:]}]
        rs = asyncio.run(_concurrently(s.url, bodies))
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
        got = [r.json()["translatedText"] for r in rs[:30]] + rs[30].json()["translatedText"]
        got += rs[31].json()["translatedText"]
        assert got == refs
        h = s.state.metrics.batch_sentences
        assert h.count < len(bodies)  # requests were decoded together
        assert h.sum == len(texts)
        # and alone, one request at a time, the same again
        for t, ref in zip(texts[:5], refs):
            assert s.post("/translate", json={"q": t}).json()["translatedText"] == ref


def test_health_answers_during_a_long_batch(translator):
    """The decode runs in the worker thread: while it is held, /health and /metrics answer."""
    with live_server(translator, max_wait_ms=0) as s:
        gate, entered = threading.Event(), threading.Event()
        real = s.lane.batcher.decode

        def held(texts, decoding):
            entered.set()
            if not gate.wait(30):
                raise RuntimeError("never released")
            return real(texts, decoding)

        s.lane.batcher.decode = held
        out = {}
        t = threading.Thread(target=lambda: out.update(r=s.post("/translate", json={"q": SOURCES})))
        t.start()
        try:
            assert entered.wait(30)
            # answered while the decode is held (a decode on the event loop would hold these
            # until the gate timed out, and then report nothing decoding)
            h = s.get("/health")
            assert h.status_code == 200 and h.json()["decoding_sentences"] == len(SOURCES)
            assert "qkv_decoding_sentences 60" in s.get("/metrics").text
        finally:
            gate.set()
            t.join(60)
        assert out["r"].status_code == 200
        assert out["r"].json()["translatedText"] == translator.translate(SOURCES)


def test_no_batching_server_decodes_each_request_alone(translator):
    with live_server(translator, batching=False, max_wait_ms=200) as s:
        texts = SOURCES[:8]
        rs = asyncio.run(_concurrently(s.url, [{"q": t} for t in texts]))
        assert [r.json()["translatedText"] for r in rs] == [translator.translate(t) for t in texts]
        h = s.state.metrics.batch_sentences
        assert h.count == 8 and h.sum == 8
        assert s.get("/health").json()["batching"]["enabled"] is False
        wait_until(lambda: s.lane.batcher.queue_depth == 0)
