"""``qkv translate --src FILE --output FILE`` on documents, chosen by extension (or
``--format``): every format round-trips through the command with a tiny model; document
flags checked; limits and unreadable files named."""

from __future__ import annotations

import io
import zipfile

import pytest
from _tiny_models import shared_translator

from qkv.cli import main
from qkv.data import bundled_pairs
from qkv.inference import BUNDLED_DATA, Decoding, save_model
from qkv.text import Limits, format_of, read_document, translate_document
from qkv.translate import Translator

PAIRS = bundled_pairs()[:600]
ONE, TWO = (s[0].upper() + s[1:] for s, _ in PAIRS[40:42])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    m, src, tgt = shared_translator()
    out = tmp_path_factory.mktemp("documents") / "model"
    return save_model(m, src, tgt, out, decoding=Decoding(), card={"data": BUNDLED_DATA})


def _docx() -> bytes:
    docx = pytest.importorskip("docx")
    d = docx.Document()
    p = d.add_paragraph(ONE + " ")
    p.add_run(TWO).bold = True
    buf = io.BytesIO()
    d.save(buf)
    return buf.getvalue()


def _odt() -> bytes:
    odfdo = pytest.importorskip("odfdo")
    o = odfdo.Document("text")
    o.body.clear()
    o.body.append(odfdo.Paragraph(f"{ONE} {TWO}"))
    buf = io.BytesIO()
    o.save(buf)
    return buf.getvalue()


def _members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {n: z.read(n) for n in z.namelist()}


FILES = {
    "page.html": lambda: f"<p>{ONE} <b>{TWO}</b></p>".encode(),
    "film.srt": lambda: f"1\n00:00:01,000 --> 00:00:02,000\n{ONE}\n{TWO}\n\n".encode(),
    "film.vtt": lambda: f"WEBVTT\n\n00:01.000 --> 00:02.000\n{ONE}\n".encode(),
    "fr.po": lambda: (
        f'msgid ""\nmsgstr ""\n"Language: fr\\n"\n\nmsgid "{ONE}"\nmsgstr ""\n'.encode()
    ),
    "ui.xliff": lambda: (
        '<?xml version="1.0" encoding="UTF-8"?>\n<xliff version="1.2" '
        'xmlns="urn:oasis:names:tc:xliff:document:1.2"><file original="a" source-language="en" '
        f'datatype="plaintext"><body><trans-unit id="1"><source>{ONE}</source></trans-unit>'
        "</body></file></xliff>"
    ).encode(),
    "notes.md": lambda: f"# {ONE}\n\n```\n{TWO}\n```\n".encode(),
    "letter.docx": _docx,
    "letter.odt": _odt,
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_qkv_translate_writes_every_document_format(model, tmp_path, name):
    data = FILES[name]()
    src, out = tmp_path / name, tmp_path / f"out-{name}"
    src.write_bytes(data)
    args = ["translate", "--model-dir", str(model), "--src", str(src), "--output", str(out)]
    assert main([*args, "--quiet"]) == 0
    tr = Translator.load(model)
    got, want = out.read_bytes(), translate_document(data, tr, format_of(name))
    if name.endswith((".docx", ".odt")):  # zip files: their members (not their times) alike
        got, want = _members(got), _members(want)
    assert got == want
    again = read_document(out.read_bytes(), format_of(name), source="fr", target="en")
    assert again.render(list(again.segments))  # the output reads back in its own format


def test_format_reads_stdin_and_writes_stdout(model, monkeypatch, capsysbinary):
    page = f"<p>{ONE}</p>".encode()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(page)))
    assert main(["translate", "--model-dir", str(model), "--format", "html", "--quiet"]) == 0
    tr = Translator.load(model)
    assert capsysbinary.readouterr().out == translate_document(page, tr, "html")


def test_document_flags_are_checked(model, tmp_path, capsys):
    src = tmp_path / "a.docx"
    src.write_bytes(b"x")
    base = ["translate", "--model-dir", str(model), "--src", str(src)]
    assert main(base) == 2
    assert "--output: a docx document is written to a file" in capsys.readouterr().err
    assert main([*base, "--output", str(tmp_path / "b.docx"), "--n-best", "2"]) == 2
    assert "--n-best: expected 1 for a docx document" in capsys.readouterr().err
    assert main([*base, "--output", str(tmp_path / "b.docx")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv translate: error: --src: expected a .docx file"), err
    assert not (tmp_path / "b.docx").exists()


def test_limits_are_checked_as_the_file_is_read():
    from qkv._errors import SettingError

    data = f"{ONE} {TWO}\n{ONE}\n".encode()
    with pytest.raises(SettingError, match=r"^max_bytes: the file has \d+ bytes"):
        read_document(data, "txt", limits=Limits(max_bytes=10))
    with pytest.raises(SettingError, match=r"^max_chars: the text to translate has"):
        read_document(data, "txt", limits=Limits(max_chars=len(ONE)))
    with pytest.raises(SettingError, match=r"^max_segments: the text to translate has 2"):
        read_document(data, "txt", limits=Limits(max_segments=1))
    with pytest.raises(SettingError, match=r"^max_chars: expected an int >= 1"):
        Limits(max_chars=0)
    assert read_document(data, "txt", limits=Limits(10_000, 10_000, 2)).segments


def test_the_format_choices_are_the_librarys_formats():
    """--format lists qkv.text.FORMATS (typed in the command so --help loads nothing)."""
    from qkv.cli.translate import _DOCUMENT_NEEDS, DOCUMENTS
    from qkv.text import FORMATS

    assert set(DOCUMENTS) == set(FORMATS) - {"txt"}
    assert set(_DOCUMENT_NEEDS) <= set(DOCUMENTS)
