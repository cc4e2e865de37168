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
``"tsv"``
    A header row naming the columns; ``src_column`` / ``tgt_column`` pick them (default: the
    first of ``src``, ``source`` and of ``tgt``, ``target`` that the header has; names match
    regardless of case). Every physical line is one record, split on tabs: there is no quoting,
    so a ``"`` is text like any other character (TSV exports do not quote).
``"csv"``
    The same header row, comma-separated, with CSV quoting: a quoted field may hold commas,
    ``""`` and line breaks. A record that reaches the end of the file inside an open quote, or
    whose quoted field runs over more than :data:`MAX_RECORD_LINES` lines, is reported as
    ``unterminated_quote`` at the line where it starts, and the lines after that line are read
    as records of their own: a stray ``"`` never swallows the rest of the file.
``"jsonl"``
    One JSON object per line; ``src_column`` / ``tgt_column`` name the fields (same defaults).
``"aligned"``
    Two files with one sentence per line, line ``i`` of one translating line ``i`` of the other:
    pass ``path=("train.en", "train.fr")``.

Any file whose name ends in ``.gz`` is decompressed on the fly. Bytes are decoded as UTF-8
(a leading byte-order mark is ignored); a line that does not decode is reported, not guessed.
Lines end at ``\n``, ``\r\n`` or a bare ``\r`` (old Mac files), so no line break is ever read
as part of a sentence.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

__all__ = ["FORMATS", "MAX_RECORD_LINES", "ReadReport", "read_pairs"]

FORMATS = ("fra", "tsv", "csv", "jsonl", "aligned")

#: A CSV record whose quoted field spans more physical lines than this is taken for an
#: unterminated quote (reported as ``unterminated_quote``), not for a sentence.
MAX_RECORD_LINES = 32

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
    "unterminated_quote": "CSV quote not closed (at the end of the file or after too many lines)",
    "field_too_large": "CSV field larger than csv.field_size_limit()",
    "csv_error": "line the csv module cannot parse",
}


@dataclass
class ReadReport:
    """What :func:`read_pairs` read and what it skipped, and why.

    Attributes:
        path: the file (or ``"a + b"`` for aligned files) that was read.
        format: the format used (guessed or given).
        lines: physical data lines read (a header row and a final newline are not lines). A
            CSV record with a multi-line quoted field counts every line it spans, so for CSV
            ``lines`` can exceed ``pairs + n_skipped``.
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
        """Total number of lines (CSV: records) skipped, all reasons together."""
        return sum(self.skipped.values())

    @property
    def n_unreadable(self) -> int:
        """Lines (CSV: records) skipped for a reason other than being blank: data lost."""
        return self.n_skipped - self.skipped.get("blank_line", 0)

    @property
    def unreadable_fraction(self) -> float:
        """:attr:`n_unreadable` over the non-blank lines (pairs read plus unreadable)."""
        total = self.pairs + self.n_unreadable
        return self.n_unreadable / total if total else 0.0

    def summary(self, *, blank: bool = True) -> str:
        """One line: each reason with its count and its first line numbers, e.g. ``wrong number
        of columns: 70 (lines 2, 3, 5, 7, 9, ...)``; ``blank=False`` leaves blank lines out."""
        parts = []
        for reason in REASONS:
            count = self.skipped.get(reason, 0)
            if not count or (reason == "blank_line" and not blank):
                continue
            numbers = [str(n) for n, _ in self.examples.get(reason, [])]
            more = ", ..." if count > len(numbers) else ""
            where = (
                f" (line{'s' if count > 1 else ''} {', '.join(numbers)}{more})" if numbers else ""
            )
            parts.append(f"{REASONS[reason]}: {count}{where}")
        return "; ".join(parts)

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
        raise ValueError(f"path: expected a file, got the directory {str(path)!r}")
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    return data


_LINE_BREAK = re.compile(rb"\r\n?|\n")


def _lines(data: bytes) -> list[bytes]:
    """Split raw bytes into lines at ``\\n``, ``\\r\\n`` or a bare ``\\r`` (old Mac files, which
    would otherwise be one long line); a final line break opens no new line."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = data.split(b"\n") if b"\r" not in data else _LINE_BREAK.split(data)
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


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
) -> int:
    """The index of the column ``wanted`` (or of the first default present) in ``names``.

    Names match regardless of case (``Source`` is ``source``); an exact match wins over a
    case-insensitive one, and a name that matches several columns only by case is an error.
    """
    folded = [n.casefold() for n in names]
    if wanted is not None:
        if wanted in names:
            return list(names).index(wanted)
        hits = [i for i, n in enumerate(folded) if n == wanted.casefold()]
        if len(hits) == 1:
            return hits[0]
        if hits:
            raise ValueError(
                f"{arg}={wanted!r} matches several of the {where} when case is ignored: "
                f"{[names[i] for i in hits]}; pass the exact name"
            )
        raise ValueError(f"{arg}={wanted!r} is not among the {where}: {list(names)}")
    for name in defaults:
        if name.casefold() in folded:
            return folded.index(name.casefold())
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


