"""A prepared corpus: token arrays on disk that any number of processes read and share.

``qkv prepare`` (:func:`qkv.train.prepare_corpus`) reads a corpus once and writes a folder::

    manifest.json           what the folder is: the source files (size, mtime, BLAKE2b), the
                            settings that made it, the languages, the split, the arrays' type,
                            the vocabulary sizes, the largest id of each side and the SHA-256
                            of every tokenizer file
    report.json             what preparing found: pairs read and kept, tokens, lengths, times
    tokenizers/             the source and target tokenizers (as a run's checkpoints hold them)
    train.src.tok           every training source's token ids, one after the other
    train.src.idx           int64 offsets: sentence ``i`` is ``tok[idx[i]:idx[i + 1]]``
    train.src.len           uint16 lengths (saturated at 65,535), what batching sorts by
    train.tgt.*             the same for the targets
    valid.jsonl, test.jsonl the held-out parts as text: raw and normalised source and target

The token files are raw arrays (``uint16`` when the vocabulary has at most 65,536 pieces, else
``int32``), read a sentence at a time with ``pread`` (:class:`TokenColumn`): a process reads only
the sentences of the batches it pads, and the ranks of one machine share the pages through the
page cache. ``manifest.json`` is
written last, so a folder without it is not (yet) a prepared corpus.

Opening a corpus checks it, cheaply and without reading a token (:class:`PreparedCorpus`):
every offset monotonic and inside its token file, every length the difference of its offsets
(numpy over blocks of offsets), the token type an integer type the vocabulary fits, the
recorded largest ids below the vocabulary sizes, the tokenizer files by their SHA-256; a token
read is checked against the vocabulary too. Each failure is one line naming the file and the
``qkv prepare`` command that rebuilds the folder (:class:`DamagedCorpusError`). A corpus
prepared before these were recorded is checked for what it records.

:func:`source_record` and :func:`check_sources` tie the folder to its text: a source file whose
size or modification time changed is hashed again, and one whose content changed is named.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from .._atomic import replace
from .._errors import SettingError
from .._folder import MANIFEST

__all__ = [
    "CLEAN_REASONS",
    "CORPUS_FILES",
    "MANIFEST",
    "PREPARED_VERSION",
    "REPORT",
    "TOKEN_DTYPES",
    "WORK_DIR",
    "Cleaning",
    "DamagedCorpusError",
    "PreparedCorpus",
    "PreparedSplit",
    "RawPairs",
    "RawPairsWriter",
    "TokenArraysWriter",
    "TokenColumn",
    "check_sources",
    "encode_chunk",
    "encode_rows",
    "file_digest",
    "init_encoder",
    "is_prepared",
    "pair_hashes",
    "prepare_command",
    "read_manifest",
    "source_record",
    "token_dtype",
    "tree_digests",
]

#: the folder's format; a newer one is refused with the version it needs
PREPARED_VERSION = 1
_LEN_MAX = np.iinfo(np.uint16).max


#: the types a token file may hold (:func:`token_dtype`)
TOKEN_DTYPES = ("uint16", "int32")
#: what a prepared corpus holds besides its manifest and report, and where a prepare works
CORPUS_FILES = (
    "tokenizers",
    "train.src.tok",
    "train.src.idx",
    "train.src.len",
    "train.tgt.tok",
    "train.tgt.idx",
    "train.tgt.len",
    "valid.jsonl",
    "test.jsonl",
)
REPORT = "report.json"
WORK_DIR = ".work"
#: offsets checked at a time when a column is opened
_CHECK_BLOCK = 1 << 20


def token_dtype(vocab_size: int) -> np.dtype:
    """The type of the token files for a vocabulary of ``vocab_size`` pieces."""
    return np.dtype(np.uint16 if vocab_size <= _LEN_MAX + 1 else np.int32)


class DamagedCorpusError(SettingError):
    """A prepared corpus whose files contradict each other or its manifest: one line naming
    the file, what is wrong and the ``qkv prepare`` command that rebuilds the folder (keyed
    ``data``)."""

    def __init__(self, path: str | Path, problem: str, remedy: str) -> None:
        super().__init__("data", f"{str(path)!r} {problem}; {remedy}")


def prepare_command(folder: str | Path, manifest: dict[str, Any] | None) -> str:
    """The ``qkv prepare`` command that makes ``folder`` again from its sources (``FILE`` when
    the manifest does not say), for the runs it was prepared for (``--max-minutes``, ...)."""
    sources = manifest.get("sources") if isinstance(manifest, dict) else None
    data = [
        str(r["path"])
        for r in sources or []
        if isinstance(r, dict) and r.get("key") == "data" and "path" in r
    ]
    settings = manifest.get("settings") if isinstance(manifest, dict) else None
    runs = settings.get("runs") if isinstance(settings, dict) else None
    flags = "".join(
        f" --{k.replace('_', '-')} {f'{v:g}' if isinstance(v, float) else v}"
        for k, v in (runs.items() if isinstance(runs, dict) else ())
    )
    return f"qkv prepare --data {' '.join(data) or 'FILE'} --out {folder}{flags}"


def _rebuild(folder: Path, manifest: dict[str, Any] | None) -> str:
    return f"rebuild it with {prepare_command(folder, manifest)}"


def tree_digests(folder: str | Path) -> dict[str, str]:
    """The SHA-256 (hex) of every file under ``folder``, by its path relative to it (``/``)."""
    root = Path(folder)
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h = hashlib.sha256()
            with open(p, "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
            out[p.relative_to(root).as_posix()] = h.hexdigest()
    return out


# ---------------------------------------------------------------------------- the sources
def file_digest(path: str | Path, chunk: int = 1 << 22) -> str:
    """BLAKE2b (16 bytes, hex) of a file's bytes, read in chunks."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def source_record(key: str, path: str | Path) -> dict[str, Any]:
    """What a manifest says of one source file: the setting that named it (``data``,
    ``valid_data``, ``test_data``), its absolute path, size, modification time and digest."""
    p = Path(path).resolve()
    st = p.stat()
    return {
        "key": key,
        "path": str(p),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "blake2b": file_digest(p),
    }


