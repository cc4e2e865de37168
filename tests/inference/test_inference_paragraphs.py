"""Paragraphs and layout through every engine (qkv, CTranslate2, ONNX), from the library and
from ``qkv translate``: a paragraph of two sentences is their two translations joined, three
lines in are three lines out, blank lines and indentation kept, all sentences in one plan;
``--split none`` and ``split="none"`` keep one line one sentence; evaluation never splits."""

from __future__ import annotations

import pytest
from _tiny_models import shared_translator

from qkv.cli import main
from qkv.data import bundled_pairs
from qkv.inference import BUNDLED_DATA, Decoding, save_model
from qkv.translate import Translator

pytest.importorskip("ctranslate2", reason="the ct2 extra (dev) runs the CTranslate2 engine")
pytest.importorskip("onnxruntime", reason="the onnx extra (dev) runs the ONNX engine")
from qkv.export.ctranslate2 import Ct2Translator, export_ctranslate2
from qkv.export.onnx import OnnxTranslator, export_onnx

PAIRS = bundled_pairs()[:600]
# real sentences of the bundled corpus, capitalised as a person writes them
ONE, TWO, THREE = (s[0].upper() + s[1:] for s, _ in PAIRS[40:43])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    model, src, tgt = shared_translator()
    out = tmp_path_factory.mktemp("paragraphs") / "model"
    return save_model(model, src, tgt, out, decoding=Decoding(), card={"data": BUNDLED_DATA})


@pytest.fixture(scope="module")
def qkv(folder):
    return Translator.load(folder)


@pytest.fixture(scope="module")
def ctranslate2(folder, tmp_path_factory):
    out = export_ctranslate2(folder, tmp_path_factory.mktemp("paragraphs") / "ct2")
    return Ct2Translator(out, threads=1)


@pytest.fixture(scope="module")
def onnx(folder, tmp_path_factory):
    """Exported only for the tests of this engine (seconds of torch.export): they are slow."""
    return OnnxTranslator(export_onnx(folder, tmp_path_factory.mktemp("paragraphs") / "onnx"))


ENGINES = ["qkv", "ctranslate2", pytest.param("onnx", marks=pytest.mark.slow)]


def _alone(tr, *sentences):
    """Each sentence translated by itself, as one segment."""
    return tr.translate(list(sentences), split="none")


@pytest.mark.parametrize("name", ENGINES)
def test_a_paragraph_is_its_sentences_translations_joined(request, name):
    tr = request.getfixturevalue(name)
    one, two, three = _alone(tr, ONE, TWO, THREE)
    assert tr.translate(f"{ONE} {TWO}") == f"{one} {two}"
    text = f"{ONE}\n\n    {TWO} {THREE}\n\t{ONE}  "
    assert tr.translate(text) == f"{one}\n\n    {two} {three}\n\t{one}  "
    assert (
        tr.translate(f"{ONE} {TWO}", split="none")
        == tr.translate([f"{ONE} {TWO}"], split="none")[0]
    )
    for t in (one, two, three):
        assert t == t.strip() and "  " not in t  # clean: no end or doubled spaces


@pytest.mark.parametrize("name", ENGINES)
def test_fifty_paragraphs_are_one_batching_plan(request, name, monkeypatch):
    tr = request.getfixturevalue(name)
    calls = []
    decode = type(tr)._decode

    def counted(self, texts, *a, **k):
        calls.append(len(texts))
        return decode(self, texts, *a, **k)

    monkeypatch.setattr(type(tr), "_decode", counted)
    tr.translate([f"{ONE} {TWO} {THREE}"] * 20 + [f"{TWO} {ONE}"] * 30)
    assert calls == [3]  # one plan, each distinct sentence once


def test_n_best_of_a_paragraph_joins_its_sentences_best(qkv):
    """The qkv engine (CTranslate2's and ONNX's give one translation per text)."""
    tr = qkv.with_decoding(beam_size=2)
    got = tr.translate(f"{ONE} {TWO}", n_best=2)
    alone = tr.translate([ONE, TWO], n_best=2, split="none")
    assert got[0][0] == f"{alone[0][0][0]} {alone[1][0][0]}"
    assert got[0][1] == pytest.approx(alone[0][0][1] + alone[1][0][1])


