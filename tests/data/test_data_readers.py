"""read_pairs on small files of every format, broken lines included, and the report."""

from __future__ import annotations

import gzip
import json

import pytest

from qkv.data import ReadReport, guess_format, read_pairs, write_pairs

FRA_3COL = (
    "Go.\tVa !\tCC-BY 2.0 (France) Attribution: tatoeba.org #2877272 (CM) & #1158250 (Wittydev)\n"
    "Hi.\tSalut !\tCC-BY 2.0 (France) Attribution: tatoeba.org #538123 (CM) & #509819 (Aiji)\n"
    "I lost.\tJ'ai perdu.\tCC-BY 2.0 (France) Attribution: tatoeba.org #1 (x) & #2 (y)\n"
)


def test_fra_three_columns_are_kept(tmp_path):
    # the book's loader keeps only 2-column lines and so drops every line of today's fra.txt
    p = tmp_path / "fra.txt"
    p.write_text(FRA_3COL, encoding="utf-8")
    pairs, report = read_pairs(p)
    assert report.format == "fra"
    assert pairs == [("Go.", "Va !"), ("Hi.", "Salut !"), ("I lost.", "J'ai perdu.")]
    assert report.lines == 3 and report.pairs == 3 and report.n_skipped == 0


def test_fra_two_columns_and_crlf(tmp_path):
    p = tmp_path / "fra.txt"
    p.write_bytes(b"Go.\tVa !\r\nRun!\tCours\xc2\xa0!\r\n")
    pairs, report = read_pairs(p, format="fra")
    assert pairs == [("Go.", "Va !"), ("Run!", "Cours\u00a0!")]
    assert report.n_skipped == 0


def test_fra_broken_lines_are_reported_with_line_numbers(tmp_path):
    p = tmp_path / "fra.txt"
    lines = [
        b"Go.\tVa !\tattr",  # 1 ok
        b"just one column",  # 2 wrong columns
        b"",  # 3 blank
        b"\tVide\tattr",  # 4 empty source
        b"Empty.\t \tattr",  # 5 empty target
        b"Caf\xe9.\tCaf\xe9.\tlatin-1 bytes",  # 6 undecodable
        b"a\tb\tc\td",  # 7 four columns
        b"Hi.\tSalut !",  # 8 ok
    ]
    p.write_bytes(b"\n".join(lines) + b"\n")
    pairs, report = read_pairs(p)
    assert pairs == [("Go.", "Va !"), ("Hi.", "Salut !")]
    assert report.lines == 8
    assert report.skipped == {
        "wrong_column_count": 2,
        "blank_line": 1,
        "empty_source": 1,
        "empty_target": 1,
        "undecodable": 1,
    }
    assert [n for n, _ in report.examples["wrong_column_count"]] == [2, 7]
    assert report.examples["undecodable"][0][0] == 6
    assert report.examples["empty_source"][0][0] == 4
    text = str(report)
    assert "8 lines, 2 pairs, 6 skipped" in text
    assert "line 6" in text and "not valid UTF-8" in text


def test_report_keeps_first_examples_and_counts_the_rest(tmp_path):
    p = tmp_path / "fra.txt"
    p.write_text("ok\tok\n" + "bad\n" * 12, encoding="utf-8")
    _, report = read_pairs(p, max_examples=3)
    assert report.skipped["wrong_column_count"] == 12
    assert [n for n, _ in report.examples["wrong_column_count"]] == [2, 3, 4]
    assert "... and 9 more" in str(report)
    assert json.loads(json.dumps(report.to_dict()))["skipped"] == {"wrong_column_count": 12}


def test_file_yielding_nothing_is_an_error_that_says_why(tmp_path):
    p = tmp_path / "fra.txt"
    p.write_text("only one column\nanother\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"no sentence pair.*all 2 lines were skipped"):
        read_pairs(p)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="no data lines"):
        read_pairs(empty)