def check_sources(records: Iterable[dict[str, Any]], folder: str | Path, remedy: str) -> None:
    """Check that the source files a prepared corpus was made from are unchanged.

    A file whose size and modification time are the recorded ones is taken as unchanged
    (nothing read); otherwise its content is hashed again.

    Raises:
        ValueError: a file is missing or its content changed; the message names the setting,
            the file, what changed and ``remedy``.
    """
    for r in records:
        p, key = Path(r["path"]), r["key"]
        if not p.is_file():
            raise SettingError(
                key, f"{str(p)!r} was prepared into {str(folder)!r} and is gone; {remedy}"
            )
        st = p.stat()
        if st.st_size == r["size"] and st.st_mtime_ns == r["mtime_ns"]:
            continue
        if st.st_size != r["size"]:
            raise SettingError(
                key,
                f"{str(p)!r} changed since it was prepared into {str(folder)!r} (size "
                f"{r['size']} -> {st.st_size} bytes); {remedy}",
            )
        if file_digest(p) != r["blake2b"]:
            raise SettingError(
                key,
                f"{str(p)!r} changed since it was prepared into {str(folder)!r} (same size, "
                f"other content: BLAKE2b {r['blake2b']} recorded); {remedy}",
            )


# ---------------------------------------------------------------------------- writing
class TokenArraysWriter:
    """Append encoded sentences to the three files of one column (``NAME.tok``, ``.idx``,
    ``.len``), written as ``.tmp`` files and renamed by :meth:`close`.

    Args:
        folder: where the files go.
        name: the column, e.g. ``"train.src"``.
        dtype: the token type (:func:`token_dtype`).
    """

    def __init__(self, folder: Path, name: str, dtype: np.dtype) -> None:
        self.folder, self.name, self.dtype = Path(folder), name, np.dtype(dtype)
        self._files = {
            ext: open(self.folder / f"{name}.{ext}.tmp", "wb")  # noqa: SIM115 - closed by close()
            for ext in ("tok", "idx", "len")
        }
        self._offset = 0
        self.count = 0
        self._files["idx"].write(np.zeros(1, dtype=np.int64).tobytes())

    def append(self, lengths: np.ndarray, tokens: np.ndarray) -> None:
        """Add ``len(lengths)`` sentences: ``lengths`` ``(n,)``, ``tokens`` their ids, flat."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != len(tokens):
            raise ValueError(f"tokens: expected {int(lengths.sum())} ids, got {len(tokens)}")
        offsets = self._offset + np.cumsum(lengths)
        self._files["tok"].write(np.asarray(tokens, dtype=self.dtype).tobytes())
        self._files["idx"].write(offsets.astype(np.int64).tobytes())
        self._files["len"].write(np.minimum(lengths, _LEN_MAX).astype(np.uint16).tobytes())
        self._offset = int(offsets[-1]) if len(offsets) else self._offset
        self.count += len(lengths)

    def close(self) -> None:
        """Flush the files to disk and give them their names."""
        for ext, f in self._files.items():
            f.flush()
            os.fsync(f.fileno())
            f.close()
            replace(self.folder / f"{self.name}.{ext}.tmp", self.folder / f"{self.name}.{ext}")


# ---------------------------------------------------------------------------- raw pairs
class RawPairsWriter:
    """The pairs of a corpus as ``qkv prepare`` reads them, appended a chunk at a time to four
    files of ``folder``: ``raw.src``/``raw.tgt`` (UTF-8 text, one sentence after the other)
    and ``raw.src.idx``/``raw.tgt.idx`` (int64 byte offsets, ``n + 1``). What preparing reads
    back by index (:class:`RawPairs`) instead of holding the corpus."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._files = [
            open(self.folder / name, "wb")  # noqa: SIM115 - closed by close()
            for name in ("raw.src", "raw.src.idx", "raw.tgt", "raw.tgt.idx")
        ]
        self._offsets = [0, 0]
        self.count = 0
        for f in self._files[1::2]:
            f.write(np.zeros(1, dtype=np.int64).tobytes())

    def append(self, pairs: list[tuple[str, str]]) -> bytes:
        """Add ``pairs``; returns their bytes as :func:`qkv.data.fingerprint` hashes them."""
        sides = []
        for side in (0, 1):
            data = [p[side].encode("utf-8", "surrogatepass") for p in pairs]
            lengths = np.fromiter(map(len, data), dtype=np.int64, count=len(data))
            self._files[2 * side].write(b"".join(data))
            ends = self._offsets[side] + np.cumsum(lengths)
            self._files[2 * side + 1].write(ends.tobytes())
            if len(ends):
                self._offsets[side] = int(ends[-1])
            sides.append(data)
        self.count += len(pairs)
        return b"".join(x for s, t in zip(*sides) for x in (s, b"\t", t, b"\n"))

    def close(self) -> None:
        for f in self._files:
            f.flush()
            os.fsync(f.fileno())
            f.close()


