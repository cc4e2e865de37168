"""What a run shows while it trains: the progress line, and its messages on the same stream.

:class:`Progress` draws one line (rank 0 only): rewritten in place on a terminal, else printed
every ``log_every`` updates. Messages go through :mod:`logging` (the run's logger is
``qkv.train.loop``); :func:`messages_on` shows them on the progress stream when nothing else
would, and :func:`sayer` makes the run's ``say``, which wipes the line first so that a message
never lands in the middle of it.

In a Jupyter notebook (a kernel, and no ``stream`` given) nothing is written to stderr, which a
notebook shows as one red box per write: the progress is one output updated in place (a bar and
the line), and the messages, the lines a terminal would print every ``log_every`` updates among
them, are one collapsible output, also updated in place (:class:`NotebookDisplay`). A terminal
and a file see exactly what they saw before.
"""

from __future__ import annotations

import contextlib
import html
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["NotebookDisplay", "Progress", "Say", "in_notebook", "messages_on", "sayer"]

#: how a run says something: ``say(text)`` (INFO), ``say(text, logging.WARNING)``
Say = Callable[..., None]


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel, whose outputs a notebook shows (IPython's
    shell with a kernel; a terminal IPython has none)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # an IPython too broken to ask: behave as a plain process
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


class NotebookDisplay:
    """A run's two outputs in a notebook, each created on first use and then updated in place
    (IPython display handles): the progress (an HTML bar and the line; the line as plain text
    for a viewer without HTML) and the messages (a ``<details>`` block: its summary the last
    message, the whole list inside)."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._notes: Any = None
        self.messages: list[str] = []

    @staticmethod
    def _show(handle: Any, bundle: dict[str, str]) -> Any:
        from IPython.display import display

        if handle is None:
            return display(bundle, raw=True, display_id=True)
        handle.update(bundle, raw=True)
        return handle

    def progress(self, line: str, step: int, total: int) -> None:
        """Show ``line`` (and a bar at ``step`` of ``total``) in the progress output."""
        bar = (
            f'<progress value="{min(step, total)}" max="{max(total, 1)}" '
            f'style="width:16em;vertical-align:middle"></progress> '
        )
        markup = f'<div class="qkv-progress">{bar}<code>{html.escape(line)}</code></div>'
        self._bar = self._show(self._bar, {"text/plain": line, "text/html": markup})

    def message(self, text: str) -> None:
        """Add ``text`` to the messages output (below the progress output, shown first)."""
        if self._bar is None:
            self.progress("starting", 0, 1)
        self.messages.append(text)
        n = len(self.messages)
        summary = f"{n} message{'s' if n != 1 else ''} of the run; the last: {text}"
        markup = (
            f'<details class="qkv-messages"><summary>{html.escape(summary)}</summary>'
            f'<pre style="margin:4px 0 0">{html.escape(chr(10).join(self.messages))}</pre>'
            "</details>"
        )
        self._notes = self._show(
            self._notes, {"text/plain": "\n".join(self.messages), "text/html": markup}
        )


class Progress:
    """The progress display: a line rewritten in place on a terminal, else a line every
    ``log_every`` updates; on stderr (rank 0 only). Messages are not its business: they go
    through :mod:`logging`, and :meth:`clear` wipes the line on a terminal first so that a
    message never lands in the middle of it. In a notebook (no ``stream`` given) it is a
    :class:`NotebookDisplay` instead, and the lines printed every ``log_every`` updates join
    the messages."""

    def __init__(self, total: int, enabled: bool, stream: Any = None) -> None:
        self.total, self.enabled = total, enabled
        self.notebook = NotebookDisplay() if stream is None and enabled and in_notebook() else None
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_draw = 0.0
        self._open = False

    def _fmt(
        self, step: int, loss: float, lr: float, tps: float, elapsed: float, eta: float
    ) -> str:
        """The line; a plan that ``step`` overran (re-planned soon) shows as done, never as
        ``138/137`` with a negative eta."""
        width, total = 20, max(self.total, step, 1)
        done = int(width * step / total)
        bar = "#" * done + "-" * (width - done)
        return (
            f"[{bar}] {step}/{total} loss {loss:.3f} lr {lr:.2e} "
            f"{tps / 1000:.1f}k tok/s {_clock(elapsed)} eta {_clock(max(eta, 0.0))}"
        )

    def update(
        self, step: int, loss: float, lr: float, tps: float, elapsed: float, eta: float, log: bool
    ) -> None:
        if not self.enabled:
            return
        line = self._fmt(step, loss, lr, tps, elapsed, eta)
        now = time.monotonic()
        if self.notebook is not None:
            if log or now - self._last_draw >= 0.25:
                self.notebook.progress(line, step, max(self.total, step))
                self._last_draw = now
            if log:
                self.notebook.message(line)
            return
        if self.tty and not log:
            if now - self._last_draw >= 0.25:
                self.stream.write("\r" + line + "\x1b[K")
                self.stream.flush()
                self._last_draw, self._open = now, True
            return
        if log:
            self.clear()
            self.stream.write(line + "\n")
            self.stream.flush()

    def clear(self) -> None:
        """Wipe the line drawn in place (a terminal), so that what comes next starts clean."""
        if self._open:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._open = False


class _MessageHandler(logging.StreamHandler):
    """Shows qkv's log records on the progress stream, the progress line wiped first."""

    def __init__(self, bar: Progress) -> None:
        super().__init__(bar.stream)
        self.bar = bar
        self.setFormatter(logging.Formatter("qkv: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if self.bar.notebook is not None:  # the notebook's messages output, not stderr
            try:
                self.bar.notebook.message(self.format(record))
            except Exception:
                self.handleError(record)
            return
        self.bar.clear()
        super().emit(record)


@contextlib.contextmanager
def messages_on(bar: Progress, *, stream_given: bool) -> Iterator[None]:
    """While a run shows progress, show its messages (INFO and up) on the progress stream too:
    when a ``stream`` was given, or when logging is not configured at all (no handler on the
    ``qkv`` logger or above it). A configured application gets them through its own handlers;
    a ``qkv`` logger set to a level is obeyed."""
    top = logging.getLogger("qkv")
    if not bar.enabled or (not stream_given and top.hasHandlers()):
        yield
        return
    handler, level = _MessageHandler(bar), top.level
    top.addHandler(handler)
    if level == logging.NOTSET:
        top.setLevel(logging.INFO)
    try:
        yield
    finally:
        top.removeHandler(handler)
        top.setLevel(level)


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(seconds)
    return (
        f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


def sayer(bar: Progress, logger: logging.Logger, *, is_main: bool) -> Say:
    """The run's ``say(text, level=logging.INFO)``: ``text`` logged on ``logger`` by rank 0
    only (``is_main``), the progress line wiped first."""

    def say(text: str, level: int = logging.INFO) -> None:
        if is_main:
            bar.clear()
            logger.log(level, text)

    return say
