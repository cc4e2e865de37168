"""Issue 17: data files in other encodings, NUL bytes, headers, non-files and large files.

Every case here was read as garbage (or hung) before: a UTF-16 file became pairs of
``"G\\x00o\\x00."``, a ``.tsv`` whose header says ``en<TAB>fr`` trained on the pair
``("en", "fr")``, a FIFO blocked forever, and every file was loaded whole (``.gz`` decompressed
whole) before its first line was read.
"""

from __future__ import annotations

import gzip
import os
import threading
import time
import tracemalloc

import pytest

from qkv.data import guess_format, read_pairs

PAIRS = [("Go.", "Va !"), ("Élève ?", "Étudiant·e ?"), ("I lost.", "J'ai perdu.")]
TEXT = "".join(f"{s}\t{t}\tCC-BY 2.0\r\n" for s, t in PAIRS)


@pytest.mark.parametrize(
    "encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"]
)
@pytest.mark.parametrize("gz", [False, True])
def test_utf16_and_utf32_with_a_byte_order_mark_are_decoded(tmp_path, encoding, gz):
    bom = "\ufeff" if encoding.endswith(("-le", "-be")) else ""
    data = (bom + TEXT).encode(encoding)  # "utf-16"/"utf-32" write their own mark
    assert data[:2] in (b"\xff\xfe", b"\xfe\xff") or data[:4] in (
        b"\xff\xfe\x00\x00",
        b"\x00\x00\xfe\xff",
    )
    p = tmp_path / ("fra.txt.gz" if gz else "fra.txt")
    p.write_bytes(gzip.compress(data) if gz else data)
    pairs, report = read_pairs(p)
    assert pairs == PAIRS
    assert report.format == "fra" and report.n_skipped == 0


def test_utf16_tsv_and_jsonl_with_a_byte_order_mark(tmp_path):
    t = tmp_path / "d.tsv"
    t.write_bytes(("src\ttgt\n" + "".join(f"{s}\t{x}\n" for s, x in PAIRS)).encode("utf-16"))
    assert guess_format(t) == "tsv"
    assert read_pairs(t)[0] == PAIRS
    j = tmp_path / "d.jsonl"
    j.write_bytes('\ufeff{"src": "Élève ?", "tgt": "Étudiant·e ?"}\n'.encode("utf-16-be"))
    assert read_pairs(j)[0] == [PAIRS[1]]


def test_a_utf8_byte_order_mark_is_dropped_before_a_header(tmp_path):
    p = tmp_path / "d.tsv"
    p.write_bytes(b"\xef\xbb\xbfsource\ttarget\nGo.\tVa !\n")
    assert guess_format(p) == "tsv"
    pairs, report = read_pairs(p)
    assert pairs == [("Go.", "Va !")] and report.n_skipped == 0


@pytest.mark.parametrize(
    ("encoding", "named"),
    [("utf-16-le", "UTF-16-LE"), ("utf-16-be", "UTF-16-BE"), ("utf-32-le", "UTF-32")],
)
def test_utf16_or_utf32_without_a_mark_is_refused_naming_it(tmp_path, encoding, named):
    p = tmp_path / "fra.txt"
    p.write_bytes(TEXT.encode(encoding))  # no byte-order mark: NUL bytes everywhere
    with pytest.raises(ValueError, match=rf"line 1 of .* holds NUL bytes: .*{named}"):
        read_pairs(p)


def test_a_nul_byte_refuses_the_file_at_its_line(tmp_path):
    p = tmp_path / "fra.txt"
    p.write_bytes(b"Go.\tVa !\nHi.\tSalut !\nRun\x00!\tCours !\n")
    with pytest.raises(ValueError, match=r"path: line 3 of .*fra\.txt' holds NUL bytes"):
        read_pairs(p)


def test_a_bad_mark_encoding_is_named(tmp_path):
    p = tmp_path / "fra.txt"
    p.write_bytes(b"\xff\xfe" + "Go.\tVa !\n".encode("utf-16-le") + b"\x00\xd8")  # lone surrogate
    with pytest.raises(ValueError, match="UTF-16-LE byte-order mark but is not valid UTF-16-LE"):
        read_pairs(p)


def test_latin1_lines_are_reported_with_the_encoding_guessed(tmp_path):
    p = tmp_path / "fra.txt"
    p.write_bytes("Go.\tVa !\nCafé.\tCafé.\n".encode("latin-1"))
    pairs, report = read_pairs(p)
    assert pairs == [("Go.", "Va !")]
    assert report.skipped == {"undecodable": 1}
    ((n, text),) = report.examples["undecodable"]
    assert n == 2 and "Latin-1" in text
    assert "not valid UTF-8" in report.summary() and "iconv" in report.summary()