class RawPairs:
    """The pairs :class:`RawPairsWriter` wrote, read back by index a block at a time."""

    #: pairs read in one go at most
    BLOCK = 1 << 16

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        size = (self.folder / "raw.src.idx").stat().st_size
        self.count = size // 8 - 1

    def __len__(self) -> int:
        return self.count

    def _side(self, side: str, a: int, b: int) -> tuple[np.ndarray, bytes]:
        with open(self.folder / f"raw.{side}.idx", "rb") as f:
            f.seek(8 * a)
            offsets = np.frombuffer(f.read(8 * (b - a + 1)), dtype=np.int64)
        with open(self.folder / f"raw.{side}", "rb") as f:
            f.seek(int(offsets[0]))
            data = f.read(int(offsets[-1] - offsets[0]))
        return offsets - offsets[0], data

    def sources(self, indices: np.ndarray) -> list[str]:
        """The source sides of the pairs at ``indices`` (in any order)."""
        return [s for s, _ in self.pairs(indices)]

    def pairs(self, indices: np.ndarray | list[int]) -> list[tuple[str, str]]:
        """The pairs at ``indices``, in that order (read in blocks of the sorted indices)."""
        idx = np.asarray(indices, dtype=np.int64)
        order = np.argsort(idx, kind="stable")
        out: list[tuple[str, str] | None] = [None] * len(idx)
        sorted_idx = idx[order]
        i = 0
        while i < len(sorted_idx):
            a = int(sorted_idx[i])
            j = int(np.searchsorted(sorted_idx, a + self.BLOCK, side="left"))
            b = int(sorted_idx[j - 1]) + 1
            (so, sd), (to, td) = self._side("src", a, b), self._side("tgt", a, b)
            for k in range(i, j):
                r = int(sorted_idx[k]) - a
                out[int(order[k])] = (
                    sd[so[r] : so[r + 1]].decode("utf-8", "surrogatepass"),
                    td[to[r] : to[r + 1]].decode("utf-8", "surrogatepass"),
                )
            i = j
        return out  # type: ignore[return-value]


