"""qkv.engines: the engine a folder holds, and the one way the commands and the server open a
model folder with an engine (open_translator)."""

from __future__ import annotations

import pytest
from _tiny_models import tiny_translator

from qkv._errors import SettingError
from qkv.data import bundled_pairs
from qkv.engines import ENGINES, folder_engine, open_translator
from qkv.inference import Decoding, TextTranslator, save_model
from qkv.translate import Translator

PAIRS = bundled_pairs()[:300]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    model, src, tgt = tiny_translator(PAIRS, eos_boost=1.8)
    out = tmp_path_factory.mktemp("engines") / "model"
    return save_model(model, src, tgt, out, decoding=Decoding(beam_size=2))


def test_a_folder_says_which_engine_runs_it(tmp_path):
    onnx, ct2, other = tmp_path / "onnx", tmp_path / "ct2", tmp_path / "run"
    for d in (onnx, ct2, other):
        d.mkdir()
    (onnx / "onnx.json").write_text("{}")
    (ct2 / "model.bin").write_bytes(b"")
    (ct2 / "qkv.json").write_text("{}")
    assert folder_engine(onnx) == "onnx" and folder_engine(onnx, "ctranslate2") == "onnx"
    assert folder_engine(ct2) == "ctranslate2"
    assert folder_engine(other) == "qkv" and folder_engine(other, "ctranslate2") == "ctranslate2"
    with pytest.raises(SettingError, match="engine: expected one of qkv, ctranslate2, onnx"):
        folder_engine(other, "marian")


def test_open_translator_opens_each_engine_with_the_models_decoding(folder, tmp_path):
    tr = open_translator(folder)
    assert isinstance(tr, Translator) and isinstance(tr, TextTranslator)
    assert tr.decoding == Decoding(beam_size=2)
    assert tr.translate("go .") == Translator.load(folder).translate("go .")
    int8 = open_translator(folder, quantize="int8")
    assert int8.model is not tr.model
    pytest.importorskip("ctranslate2", reason="the ct2 extra runs the CTranslate2 engine")
    from qkv.export.ctranslate2 import Ct2Translator, export_ctranslate2

    ct2 = open_translator(export_ctranslate2(folder, tmp_path / "ct2"), engine="ctranslate2")
    assert isinstance(ct2, Ct2Translator) and ct2.decoding == Decoding(beam_size=2)
    assert {tr.engine, ct2.engine} <= set(ENGINES)


def test_an_unknown_engine_is_named(folder):
    with pytest.raises(SettingError, match="engine: expected one of") as err:
        open_translator(folder, engine="marian")
    assert err.value.key == "engine"
