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

Any file whose name ends in ``.gz`` is decompressed on the fly (a file that is not gzip, or
is truncated, is refused with the reason). Files are read as a stream of lines, never loaded
whole, and must be regular files (a FIFO or a device is refused: a data file is read more than
once). Bytes are decoded as UTF-8; a UTF-8 byte-order mark is dropped, and a UTF-16 or UTF-32
file that starts with its byte-order mark is decoded as what the mark says. A line that is not
UTF-8 is reported (``undecodable``, with a guess at its encoding), never guessed; a NUL byte (a
UTF-16 or UTF-32 file without its mark, or a binary file) refuses the file, naming the line and
the encoding it looks like. Lines end at ``\n``, ``\r\n`` or a bare ``\r`` (old Mac files),
so no line break is ever read as part of a sentence.

In the ``fra`` format a first line whose columns are language codes or names or column names
(``en<TAB>fr``, ``English<TAB>French``, ``source<TAB>target``) is a header, not a pair: it is
skipped and reported (``header_row``).
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import os
import re
import stat
import zlib
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Union

from .._errors import SettingError, keyed

__all__ = ["FORMATS", "MAX_RECORD_LINES", "ReadReport", "iter_pairs", "read_pairs"]

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
    "header_row": "a header row (the fra format has none: not a pair)",
    "wrong_column_count": "wrong number of columns",
    "empty_source": "empty source side",
    "empty_target": "empty target side",
    "undecodable": "bytes that are not valid UTF-8 (convert the file: iconv -f ENCODING -t UTF-8)",
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
        """Lines (CSV: records) skipped for a reason other than being blank or a header row:
        data lost."""
        return (
            self.n_skipped - self.skipped.get("blank_line", 0) - self.skipped.get("header_row", 0)
        )

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


_CHUNK = 1 << 18  # bytes read at a time: files are streamed, never loaded whole

# byte-order marks, the 4-byte ones first (UTF-32-LE's starts with UTF-16-LE's)
_BOMS = (
    (codecs.BOM_UTF32_BE, "UTF-32-BE"),
    (codecs.BOM_UTF32_LE, "UTF-32-LE"),
    (codecs.BOM_UTF8, "UTF-8"),
    (codecs.BOM_UTF16_BE, "UTF-16-BE"),
    (codecs.BOM_UTF16_LE, "UTF-16-LE"),
)


def _check_file(path: Path) -> None:
    """A regular file, or FileNotFoundError/ValueError naming ``path`` and what it is."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise keyed(FileNotFoundError, "path", f"no such file {str(path)!r}") from None
    except OSError as e:
        raise SettingError("path", f"cannot read {str(path)!r}: {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        raise SettingError("path", f"expected a file, got the directory {str(path)!r}")
    if not stat.S_ISREG(mode):
        what = (
            "a FIFO (named pipe)"
            if stat.S_ISFIFO(mode)
            else "a character device"
            if stat.S_ISCHR(mode)
            else "a block device"
            if stat.S_ISBLK(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "not a regular file"
        )
        raise SettingError(
            "path",
            f"{str(path)!r} is {what}; expected a regular file (a data file is read more "
            "than once: to guess its format, to split it, to resume): save it to a file first",
        )


def _chunks(path: Path) -> Iterator[bytes]:
    """The file's bytes, ``_CHUNK`` at a time, decompressed when its name ends in ``.gz``; a
    bad or truncated gzip file is a ValueError naming it."""
    _check_file(path)
    gz = path.name.endswith(".gz")
    try:
        with path.open("rb") as raw:
            f = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
            while True:
                chunk = f.read(_CHUNK)
                if not chunk:
                    return
                yield chunk
    except EOFError:
        raise SettingError(
            "path",
            f"{str(path)!r} is truncated: its gzip stream ends before its end marker "
            "(an interrupted download or copy?); get the file again",
        ) from None
    except (gzip.BadGzipFile, zlib.error) as e:
        raise SettingError("path", f"{str(path)!r} is not a valid gzip file ({e})") from None
    except OSError as e:
        raise SettingError("path", f"cannot read {str(path)!r}: {e.strerror or e}") from None


def _split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Lines of a stream of bytes, split at ``\n``, ``\r\n`` or a bare ``\r`` (old Mac files,
    which would otherwise be one long line); a final line break opens no new line."""
    pending: list[bytes] = []
    for chunk in chunks:
        if b"\n" not in chunk and b"\r" not in chunk:
            pending.append(chunk)
            continue
        buf = b"".join((*pending, chunk)) if pending else chunk
        pending = []
        hold = buf.endswith(b"\r")  # perhaps the first half of a \r\n split between chunks
        if hold:
            buf = buf[:-1]
        parts = buf.split(b"\n") if b"\r" not in buf else _LINE_BREAK.split(buf)
        rest = parts.pop()
        yield from parts
        if rest or hold:
            pending = [rest + (b"\r" if hold else b"")]
    rest = b"".join(pending)
    if rest:
        parts = _LINE_BREAK.split(rest)
        if parts[-1] == b"":
            parts.pop()
        yield from parts