# ---------------------------------------------------------------------------- reading
class TokenColumn:
    """One column of a prepared corpus (e.g. the training sources), read where it is needed.

    ``lengths`` reads the ``(n,)`` uint16 array of lengths; ``column[i]`` is sentence ``i``'s
    token ids, read with ``pread`` from the files (two offsets, then the ids). This is what
    :class:`qkv.data.TokenBatcher` takes in place of a list of id lists.

    Opening it checks the three files against each other (:meth:`check`); ``limit``, when set,
    is the vocabulary size every id read must be below (:meth:`__getitem__`).

    The files are read, not mapped: the pages come from the page cache, which every process
    of the machine shares, and nothing stays in the reading process. (A memory map counts every
    page it touches, and the kernel maps the neighbours of each with it, in every process's
    resident memory: random batches over a large corpus grow it by hundreds of megabytes.)

    Raises:
        DamagedCorpusError: a file of the wrong size, offsets that go backwards or past the
            token file, lengths that are not the offsets' differences (``remedy`` said).
    """

    def __init__(
        self,
        folder: Path,
        name: str,
        dtype: np.dtype,
        count: int,
        *,
        remedy: str = "prepare it again",
        limit: int | None = None,
    ) -> None:
        self.name = name
        self.dtype = np.dtype(dtype)
        self.limit = limit
        self._count = count
        self._remedy = remedy
        self._len_path = folder / f"{name}.len"
        self._idx_path, self._tok_path = folder / f"{name}.idx", folder / f"{name}.tok"
        _check_size(self._len_path, np.uint16, count, remedy)
        _check_size(self._idx_path, np.int64, count + 1, remedy)
        self._idx = os.open(self._idx_path, os.O_RDONLY)
        self._tok = os.open(self._tok_path, os.O_RDONLY)
        self.check()

    def check(self) -> None:
        """Check the offsets and lengths, :data:`_CHECK_BLOCK` sentences at a time: the first
        offset 0, each one at least the one before, the last the token file's size; each length
        its offsets' difference (saturated as written). Reads ``10 n`` bytes, no token."""
        end = 0
        for a in range(0, max(self._count, 1), _CHECK_BLOCK):
            b = min(a + _CHECK_BLOCK, self._count)
            offsets = self._offsets(a, b - a + 1)
            if offsets[0] != end:
                self._damaged(self._idx_path, f"offset {a} is {offsets[0]}, expected {end}")
            sizes = np.diff(offsets)
            back = np.flatnonzero(sizes < 0)
            if back.size:
                i = int(back[0])
                self._damaged(
                    self._idx_path,
                    f"goes backwards at sentence {a + i} (offset {offsets[i]} then "
                    f"{offsets[i + 1]}): the offsets must not decrease",
                )
            lengths = np.fromfile(self._len_path, dtype=np.uint16, count=b - a, offset=2 * a)
            wrong = np.flatnonzero(np.minimum(sizes, _LEN_MAX) != lengths)
            if wrong.size:
                i = int(wrong[0])
                self._damaged(
                    self._len_path,
                    f"gives sentence {a + i} {lengths[i]} tokens where {self._idx_path.name} "
                    f"gives it {sizes[i]} ({wrong.size} such sentences between {a} and {b})",
                )
            end = int(offsets[-1])
        _check_size(self._tok_path, self.dtype, end, self._remedy)

    def _damaged(self, path: Path, problem: str) -> NoReturn:
        raise DamagedCorpusError(path, f"is damaged: it {problem}", self._remedy)

    def _offsets(self, i: int, n: int = 1) -> np.ndarray:
        return np.frombuffer(os.pread(self._idx, 8 * n, 8 * i), dtype=np.int64)

    @property
    def lengths(self) -> np.ndarray:
        """``(n,)`` uint16, read from the file (a fresh array: nothing of it stays in the
        process once the caller lets it go)."""
        return np.fromfile(self._len_path, dtype=np.uint16, count=self._count)

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i: int) -> np.ndarray:
        """Sentence ``i``'s ids, ``(length,)`` of the column's dtype.

        Raises:
            DamagedCorpusError: an id at or above :attr:`limit` (the vocabulary's size).
        """
        a, b = (int(x) for x in self._offsets(int(i), 2))
        size = self.dtype.itemsize
        ids = np.frombuffer(os.pread(self._tok, (b - a) * size, a * size), dtype=self.dtype)
        if self.limit is not None and b > a:
            top = int(ids.max()) if b - a > 64 else max(ids.tolist())  # the faster for its size
            if top >= self.limit:
                self._damaged(
                    self._tok_path,
                    f"holds id {top} in sentence {i}, beyond the vocabulary of {self.limit} pieces",
                )
        return ids

    def __del__(self) -> None:
        for fd in (getattr(self, "_idx", None), getattr(self, "_tok", None)):
            if fd is not None:
                os.close(fd)


