"""Readers of parallel text: every format people download, one entry point.

``read_pairs(path, format=None)`` returns ``(pairs, report)``: the ``(source, target)`` string
pairs that could be used and a :class:`ReadReport` that counts every line that could not, by
reason, with the first few line numbers of each. Nothing is dropped silently, and a file that
yields no pair at all is an error that says why.

Formats (``format=``):

``"fra"``
    The Tatoeba/Anki ``fra.txt`` layout: tab-separated, no header, ``source<TAB>target`` with an
    optional third attribution column (today's download has three columns on every line; the
    book's loader keeps only two-column lines and so drops all of them -- qkv keeps both).
``"tsv"`` / ``"csv"``
    A header row naming the columns; ``src_column`` / ``tgt_column`` pick them (default: the
    first of ``src``, ``source`` and of ``tgt``, ``target`` that the header has).
``"jsonl"``
    One JSON object per line; ``src_column`` / ``tgt_column`` name the fields (same defaults).
``"aligned"``
    Two files with one sentence per line, line ``i`` of one translating line ``i`` of the other:
    pass ``path=("train.en", "train.fr")``.

Any file whose name ends in ``.gz`` is decompressed on the fly. Bytes are decoded as UTF-8
(a leading byte-order mark is ignored); a line that does not decode is reported, not guessed.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

__all__ = ["FORMATS", "ReadReport", "read_pairs"]

FORMATS = ("fra", "tsv", "csv", "jsonl", "aligned")

PathLike = Union[str, "os.PathLike[str]"]

_SRC_NAMES = ("src", "source")
_TGT_NAMES = ("tgt", "target")

# Reasons a line is skipped; the order is the order of the report.
REASONS = {
    "blank_line": "blank line",
    "wrong_column_count": "wrong number of columns",
    "empty_source": "empty source side",
    "empty_target": "empty target side",
    "undecodable": "bytes that are not valid UTF-8",
    "invalid_json": "not a JSON object",
    "missing_field": "source or target field missing or not a string",
}


@dataclass
class ReadReport:
    """What :func:`read_pairs` read and what it skipped, and why.

    Attributes:
        path: the file (or ``"a + b"`` for aligned files) that was read.
        format: the format used (guessed or given).
        lines: data lines seen (a header row and a final newline are not lines).
        pairs: pairs returned.
        skipped: reason -> number of lines skipped for it (only reasons that occurred).
        examples: reason -> the first ``max_examples`` ``(line_number, text)`` skipped for it;
            line numbers are 1-based and count the header row, as an editor shows them.
        max_examples: how many examples are kept per reason.
    """

    path: str
    format: str
    lines: int = 0
    pairs: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    max_examples: int = 5

    @property
    def n_skipped(self) -> int:
        """Total number of lines skipped, all reasons together."""
        return sum(self.skipped.values())

    def skip(self, reason: str, line_number: int, text: str) -> None:
        """Record that line ``line_number`` (1-based) was skipped for ``reason``."""
        if reason not in REASONS:
            raise ValueError(f"reason must be one of {sorted(REASONS)}, got {reason!r}")
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        ex = self.examples.setdefault(reason, [])
        if len(ex) < self.max_examples:
            ex.append((line_number, text if len(text) <= 80 else text[:77] + "..."))

    def to_dict(self) -> dict:
        """A JSON-serialisable copy of the report."""
        return {
            "path": self.path,
            "format": self.format,
            "lines": self.lines,
            "pairs": self.pairs,
            "skipped": dict(self.skipped),
            "examples": {k: [list(e) for e in v] for k, v in self.examples.items()},
        }

    def __str__(self) -> str:
        head = (
            f"{self.path} ({self.format}): {self.lines} lines, {self.pairs} pairs, "
            f"{self.n_skipped} skipped"
        )
        rows = [head]
        for reason in REASONS:
            if reason not in self.skipped:
                continue
            count = self.skipped[reason]
            rows.append(f"  {REASONS[reason]}: {count}")
            for line_number, text in self.examples.get(reason, []):
                rows.append(f"    line {line_number}: {text!r}")
            if count > len(self.examples.get(reason, [])):
                rows.append(f"    ... and {count - len(self.examples[reason])} more")
        return "\n".join(rows)


def _open_bytes(path: Path) -> bytes:
    if not path.exists():
        raise FileNotFoundError(f"path: no such file {str(path)!r}")
    if path.is_dir():
        raise ValueError(f"path must be a file, got the directory {str(path)!r}")
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    return data


def _lines(data: bytes) -> list[bytes]:
    """Split raw bytes into lines (``\\n``, ``\\r\\n``); a final newline opens no new line."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]