def test_aligned_files(tmp_path):
    en, fr = tmp_path / "train.en", tmp_path / "train.fr"
    en.write_text("Hello .\n\nThe café is open .\nBye .\n", encoding="utf-8")
    fr.write_bytes("Bonjour .\nVide\nLe café est ouvert .\n".encode() + b"Au revoir \xff.\n")
    pairs, report = read_pairs((en, fr))
    assert report.format == "aligned"
    assert pairs == [("Hello .", "Bonjour ."), ("The café is open .", "Le café est ouvert .")]
    assert report.skipped == {"empty_source": 1, "undecodable": 1}
    assert report.examples["undecodable"][0][0] == 4
    assert "train.fr" in report.examples["undecodable"][0][1]


def test_aligned_files_of_different_lengths_are_refused(tmp_path):
    en, fr = tmp_path / "a.en", tmp_path / "a.fr"
    en.write_text("a\nb\nc\n", encoding="utf-8")
    fr.write_text("x\ny\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"same number of lines, got 3 .* and 2"):
        read_pairs((en, fr))


def test_tsv_with_named_columns(tmp_path):
    p = tmp_path / "data.tsv"
    p.write_text("id\tsource\ttarget\n1\tGo.\tVa !\n2\tHi.\n3\tRun!\tCours !\n", encoding="utf-8")
    pairs, report = read_pairs(p)
    assert report.format == "tsv"
    assert pairs == [("Go.", "Va !"), ("Run!", "Cours !")]
    assert report.examples["wrong_column_count"][0][0] == 3  # the header is line 1


def test_tsv_custom_column_names_and_missing_column(tmp_path):
    p = tmp_path / "data.tsv"
    p.write_text("en\tfr\nGo.\tVa !\n", encoding="utf-8")
    pairs, _ = read_pairs(p, format="tsv", src_column="en", tgt_column="fr")
    assert pairs == [("Go.", "Va !")]
    with pytest.raises(ValueError, match="src_column: none of the default names"):
        read_pairs(p, format="tsv")
    with pytest.raises(ValueError, match="tgt_column: 'de' is not among"):
        read_pairs(p, format="tsv", src_column="en", tgt_column="de")


def test_csv_with_quotes_commas_and_multiline_fields(tmp_path):
    p = tmp_path / "data.csv"
    p.write_text(
        'src,tgt\n"Hello, world.","Bonjour, le monde."\n"Two\nlines",Deux\n,vide\nOk.,D\'accord.\n',
        encoding="utf-8",
    )
    pairs, report = read_pairs(p)
    assert report.format == "csv"
    assert pairs == [
        ("Hello, world.", "Bonjour, le monde."),
        ("Two\nlines", "Deux"),
        ("Ok.", "D'accord."),
    ]
    # the empty source is on physical line 5 (the quoted field spans lines 3-4)
    assert report.examples["empty_source"] == [(5, ",vide")]


def test_jsonl(tmp_path):
    p = tmp_path / "data.jsonl"
    rows = [
        json.dumps({"src": "Go.", "tgt": "Va !"}),
        "{not json",
        json.dumps(["a", "list"]),
        json.dumps({"src": "Hi."}),
        json.dumps({"src": "Café ?", "tgt": "Café ?"}, ensure_ascii=False),
    ]
    p.write_text("\n".join(rows) + "\n", encoding="utf-8")
    pairs, report = read_pairs(p)
    assert report.format == "jsonl"
    assert pairs == [("Go.", "Va !"), ("Café ?", "Café ?")]
    assert report.skipped == {"invalid_json": 2, "missing_field": 1}
    assert report.examples["missing_field"][0][0] == 4


def test_jsonl_custom_fields(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"en": "Go.", "fr": "Va !"}\n', encoding="utf-8")
    pairs, _ = read_pairs(p, src_column="en", tgt_column="fr")
    assert pairs == [("Go.", "Va !")]


def test_gzip_and_bom(tmp_path):
    p = tmp_path / "fra.txt.gz"
    p.write_bytes(gzip.compress("\ufeffGo.\tVa !\tx\n".encode()))
    pairs, _ = read_pairs(p)
    assert pairs == [("Go.", "Va !")]


def test_write_then_read_round_trip(tmp_path):
    pairs = [("Go.", "Va !"), ("Élève ?", "Étudiant·e ?")]
    for name in ("out.txt", "out.txt.gz"):
        write_pairs(tmp_path / name, pairs, attribution="CC0")
        assert read_pairs(tmp_path / name)[0] == pairs
    with pytest.raises(ValueError, match="tabs and newlines"):
        write_pairs(tmp_path / "bad.txt", [("a\tb", "c")])


def test_guess_format(tmp_path):
    fra = tmp_path / "fra.txt"
    fra.write_text(FRA_3COL, encoding="utf-8")
    tsv = tmp_path / "named.tsv"
    tsv.write_text("src\ttgt\na\tb\n", encoding="utf-8")
    plain_tsv = tmp_path / "plain.tsv"
    plain_tsv.write_text("a\tb\n", encoding="utf-8")
    js = tmp_path / "data.txt"
    js.write_text('{"src": "a", "tgt": "b"}\n', encoding="utf-8")
    assert guess_format(fra) == "fra"
    assert guess_format(tsv) == "tsv"
    assert guess_format(plain_tsv) == "fra"
    assert guess_format(js) == "jsonl"
    assert guess_format(tmp_path / "x.csv") == "csv"
    assert guess_format(("a.en", "a.fr")) == "aligned"


def test_bad_arguments(tmp_path):
    p = tmp_path / "fra.txt"
    p.write_text("a\tb\n", encoding="utf-8")
    with pytest.raises(ValueError, match="format: expected one of"):
        read_pairs(p, format="xml")
    with pytest.raises(TypeError, match="tuple"):
        read_pairs(p, format="aligned")
    with pytest.raises(TypeError, match="aligned"):
        read_pairs((p, p), format="fra")
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_pairs(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="directory"):
        read_pairs(tmp_path, format="fra")


def test_report_rejects_unknown_reason():
    with pytest.raises(ValueError, match="reason must be one of"):
        ReadReport("x", "fra").skip("bogus", 1, "")


# -- review fixes: TSV has no quoting, CSV quotes cannot swallow lines, line ends, headers --


def test_tsv_has_no_quoting_every_physical_line_is_a_record(tmp_path):
    # the reviewer's file: a csv.reader with default quoting read ('Hi\tSalut\nBye', 'Au revoir')
    p = tmp_path / "x.tsv"
    p.write_bytes(b'src\ttgt\nok\td\'accord\n"Hi\tSalut\nBye"\tAu revoir\nyes\toui\n')
    pairs, report = read_pairs(p)
    assert report.format == "tsv"
    assert pairs == [("ok", "d'accord"), ('"Hi', "Salut"), ('Bye"', "Au revoir"), ("yes", "oui")]
    assert report.lines == 4 and report.n_skipped == 0


def test_tsv_quotes_are_kept_and_an_open_quote_swallows_nothing(tmp_path):
    p = tmp_path / "q.tsv"
    lines = [b"src\ttgt", b'"Go," he said.\t"Va," dit-il.', b'"oops\tc']
    lines += [b"w%d\tm%d" % (i, i) for i in range(50)]
    p.write_bytes(b"\n".join(lines) + b"\n")
    pairs, report = read_pairs(p)
    assert pairs[:2] == [('"Go," he said.', '"Va," dit-il.'), ('"oops', "c")]
    assert len(pairs) == 52 and report.lines == 52 and report.n_skipped == 0


def test_csv_unterminated_quote_is_reported_and_the_lines_after_it_are_read(tmp_path):
    p = tmp_path / "e.csv"
    p.write_bytes(b"src,tgt\nok,d'accord\n\"hello,bonjour\nhi,salut\nbye,au revoir\n")
    pairs, report = read_pairs(p)
    assert pairs == [("ok", "d'accord"), ("hi", "salut"), ("bye", "au revoir")]
    assert report.skipped == {"unterminated_quote": 1}
    assert report.examples["unterminated_quote"] == [(3, '"hello,bonjour')]
    assert report.lines == 4  # every physical data line is counted once
    assert "quote not closed" in str(report)


def test_csv_quote_spanning_implausibly_many_lines_is_unterminated(tmp_path):
    from qkv.data.readers import MAX_RECORD_LINES

    n = MAX_RECORD_LINES + 5
    body = [f"w{i},m{i}" for i in range(n)]
    p = tmp_path / "long.csv"
    # a stray quote on line 2, "closed" by another stray quote far below
    p.write_text("src,tgt\n" + '"a,b\n' + "\n".join(body) + '\nz",y\nlast,fin\n', encoding="utf-8")
    pairs, report = read_pairs(p)
    assert report.examples["unterminated_quote"][0] == (2, '"a,b')
    assert pairs[:n] == [(f"w{i}", f"m{i}") for i in range(n)]
    assert pairs[-1] == ("last", "fin")
    assert report.lines == n + 3
    # a multi-line quoted field of a plausible length is still one record
    ok = tmp_path / "ok.csv"
    ok.write_text('src,tgt\n"one\ntwo\nthree",un\nx,y\n', encoding="utf-8")
    pairs, report = read_pairs(ok)
    assert pairs == [("one\ntwo\nthree", "un"), ("x", "y")]
    assert report.lines == 4 and report.n_skipped == 0


def test_csv_counts_physical_lines(tmp_path):
    p = tmp_path / "m.csv"
    p.write_bytes(b'src,tgt\r\n"a\r\nb",c\r\nhi,salut\r\n')
    pairs, report = read_pairs(p)
    assert pairs == [("a\nb", "c"), ("hi", "salut")]
    assert report.lines == 3 and report.pairs == 2


def test_csv_field_over_the_size_limit_has_its_own_reason(tmp_path):
    import csv

    p = tmp_path / "f.csv"
    p.write_bytes(b"src,tgt\n" + b"a" * (csv.field_size_limit() + 10) + b",b\nhi,salut\n")
    pairs, report = read_pairs(p)
    assert pairs == [("hi", "salut")]
    assert report.skipped == {"field_too_large": 1}
    assert report.examples["field_too_large"][0][0] == 2
    assert report.lines == 2


def test_header_names_match_regardless_of_case(tmp_path):
    p = tmp_path / "c.tsv"
    p.write_text("ID\tSource\tTarget\n1\thi\tsalut\n", encoding="utf-8")
    assert guess_format(p) == "tsv"
    assert read_pairs(p)[0] == [("hi", "salut")]
    c = tmp_path / "c.csv"
    c.write_text("EN,FR\nhi,salut\n", encoding="utf-8")
    assert read_pairs(c, src_column="en", tgt_column="Fr")[0] == [("hi", "salut")]
    both = tmp_path / "both.csv"
    both.write_text("en,EN,fr\na,b,c\n", encoding="utf-8")
    assert read_pairs(both, src_column="EN", tgt_column="fr")[0] == [("b", "c")]  # exact wins
    with pytest.raises(ValueError, match="several"):
        read_pairs(both, src_column="En", tgt_column="fr")


def test_bare_carriage_returns_end_lines(tmp_path):
    p = tmp_path / "mac.txt"
    p.write_bytes(b"Go.\tVa !\rHi.\tSalut !\r")
    pairs, report = read_pairs(p)
    assert pairs == [("Go.", "Va !"), ("Hi.", "Salut !")]
    assert report.lines == 2
    t = tmp_path / "mac.tsv"
    t.write_bytes(b"src\ttgt\rGo.\tVa !\r\nHi.\tSalut !\r")
    assert read_pairs(t)[0] == [("Go.", "Va !"), ("Hi.", "Salut !")]
    en, fr = tmp_path / "a.en", tmp_path / "a.fr"
    en.write_bytes(b"Go.\rHi.\r")
    fr.write_bytes(b"Va !\nSalut !\n")
    assert read_pairs((en, fr))[0] == [("Go.", "Va !"), ("Hi.", "Salut !")]


def test_aligned_files_as_a_list(tmp_path):
    en, fr = tmp_path / "a.en", tmp_path / "a.fr"
    en.write_text("Go.\n", encoding="utf-8")
    fr.write_text("Va !\n", encoding="utf-8")
    assert guess_format([en, fr]) == "aligned"
    pairs, report = read_pairs([en, fr])
    assert pairs == [("Go.", "Va !")] and report.format == "aligned"
