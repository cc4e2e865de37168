"""Dynamic batching: requests queued by the event loop, decoded together by one worker thread.

A request is a :class:`Job`: its sentences and how to decode them (a
:class:`~qkv.inference.Decoding`, the job's key: jobs of one decoding decode together). The worker
takes the oldest job, then every queued job decoded the same way that still fits the token budget
(``max_batch_tokens`` source tokens, times ``beam_size``), waiting at most ``max_wait_ms`` after the
first job arrived for more to come, and decodes them in one call. Jobs that arrive while a batch
is decoding queue up and go together into the next one, so the batches grow with the load.

The wait is spent only when company is likely: when jobs arrived while the last batch was
decoding, or when the server is reading requests that have not reached the queue yet
(``pending()``). A lone client's request is decoded at once, without waiting for nobody.

Decoding runs in the worker thread, never on the event loop: the server answers ``/health`` and
``/metrics`` during a long batch. A sentence's translation does not depend on the sentences
decoded with it (:func:`qkv.inference.generate_ids` guarantees it), so batching changes the speed,
never the output. When a batch fails (one hostile sentence, say), each of its jobs is decoded
again on its own, so the error reaches only the request that caused it.

With ``batching=False`` each job is decoded alone, in arrival order: the peer the benchmark
compares with.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import SettingError
from ..inference import Decoding

__all__ = ["Batcher", "Job", "QueueFull"]

log = logging.getLogger(__name__)

#: ``decode(texts, decoding)``: one result per text, in order
Decode = Callable[[list[str], Decoding], list[Any]]


class QueueFull(RuntimeError):
    """More sentences are waiting than the queue holds (``max_queue``); try again later."""


@dataclass(eq=False)
class Job:
    """One request's work: ``texts`` decoded with ``decoding``, or ``call`` run alone.

    ``tokens`` is its share of the token budget (source tokens with ``<eos>``, times ``beam_size``).
    ``future`` receives the list of results (one per text) or ``call``'s return value.
    """

    texts: list[str]
    decoding: Decoding | None = None
    tokens: int = 0
    call: Callable[[], Any] | None = None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    enqueued: float = field(default_factory=time.monotonic)

    @property
    def key(self) -> Decoding | None:
        """Jobs with the same key decode in one batch (None: a call, run alone)."""
        return None if self.call is not None else self.decoding


class Batcher:
    """The queue and its worker thread.

    Args:
        decode: ``decode(texts, decoding)`` -> one result per text (runs in the worker).
        max_batch_tokens: the token budget of one batch: source tokens (with ``<eos>``) times the
            ``beam_size``, summed over its jobs; a job larger than the budget is decoded alone.
        max_wait_ms: how long after the first job of a batch arrived the worker waits for more
            (0: take what is queued, never wait).
        batching: False: one job per decode (no merging).
        max_queue: the most sentences waiting; :meth:`submit` raises :class:`QueueFull` beyond.
        on_batch: called after each decode with ``(sentences, tokens, seconds)`` (metrics).
        pending: how many requests are being read that will be submitted (None: unknown, 0).

    Raises:
        SettingError: (a ``ValueError``) a setting out of range, named by its argument.
        TypeError: a setting of the wrong type.
    """

    def __init__(
        self,
        decode: Decode,
        *,
        max_batch_tokens: int = 4096,
        max_wait_ms: float = 5.0,
        batching: bool = True,
        max_queue: int = 4096,
        on_batch: Callable[[int, int, float], None] | None = None,
        pending: Callable[[], int] | None = None,
    ) -> None:
        if isinstance(max_batch_tokens, bool) or not isinstance(max_batch_tokens, int):
            raise TypeError(f"max_batch_tokens: expected an int, got {max_batch_tokens!r}")
        if max_batch_tokens < 1:
            raise SettingError("max_batch_tokens", f"expected an int >= 1, got {max_batch_tokens}")
        if isinstance(max_wait_ms, bool) or not isinstance(max_wait_ms, (int, float)):
            raise TypeError(f"max_wait_ms: expected a number, got {max_wait_ms!r}")
        if not 0 <= max_wait_ms <= 10_000:
            raise SettingError("max_wait_ms", f"expected a number in [0, 10000], got {max_wait_ms}")
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise SettingError("max_queue", f"expected an int >= 1, got {max_queue!r}")
        self.decode = decode
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait_ms / 1000.0
        self.batching = bool(batching)
        self.max_queue = max_queue
        self.on_batch = on_batch
        self.pending = pending
        self._arrived_busy = 0  # jobs queued while the last batch was decoding
        self._queue: collections.deque[Job] = collections.deque()
        self._queued_sentences = 0
        self._busy = 0  # sentences being decoded now
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the event loop's side
    def start(self) -> None:
        """Start the worker thread (once)."""
        with self._cond:
            if self._thread is not None:
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="qkv-serve-batcher", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Finish every queued job, then end the worker thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def queue_depth(self) -> int:
        """Sentences waiting to be decoded (not those decoding now)."""
        return self._queued_sentences

    @property
    def in_progress(self) -> int:
        """Sentences being decoded now."""
        return self._busy

    def submit(self, texts: Sequence[str], decoding: Decoding, *, tokens: int) -> Job:
        """Queue ``texts`` for decoding with ``decoding``; ``job.future`` gets one result per
        text.

        Raises:
            QueueFull: the queue holds ``max_queue`` sentences already.
            RuntimeError: the batcher is stopped.
        """
        job = Job(list(texts), decoding, tokens=tokens)
        self._put(job, len(job.texts))
        return job

    def call(self, fn: Callable[[], Any]) -> Job:
        """Run ``fn()`` in the worker thread between batches (work that must not run beside a
        decode, e.g. a sentence's attention); ``job.future`` gets its return value."""
        job = Job([], call=fn)
        self._put(job, 1)
        return job

    def _put(self, job: Job, n: int) -> None:
        with self._cond:
            if self._stopping or self._thread is None:
                raise RuntimeError("the batcher is not running")
            if self._queued_sentences + n > self.max_queue and self._queue:
                raise QueueFull(
                    f"{self._queued_sentences} sentences are waiting (the queue holds "
                    f"{self.max_queue}); try again shortly"
                )
            self._queue.append(job)
            if self._busy:
                self._arrived_busy += 1
            self._queued_sentences += max(len(job.texts), 1 if job.call else 0)
            self._cond.notify_all()

    # ------------------------------------------------------------------ the worker's side
    def _size(self, job: Job) -> int:
        return max(len(job.texts), 1 if job.call else 0)

    def _take(self) -> list[Job] | None:
        """The next batch, or None when stopping with nothing queued. Jobs whose request
        gave up waiting (a cancelled future: the shutdown timeout ran out) are dropped."""
        with self._cond:
            while True:
                batch = self._gather()
                if batch is None:
                    return None
                n = sum(self._size(j) for j in batch)
                self._queued_sentences -= n
                batch = [j for j in batch if not j.future.cancelled()]
                if batch:
                    self._busy = sum(self._size(j) for j in batch)
                    return batch

    def _drop_cancelled(self) -> None:
        for job in [j for j in self._queue if j.future.cancelled()]:
            self._queue.remove(job)
            self._queued_sentences -= self._size(job)

    def _gather(self) -> list[Job] | None:
        """(Under the lock.) The oldest job and those that may join it; None: stopping."""
        self._drop_cancelled()
        while not self._queue:
            if self._stopping:
                return None
            self._cond.wait()
            self._drop_cancelled()
        first = self._queue.popleft()
        batch, used = [first], first.tokens
        company = self._arrived_busy > 0  # busy times bring company; a lone client does not
        self._arrived_busy = 0
        if first.key is not None and self.batching:
            deadline = first.enqueued + self.max_wait
            while True:
                full = False
                for job in list(self._queue):
                    if job.key != first.key:
                        continue
                    if used + job.tokens > self.max_batch_tokens:
                        full = True
                        break
                    self._queue.remove(job)
                    batch.append(job)
                    used += job.tokens
                left = deadline - time.monotonic()
                if full or left <= 0 or self._stopping:
                    break
                coming = self.pending() if self.pending is not None else 0
                if not company and coming <= 0:
                    break  # nobody else is on the way: decode now
                # a request being read is submitted within a moment: look again soon
                self._cond.wait(min(left, 0.001) if coming > 0 else left)
        return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            try:
                outcomes = self._process(batch)
            except BaseException as e:  # never leave a request waiting for ever
                log.exception("qkv serve: the batch worker failed")
                outcomes = [(job, False, e) for job in batch]
            # idle before any answer goes out: a request sent on the heels of an answer is not
            # taken for one that arrived during the decode
            with self._cond:
                self._busy = 0
            for job, ok, value in outcomes:
                if job.future.done():
                    continue
                if ok:
                    job.future.set_result(value)
                else:
                    job.future.set_exception(value)

    def _process(self, batch: list[Job]) -> list[tuple[Job, bool, Any]]:
        """Each job's ``(job, True, result)`` or ``(job, False, exception)``."""
        first = batch[0]
        if first.call is not None:
            try:
                return [(first, True, first.call())]
            except Exception as e:
                return [(first, False, e)]
        texts = [t for job in batch for t in job.texts]
        t0 = time.perf_counter()
        try:
            assert first.decoding is not None  # a decode job, not a call
            results = self.decode(texts, first.decoding)
        except Exception as e:
            if len(batch) == 1:
                return [(first, False, e)]
            # one job's sentence may be what failed: decode each alone, so only it fails
            return [out for job in batch for out in self._process([job])]
        if self.on_batch is not None:
            self.on_batch(len(texts), sum(j.tokens for j in batch), time.perf_counter() - t0)
        outcomes, start = [], 0
        for job in batch:
            outcomes.append((job, True, results[start : start + len(job.texts)]))
            start += len(job.texts)
        return outcomes
