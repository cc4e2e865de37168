"""SIGINT and SIGTERM while training: finish the update, save, say how to resume.

A scheduler's pre-emption (SIGTERM), a closed terminal or a Ctrl-C (SIGINT) must not lose the
updates since the last checkpoint. While :func:`qkv.train.train` runs (in the main thread),
:class:`StopSignals` replaces the handlers of both signals: the first one only asks the loop to
stop; the loop finishes the current update (its scheduled evaluation included), writes a
checkpoint, and raises :class:`TrainingInterrupted`. A second signal, or one that arrives before
the first update or after the last, stops at once. The previous handlers are put back when
``train`` returns, however it returns.
"""

from __future__ import annotations

import logging
import shlex
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["StopSignals", "TrainingInterrupted", "resume_command"]

log = logging.getLogger(__name__)


class TrainingInterrupted(KeyboardInterrupt):
    """Training was stopped by a signal (SIGINT or SIGTERM).

    A subclass of :class:`KeyboardInterrupt`, so ``except Exception`` does not swallow it and
    code that handles Ctrl-C already handles it.

    Attributes:
        signum: the signal's number; ``signal_name`` its name (``"SIGTERM"``).
        step: the update the run had reached.
        checkpoint: the newest checkpoint folder, the one ``--resume`` continues from (None
            when the run has none).
        exit_status: ``128 + signum``, what a shell reports for a process the signal ended
            (130 for SIGINT, 143 for SIGTERM); ``qkv train`` exits with it.
    """

    def __init__(
        self, message: str, *, signum: int, step: int, checkpoint: Path | None = None
    ) -> None:
        super().__init__(message)
        self.signum, self.step, self.checkpoint = signum, step, checkpoint

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def resume_command(out: str | Path) -> str:
    """The command that continues the run in ``out``."""
    return f"qkv train --out {shlex.quote(str(out))} --resume"


class StopSignals:
    """Handlers of SIGINT and SIGTERM for the time of a run (a context manager).

    ``graceful`` is True while the loop can stop cleanly between updates: a first signal then
    sets :attr:`received` (the loop looks at it after every update) and logs a warning. Any
    other signal, a second one or one while ``graceful`` is False, calls ``stop_now(signum)``,
    which raises (:class:`TrainingInterrupted`). Installed only in the main thread (Python
    delivers signals there only), and not for a signal that is ignored (``SIG_IGN``: a shell's
    background job ignores SIGINT, ``nohup`` SIGHUP); elsewhere it does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, stop_now: Callable[[int], Any]) -> None:
        self.stop_now = stop_now
        self.received: int | None = None
        self.graceful = False
        self.describe_step: Callable[[], str] = lambda: "the current update"
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                previous = signal.getsignal(s)
                if previous == signal.SIG_IGN:  # e.g. SIGINT of a shell's background job
                    continue
                self._previous[s] = previous
                signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Put the previous handlers back."""
        for s, previous in self._previous.items():
            signal.signal(s, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.graceful and self.received is None:
            self.received = signum
            again = "Ctrl-C" if signum == signal.SIGINT else "the signal"
            log.warning(
                f"{signal.Signals(signum).name} received: finishing {self.describe_step()}, "
                f"then a checkpoint ({again} again stops at once)"
            )
            return
        self.restore()
        self.stop_now(signum)
