"""One trainer per run folder: ``--out`` checked, then an advisory lock on ``OUT/.lock``.

Before a run reads any data, :func:`check_out` makes sure ``OUT`` is (or can become) a folder it
can write, and :class:`RunLock` takes ``OUT/.lock``: ``fcntl.flock`` where the platform has it (the
kernel releases the lock when its process dies, however it dies), else a file created
exclusively. The file records who holds it (pid, host, start time, command); a second trainer on
the same folder fails at once with :class:`RunLockedError` naming them. A lock file left by a
process that is gone (killed with SIGKILL, a machine that crashed) is taken over with a warning.
The lock is released, and its file removed, when the run ends, normally, by an error or by a
signal. Under torchrun only rank 0 takes it: one lock per run, not per process.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shlex
import socket
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType

from .._errors import SettingError, keyed
from .._folder import MANIFEST, MODEL_MARKS, TRAINER_TENSORS
from ..data.prepared import CORPUS_FILES, REPORT, WORK_DIR, read_manifest
from ..inference.layout import CHECKPOINTS_DIR, LOCK_NAME, RunLayout
from ..inference.writing import TMP_PREFIX

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_NAME", "LockHolder", "RunLock", "RunLockedError", "check_corpus_out", "check_out"]

log = logging.getLogger(__name__)

#: what ``flock`` fails with where the file system has no locks (then: exclusive creation)
_NO_LOCKS = frozenset(
    getattr(errno, name) for name in ("ENOLCK", "EOPNOTSUPP", "ENOSYS") if hasattr(errno, name)
)


class RunLockedError(RuntimeError):
    """Another process is training into the same run folder.

    Attributes:
        path: the lock file.
        holder: what the lock file says about the process that holds it (None when unreadable).
    """

    path: Path | None = None
    holder: LockHolder | None = None


@dataclass(frozen=True)
class LockHolder:
    """The process a lock file names: ``pid`` on ``host``, since ``started`` (ISO 8601), running
    ``command``."""

    pid: int
    host: str
    started: str
    command: str

    @classmethod
    def me(cls) -> LockHolder:
        """This process."""
        return cls(
            pid=os.getpid(),
            host=socket.gethostname(),
            started=datetime.now().astimezone().isoformat(timespec="seconds"),
            command=" ".join(shlex.quote(a) for a in sys.argv),
        )

    @classmethod
    def parse(cls, text: str) -> LockHolder | None:
        """The holder a lock file's text names, or None (empty, or not written by qkv)."""
        try:
            d = json.loads(text)
            return cls(int(d["pid"]), str(d["host"]), str(d["started"]), str(d["command"]))
        except (ValueError, KeyError, TypeError):
            return None

    def to_json(self) -> str:
        return json.dumps(self.__dict__, ensure_ascii=False) + "\n"

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} since {self.started}"

    def alive(self) -> bool | None:
        """Is the process still running? None when that cannot be told (another host, or a
        platform without ``os.kill(pid, 0)``)."""
        if self.host != socket.gethostname() or os.name != "posix":
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # a process of another user has that pid
            return True
        return True


def check_out(out: str | Path) -> bool:
    """Make sure ``out`` is a folder this process can write, creating it (and its parents) if
    needed. Returns whether it was created.

    Raises:
        ValueError: ``out`` is a file, lies under a file, or cannot be created or written (the
            message names ``out``).
    """
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise SettingError("out", f"{str(p)!r} is a file; expected a folder for the run")
    parent = p
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise SettingError(
            "out", f"{str(p)!r} lies under {str(parent)!r}, which is a file; expected a folder"
        )
    created = not p.exists()
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SettingError("out", f"cannot create {str(p)!r}: {e.strerror or e}") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise SettingError("out", f"{str(p)!r} is not writable by this user")
    return created


def check_corpus_out(out: str | Path) -> bool:
    """:func:`check_out` for ``qkv prepare``, which writes only into a folder that is new,
    empty (a lock file aside), a prepared corpus, or what a killed prepare left (a prepare's
    files and no others). Returns whether ``out`` was created.

    Raises:
        SettingError: (``out``) what :func:`check_out` refuses, and a folder of anything else:
            a model of any engine, a checkpoint, a run, files a prepare did not write (what it
            is named; nothing in it touched).
    """
    p = Path(out)
    why = _foreign(p) if p.is_dir() else None
    if why is not None:
        raise SettingError(
            "out",
            f"{str(p)!r} is not a prepared corpus: {why}; qkv prepare writes only into a new "
            "or empty folder or a corpus it prepared, so nothing there was touched: choose "
            "another --out",
        )
    return check_out(p)


def _foreign(folder: Path) -> str | None:
    """Why ``folder`` (which exists) is not one ``qkv prepare`` may write into, or None."""
    names = {p.name for p in folder.iterdir()} - {LOCK_NAME}
    if not names:
        return None
    marks = sorted(names & {*MODEL_MARKS, TRAINER_TENSORS} - {MANIFEST})
    if marks:
        return f"it is a model folder (it holds {marks[0]})"
    if CHECKPOINTS_DIR in names:
        return f"it is a training run (it holds {CHECKPOINTS_DIR}/)"
    if (folder / MANIFEST).is_file():
        try:
            read_manifest(folder)
        except ValueError:
            if not names & {WORK_DIR, *CORPUS_FILES}:
                return f"its {MANIFEST} is another kind's (a model's, or another tool's)"
        else:
            return None
    own = {*CORPUS_FILES, MANIFEST, REPORT, WORK_DIR}
    # and the temporary file of a manifest or report a killed prepare was writing
    foreign = sorted(n for n in names if n not in own and _temp_of(n) not in (MANIFEST, REPORT))
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        return f"it holds files qkv prepare does not write ({foreign[0]!r}{more})"
    writing = any(_temp_of(n) in (MANIFEST, REPORT) for n in names)
    if WORK_DIR not in names and not writing and not (folder / MANIFEST).is_file():
        # names a corpus has, without its manifest or a trace of a killed prepare: the user's
        kept = sorted(names & set(CORPUS_FILES))
        if kept:
            return f"it holds {kept[0]!r} but no {MANIFEST}: not a corpus qkv prepare wrote"
    return None


