"""The translated files of ``POST /translate_file``, kept until ``GET /download_file/NAME``.

LibreTranslate's shape: a file ``notes.txt`` translated into French is answered with
``translatedFileUrl`` ``.../download_file/<random>.notes_fr.txt`` and downloaded as
``notes_fr.txt``. Here:

* a translated file is written under a random name (32 hex digits, then the file's name made
  safe for a URL) in a private temporary folder (mode 0700, the files 0600), and found again
  only by that exact name, looked up in the store's table: no name a client sends is ever
  joined to a path, so ``..``, slashes or encoded ones reach nothing;
* it is removed once downloaded, when its time is up (:attr:`FileStore.ttl`, LibreTranslate's
  30 minutes by default; :meth:`FileStore.sweep` runs every few seconds), when the client that
  asked for it left before it was written, and with the whole folder when the server stops;
* at most :attr:`FileStore.max_files` wait at once (the oldest are removed first when more
  come), so files nobody downloads cannot fill the disk.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePath

__all__ = ["MAX_FILES", "FileStore", "Stored", "content_type", "disposition", "translated_name"]

#: the most translated files waiting to be downloaded at once
MAX_FILES = 1000

#: a stored file's name: the random part, a dot, the download name made URL-safe
_STORED = re.compile(r"[0-9a-f]{32}\.[A-Za-z0-9._-]{1,200}", re.ASCII)

#: the media type of a download by its extension (anything else: application/octet-stream)
_TYPES = {
    ".txt": "text/plain; charset=utf-8",
    ".text": "text/plain; charset=utf-8",
    ".md": "text/markdown; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".srt": "application/x-subrip; charset=utf-8",
    ".vtt": "text/vtt; charset=utf-8",
    ".po": "text/x-gettext-translation; charset=utf-8",
    ".pot": "text/x-gettext-translation; charset=utf-8",
    ".xliff": "application/xliff+xml",
    ".xlf": "application/xliff+xml",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".odt": "application/vnd.oasis.opendocument.text",
}


def content_type(name: str) -> str:
    """The media type a download of ``name`` is sent with."""
    return _TYPES.get(PurePath(name).suffix.lower(), "application/octet-stream")


def _clean_name(name: str) -> str:
    """A client's file name without folders, control characters or characters a file name
    cannot hold (the last path part, of a Windows path too); ``"file"`` when nothing is left."""
    base = re.split(r"[\\/]", name)[-1]
    base = "".join(c for c in base if c.isprintable() and c not in '<>:"|?*')
    base = base.strip().strip(".")
    return base[:200] or "file"


def translated_name(name: str, target: str) -> str:
    """LibreTranslate's name for ``name`` translated into ``target``: ``notes.txt`` ->
    ``notes_fr.txt`` (``report.tar.txt`` -> ``report.tar_fr.txt``)."""
    clean = _clean_name(name)
    p = PurePath(clean)
    stem, ext = (p.stem, p.suffix) if p.stem else (clean, "")
    return f"{stem}_{target}{ext}"


def _url_safe(name: str) -> str:
    """``name`` in ASCII letters, digits, ``.``, ``_`` and ``-`` only (others become ``_``),
    the extension kept."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return safe[-200:] if len(safe) > 200 else safe


def disposition(name: str) -> str:
    """A ``Content-Disposition`` that downloads the file as ``name`` (RFC 6266: an ASCII
    ``filename`` and, when the name is not ASCII, ``filename*`` in UTF-8)."""
    ascii_name = _url_safe(name)
    out = f'attachment; filename="{ascii_name}"'
    if ascii_name != name:
        out += f"; filename*=UTF-8''{urllib.parse.quote(name, safe='')}"
    return out


@dataclass(frozen=True)
class Stored:
    """A translated file waiting: its path, the name it downloads as, when it was written."""

    path: Path
    download_name: str
    written: float
    size: int


class FileStore:
    """The translated files waiting to be downloaded (see the module).

    Args:
        ttl: seconds a file waits before it is removed.
        max_files: the most files waiting at once; the oldest go first.
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(
        self,
        ttl: float,
        max_files: int = MAX_FILES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = float(ttl)
        self.max_files = max_files
        self.clock = clock
        self._files: dict[str, Stored] = {}
        self._folder: Path | None = None
        self._lock = threading.Lock()

    @property
    def folder(self) -> Path:
        """The private folder the files are written in (made when first needed)."""
        with self._lock:
            if self._folder is None:
                self._folder = Path(tempfile.mkdtemp(prefix="qkv-serve-files-"))
            return self._folder

    def __len__(self) -> int:
        return len(self._files)

    @property
    def bytes(self) -> int:
        """The bytes of the files waiting."""
        return sum(f.size for f in list(self._files.values()))

    def put(self, data: bytes, download_name: str) -> str:
        """Write ``data`` as a file that downloads as ``download_name``; its stored name
        (what ``/download_file/NAME`` takes)."""
        folder = self.folder
        name = f"{secrets.token_hex(16)}.{_url_safe(_clean_name(download_name))}"
        path = folder / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        stored = Stored(path, _clean_name(download_name), self.clock(), len(data))
        with self._lock:
            self._files[name] = stored
            oldest = sorted(self._files, key=lambda n: self._files[n].written)
            extra = oldest[: max(0, len(oldest) - self.max_files)]
        for old in extra:
            self.remove(old)
        return name

    @staticmethod
    def well_formed(name: str) -> bool:
        """Whether ``name`` has the form of a stored name (32 hex digits, a dot, a safe name)."""
        return bool(_STORED.fullmatch(name)) and ".." not in name

    def take(self, name: str) -> tuple[bytes, str] | None:
        """The bytes and download name of the file stored as ``name``, which is removed;
        None when there is none (never stored, downloaded already, or its time was up)."""
        with self._lock:
            stored = self._files.pop(name, None)
        if stored is None:
            return None
        try:
            if self.clock() - stored.written > self.ttl:
                return None
            return stored.path.read_bytes(), stored.download_name
        except FileNotFoundError:
            return None
        finally:
            stored.path.unlink(missing_ok=True)

    def remove(self, name: str) -> None:
        """Remove the file stored as ``name`` (nothing when there is none)."""
        with self._lock:
            stored = self._files.pop(name, None)
        if stored is not None:
            stored.path.unlink(missing_ok=True)

    def sweep(self) -> int:
        """Remove the files whose time is up; how many were removed."""
        now = self.clock()
        with self._lock:
            old = [n for n, f in self._files.items() if now - f.written > self.ttl]
        for name in old:
            self.remove(name)
        return len(old)

    def close(self) -> None:
        """Remove every file and the folder."""
        with self._lock:
            self._files.clear()
            folder, self._folder = self._folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
