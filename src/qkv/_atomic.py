"""Atomic writing: a file or a folder is there whole, or as it was before, never in part.

Every file and folder qkv writes for keeps goes through here: checkpoints and the run's
``best.json`` (:mod:`qkv.train.checkpoint`), model folders and exports
(:mod:`qkv.inference.writing`, whose folder writer every export uses), prepared corpora
(:mod:`qkv.data.prepared`) and the work folder a prepare resumes from
(:mod:`qkv.train.corpus`). The recipe, in one place:

* a file is written under a temporary name in its own folder, flushed and fsynced, renamed
  over the final name (:func:`atomic_file`), and the folder is fsynced so the rename
  survives a crash (:func:`replace`);
* a folder is filled under a temporary name beside the final one, then renamed into place; a
  folder it replaces is set aside first and removed only once the new one is in place, or
  put back if the rename fails (:func:`install_folder`);
* a full disk is a :class:`NoSpaceError` in one line: the folder, about how much the write
  needs (:func:`no_space_error`'s ``needed``: what the caller expects, else what was written
  before the disk filled, :func:`tree_bytes`) and how much is free, the temporary file removed.

This module imports nothing of qkv (floor 0).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "NoSpaceError",
    "atomic_file",
    "fsync_dir",
    "install_folder",
    "is_no_space",
    "no_space_error",
    "payload_bytes",
    "replace",
    "tree_bytes",
    "write_bytes",
    "write_json",
]


class NoSpaceError(OSError):
    """A folder could not be written: the disk (or the user's quota) is full.  Nothing of it
    is left behind, and what was written before is intact.  ``str(err)`` is the message."""

    def __str__(self) -> str:
        return str(self.strerror)


#: errno values that mean "the device is full"
_NO_SPACE = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})


def is_no_space(err: BaseException) -> bool:
    """Whether ``err`` says the disk is full: an OSError with ENOSPC/EDQUOT, a library's error
    that only carries the text (as safetensors' does), or an error raised while handling one
    (torch's zip writer, closed after a failed write, raises its own ``RuntimeError`` whose
    context is the ``OSError``)."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _NO_SPACE:
            return True
        text = str(e)
        if any(s in text for s in ("No space left on device", "StorageFull", "Disk quota")):
            return True
        e = e.__cause__ or e.__context__
    return False


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def payload_bytes(obj: Any) -> int:
    """The bytes of the arrays in ``obj`` (tensors, numpy arrays: what has ``nbytes``), through
    dicts, lists and tuples: about what writing them takes."""
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(v) for v in obj)
    n = getattr(obj, "nbytes", 0)
    return n if isinstance(n, int) else 0


def tree_bytes(path: Path) -> int:
    """The bytes of the files under ``path`` (a file's own size; 0 when it is gone)."""
    try:
        if path.is_file():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except OSError:
        return 0


def no_space_error(
    err: BaseException,
    folder: Path,
    what: str,
    remedy: str = "",
    needed: int | None = None,
    kept: str = "nothing of it was kept, and what was written there before is intact",
) -> NoSpaceError:
    """The :class:`NoSpaceError` for ``err``, one line: "no space left" with the folder and what
    was being written, the space it needs (``needed`` bytes, when known), the free space, what
    was ``kept``, and ``remedy``."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    room = [f"it needs about {_size(needed)}"] if needed else []
    if free is not None:
        room.append(f"{_size(free)} free there now")
    return NoSpaceError(
        errno.ENOSPC,
        f"no space left on the device of {str(folder)!r} while writing {what}"
        + (f" ({', '.join(room)})" if room else "")
        + f": {kept}; free some "
        + ("space, " + remedy if remedy else "space, then try again"),
    )


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def replace(src: str | Path, dst: str | Path) -> None:
    """Rename ``src`` (a file or folder, written and synced) to ``dst`` in one step, replacing
    a file ``dst``, and fsync ``dst``'s folder so the rename survives a crash."""
    dst = Path(dst)
    os.replace(src, dst)
    fsync_dir(dst.parent)


@contextlib.contextmanager
def atomic_file(
    path: str | Path,
    mode: str = "wb",
    *,
    encoding: str | None = None,
    newline: str | None = None,
    temp: str | None = None,
) -> Iterator[IO[Any]]:
    """Write the file ``path`` atomically: ``with atomic_file(p) as f: f.write(...)`` writes a
    temporary file in the same folder (named ``temp``, else ``.NAME.PID-RANDOM.tmp``), created
    with the mode the user's umask gives, flushed and fsynced, then renamed over ``path``.
    Readers see the old content or the new, never a part; on an error (or an exception in the
    block) the temporary file is removed and ``path`` is left as it was; a full disk is a
    :class:`NoSpaceError`. ``mode``: ``"wb"`` or ``"w"`` (with ``encoding`` and ``newline``)."""
    p = Path(path)
    tmp = p.with_name(temp or f".{p.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        tmp.unlink(missing_ok=True)  # a stale one of this name: never written through
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        with os.fdopen(fd, mode, encoding=encoding, newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and is_no_space(e):
            raise no_space_error(e, p.parent, p.name) from None
        raise
    fsync_dir(p.parent)


def write_bytes(path: str | Path, data: bytes, *, temp: str | None = None) -> None:
    """:func:`atomic_file` of ``data`` (``temp``: the temporary file's name)."""
    with atomic_file(path, temp=temp) as f:
        f.write(data)


def write_json(path: str | Path, obj: Any, *, temp: str | None = None) -> None:
    """:func:`write_bytes` of ``obj`` as indented UTF-8 JSON (non-ASCII kept as it is)."""
    write_bytes(path, (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode(), temp=temp)


def install_folder(tmp: Path, final: Path, aside: Path) -> None:
    """Rename the finished folder ``tmp`` (its files synced) to ``final``, which it replaces:
    an existing ``final`` is renamed to ``aside`` first, put back if ``tmp`` cannot take its
    place, and removed once it has; the parent folder is fsynced. On an error ``final`` is
    as it was."""
    try:
        if final.exists():  # replaced: set aside until the new one is in place
            os.replace(final, aside)
        os.replace(tmp, final)
    except BaseException:
        if aside.exists() and not final.exists():  # the old folder goes back where it was
            os.replace(aside, final)
        raise
    shutil.rmtree(aside, ignore_errors=True)
    fsync_dir(final.parent)