def _temp_of(name: str) -> str | None:
    """The file whose atomic write's temporary file ``name`` is (``.NAME.qkv-tmp-PID``), or
    None."""
    head, sep, pid = name.partition(TMP_PREFIX)
    return head[1:] if sep and head.startswith(".") and pid.isdigit() else None


class RunLock:
    """The advisory lock of run folder ``out`` (``out/.lock``); a context manager.

    ``acquire`` takes it or raises :class:`RunLockedError`; ``release`` (also on leaving the
    ``with`` block, whatever the exit) drops it and removes the file, and removes ``out`` too
    when ``created_out`` says this run created it and it is still empty. ``role`` is what the
    message of a refusal calls the holder (``qkv prepare`` takes the same lock: ``"qkv
    process"``).
    """

    def __init__(
        self, out: str | Path, *, created_out: bool = False, role: str = "trainer"
    ) -> None:
        self.out = Path(out)
        self.role = role
        self.path = RunLayout(self.out).lock
        self.created_out = created_out
        self._fd: int | None = None
        self._held_excl = False

    @property
    def held(self) -> bool:
        return self._fd is not None or self._held_excl

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    # -- taking it ---------------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the lock, or raise :class:`RunLockedError` naming its holder.

        Raises:
            RunLockedError: another live process holds it.
            ValueError: the lock file cannot be created (names ``out``).
        """
        if self.held:
            return
        me = LockHolder.me()
        try:
            previous = self._acquire_flock() if fcntl is not None else self._acquire_excl()
        except OSError as e:
            raise SettingError(
                "out", f"cannot write {str(self.path)!r}: {e.strerror or e}"
            ) from None
        if previous is not None and previous.pid != me.pid:
            alive = previous.alive()
            why = {
                False: "that process is gone",
                True: "no process holds it (that pid is now another process)",
                None: "no process holds it",
            }[alive]
            log.warning(f"took over the lock {self.path} left by {previous.describe()}: {why}")
        self._write(me)

    def _acquire_flock(self) -> LockHolder | None:
        """``flock`` the file at ``self.path`` (retrying when a releasing holder removed it in
        between); returns the holder its old content names."""
        for _ in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                text = _read_fd(fd)
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise self._locked(LockHolder.parse(text)) from None
                if e.errno in _NO_LOCKS:  # a file system without flock: create it exclusively
                    if not text.strip():  # the empty file just created here
                        self.path.unlink(missing_ok=True)
                    return self._acquire_excl()
                raise
            # the holder we waited for unlinks the file before it unlocks: lock the file that
            # is at the path now, not an orphan
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return LockHolder.parse(_read_fd(fd))
            os.close(fd)
        raise self._locked(None)  # pragma: no cover - another process keeps recreating it

    def _acquire_excl(self) -> LockHolder | None:
        """Without ``flock`` (Windows, or a file system without locks): create the file
        exclusively; a file naming a process of this host that is gone is replaced."""
        previous = None
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = LockHolder.parse(self.path.read_text(encoding="utf-8", errors="replace"))
                if holder is None or holder.alive() is not False:
                    raise self._locked(holder, stale_hint=True) from None
                previous = holder
                self.path.unlink(missing_ok=True)
                continue
            os.close(fd)
            self._held_excl = True
            return previous
        raise self._locked(None, stale_hint=True)

    def _locked(self, holder: LockHolder | None, *, stale_hint: bool = False) -> RunLockedError:
        who = (
            f"{holder.describe()} ({holder.command})"
            if holder is not None
            else "another process (it has not written its details yet)"
        )
        hint = (
            f"; if no {self.role} runs there any more, delete {self.path}"
            if stale_hint
            else "; wait for it to end or stop it, or choose another --out"
        )
        err = keyed(
            RunLockedError,
            "out",
            f"{str(self.out)!r} is in use by another {self.role}: {who}; lock file {self.path}{hint}",
        )
        err.path, err.holder = self.path, holder
        return err

    def _write(self, me: LockHolder) -> None:
        data = me.to_json().encode("utf-8")
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, data, 0)
            os.fsync(self._fd)
        else:
            self.path.write_bytes(data)

    # -- giving it back ----------------------------------------------------------------------
    def release(self) -> None:
        """Remove the lock file and drop the lock (no-op when not held)."""
        if not self.held:
            return
        try:
            if self._fd is not None:
                try:
                    if os.path.samestat(os.fstat(self._fd), os.stat(self.path)):
                        self.path.unlink()
                except FileNotFoundError:
                    pass
            else:
                self.path.unlink(missing_ok=True)
        finally:
            if self._fd is not None:
                os.close(self._fd)  # drops the flock
            self._fd, self._held_excl = None, False
        if self.created_out:
            with contextlib.suppress(OSError):  # only when still empty: nothing was written
                self.out.rmdir()


def _read_fd(fd: int) -> str:
    try:
        return os.pread(fd, 1 << 16, 0).decode("utf-8", errors="replace")
    except OSError:  # pragma: no cover
        return ""