def _decoded(
    raw: list[bytes], report: ReadReport, first_line: int = 1
) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` for every line that decodes; report the others."""
    for i, b in enumerate(raw, start=first_line):
        try:
            text = b.decode("utf-8")
        except UnicodeDecodeError as e:
            report.lines += 1
            report.skip("undecodable", i, f"{b!r} ({e.reason} at byte {e.start})")
            continue
        yield i, text


def _pick(
    names: Sequence[str], wanted: str | None, defaults: Sequence[str], arg: str, where: str
) -> str:
    if wanted is not None:
        if wanted not in names:
            raise ValueError(f"{arg}={wanted!r} is not among the {where}: {list(names)}")
        return wanted
    for name in defaults:
        if name in names:
            return name
    raise ValueError(
        f"{arg}: none of the default names {list(defaults)} is among the {where} "
        f"{list(names)}; pass {arg}= to choose one"
    )


def _keep(
    pairs: list[tuple[str, str]], report: ReadReport, n: int, src: str, tgt: str, raw: str
) -> None:
    src, tgt = src.strip(), tgt.strip()
    if not src and not tgt:
        report.skip("blank_line", n, raw)
    elif not src:
        report.skip("empty_source", n, raw)
    elif not tgt:
        report.skip("empty_target", n, raw)
    else:
        pairs.append((src, tgt))


def _read_fra(data: bytes, report: ReadReport) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for n, line in _decoded(_lines(data), report):
        report.lines += 1
        if not line.strip():
            report.skip("blank_line", n, line)
            continue
        cols = line.split("\t")
        if len(cols) not in (2, 3):
            report.skip("wrong_column_count", n, f"{len(cols)} columns: {line}")
            continue
        _keep(pairs, report, n, cols[0], cols[1], line)
    return pairs


def _read_delimited(
    data: bytes, report: ReadReport, delimiter: str, src_column: str | None, tgt_column: str | None
) -> list[tuple[str, str]]:
    raw = _lines(data)
    if not raw:
        return []
    try:
        header_text = raw[0].decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"path: the header row is not valid UTF-8 ({e.reason})") from None
    header = next(csv.reader([header_text], delimiter=delimiter))
    header = [h.strip() for h in header]
    where = "header's columns"
    s = header.index(_pick(header, src_column, _SRC_NAMES, "src_column", where))
    t = header.index(_pick(header, tgt_column, _TGT_NAMES, "tgt_column", where))
    width = len(header)
    pairs: list[tuple[str, str]] = []
    decoded = list(_decoded(raw[1:], report, first_line=2))
    numbers = [n for n, _ in decoded]
    # csv.reader consumes several physical lines for a quoted field with newlines; line_num
    # tells how many, so every row is reported at the line where it starts.
    reader = csv.reader((text + "\n" for _, text in decoded), delimiter=delimiter, strict=False)
    consumed = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:  # pragma: no cover - strict=False makes this rare
            n = numbers[min(consumed, len(numbers) - 1)]
            report.lines += 1
            report.skip("wrong_column_count", n, f"csv error: {e}")
            consumed = reader.line_num
            continue
        n = numbers[consumed]
        consumed = reader.line_num
        report.lines += 1
        text = delimiter.join(row)
        if not row or not any(c.strip() for c in row):
            report.skip("blank_line", n, text)
        elif len(row) != width:
            report.skip("wrong_column_count", n, f"{len(row)} columns, header has {width}: {text}")
        else:
            _keep(pairs, report, n, row[s], row[t], text)
    return pairs


def _read_jsonl(
    data: bytes, report: ReadReport, src_column: str | None, tgt_column: str | None
) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    src_key, tgt_key = src_column, tgt_column
    for n, line in _decoded(_lines(data), report):
        report.lines += 1
        if not line.strip():
            report.skip("blank_line", n, line)
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            report.skip("invalid_json", n, line)
            continue
        if not isinstance(obj, dict):
            report.skip("invalid_json", n, line)
            continue
        if src_key is None:
            src_key = next((k for k in _SRC_NAMES if k in obj), None)
        if tgt_key is None:
            tgt_key = next((k for k in _TGT_NAMES if k in obj), None)
        s, t = obj.get(src_key or _SRC_NAMES[0]), obj.get(tgt_key or _TGT_NAMES[0])
        if not isinstance(s, str) or not isinstance(t, str):
            report.skip("missing_field", n, line)
            continue
        _keep(pairs, report, n, s, t, line)
    return pairs


def _read_aligned(a: Path, b: Path, report: ReadReport) -> list[tuple[str, str]]:
    la, lb = _lines(_open_bytes(a)), _lines(_open_bytes(b))
    if len(la) != len(lb):
        raise ValueError(
            f"path: aligned files must have the same number of lines, got {len(la)} in "
            f"{str(a)!r} and {len(lb)} in {str(b)!r}; the pairs cannot be trusted"
        )
    pairs: list[tuple[str, str]] = []
    for n, (ra, rb) in enumerate(zip(la, lb), start=1):
        report.lines += 1
        try:
            sa, sb = ra.decode("utf-8"), rb.decode("utf-8")
        except UnicodeDecodeError as e:
            which = a.name if _bad(ra) else b.name
            report.skip("undecodable", n, f"{which}: {e.reason} at byte {e.start}")
            continue
        _keep(pairs, report, n, sa, sb, f"{sa}\t{sb}")
    return pairs


def _bad(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def guess_format(path: PathLike | tuple[PathLike, PathLike]) -> str:
    """Guess the format of ``path`` from its name, then its first line.

    Returns:
        one of :data:`FORMATS`. A pair of paths is ``"aligned"``; ``.jsonl``/``.ndjson`` is
        ``"jsonl"``; ``.csv`` is ``"csv"``; a tab-separated file is ``"tsv"`` when its first
        line names a source and a target column, else ``"fra"``; a first line starting with
        ``{`` is ``"jsonl"``.
    """
    if isinstance(path, tuple):
        return "aligned"
    name = os.fspath(path).lower()
    if name.endswith(".gz"):
        name = name[:-3]
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if name.endswith(".csv"):
        return "csv"
    data = _open_bytes(Path(path))
    first = _lines(data[:4096])[:1]
    head = first[0].decode("utf-8", errors="replace").strip() if first else ""
    if head.startswith("{"):
        return "jsonl"
    cols = [c.strip().lower() for c in head.split("\t")]
    if any(c in _SRC_NAMES for c in cols) and any(c in _TGT_NAMES for c in cols):
        return "tsv"
    return "fra"


def read_pairs(
    path: PathLike | tuple[PathLike, PathLike],
    format: str | None = None,
    *,
    src_column: str | None = None,
    tgt_column: str | None = None,
    max_examples: int = 5,
) -> tuple[list[tuple[str, str]], ReadReport]:
    """Read ``(source, target)`` sentence pairs from a file in any supported format.

    Args:
        path: a file, or a tuple ``(source_file, target_file)`` of aligned files. Names ending
            in ``.gz`` are decompressed.
        format: one of :data:`FORMATS`, or None to guess it (see :func:`guess_format`).
        src_column, tgt_column: column (tsv/csv header) or field (jsonl) names; default the
            first present of ``src``/``source`` and ``tgt``/``target``.
        max_examples: how many skipped lines of each reason the report keeps.

    Returns:
        ``(pairs, report)``: a list of ``(source, target)`` strings, each side stripped of
        surrounding whitespace and non-empty, in file order; and a :class:`ReadReport`.

    Raises:
        ValueError: an unknown format, a missing column, aligned files of different lengths,
            or a file from which no pair could be read (the message says why).
        FileNotFoundError: ``path`` does not exist.
    """
    if format is None:
        format = guess_format(path)
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS} or None, got {format!r}")
    if not isinstance(max_examples, int) or max_examples < 0:
        raise ValueError(f"max_examples must be an int >= 0, got {max_examples!r}")
    if format == "aligned":
        if not (isinstance(path, (tuple, list)) and len(path) == 2):
            raise TypeError(
                f"path must be a tuple (source_file, target_file) for format='aligned', "
                f"got {path!r}"
            )
        a, b = Path(path[0]), Path(path[1])
        report = ReadReport(f"{a} + {b}", format, max_examples=max_examples)
        pairs = _read_aligned(a, b, report)
    else:
        if isinstance(path, (tuple, list)):
            raise TypeError(
                f"path must be one file for format={format!r}, got {len(path)} paths; "
                "a pair of paths is read as format='aligned'"
            )
        p = Path(path)
        report = ReadReport(str(p), format, max_examples=max_examples)
        data = _open_bytes(p)
        if format == "fra":
            pairs = _read_fra(data, report)
        elif format == "jsonl":
            pairs = _read_jsonl(data, report, src_column, tgt_column)
        else:
            delim = "\t" if format == "tsv" else ","
            pairs = _read_delimited(data, report, delim, src_column, tgt_column)
    report.pairs = len(pairs)
    if not pairs:
        if report.lines == 0:
            why = "it has no data lines"
        else:
            why = f"all {report.lines} lines were skipped:\n{report}"
        raise ValueError(f"path: no sentence pair could be read from {report.path}: {why}")
    return pairs, report


def write_pairs(path: PathLike, pairs: Sequence[tuple[str, str]], attribution: str = "") -> None:
    """Write ``pairs`` in the ``fra`` format (gzip when ``path`` ends in ``.gz``).

    A non-empty ``attribution`` is written as a third column on every line.
    """
    buf = io.StringIO()
    for s, t in pairs:
        if "\t" in s or "\n" in s or "\t" in t or "\n" in t:
            raise ValueError(f"pairs: tabs and newlines cannot be written, got {(s, t)!r}")
        buf.write(f"{s}\t{t}\t{attribution}\n" if attribution else f"{s}\t{t}\n")
    data = buf.getvalue().encode("utf-8")
    p = Path(path)
    if p.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    p.write_bytes(data)
