"""A model's languages (issue 26): recorded in model.json, the model card's Hugging Face front
matter and card.json, kept by every export, read by every engine; a folder saved before
languages were recorded loads as before."""

from __future__ import annotations

import json

import pytest
from _tiny_models import shared_translator

from qkv.export import export_model
from qkv.inference import CheckpointError, load_model, model_languages, save_model
from qkv.translate import Translator


@pytest.fixture(scope="module")
def tiny():
    return shared_translator()


def test_languages_are_recorded_and_read_back(tiny, tmp_path):
    model, src, tgt = tiny
    out = save_model(
        model, src, tgt, tmp_path / "m", languages=("en", "zh-cn"),
        card={"scores": {"valid BLEU": 12.5, "valid chrF": 30.0}},
    )  # fmt: skip
    meta = json.loads((out / "model.json").read_text(encoding="utf-8"))
    assert meta["languages"] == {"source": "en", "target": "zh-CN"}
    assert load_model(out).languages == ("en", "zh-CN")
    tr = Translator.load(out)
    assert tr.languages == ("en", "zh-CN")
    card = (out / "README.md").read_text(encoding="utf-8")
    front = card.split("---\n")[1]
    assert front.startswith("language:\n- en\n- zh-CN\nmetrics:\n- bleu\n- chrf\n")
    assert "pipeline_tag: translation" in front and "library_name: qkv" in front
    assert "Translates English into Chinese (CN): `en` \u2192 `zh-CN`." in card
    assert json.loads((out / "card.json").read_text())["languages"] == ["en", "zh-CN"]
    # exported again, and saved again by a Translator: the languages travel
    again = export_model(out, tmp_path / "again")
    assert load_model(again).languages == ("en", "zh-CN")
    assert load_model(tr.save(tmp_path / "saved")).languages == ("en", "zh-CN")


def test_a_folder_without_languages_loads_as_before(tiny, tmp_path):
    model, src, tgt = tiny
    out = save_model(model, src, tgt, tmp_path / "old")
    meta = json.loads((out / "model.json").read_text(encoding="utf-8"))
    assert "languages" not in meta
    assert load_model(out).languages is None
    assert Translator.load(out).languages is None
    assert (out / "README.md").read_text().startswith("# qkv translation model")
    assert model_languages({"config": {}}) is None
    with pytest.raises(CheckpointError, match="invalid languages"):
        model_languages({"languages": {"source": "english", "target": "fr"}}, out)
    with pytest.raises(ValueError, match="languages"):
        save_model(model, src, tgt, tmp_path / "bad", languages=("en",))


def test_ctranslate2_export_carries_the_languages(tiny, tmp_path):
    pytest.importorskip("ctranslate2")
    from qkv.export.ctranslate2 import Ct2Translator, export_ctranslate2

    model, src, tgt = tiny
    out = save_model(model, src, tgt, tmp_path / "m", languages=("de", "en"))
    ct2 = export_ctranslate2(out, tmp_path / "ct2")
    assert json.loads((ct2 / "qkv.json").read_text())["languages"] == ["de", "en"]
    assert Ct2Translator(ct2).languages == ("de", "en")
    assert Ct2Translator(tmp_path / "ct2").languages == ("de", "en")


@pytest.mark.slow
def test_onnx_export_carries_the_languages(tiny, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from qkv.export.onnx import OnnxTranslator, export_onnx

    model, src, tgt = tiny
    out = save_model(model, src, tgt, tmp_path / "m", languages=("fr", "en"))
    onnx_dir = export_onnx(out, tmp_path / "onnx")
    assert json.loads((onnx_dir / "onnx.json").read_text())["languages"] == ["fr", "en"]
    assert OnnxTranslator(onnx_dir).languages == ("fr", "en")