def _transcoded(chunks: Iterator[bytes], encoding: str, path: Path) -> Iterator[bytes]:
    """``chunks`` of a UTF-16/32 file (its mark dropped) as UTF-8; a ValueError naming the
    encoding when they do not decode."""
    decoder = codecs.getincrementaldecoder(encoding.lower())()
    done = 0  # bytes decoded so far, for the error's position
    try:
        for chunk in chunks:
            yield decoder.decode(chunk).encode("utf-8")
            done += len(chunk)
        yield decoder.decode(b"", final=True).encode("utf-8")
    except UnicodeDecodeError as e:
        raise SettingError(
            "path",
            f"{str(path)!r} starts with a {encoding} byte-order mark but is not valid "
            f"{encoding} ({e.reason} near byte {done + e.start}); convert it to UTF-8",
        ) from None


def _nul_encoding(line: bytes) -> str:
    """What a line holding NUL bytes looks like: UTF-16/32 without a byte-order mark (their
    ASCII characters have zero bytes on one side), else binary data."""
    n = len(line)
    if n >= 4 and line[1::4].count(0) + line[2::4].count(0) > n // 2 - 1:
        return "UTF-32 without a byte-order mark"
    odd, even = line[1::2].count(0), line[0::2].count(0)
    if odd >= max(1, (n // 2) * 3 // 4) and odd > even:
        return "UTF-16-LE without a byte-order mark"
    if even >= max(1, (n // 2) * 3 // 4) and even > odd:
        return "UTF-16-BE without a byte-order mark"
    return "binary data, not text"


def _read_lines(path: Path, first_line: int = 1) -> Iterator[bytes]:
    """The lines of ``path`` as UTF-8 bytes (undecodable ones as they are), streamed.

    A UTF-8 byte-order mark is dropped; a UTF-16/32 mark makes the rest be decoded as that
    encoding. A NUL byte stops the reading with a ValueError naming the line and the encoding
    the line looks like (text is never trained on as garbage).
    """
    chunks = _chunks(path)
    head = b""
    for chunk in chunks:  # enough bytes to read a mark (a chunk is 256 KiB, or the file's end)
        head += chunk
        if len(head) >= 4:
            break
    encoding = "UTF-8"
    for bom, name in _BOMS:
        if head.startswith(bom):
            head, encoding = head[len(bom) :], name
            break
    stream: Iterator[bytes] = _prepend(head, chunks)
    if encoding != "UTF-8":
        stream = _transcoded(stream, encoding, path)
    for n, line in enumerate(_split_lines(stream), start=first_line):
        if b"\x00" in line:
            what = _nul_encoding(line) if encoding == "UTF-8" else f"{encoding} holding NULs"
            raise SettingError(
                "path",
                f"line {n} of {str(path)!r} holds NUL bytes: it looks like {what}; qkv "
                "reads UTF-8 text (or UTF-16/UTF-32 starting with a byte-order mark): convert "
                "it, e.g. iconv -f UTF-16 -t UTF-8",
            )
        yield line


def _prepend(head: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if head:
        yield head
    yield from rest


_LINE_BREAK = re.compile(rb"\r\n?|\n")


def _lines(data: bytes) -> list[bytes]:
    """Split raw bytes into lines at ``\\n``, ``\\r\\n`` or a bare ``\\r``; a final line break
    opens no new line (a leading UTF-8 byte-order mark is dropped)."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[3:]
    return list(_split_lines([data]))


def _not_utf8(b: bytes, e: UnicodeDecodeError) -> str:
    """Why ``b`` is not UTF-8, with a guess at what it is."""
    guess = ""
    bad = b[e.start : e.start + 1]
    if bad and 0x80 <= bad[0] <= 0xFF:
        guess = "; Latin-1 or Windows-1252?" if bad[0] >= 0xA0 else "; Windows-1252?"
    return f"{b!r} ({e.reason} at byte {e.start}{guess})"


def _decoded(
    raw: Iterable[bytes], report: ReadReport, first_line: int = 1
) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` for every line that decodes; report the others."""
    for i, b in enumerate(raw, start=first_line):
        try:
            text = b.decode("utf-8")
        except UnicodeDecodeError as e:
            report.lines += 1
            report.skip("undecodable", i, _not_utf8(b, e))
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
            raise SettingError(
                arg,
                f"{wanted!r} matches several of the {where} when case is ignored: "
                f"{[names[i] for i in hits]}; pass the exact name",
            )
        raise SettingError(arg, f"{wanted!r} is not among the {where}: {list(names)}")
    for name in defaults:
        if name.casefold() in folded:
            return folded.index(name.casefold())
    raise SettingError(
        arg,
        f"none of the default names {list(defaults)} is among the {where} "
        f"{list(names)}; pass {arg}= to choose one",
    )


def _keep(report: ReadReport, n: int, src: str, tgt: str, raw: str) -> tuple[str, str] | None:
    """The pair stripped, or None (and the line reported) when a side is empty."""
    src, tgt = src.strip(), tgt.strip()
    if not src and not tgt:
        report.skip("blank_line", n, raw)
    elif not src:
        report.skip("empty_source", n, raw)
    elif not tgt:
        report.skip("empty_target", n, raw)
    else:
        return src, tgt
    return None


# A header row in a file without one: language codes (ISO 639-1, and common 639-2/3 ones) or
# names, optionally with a region or script (en-US, pt_BR, zh-Hans), or the usual column names.
def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_LANG_CODES = _words(
    "aa ab af ak am an ar as av ay az ba be bg bh bi bm bn bo br bs ca ce ch co cr cs cu cv cy "
    "da de dv dz ee el en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he hi ho hr ht "
    "hu hy hz ia id ie ig ii ik io is it iu ja jv ka kg ki kj kk kl km kn ko kr ks ku kv kw ky "
    "la lb lg li ln lo lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd ne ng nl nn no nr nv ny "
    "oc oj om or os pa pi pl ps pt qu rm rn ro ru rw sa sc sd se sg si sk sl sm sn so sq sr ss "
    "st su sv sw ta te tg th ti tk tl tn to tr ts tt tw ty ug uk ur uz ve vi vo wa wo xh yi yo "
    "za zh zu ara ben bul cat ces cmn cze dan deu dut ell eng epo est eus fas fin fra fre ger "
    "gre heb hin hrv hun ind isl ita jpn kor lat lit lav nld nob nor per pol por ron rum rus "
    "slk slv spa srp swe tha tur ukr urd vie yue zho chi"
)
_LANG_NAMES = _words(
    "arabic bengali bulgarian catalan chinese croatian czech danish dutch english esperanto "
    "estonian finnish french german greek hebrew hindi hungarian icelandic indonesian irish "
    "italian japanese korean latin latvian lithuanian norwegian persian polish portuguese "
    "romanian russian serbian slovak slovenian spanish swedish thai turkish ukrainian urdu "
    "vietnamese welsh"
)
_COLUMN_NAMES = _words(
    " ".join((*_SRC_NAMES, *_TGT_NAMES))
    + " text sentence sentences translation translations original reference references"
    " input output src_text tgt_text source_text target_text source_sentence"
    " target_sentence src_lang tgt_lang lang1 lang2 text1 text2 sentence1 sentence2"
)
_REGION = re.compile(r"^([a-z]{2,3})(?:[-_][a-z]{2,4})?$")


def _header_word(word: str) -> bool:
    w = word.strip().casefold()
    m = _REGION.match(w)
    return (m is not None and m.group(1) in _LANG_CODES) or w in _LANG_NAMES or w in _COLUMN_NAMES


def _looks_like_header(cols: Sequence[str]) -> bool:
    """Whether the first line of a fra file is a header row: its first two columns are two
    different header words (``en``/``fr``, ``English``/``French``, ``source``/``target``)."""
    if len(cols) not in (2, 3):
        return False
    a, b = cols[0].strip().casefold(), cols[1].strip().casefold()
    return a != b and _header_word(a) and _header_word(b)


def _read_fra(lines: Iterator[bytes], report: ReadReport) -> Iterator[tuple[str, str]]:
    for n, line in _decoded(lines, report):
        report.lines += 1
        if not line.strip():
            report.skip("blank_line", n, line)
            continue
        cols = line.split("\t")
        if len(cols) not in (2, 3):
            report.skip("wrong_column_count", n, f"{len(cols)} columns: {line}")
            continue
        if n == 1 and _looks_like_header(cols):
            report.skip("header_row", n, line)
            continue
        if (pair := _keep(report, n, cols[0], cols[1], line)) is not None:
            yield pair


def _header(
    lines: Iterator[bytes],
    delimiter: str,
    src_column: str | None,
    tgt_column: str | None,
    path: str,
) -> tuple[int, int, int] | None:
    """``(source index, target index, number of columns)`` from the header row (the first of
    ``lines``, consumed); None for an empty file."""
    first = next(lines, None)
    if first is None:
        return None
    try:
        header_text = first.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SettingError(
            "path", f"the header row of {path!r} is not valid UTF-8 ({e.reason})"
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
    report: ReadReport,
    n: int,
    row: list[str],
    s: int,
    t: int,
    width: int,
    delimiter: str,
) -> tuple[str, str] | None:
    text = delimiter.join(row)
    if not row or not any(c.strip() for c in row):
        report.skip("blank_line", n, text)
    elif len(row) != width:
        report.skip("wrong_column_count", n, f"{len(row)} columns, header has {width}: {text}")
    else:
        return _keep(report, n, row[s], row[t], text)
    return None


def _read_tsv(
    lines: Iterator[bytes], report: ReadReport, src_column: str | None, tgt_column: str | None
) -> Iterator[tuple[str, str]]:
    """One record per physical line, split on tabs; no quoting (``"`` is ordinary text)."""
    head = _header(lines, "\t", src_column, tgt_column, report.path)
    if head is None:
        return
    s, t, width = head
    for n, line in _decoded(lines, report, first_line=2):
        report.lines += 1
        if (pair := _row(report, n, line.split("\t"), s, t, width, "\t")) is not None:
            yield pair


def _read_csv(
    lines: Iterator[bytes], report: ReadReport, src_column: str | None, tgt_column: str | None
) -> Iterator[tuple[str, str]]:
    """CSV with quoting; every physical line is counted, and a quote left open is reported.

    Streamed: only the lines of the record being read are held (at most
    :data:`MAX_RECORD_LINES`), so a record that cannot be read costs its first line and the
    reading goes on one line after it.
    """
    head = _header(lines, ",", src_column, tgt_column, report.path)
    if head is None:
        return
    s, t, width = head
    source = _decoded(lines, report, first_line=2)
    pending: deque[tuple[int, str]] = deque()  # lines to read again (after a broken record)
    record: list[tuple[int, str]] = []  # the lines the reader took for the record it reads
    state = {"ran_out": False}

    def feed() -> Iterator[str]:
        while len(record) < MAX_RECORD_LINES:
            item = pending.popleft() if pending else next(source, None)
            if item is None:
                break
            record.append(item)
            yield item[1] + "\n"
        state["ran_out"] = True  # asked for a line past the end (or past the cap)

    reader = None
    while True:
        if reader is None:  # one reader until a record breaks, then one from the next line
            state["ran_out"] = False
            reader = csv.reader(feed(), delimiter=",", strict=False)
        try:
            row = next(reader)
            broken = "unterminated_quote" if state["ran_out"] else None
            error = ""
        except StopIteration:
            if not record:
                return
            row, broken, error = [], "unterminated_quote", ""
        except csv.Error as e:
            row, error = [], f"{e}: "
            broken = "field_too_large" if "field limit" in str(e) else "csv_error"
        n, text = record[0]
        if broken is not None:  # costs the record's first line; the others are read again
            report.lines += 1
            report.skip(broken, n, error + text)
            pending.extendleft(reversed(record[1:]))
            reader = None
        else:
            report.lines += len(record)
            if (pair := _row(report, n, row, s, t, width, ",")) is not None:
                yield pair
        record.clear()


def _read_jsonl(
    lines: Iterator[bytes], report: ReadReport, src_column: str | None, tgt_column: str | None
) -> Iterator[tuple[str, str]]:
    src_key, tgt_key = src_column, tgt_column
    for n, line in _decoded(lines, report):
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
        if (pair := _keep(report, n, s, t, line)) is not None:
            yield pair


def _read_aligned(a: Path, b: Path, report: ReadReport) -> Iterator[tuple[str, str]]:
    na = nb = 0
    for n, (ra, rb) in enumerate(zip_longest(_read_lines(a), _read_lines(b)), start=1):
        na, nb = na + (ra is not None), nb + (rb is not None)
        if ra is None or rb is None:  # one file ended: count the other's lines, then refuse
            continue
        report.lines += 1
        try:
            sa, sb = ra.decode("utf-8"), rb.decode("utf-8")
        except UnicodeDecodeError as e:
            which = a.name if _bad(ra) else b.name
            report.skip("undecodable", n, f"{which}: {e.reason} at byte {e.start}")
            continue
        if (pair := _keep(report, n, sa, sb, f"{sa}\t{sb}")) is not None:
            yield pair
    if na != nb:
        raise SettingError(
            "path",
            f"aligned files must have the same number of lines, got {na} in "
            f"{str(a)!r} and {nb} in {str(b)!r}; the pairs cannot be trusted",
        )


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
    lines = _read_lines(Path(path))
    first = next(lines, b"")
    lines.close()  # only the first line is read
    head = first.decode("utf-8", errors="replace").strip()
    if head.startswith("{"):
        return "jsonl"
    cols = [c.strip().lower() for c in head.split("\t")]
    if any(c in _SRC_NAMES for c in cols) and any(c in _TGT_NAMES for c in cols):
        return "tsv"
    return "fra"


def iter_pairs(
    path: PathLike | tuple[PathLike, PathLike] | list[PathLike],
    format: str | None = None,
    *,
    src_column: str | None = None,
    tgt_column: str | None = None,
    max_examples: int = 5,
) -> tuple[Iterator[tuple[str, str]], ReadReport]:
    """The pairs of :func:`read_pairs` as a stream: only the line being read is held.

    The arguments are checked (and the format guessed) at once; the file's own errors come
    from the stream as it reaches them, with the messages of :func:`read_pairs`, the last one
    (no pair at all) at its end.

    Returns:
        ``(stream, report)``: an iterator of ``(source, target)`` pairs in file order, and the
        :class:`ReadReport` it fills in as it goes (complete once the stream is exhausted).
    """
    if format is not None and format not in FORMATS:
        raise SettingError("format", f"expected one of {FORMATS} or None, got {format!r}")
    for name, col in (("src_column", src_column), ("tgt_column", tgt_column)):
        if col is not None and (not isinstance(col, str) or not col.strip()):
            raise SettingError(name, f"expected a column name, got {col!r}")
    named = src_column is not None or tgt_column is not None
    if format is None:
        format = guess_format(path)
        if format == "fra" and named:  # the columns are named: the first line names them
            format = "tsv"
    if named and format in ("fra", "aligned"):
        arg = "src_column" if src_column is not None else "tgt_column"
        raise SettingError(
            arg,
            f"the {format} format has no named columns (source first, then target); "
            "name columns in a tsv, csv or jsonl file",
        )
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
        pairs: Iterator[tuple[str, str]] = _read_aligned(a, b, report)
    else:
        if isinstance(path, (tuple, list)):
            raise TypeError(
                f"path must be one file for format={format!r}, got {len(path)} paths; "
                "a pair of paths is read as format='aligned'"
            )
        p = Path(path)
        report = ReadReport(str(p), format, max_examples=max_examples)
        lines = _read_lines(p)
        if format == "fra":
            pairs = _read_fra(lines, report)
        elif format == "jsonl":
            pairs = _read_jsonl(lines, report, src_column, tgt_column)
        else:
            read = _read_tsv if format == "tsv" else _read_csv
            pairs = read(lines, report, src_column, tgt_column)
    return _counted(pairs, report), report


def _counted(pairs: Iterator[tuple[str, str]], report: ReadReport) -> Iterator[tuple[str, str]]:
    """``pairs``, counted into ``report.pairs``; a ValueError saying why at the end of a file
    that gave none."""
    for pair in pairs:
        report.pairs += 1
        yield pair
    if not report.pairs:
        if report.lines == 0:
            why = "it has no data lines"
        else:
            why = f"all {report.lines} lines were skipped:\n{report}"
        raise SettingError("path", f"no sentence pair could be read from {report.path}: {why}")


def read_pairs(
    path: PathLike | tuple[PathLike, PathLike] | list[PathLike],
    format: str | None = None,
    *,
    src_column: str | None = None,
    tgt_column: str | None = None,
    max_examples: int = 5,
) -> tuple[list[tuple[str, str]], ReadReport]:
    """Read ``(source, target)`` sentence pairs from a file in any supported format.

    The file is read as a stream of lines (never loaded whole); it must be a regular file.
    :func:`iter_pairs` gives the same pairs one at a time, for a corpus too large to hold.

    Args:
        path: a file, or a pair ``(source_file, target_file)`` (tuple or list) of aligned
            files. Names ending in ``.gz`` are decompressed.
        format: one of :data:`FORMATS`, or None to guess it (see :func:`guess_format`; a
            tab-separated file guessed ``"fra"`` is read as ``"tsv"`` when a column is named).
        src_column, tgt_column: column (tsv/csv header) or field (jsonl) names; default the
            first present of ``src``/``source`` and ``tgt``/``target``. Header names match
            regardless of case; jsonl field names exactly.
        max_examples: how many skipped lines of each reason the report keeps.

    Returns:
        ``(pairs, report)``: a list of ``(source, target)`` strings, each side stripped of
        surrounding whitespace and non-empty, in file order; and a :class:`ReadReport`.

    Raises:
        ValueError: an unknown format, a missing column, aligned files of different lengths,
            a file that is not a regular file, a bad or truncated ``.gz``, a NUL byte (UTF-16
            or UTF-32 without its byte-order mark, binary data), or a file from which no pair
            could be read (the message says why).
        FileNotFoundError: ``path`` does not exist.
    """
    stream, report = iter_pairs(
        path, format, src_column=src_column, tgt_column=tgt_column, max_examples=max_examples
    )
    return list(stream), report


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
