"""benchmarks/real_corpus.py and real.py: the catalog parsers, the filters and the degenerate-output
check that the real-data benchmark's figures rest on (no network: hand-made catalogs)."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import real_corpus as rc
from benchmarks.real import degenerate


def _mo(entries: list[tuple[bytes, bytes]], order: str = "<") -> bytes:
    """A .mo file holding ``entries`` (msgid, msgstr), written from the format's description."""
    n = len(entries)
    ids_at, strs_at = 28, 28 + 8 * n
    data_at = 28 + 16 * n
    blob, ids, strs = b"", [], []
    for msgid, _ in entries:
        ids.append((len(msgid), data_at + len(blob)))
        blob += msgid + b"\0"
    for _, msgstr in entries:
        strs.append((len(msgstr), data_at + len(blob)))
        blob += msgstr + b"\0"
    magic = 0x950412DE
    head = struct.pack(order + "7I", magic, 0, n, ids_at, strs_at, 0, 0)
    table = b"".join(struct.pack(order + "2I", *x) for x in ids + strs)
    return head + table + blob


@pytest.mark.parametrize("order", ["<", ">"])
def test_parse_mo_reads_context_plural_and_charset(order):
    data = _mo(
        [
            (b"", b"Content-Type: text/plain; charset=UTF-8\n"),
            (b"Open", b"Ouvrir"),
            (b"menu\x04Close", b"Fermer"),
            (b"file\x00files", b"fichier\x00fichiers"),
        ],
        order,
    )
    entries = rc.parse_mo(data)
    got = {(e.msgid, e.msgstr, e.context, e.plural) for e in entries if e.msgid}
    assert got == {
        ("Open", "Ouvrir", "", False),
        ("Close", "Fermer", "menu", False),
        ("file", "fichier", "", True),
    }
    with pytest.raises(ValueError, match="magic"):
        rc.parse_mo(b"\0" * 40)


def test_parse_po_unescapes_and_flags_fuzzy():
    text = r"""
msgid ""
msgstr "Content-Type: text/plain; charset=UTF-8\n"

#, fuzzy
msgid "Save"
msgstr "Enregistrer"

msgctxt "verb"
msgid "Say \"hi\""
msgstr ""
"Dites "
"« salut »"
"""
    entries = [e for e in rc.parse_po(text) if e.msgid]
    assert [(e.msgid, e.msgstr, e.context, e.fuzzy) for e in entries] == [
        ("Save", "Enregistrer", "", True),
        ('Say "hi"', "Dites « salut »", "verb", False),
    ]
    assert rc.entry_reason(entries[0]) == "fuzzy" and rc.entry_reason(entries[1]) is None


@pytest.mark.parametrize(
    ("src", "tgt", "markers", "reason"),
    [
        ("Open file", "Ouvrir le fichier", "", None),
        ("%s files", "%s fichiers", "", "format"),
        ("Hello {name}", "Bonjour {name}", "", "format"),
        ("Cost $1", "Coût $1", "", "format"),
        ("<b>Bold</b>", "<b>Gras</b>", "", "markup"),
        ("See https://x.org", "Voir https://x.org", "", "url"),
        ("Line\nbreak", "Saut\nde ligne", "", "control"),
        ("OK", "Ok", "", "identical"),
        ("...", "...", "", "no_letters"),
        ("~Open", "~Ouvrir", "~", None),
        ("~Open ~now", "~Ouvrir", "~", "accelerator"),
        ("A" * 201, "B" * 10, "", "too_long"),
    ],
)
def test_filters(src, tgt, markers, reason):
    assert rc.keep_pair(src, tgt, markers) == reason


def test_cleaning_strips_accelerators_and_spaces():
    assert rc.clean_pair(" ~Open\u00a0 file ", "Ouv_rir  le\u202ffichier", "~_") == (
        "Open file",
        "Ouvrir le fichier",
        None,
    )
    assert rc.strip_accelerators("Ouv_rir", "_") == "Ouvrir"
    assert rc.strip_accelerators("a_", "_") is None
    assert rc.split_key("Save As...") == rc.split_key("save as") == "saveas"


def test_degenerate_counts_four_in_a_row_only():
    assert degenerate("autre autre autre autre")
    assert not degenerate("autre autre autre fin")
    assert not degenerate("")


def test_the_corpora_of_other_languages_read_their_own_catalogs():
    """en-de and en-zh read the de / zh_CN (zh_Hans) catalogs; Chinese mnemonics in
    parentheses go whole; the French corpus is read as before."""
    names = [
        "x/fr/LC_MESSAGES/a.po", "x/de/LC_MESSAGES/a.po", "x/zh_CN/LC_MESSAGES/a.mo",
        "x/zh_Hans/LC_MESSAGES/b.po", "x/zh_TW/LC_MESSAGES/a.po",
    ]  # fmt: skip
    assert rc._pick_catalogs(names) == ["x/fr/LC_MESSAGES/a.po"]
    assert rc._pick_catalogs(names, rc.CORPORA["de"].locales) == ["x/de/LC_MESSAGES/a.po"]
    assert rc._pick_catalogs(names, rc.CORPORA["zh"].locales) == [
        "x/zh_CN/LC_MESSAGES/a.mo",
        "x/zh_Hans/LC_MESSAGES/b.po",
    ]
    assert rc.clean_pair("~Save", "保存(~S)", "~_", paren_mnemonics=True) == ("Save", "保存", None)
    assert rc.clean_pair("~Open...", "打开（_O）...", "~_", paren_mnemonics=True)[1] == "打开..."
    assert rc.clean_pair("~Save", "保存(~S)", "~_")[1] == "保存(S)"  # the French rules as before
    assert rc.default_cache("de").name == "bench-real-en-de-v1"
    assert {c.lang for c in rc.CORPORA.values()} == {"fr", "de", "zh"}


def test_degenerate_chinese_counts_characters():
    """A Chinese sentence has no spaces: its tokens are sacreBLEU's zh tokens (characters), so
    a character said four times is degenerate, and a sentence is never one long "word"."""
    pytest.importorskip("sacrebleu")
    assert degenerate("使用了了了了无效信息。", tokenize="zh")
    assert not degenerate("使用了了了无效信息。", tokenize="zh")
    assert not degenerate("使用了了了了无效信息。")  # one whitespace word
    assert degenerate("安装 Cinnamon Cinnamon Cinnamon Cinnamon", tokenize="zh")


def test_the_reference_reading_is_recorded_with_its_reference_minutes(tmp_path):
    """benchmarks/real.py's English-French 10-minute row: the probe read 8,194 tokens/s for the
    reference model on a 7.6-minute budget, 20.8 reference minutes (the tier's bound is in
    those); a run that measured nothing records None."""
    import json

    from benchmarks.real import reference_reading

    (tmp_path / "trainer.json").write_text(
        json.dumps({"preset": {"name": "cpu-minutes", "reference_speed": 8194.3}})
    )
    assert reference_reading(tmp_path, 7.6) == {
        "reference_speed": 8194,
        "reference_minutes": 20.8,
    }
    (tmp_path / "trainer.json").write_text(json.dumps({"preset": {"reference_speed": None}}))
    assert reference_reading(tmp_path, 7.6) == {"reference_speed": None, "reference_minutes": None}
    assert reference_reading(tmp_path / "missing", 7.6)["reference_speed"] is None