def _check_size(path: Path, dtype: Any, count: int, remedy: str) -> None:
    """``path`` holds ``count`` items of ``dtype``; a :class:`DamagedCorpusError` otherwise."""
    dtype = np.dtype(dtype)
    want = count * dtype.itemsize
    size = path.stat().st_size if path.is_file() else None
    if size != want:
        raise DamagedCorpusError(
            path,
            f"should hold {count} {dtype.name} values ({want} bytes), "
            f"{'it is missing' if size is None else f'it has {size} bytes'}",
            remedy,
        )


def is_prepared(path: str | Path | list | None) -> bool:
    """Is ``path`` a prepared corpus's folder (it holds a ``manifest.json``)?"""
    return isinstance(path, (str, Path)) and (Path(path) / MANIFEST).is_file()


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The ``manifest.json`` of a prepared corpus.

    Raises:
        ValueError: not a prepared corpus, or one of a newer format; a manifest that is not
            JSON (:class:`DamagedCorpusError`, naming it).
    """
    path = Path(folder) / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SettingError(
            "data", f"{str(folder)!r} is not a prepared corpus ({e.strerror or e}: {path})"
        ) from None
    try:
        m = json.loads(text)
    except ValueError as e:
        raise DamagedCorpusError(
            path, f"is not valid JSON ({e})", _rebuild(Path(folder), None)
        ) from None
    if not isinstance(m, dict) or m.get("type") != "qkv.PreparedCorpus":
        raise SettingError("data", f"{str(path)!r} is not the manifest of a prepared corpus")
    version = m.get("version")
    if not isinstance(version, int) or version > PREPARED_VERSION:
        raise SettingError(
            "data",
            f"{str(folder)!r} is a prepared corpus of version {version!r}; this qkv "
            f"reads versions up to {PREPARED_VERSION}: prepare it again with this qkv",
        )
    for key, kind in _MANIFEST_KEYS.items():
        if not isinstance(m.get(key), kind):
            what = (
                f"lacks {key!r}"
                if key not in m
                else f"holds a {type(m[key]).__name__} as {key!r}, not a {kind.__name__}"
            )
            raise DamagedCorpusError(path, what, _rebuild(Path(folder), m))
    langs = [k for k in ("src_lang", "tgt_lang") if k not in m["resolved"]]
    if langs:
        raise DamagedCorpusError(path, f"lacks 'resolved.{langs[0]}'", _rebuild(Path(folder), m))
    return m


#: what every reader of a manifest relies on, by type (the checks of the arrays read the rest)
_MANIFEST_KEYS = {
    "fingerprint": str,
    "sources": list,
    "settings": dict,
    "resolved": dict,
    "split": dict,
    "counts": dict,
}


@dataclass(frozen=True)
class PreparedSplit:
    """What a run trained on a prepared corpus records as its split: the corpus, its
    identity and the sizes of its parts (the indices stay in the corpus). Saved in the run's
    ``split.json`` like a :class:`qkv.data.Split`."""

    corpus: str
    fingerprint: str
    n: int
    seed: int
    sizes: tuple[int, int, int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "qkv.PreparedSplit",
            "corpus": self.corpus,
            "fingerprint": self.fingerprint,
            "n": self.n,
            "seed": self.seed,
            "sizes": list(self.sizes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PreparedSplit:
        if not isinstance(d, dict) or d.get("type") != "qkv.PreparedSplit":
            raise ValueError(f"d must be a dict from PreparedSplit.to_dict, got {d!r:.80}")
        a, b, c = (int(x) for x in d["sizes"])
        return cls(str(d["corpus"]), str(d["fingerprint"]), int(d["n"]), int(d["seed"]), (a, b, c))

    @staticmethod
    def describes(d: Any) -> bool:
        """Is ``d`` (a run's saved split) a prepared corpus's?"""
        return isinstance(d, dict) and d.get("type") == "qkv.PreparedSplit"


class PreparedCorpus:
    """A prepared corpus opened for reading (see the module docstring), checked as it opens:
    the manifest's counts, token type, vocabulary sizes and largest ids, the tokenizer files
    by SHA-256, the columns' offsets and lengths (:class:`TokenColumn`).

    Attributes:
        folder: the folder.
        manifest: its ``manifest.json``.
        src, tgt: the training columns (:class:`TokenColumn`).

    Raises:
        ValueError: not a prepared corpus, or one of a newer format.
        DamagedCorpusError: a file that contradicts the manifest or the other files (named,
            with the ``qkv prepare`` command that rebuilds the folder).
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder).resolve()
        self.manifest = read_manifest(self.folder)
        self.remedy = _rebuild(self.folder, self.manifest)
        counts = self.manifest.get("counts")
        n = counts.get("train") if isinstance(counts, dict) else None
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            self._damaged(MANIFEST, f"records {n!r} training pairs; expected an int >= 0")
        dtype = self._dtype()
        vocab = self.vocab_sizes
        limits = vocab if vocab is not None else (None, None)
        self._check_tokenizers()
        self.src = TokenColumn(
            self.folder, "train.src", dtype, n, remedy=self.remedy, limit=limits[0]
        )
        self.tgt = TokenColumn(
            self.folder, "train.tgt", dtype, n, remedy=self.remedy, limit=limits[1]
        )

    def _damaged(self, name: str, problem: str) -> NoReturn:
        raise DamagedCorpusError(self.folder / name, problem, self.remedy)

    @property
    def vocab_sizes(self) -> tuple[int, int] | None:
        """The source and target vocabulary sizes the manifest records (None: prepared before
        they were recorded)."""
        v = self.manifest.get("vocab_sizes")
        if v is None:
            return None
        if not (
            isinstance(v, list)
            and len(v) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v)
        ):
            self._damaged(MANIFEST, f"records vocab_sizes {v!r}; expected two ints > 0")
        return v[0], v[1]

    def _dtype(self) -> np.dtype:
        """The token files' type: one of :data:`TOKEN_DTYPES`, the one the recorded
        vocabularies need, their recorded largest ids below them."""
        name = self.manifest.get("token_dtype")
        if name not in TOKEN_DTYPES:
            self._damaged(
                MANIFEST, f"records token_dtype {name!r}; expected one of {', '.join(TOKEN_DTYPES)}"
            )
        dtype = np.dtype(name)
        vocab = self.vocab_sizes
        if vocab is None:
            return dtype
        if dtype != token_dtype(max(vocab)):
            self._damaged(
                MANIFEST,
                f"records token_dtype {name}, but vocabularies of {vocab[0]} and {vocab[1]} "
                f"pieces are written as {token_dtype(max(vocab)).name}",
            )
        top = self.manifest.get("max_ids")
        if top is not None and not (
            isinstance(top, list)
            and len(top) == 2
            and all(isinstance(x, int) and -1 <= x < v for x, v in zip(top, vocab))
        ):
            self._damaged(
                MANIFEST, f"records largest ids {top!r}, not below the vocabularies {list(vocab)}"
            )
        return dtype

    def _check_tokenizers(self) -> None:
        """The tokenizer files are the ones the corpus was encoded with (by SHA-256)."""
        want = self.manifest.get("tokenizer_sha256")
        if want is None:
            return
        if not isinstance(want, dict):
            self._damaged(MANIFEST, f"records tokenizer_sha256 {want!r:.60}; expected a mapping")
        got = tree_digests(self.folder / "tokenizers")
        for name in sorted(set(want) | set(got)):
            if name not in got:
                self._damaged(f"tokenizers/{name}", "is missing")
            if name not in want:
                self._damaged(f"tokenizers/{name}", "is not one of the corpus's tokenizer files")
            if got[name] != want[name]:
                self._damaged(
                    f"tokenizers/{name}",
                    f"is not the file the corpus was encoded with (SHA-256 {got[name][:16]}..., "
                    f"the manifest records {str(want[name])[:16]}...)",
                )

    def check_vocabulary(self, src_size: int, tgt_size: int) -> None:
        """Check the tokenizers a run reads the corpus with (``src_size`` and ``tgt_size``
        pieces) against the vocabularies the corpus records, and check every id read against
        them (a corpus that records none: against these).

        Raises:
            DamagedCorpusError: other vocabulary sizes than the corpus was encoded with.
        """
        vocab = self.vocab_sizes
        if vocab is not None and vocab != (src_size, tgt_size):
            self._damaged(
                "tokenizers",
                f"holds vocabularies of {src_size} and {tgt_size} pieces; the corpus was "
                f"encoded with {vocab[0]} and {vocab[1]}",
            )
        self.src.limit, self.tgt.limit = src_size, tgt_size

    @property
    def n_train(self) -> int:
        return len(self.src)

    @property
    def fingerprint(self) -> str:
        """The identity of the prepared data (the split's fingerprint, the settings, the
        tokenizers): a run records it and a resumed run checks it."""
        return str(self.manifest["fingerprint"])

    def split(self) -> PreparedSplit:
        s = self.manifest["split"]
        c = self.manifest["counts"]
        return PreparedSplit(
            str(self.folder),
            self.fingerprint,
            int(s["n"]),
            int(s["seed"]),
            (int(c["train"]), int(c["valid"]), int(c["test"])),
        )

    def held_out(self, part: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """The ``valid`` or ``test`` part as ``(raw pairs, normalised pairs)``.

        Raises:
            DamagedCorpusError: the file is missing, or a line is not a row of four strings
                (the file and the line named).
        """
        if part not in ("valid", "test"):
            raise ValueError(f"part: expected 'valid' or 'test', got {part!r}")
        raw: list[tuple[str, str]] = []
        norm: list[tuple[str, str]] = []
        name = f"{part}.jsonl"
        try:
            f = open(self.folder / name, "rb")  # noqa: SIM115 - closed below
        except OSError as e:
            self._damaged(name, f"cannot be read ({e.strerror or e})")
        with f:
            for n, line in enumerate(f, start=1):
                try:
                    row = json.loads(line.decode("utf-8"))
                    if not (
                        isinstance(row, list)
                        and len(row) == 4
                        and all(isinstance(r, str) for r in row)
                    ):
                        raise ValueError(f"got {str(row)[:40]!r}")
                except ValueError as e:  # UnicodeDecodeError and JSONDecodeError included
                    self._damaged(
                        name, f"line {n} is not a row [source, target, normalised source, "
                        f"normalised target] ({e})"
                    )  # fmt: skip
                raw.append((row[0], row[1]))
                norm.append((row[2], row[3]))
        return raw, norm


# ---------------------------------------------------------------------------- cleaning
@dataclass(frozen=True)
class Cleaning:
    """The cleaning NMT practitioners apply to web-crawled corpora, each off by default; applied
    by ``qkv prepare`` to the training pairs only (the held-out parts stay as read).

    Attributes:
        max_ratio: drop a pair whose longer side has more than this many times the characters
            of the shorter (a sentence aligned with a paragraph), or None.
        dedup: drop a pair equal to an earlier one (after normalisation; by a 64-bit hash).
        drop_copies: drop a pair whose target is its source (untranslated text).
        languages: ``(source, target)`` codes: drop a pair whose source is not detected as the
            source language or whose target is not the target language, detection being
            restricted to these two (py3langid); None: no check.
    """

    max_ratio: float | None = None
    dedup: bool = False
    drop_copies: bool = False
    languages: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        r = self.max_ratio
        if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or r < 1):
            raise ValueError(f"max_ratio: expected a number >= 1 or None, got {r!r}")

    @property
    def active(self) -> bool:
        return bool(self.max_ratio or self.dedup or self.drop_copies or self.languages)

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_ratio": self.max_ratio,
            "dedup": self.dedup,
            "drop_copies": self.drop_copies,
            "languages": list(self.languages) if self.languages else None,
        }

    def reasons(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """Per pair (normalised), 0 to keep it, else the 1-based index in :data:`CLEAN_REASONS`
        of the first rule that drops it (deduplication aside: see :func:`pair_hashes`)."""
        out = np.zeros(len(pairs), dtype=np.int8)
        for i, (s, t) in enumerate(pairs):
            a, b = len(s), len(t)
            if self.drop_copies and s == t:
                out[i] = 1
            elif self.max_ratio and max(a, b) > self.max_ratio * max(min(a, b), 1):
                out[i] = 2
        if self.languages:
            from .languages import detect_languages

            src, tgt = self.languages
            both = (src, tgt)
            found_s = detect_languages([s for s, _ in pairs], candidates=both)
            found_t = detect_languages([t for _, t in pairs], candidates=both)
            for i, ((cs, _), (ct, _)) in enumerate(zip(found_s, found_t)):
                if out[i] == 0 and ((cs and cs != src) or (ct and ct != tgt)):
                    out[i] = 3
        return out


#: why a pair was cleaned away, by the codes of :meth:`Cleaning.reasons` (then ``duplicate``)
CLEAN_REASONS = ("source = target", "length ratio", "language", "duplicate")


def pair_hashes(pairs: list[tuple[str, str]]) -> np.ndarray:
    """A 64-bit BLAKE2b hash of every pair, what deduplication compares."""
    out = np.empty(len(pairs), dtype=np.uint64)
    for i, (s, t) in enumerate(pairs):
        h = hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=8)
        h.update(b"\t" + t.encode("utf-8", "surrogatepass"))
        out[i] = int.from_bytes(h.digest(), "little")
    return out