def test_evaluation_never_splits(qkv, monkeypatch):
    seen = []
    decode = type(qkv)._decode
    monkeypatch.setattr(
        type(qkv),
        "_decode",
        lambda self, texts, *a, **k: seen.extend(texts) or decode(self, texts, *a, **k),
    )
    qkv.evaluate([(f"{ONE} {TWO}", "x y")], tokenize="13a")
    assert seen == [f"{ONE} {TWO}"]


@pytest.mark.parametrize("engine", ENGINES)
def test_qkv_translate_keeps_lines_and_layout(request, engine, tmp_path, capsys):
    tr = request.getfixturevalue(engine)
    one, two, three = _alone(tr, ONE, TWO, THREE)
    src = tmp_path / "in.txt"
    src.write_text(f"{ONE} {TWO}\n\n  {THREE}\n", encoding="utf-8")
    # the ONNX folder runs on onnxruntime by itself; the others by --engine
    how = [] if engine == "onnx" else ["--engine", engine]
    model = str(tr.path.parent if engine == "ctranslate2" else tr.path)
    args = ["translate", "--model-dir", model, *how, "--src", str(src), "--quiet"]
    assert main(args) == 0
    assert capsys.readouterr().out == f"{one} {two}\n\n  {three}\n"
    assert main([*args, "--split", "none"]) == 0
    whole = tr.translate([f"{ONE} {TWO}"], split="none")[0]
    assert capsys.readouterr().out == f"{whole}\n\n  {three}\n"


def test_qkv_translate_names_a_bad_split(folder, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["translate", "--model-dir", str(folder), "--split", "words", "Go."])
    assert exit_.value.code == 2
    assert "argument --split: invalid choice: 'words'" in capsys.readouterr().err


PAGE = (
    "<html><body><h1>{one}</h1>\n<p>{two} <b>{three_a}</b> {three_b}</p>"
    "<p><code>x = 1</code> {one}</p></body></html>"
)


@pytest.mark.parametrize("name", ENGINES)
def test_a_page_keeps_its_tags_through_every_engine(request, name):
    lxml_html = pytest.importorskip("lxml.html")
    from qkv.text import translate_document

    tr = request.getfixturevalue(name)
    words = THREE.split()
    page = PAGE.format(one=ONE, two=TWO, three_a=words[0], three_b=" ".join(words[1:]))
    out = translate_document(page, tr, "html").decode()

    def tags(p):
        return [el.tag for el in lxml_html.document_fromstring(p).iter()]

    assert tags(out) == tags(page)
    (one,) = _alone(tr, ONE)
    assert f"<h1>{one}</h1>" in out and "<code>x = 1</code>" in out
    assert tr.aligns == (name != "onnx")
    if tr.aligns:
        (al,) = tr.align_segments([THREE], _alone(tr, THREE))
        assert len(al.weights) == len(al.target_tokens) > 0
        assert all(len(row) == len(al.source_tokens) for row in al.weights)


def test_the_attention_of_a_paragraph_is_each_sentences(qkv, tmp_path, capsys):
    from qkv.translate import ParagraphAttention, SentenceAttention

    para = qkv.attention(f"{ONE} {TWO}")
    assert isinstance(para, ParagraphAttention) and len(para) == 2
    assert [sa.source for sa in para] == [ONE, TWO]
    assert para.translation == qkv.translate(f"{ONE} {TWO}")
    alone = qkv.attention(ONE)
    assert isinstance(alone, SentenceAttention)
    assert all((a == b).all() for a, b in zip(para[0].cross, alone.cross))
    page = para.save(tmp_path / "para.html").read_text(encoding="utf-8")
    assert page.count('class="qkv-controls') == 2 and f"1. {ONE}" in page
    two = para.save(tmp_path / "two.html", sentence=1).read_text(encoding="utf-8")
    assert "<title>" in two and TWO.split()[0] in two and "1. " not in two
    with pytest.raises(ValueError, match="sentence: a figure shows one sentence of 2"):
        para.save(tmp_path / "para.png")
    # qkv translate --attention: each sentence of a line of two
    args = ["translate", "--model-dir", str(qkv.path), "--attention", str(tmp_path / "a.html")]
    assert main([*args, "--quiet", f"{ONE} {TWO}", ONE]) == 0
    assert sorted(p.name for p in tmp_path.glob("a-*.html")) == [
        "a-1.1.html",
        "a-1.2.html",
        "a-2.html",
    ]
