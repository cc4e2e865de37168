"""Catalogs: gettext and XLIFF entries filled and marked for review, plurals, comments, flags,
translated and obsolete entries kept; checked by GNU gettext's own msgfmt where it is
installed, and read back by the Translate Toolkit."""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest

from qkv.text import read_document

pytest.importorskip("translate.storage.pypo", reason="the documents extra reads catalogs")
from translate.storage import pypo, xliff

PO = r"""# French translation of qkv.
# Copyright (C) 2026 the qkv developers
msgid ""
msgstr ""
"Project-Id-Version: qkv 0.1\n"
"Content-Type: text/plain; charset=UTF-8\n"
"Content-Transfer-Encoding: 8bit\n"
"Language: \n"
"Plural-Forms: nplurals=2; plural=(n > 1);\n"

#. TRANSLATORS: shown when the model is loaded
#: src/qkv/cli/translate.py:12 src/qkv/cli/serve.py:40
#, python-format
msgid "I am home. He is calm."
msgstr ""

#: src/qkv/a.py:3
msgid ""
"First line.\n"
"Second line."
msgstr ""

msgid "One file"
msgid_plural "%d files"
msgstr[0] ""
msgstr[1] ""

msgid "Done."
msgstr "Fait."

#, fuzzy
msgid "Stop."
msgstr "Arrêt ?"

#~ msgid "Old."
#~ msgstr ""
"""


def _shout(segments):
    return [s.upper() for s in segments]


def _units(data: bytes):
    return {str(u.source): u for u in pypo.pofile.parsestring(data).units if not u.isheader()}


def test_a_po_catalog_is_filled_for_review_and_keeps_the_rest():
    doc = read_document(PO, "po", source="en", target="fr")
    assert doc.segments == (
        "I am home.", "He is calm.", "First line.", "Second line.", "One file", "%d files",
    )  # fmt: skip
    out = doc.render(_shout(doc.segments))
    units = _units(out)
    home = units["I am home. He is calm."]
    assert str(home.target) == "I AM HOME. HE IS CALM." and home.isfuzzy()
    assert "python-format" in str(home.typecomments) and "TRANSLATORS" in home.getnotes()
    assert home.getlocations() == ["src/qkv/cli/translate.py:12", "src/qkv/cli/serve.py:40"]
    assert str(units["First line.\nSecond line."].target) == "FIRST LINE.\nSECOND LINE."
    plural = units["One file"]
    assert [str(s) for s in plural.target.strings] == ["ONE FILE", "%D FILES"]
    assert str(units["Done."].target) == "Fait." and not units["Done."].isfuzzy()
    assert str(units["Stop."].target) == "Arrêt ?"  # a draft a person made: kept
    assert units["Old."].isobsolete()
    assert b'"Language: fr\\n"' in out
    assert b"# Copyright (C) 2026 the qkv developers" in out


@pytest.mark.skipif(shutil.which("msgfmt") is None, reason="GNU gettext's msgfmt")
def test_msgfmt_reads_the_output_and_counts_the_drafts_fuzzy(tmp_path):
    rng = random.Random(39)
    words = ["home", "calm", "we", "go", "the", "red", "car"]
    entries = []
    for i in range(80):
        msg = " ".join(rng.choices(words, k=rng.randint(1, 6))).capitalize() + f" {i}."
        done = rng.random() < 0.3
        entries.append(f'msgid "{msg}"\nmsgstr "{"Fait " + str(i) if done else ""}"\n')
    head = 'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
    data = (head + "\n".join(entries)).encode()
    doc = read_document(data, "po", source="en", target="fr")
    path = tmp_path / "fr.po"
    path.write_bytes(doc.render(_shout(doc.segments)))
    done = sum("Fait" in e for e in entries)
    run = subprocess.run(
        ["msgfmt", "--check", "--statistics", "-o", "/dev/null", str(path)],
        capture_output=True,
        text=True,
        env={"LC_ALL": "C"},
    )
    assert run.returncode == 0, run.stderr
    assert f"{done} translated messages, {80 - done} fuzzy translations" in run.stderr


def test_a_language_of_one_plural_form_gets_the_plural():
    po = PO.replace("nplurals=2; plural=(n > 1);", "nplurals=1; plural=0;").replace(
        'msgstr[0] ""\nmsgstr[1] ""', 'msgstr[0] ""'
    )
    doc = read_document(po, "po", source="en", target="zh")
    units = _units(doc.render(_shout(doc.segments)))
    assert [str(s) for s in units["One file"].target.strings] == ["%D FILES"]


XLIFF = """<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">
  <file original="ui.txt" source-language="en" target-language="fr" datatype="plaintext">
    <body>
      <trans-unit id="hello"><source>I am home. He is calm.</source><note>a note</note></trans-unit>
      <trans-unit id="done"><source>Done.</source><target state="final">Fait.</target></trans-unit>
    </body>
  </file>
</xliff>"""


def test_an_xliff_file_is_filled_for_review():
    doc = read_document(XLIFF, "xliff", source="en", target="fr")
    assert doc.segments == ("I am home.", "He is calm.")
    out = doc.render(["Je suis chez moi.", "Il est calme."])
    store = xliff.xlifffile.parsestring(out)
    hello, done = store.units
    assert (
        hello.getid().endswith("hello") and str(hello.target) == "Je suis chez moi. Il est calme."
    )
    assert hello.isfuzzy() and "a note" in hello.getnotes()
    assert b'state="needs-review-translation"' in out and b'state-qualifier="leveraged-mt"' in out
    assert str(done.target) == "Fait." and b'state="final"' in out


def test_a_file_that_is_no_catalog_is_named():
    from qkv._errors import SettingError

    with pytest.raises(SettingError, match=r"^file: expected a xliff catalog"):
        read_document(b"<not xml", "xliff")
