"""Office files: Word and OpenDocument paragraphs translated, their runs' formatting kept;
read back with python-docx and odfdo, and their XML parsed by lxml."""

from __future__ import annotations

import io
import random
import zipfile

import pytest

from qkv.text import Alignment, read_document

docx = pytest.importorskip("docx")
odfdo = pytest.importorskip("odfdo")
etree = pytest.importorskip("lxml.etree")

WORDS = ["home", "calm", "very", "happy", "the", "red", "car", "we", "go"]


def _random_docx(rng: random.Random) -> tuple[bytes, list[list[tuple[str, bool, bool]]]]:
    d = docx.Document()
    paras = []
    for _ in range(rng.randint(1, 6)):
        p = d.add_paragraph(style=rng.choice([None, "Heading 1", "List Bullet"]))
        runs = []
        for k in range(rng.randint(1, 5)):
            text = " ".join(rng.choices(WORDS, k=rng.randint(1, 4)))
            text = (text.capitalize() if k == 0 else " " + text) + rng.choice(["", ".", ". "])
            r = p.add_run(text)
            r.bold, r.italic = rng.random() < 0.4, rng.random() < 0.3
            runs.append((text, bool(r.bold), bool(r.italic)))
        paras.append(runs)
    table = d.add_table(rows=1, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "Cell one.", "Cell two."
    d.sections[0].header.paragraphs[0].text = "A header."
    buf = io.BytesIO()
    d.save(buf)
    return buf.getvalue(), paras


def _flip(segments):
    return [" ".join(w[::-1] for w in reversed(s.split())) for s in segments]


def test_random_word_files_keep_every_run_and_its_formatting():
    rng = random.Random(39)
    for n in range(25):
        data, paras = _random_docx(rng)
        doc = read_document(data, "docx", source="en", target="fr")
        trans = _flip(doc.segments)
        alignments = None
        if n % 2:
            alignments = {
                i: Alignment(
                    tuple(doc.segments[i].split()),
                    tuple(trans[i].split()),
                    tuple(
                        tuple(rng.random() for _ in doc.segments[i].split())
                        for _ in trans[i].split()
                    ),
                )
                for i in doc.aligned
            }
        out = doc.render(trans, alignments)
        with zipfile.ZipFile(io.BytesIO(out)) as z:
            etree.fromstring(z.read("word/document.xml"))  # well-formed
        back = docx.Document(io.BytesIO(out))
        want = read_document(data, "docx", source="en", target="fr").plan.join(trans)
        got_paras = [p for p in back.paragraphs if p.text.strip()]
        assert [p.text for p in got_paras] == want[: len(got_paras)]
        for p, runs in zip(got_paras, paras):
            assert [(bool(r.bold), bool(r.italic)) for r in p.runs] == [(b, i) for _, b, i in runs]
        assert back.tables[0].cell(0, 1).text == ".owt lleC"
        assert back.sections[0].header.paragraphs[0].text == ".redaeh A"


def test_a_bold_word_stays_bold_where_the_attention_puts_it():
    d = docx.Document()
    p = d.add_paragraph("I see the ")
    p.add_run("red").bold = True
    p.add_run(" car.")
    buf = io.BytesIO()
    d.save(buf)
    doc = read_document(buf.getvalue(), "docx", source="en", target="fr")
    src = ("▁I", "▁see", "▁the", "▁red", "▁car", ".")
    tgt = ("▁Je", "▁vois", "▁la", "▁voiture", "▁rouge", ".")
    order = [0, 1, 2, 4, 3, 5]
    weights = tuple(tuple(0.9 if j == order[t] else 0.02 for j in range(6)) for t in range(6))
    out = doc.render(["Je vois la voiture rouge."], {0: Alignment(src, tgt, weights)})
    runs = docx.Document(io.BytesIO(out)).paragraphs[0].runs
    assert [(r.text, bool(r.bold)) for r in runs] == [
        ("Je vois la voiture ", False),
        ("rouge", True),
        (".", False),
    ]


def test_an_open_document_keeps_its_spans_headings_and_spaces():
    o = odfdo.Document("text")
    o.body.clear()
    o.body.append(odfdo.Header(1, "Title here."))
    p = odfdo.Paragraph("I am ")
    p.append(odfdo.Span("very", style="B"))
    p.append(" happy. He is calm.")
    o.body.append(p)
    buf = io.BytesIO()
    o.save(buf)
    doc = read_document(buf.getvalue(), "odt", source="en", target="fr")
    assert doc.segments == ("Title here.", "I am very happy.", "He is calm.")
    out = doc.render([s.upper() for s in doc.segments])
    back = odfdo.Document(io.BytesIO(out))
    h, para = back.body.get_elements("//text:h | //text:p")
    assert h.text_recursive == "TITLE HERE." and h.get_attribute("text:outline-level") == "1"
    assert para.text_recursive == "I AM VERY HAPPY. HE IS CALM."
    (span,) = para.get_elements("text:span")
    assert span.text == "VERY" and span.get_attribute("text:style-name") == "B"


def test_a_file_that_is_no_office_file_is_named():
    from qkv._errors import SettingError

    with pytest.raises(SettingError, match=r"^file: expected a \.docx file"):
        read_document(b"not a zip", "docx")
    with pytest.raises(SettingError, match=r"^file: expected an \.odt file"):
        read_document(b"not a zip", "odt")
