"""qkv.inference.TextTranslator: the qkv, CTranslate2 and ONNX engines behind one interface, each
with its decoding, its languages, text in and text out, and scores through any of them."""

from __future__ import annotations

import math

import pytest
from _tiny_models import shared_translator

from qkv.data import bundled_pairs
from qkv.inference import (
    BUNDLED_DATA,
    Decoding,
    TextTranslator,
    corpus_scores,
    evaluate_pairs,
    save_model,
)
from qkv.translate import Translator

pytest.importorskip("ctranslate2", reason="the ct2 extra (dev) runs the CTranslate2 engine")
from qkv.export.ctranslate2 import Ct2Translator, export_ctranslate2

PAIRS = bundled_pairs()[:600]
TEXTS = [s for s, _ in PAIRS[:24]] + ["", "   "]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    model, src, tgt = shared_translator()
    out = tmp_path_factory.mktemp("engines") / "model"
    decoding = Decoding(beam_size=2, length_penalty=0.6)
    return save_model(model, src, tgt, out, decoding=decoding, card={"data": BUNDLED_DATA})


@pytest.fixture(scope="module")
def engines(folder, tmp_path_factory):
    ct2 = export_ctranslate2(folder, tmp_path_factory.mktemp("engines") / "ct2")
    return {"qkv": Translator.load(folder), "ctranslate2": Ct2Translator(ct2, threads=1)}


def test_every_engine_is_a_text_translator_with_the_models_decoding(engines):
    for name, tr in engines.items():
        assert isinstance(tr, TextTranslator) and tr.engine == name
        assert tr.decoding == Decoding(beam_size=2, length_penalty=0.6)
        assert tr.languages == ("en", "fr")  # the card names the bundled corpus
        assert tr.kind == "transformer"
        assert tr.has_attention == (name == "qkv")


def test_every_engine_shows_its_card_in_a_notebook(engines):
    for name, tr in engines.items():
        rows = dict(tr.card_rows())
        assert rows["engine"] == name and rows["languages"] == "en \u2192 fr"
        assert rows["decoding"] == "beam 2, length penalty 0.6"
        assert ("model" in rows) == (name == "qkv")  # CTranslate2's model is opaque to qkv
        html = tr._repr_html_()
        assert type(tr).__name__ in html and "beam 2, length penalty 0.6" in html


def test_the_engines_translate_alike_and_blank_texts_alike(engines):
    qkv, ct2 = engines["qkv"], engines["ctranslate2"]
    for beam in (1, 2):
        want = qkv.translate(TEXTS, beam_size=beam)
        got = ct2.translate(TEXTS, beam_size=beam)
        assert want[-2:] == got[-2:] == ["", "   "]  # a blank text comes back as it is
        assert sum(a == b for a, b in zip(want, got)) >= 0.9 * len(TEXTS)
        assert ct2.translate(TEXTS[0], beam_size=beam) == got[0]  # one text, one string
        assert (
            ct2.translate_ids(TEXTS[0], beam_size=beam)
            == ct2.generate(TEXTS[:1], beam_size=beam)[0]
        )


def test_with_decoding_gives_another_translator_and_never_changes_this_one(engines):
    for tr in engines.values():
        greedy = tr.with_decoding(beam_size=1, no_repeat_ngram=2)
        assert greedy is not tr and greedy.decoding == Decoding(
            beam_size=1, length_penalty=0.6, no_repeat_ngram=2
        )
        assert tr.decoding.beam_size == 2  # unchanged
        assert greedy.translate(TEXTS[:5]) == tr.translate(
            TEXTS[:5], beam_size=1, no_repeat_ngram=2
        )
        with pytest.raises(AttributeError):
            tr.decoding = Decoding()  # type: ignore[misc]  # read-only: use with_decoding
    whole = Decoding(beam_size=1, max_output_len=3)
    assert all(len(ids) <= 3 for ids in engines["qkv"].generate(TEXTS, whole))


def test_an_engine_refuses_what_it_cannot_do_naming_the_option(engines):
    ct2 = engines["ctranslate2"]
    with pytest.raises(ValueError, match="n_best: the ctranslate2 engine gives one translation"):
        ct2.translate(TEXTS[:2], n_best=2)
    with pytest.raises(ValueError, match="attention: the ctranslate2 engine returns no attention"):
        ct2.attention(TEXTS[0])
    with pytest.raises(TypeError, match="max_len: not a decoding option"):
        engines["qkv"].translate(TEXTS[:2], max_len=5)
    with pytest.raises(TypeError, match="texts: expected a sequence of str"):
        ct2.generate("one text")  # type: ignore[arg-type]


def test_scores_go_through_whichever_engine_is_given(engines):
    pairs = PAIRS[:20]
    for tr in engines.values():
        ev = evaluate_pairs(tr, pairs, beam_size=1)
        want = corpus_scores(
            tr.translate([s for s, _ in pairs], beam_size=1), [t for _, t in pairs]
        )
        assert (ev.bleu, ev.chrf, ev.n) == (want.bleu, want.chrf, 20)
        assert tr.evaluate(pairs, beam_size=1).bleu == ev.bleu
    # a translator whose default is n-best still scores one translation per source
    nbest = engines["qkv"].with_decoding(n_best=2)
    assert nbest.evaluate(pairs).bleu == engines["qkv"].evaluate(pairs).bleu


def test_n_best_shape_is_the_same_for_a_blank_text(engines):
    res = engines["qkv"].translate(["", TEXTS[0]], n_best=2)
    assert res[0] == [("", 0.0), ("", -math.inf)] and len(res[1]) == 2


@pytest.mark.slow
def test_the_onnx_engine_is_greedy_and_says_so(folder, engines, tmp_path):
    pytest.importorskip("onnxruntime", reason="the onnx extra (dev)")
    from qkv.export.onnx import OnnxTranslator, export_onnx

    onnx = OnnxTranslator(export_onnx(folder, tmp_path / "onnx"), threads=1)
    assert isinstance(onnx, TextTranslator) and onnx.engine == "onnx"
    assert onnx.decoding == Decoding()  # what this runner does, whatever the model's says
    assert onnx.translate(TEXTS) == engines["qkv"].translate(TEXTS, beam_size=1)
    for option, value in (("beam_size", 2), ("n_best", 2), ("no_repeat_ngram", 3)):
        with pytest.raises(ValueError, match=rf"{option}.*: the onnx engine decodes greedily"):
            onnx.translate(TEXTS[:2], **{option: value})
    assert (
        evaluate_pairs(onnx, PAIRS[:10]).bleu
        == evaluate_pairs(engines["qkv"], PAIRS[:10], beam_size=1).bleu
    )