@pytest.mark.parametrize(
    "header", ["en\tfr", "English\tFrench\tattribution", "eng\tfra", "en-US\tfr_FR", "src\ttgt"]
)
def test_a_header_row_is_never_a_training_pair(tmp_path, header):
    p = tmp_path / "data.tsv"
    p.write_text(f"{header}\nGo.\tVa !\nHi.\tSalut !\n", encoding="utf-8")
    pairs, report = read_pairs(p)
    assert pairs == [("Go.", "Va !"), ("Hi.", "Salut !")]
    if report.format == "fra":  # no column named src/tgt: the header is skipped, and said
        assert report.skipped == {"header_row": 1}
        assert report.n_unreadable == 0  # not lost data: --strict does not refuse it
    # the fra format given explicitly skips it too
    assert read_pairs(p, format="fra")[0] == pairs or header == "src\ttgt"


def test_a_first_pair_that_is_not_a_header_is_kept(tmp_path):
    p = tmp_path / "fra.txt"
    p.write_text("Hi\tSalut\nla\tle\n", encoding="utf-8")  # "hi" is a code, "salut" is not
    assert read_pairs(p)[0] == [("Hi", "Salut"), ("la", "le")]


def test_named_columns_make_a_tab_file_a_tsv(tmp_path):
    p = tmp_path / "data.tsv"
    p.write_text("id\ten\tfr\n1\tGo.\tVa !\n", encoding="utf-8")
    pairs, report = read_pairs(p, src_column="en", tgt_column="fr")
    assert pairs == [("Go.", "Va !")] and report.format == "tsv"
    with pytest.raises(ValueError, match="src_column: the fra format has no named columns"):
        read_pairs(p, format="fra", src_column="en", tgt_column="fr")


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "data.fifo"
    os.mkfifo(fifo)

    def writer():  # a writer appears (so the old code did not hang): it wrote a pair
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.01)
                continue
            os.write(fd, b"Go.\tVa !\n")
            os.close(fd)  # and serves the next open, until the deadline

    threading.Thread(target=writer, daemon=True).start()
    with pytest.raises(ValueError, match=r"is a FIFO \(named pipe\); expected a regular file"):
        read_pairs(fifo, format="fra")


def test_a_device_is_refused():
    with pytest.raises(ValueError, match="is a character device; expected a regular file"):
        read_pairs("/dev/null", format="fra")
    with pytest.raises(ValueError, match="character device"):
        guess_format("/dev/zero")  # would never end


@pytest.mark.parametrize("gz", [False, True])
def test_large_files_are_streamed_not_loaded_whole(tmp_path, gz):
    # 16 MB of blank lines around two pairs: reading it must not hold the file in memory
    body = b"Go.\tVa !\n" + (b" " * 99 + b"\n") * 160_000 + b"Hi.\tSalut !\n"
    p = tmp_path / ("big.txt.gz" if gz else "big.txt")
    p.write_bytes(gzip.compress(body, compresslevel=1) if gz else body)
    tracemalloc.start()
    try:
        pairs, report = read_pairs(p, format="fra")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert pairs == [("Go.", "Va !"), ("Hi.", "Salut !")]
    assert report.skipped == {"blank_line": 160_000}
    assert peak < len(body) / 4, f"peak {peak / 1e6:.1f} MB for a {len(body) / 1e6:.1f} MB file"


def test_large_csv_is_streamed(tmp_path):
    # a CSV reader holds the lines of the record it reads, not the file
    body = b"src,tgt\n" + b'"a, b",c\n' + (b" " * 99 + b"\n") * 160_000 + b'"x\ny",z\n'
    p = tmp_path / "big.csv"
    p.write_bytes(body)
    tracemalloc.start()
    try:
        pairs, report = read_pairs(p)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert pairs == [("a, b", "c"), ("x\ny", "z")]
    assert report.lines == 160_003
    assert peak < len(body) / 4, f"peak {peak / 1e6:.1f} MB for a {len(body) / 1e6:.1f} MB file"


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"Go.\tVa !\n", "is not a valid gzip file"),
        (gzip.compress(b"Go.\tVa !\n" * 100)[:-12], "is truncated"),
    ],
    ids=["not gzip", "truncated"],
)
def test_a_bad_or_truncated_gz_is_refused(tmp_path, content, match):
    p = tmp_path / "fra.txt.gz"
    p.write_bytes(content)
    with pytest.raises(ValueError, match=rf"path: .*fra\.txt\.gz' {match}"):
        read_pairs(p, format="fra")


def test_empty_and_mark_only_files(tmp_path):
    for data in (b"", b"\xef\xbb\xbf", b"\xff\xfe"):
        p = tmp_path / "e.txt"
        p.write_bytes(data)
        with pytest.raises(ValueError, match="no data lines"):
            read_pairs(p, format="fra")
