"""``qkv serve`` takes any TextTranslator: the CTranslate2 engine answers /translate (batched,
as the engine translates alone), says which engine it is, and refuses /attention with 501."""

from __future__ import annotations

import pytest
from _serve_helpers import SOURCES, live_server

from qkv.cli import main
from qkv.serve import create_app

pytest.importorskip("ctranslate2", reason="the ct2 extra (dev) runs the CTranslate2 engine")


def test_the_ctranslate2_engine_serves_translations(ct2):
    with live_server(ct2, max_wait_ms=20) as s:
        r = s.post("/translate", json={"q": SOURCES[:8], "source": "en", "target": "fr"})
        assert r.status_code == 200, r.text
        assert r.json()["translatedText"] == ct2.translate(SOURCES[:8])
        model = s.get("/health").json()["model"]
        assert (model["engine"], model["beam"]) == ("ctranslate2", ct2.decoding.beam_size)
        r = s.post("/attention", json={"q": SOURCES[0], "source": "en", "target": "fr"})
        assert r.status_code == 501 and "ctranslate2 engine returns no attention" in r.text


def test_create_app_says_what_it_takes():
    with pytest.raises(TypeError, match=r"translator: expected a qkv.inference.TextTranslator"):
        create_app(object())  # type: ignore[arg-type]


def test_qkv_serve_engine_ctranslate2_without_an_export_is_one_line(model_dir, capsys):
    argv = ["serve", "--model-dir", str(model_dir), "--engine", "ctranslate2", "--quiet"]
    assert main([*argv, "--source-lang", "en", "--target-lang", "fr"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv serve: error: model dir: ") and err.count("\n") == 1, err
    assert "holds no CTranslate2 model" in err