# ---------------------------------------------------------------------------- encoding workers
_WORKER: dict[str, Any] = {}


def init_encoder(tokenizers: str, cleaning: Cleaning | None = None) -> None:
    """A worker's start: load the tokenizers saved in the folder ``tokenizers``; ``cleaning``
    what :func:`encode_chunk` also judges."""
    from .tokenizers import load_tokenizers

    _WORKER["tokenizers"] = load_tokenizers(tokenizers)
    _WORKER["cleaning"] = cleaning
    _WORKER["loaded"] = (tokenizers, cleaning)


def encode_rows(task: tuple[str, Cleaning | None, str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """:func:`encode_chunk` of the pairs a :class:`RawPairs` folder holds at some indices:
    ``task`` is ``(tokenizers folder, cleaning, raw pairs folder, indices)``. The worker loads
    the tokenizers at its first task (a pool started before they were trained can run it)."""
    tokenizers, cleaning, raw, indices = task
    if _WORKER.get("loaded") != (tokenizers, cleaning):
        init_encoder(tokenizers, cleaning)
    return encode_chunk(RawPairs(Path(raw)).pairs(indices))


def encode_chunk(pairs: list[tuple[str, str]]) -> tuple[np.ndarray, ...]:
    """Normalise and encode raw ``pairs`` with the worker's tokenizers (:func:`init_encoder`),
    exactly as a run encodes its training pairs.

    Returns:
        ``(src_lengths, src_tokens, tgt_lengths, tgt_tokens)``: int64 ``(n,)`` lengths and the
        int64 ids of all sentences of each side, one after the other; with an active
        :class:`Cleaning`, also the ``(n,)`` int8 reasons and the uint64 pair hashes.
    """
    src_tok, tgt_tok = _WORKER["tokenizers"]
    cleaning: Cleaning | None = _WORKER.get("cleaning")
    out = []
    normalised = []
    for side, tok in ((0, src_tok), (1, tgt_tok)):
        texts = [tok.normalize(p[side]) for p in pairs]
        ids = [tok.encode_normalized(t) for t in texts]
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter((i for x in ids for i in x), dtype=np.int64, count=int(lengths.sum()))
        out += [lengths, flat]
        normalised.append(texts)
    if cleaning is not None and cleaning.active:
        norm_pairs = list(zip(normalised[0], normalised[1]))
        out += [cleaning.reasons(norm_pairs), pair_hashes(norm_pairs)]
    return tuple(out)