def _header(
    raw: list[bytes], delimiter: str, src_column: str | None, tgt_column: str | None, path: str
) -> tuple[int, int, int]:
    """``(source index, target index, number of columns)`` from the header row ``raw[0]``."""
    try:
        header_text = raw[0].decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"path: the header row of {path!r} is not valid UTF-8 ({e.reason})"
        ) from None
    if delimiter == "\t":
        header = header_text.split("\t")
    else:
        header = next(csv.reader([header_text], delimiter=delimiter), [])
    header = [h.strip() for h in header]
    where = "header's columns"
    s = _pick(header, src_column, _SRC_NAMES, "src_column", where)
    t = _pick(header, tgt_column, _TGT_NAMES, "tgt_column", where)
    return s, t, len(header)


def _row(
    pairs: list[tuple[str, str]],
    report: ReadReport,
    n: int,
    row: list[str],
    s: int,
    t: int,
    width: int,
    delimiter: str,
) -> None:
    text = delimiter.join(row)
    if not row or not any(c.strip() for c in row):
        report.skip("blank_line", n, text)
    elif len(row) != width:
        report.skip("wrong_column_count", n, f"{len(row)} columns, header has {width}: {text}")
    else:
        _keep(pairs, report, n, row[s], row[t], text)


def _read_tsv(
    data: bytes, report: ReadReport, src_column: str | None, tgt_column: str | None
) -> list[tuple[str, str]]:
    """One record per physical line, split on tabs; no quoting (``"`` is ordinary text)."""
    raw = _lines(data)
    if not raw:
        return []
    s, t, width = _header(raw, "\t", src_column, tgt_column, report.path)
    pairs: list[tuple[str, str]] = []
    for n, line in _decoded(raw[1:], report, first_line=2):
        report.lines += 1
        _row(pairs, report, n, line.split("\t"), s, t, width, "\t")
    return pairs


def _read_csv(
    data: bytes, report: ReadReport, src_column: str | None, tgt_column: str | None
) -> list[tuple[str, str]]:
    """CSV with quoting; every physical line is counted, and a quote left open is reported."""
    raw = _lines(data)
    if not raw:
        return []
    s, t, width = _header(raw, ",", src_column, tgt_column, report.path)
    pairs: list[tuple[str, str]] = []
    decoded = list(_decoded(raw[1:], report, first_line=2))
    numbers = [n for n, _ in decoded]
    texts = [text for _, text in decoded]
    total = len(texts)
    # the record being read (index into texts), and whether the reader asked for a line past
    # the end of the file (or past MAX_RECORD_LINES of that record) while inside it
    cur = {"start": 0, "ran_out": False}

    def feed(base: int) -> Iterator[str]:
        for j in range(base, total):
            if j - cur["start"] >= MAX_RECORD_LINES:
                break
            yield texts[j] + "\n"
        cur["ran_out"] = True

    pos = 0  # index into texts of the first line not read yet
    while pos < total:
        # One csv.reader from ``pos`` on; it is rebuilt one line past the start of a record it
        # could not read, so a broken record costs its first line and nothing after it.
        base = pos
        cur["ran_out"] = False
        reader = csv.reader(feed(base), delimiter=",", strict=False)
        pos = total
        while True:
            start = cur["start"] = base + reader.line_num
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                reason = "field_too_large" if "field limit" in str(e) else "csv_error"
                report.lines += 1
                report.skip(reason, numbers[start], f"{e}: {texts[start]}")
                pos = start + 1
                break
            if cur["ran_out"]:  # the end (or the cap) came inside an open quote
                report.lines += 1
                report.skip("unterminated_quote", numbers[start], texts[start])
                pos = start + 1
                break
            report.lines += base + reader.line_num - start
            _row(pairs, report, numbers[start], row, s, t, width, ",")
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


def guess_format(path: PathLike | tuple[PathLike, PathLike] | list[PathLike]) -> str:
    """Guess the format of ``path`` from its name, then its first line.

    Returns:
        one of :data:`FORMATS`. A pair of paths (tuple or list) is ``"aligned"``; ``.jsonl``/``.ndjson`` is
        ``"jsonl"``; ``.csv`` is ``"csv"``; a tab-separated file is ``"tsv"`` when its first
        line names a source and a target column, else ``"fra"``; a first line starting with
        ``{`` is ``"jsonl"``.
    """
    if isinstance(path, (tuple, list)):
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
    path: PathLike | tuple[PathLike, PathLike] | list[PathLike],
    format: str | None = None,
    *,
    src_column: str | None = None,
    tgt_column: str | None = None,
    max_examples: int = 5,
) -> tuple[list[tuple[str, str]], ReadReport]:
    """Read ``(source, target)`` sentence pairs from a file in any supported format.

    Args:
        path: a file, or a pair ``(source_file, target_file)`` (tuple or list) of aligned
            files. Names ending in ``.gz`` are decompressed.
        format: one of :data:`FORMATS`, or None to guess it (see :func:`guess_format`).
        src_column, tgt_column: column (tsv/csv header) or field (jsonl) names; default the
            first present of ``src``/``source`` and ``tgt``/``target``. Header names match
            regardless of case; jsonl field names exactly.
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
        raise ValueError(f"format: expected one of {FORMATS} or None, got {format!r}")
    if not isinstance(max_examples, int) or max_examples < 0:
        raise ValueError(f"max_examples must be an int >= 0, got {max_examples!r}")
    if format == "aligned":
        if not (isinstance(path, (tuple, list)) and len(path) == 2):
            raise TypeError(
                "path must be a tuple or list (source_file, target_file) for "
                f"format='aligned', got {path!r}"
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
            read = _read_tsv if format == "tsv" else _read_csv
            pairs = read(data, report, src_column, tgt_column)
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
