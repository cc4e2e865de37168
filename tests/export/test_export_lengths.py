"""The length rule of the exported engines is qkv's (issue 27 row 9): a line longer than the
engine's positions is left untranslated with a warning naming it, and the other lines get their
translations; a translation the positions stop before it ends is named in a warning, never cut
silently. CTranslate2 exports a table of at least 1,024 rows; ONNX graphs hold ``max_len``."""

from __future__ import annotations

import contextlib
import io
import logging

import pytest
import torch

from qkv.cli import main
from qkv.data import Normalizer, WordTokenizer, bundled_pairs
from qkv.export import save_model
from qkv.export.ctranslate2 import Ct2Translator, export_ctranslate2
from qkv.nn import Seq2SeqConfig, build_model
from qkv.translate import Translator

PAIRS = bundled_pairs()[:600]
NORM = Normalizer.book()
SRC = WordTokenizer.train([s for s, _ in PAIRS], normalizer=NORM)
TGT = WordTokenizer.train([t for _, t in PAIRS], normalizer=NORM)


def _model(eos_bias: float, **over) -> torch.nn.Module:
    torch.manual_seed(0)
    config = Seq2SeqConfig(src_vocab_size=SRC.vocab_size, tgt_vocab_size=TGT.vocab_size,
                           num_hiddens=16, ffn_num_hiddens=32, num_heads=2, num_enc_layers=1,
                           num_dec_layers=1, dropout=0.0, **over)  # fmt: skip
    model = build_model(config).eval()
    with torch.no_grad():
        model.decoder.dense.bias[TGT.eos_id] += eos_bias
    return model


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.fixture(scope="module")
def ct2(tmp_path_factory):
    """A model that ends its sentences, exported to CTranslate2 (a 1,024-row table)."""
    root = tmp_path_factory.mktemp("ct2")
    folder = save_model(_model(3.0), SRC, TGT, root / "qkv")
    export_ctranslate2(folder, root / "ct2")
    return folder, root / "ct2"


def test_a_line_over_the_ctranslate2_table_is_skipped_and_named(ct2, caplog):
    folder, d = ct2
    engine = Ct2Translator(d, threads=1)
    long = ("go . " * 520).rstrip()  # 1,040 tokens: more than the 1,024 positions
    texts = ["go .", long, "i lost ."]
    with caplog.at_level(logging.WARNING, logger="qkv"):
        got = engine.translate(texts, beam_size=1, split="none")  # one sentence: a line
    assert got[1] == ""
    assert [got[0], got[2]] == engine.translate(["go .", "i lost ."], beam_size=1)
    assert [got[0], got[2]] == Translator.load(folder).translate(["go .", "i lost ."], beam_size=1)
    (msg,) = _warnings(caplog)
    assert msg.startswith("input 2: more source tokens than the CTranslate2 model's 1024 positions")


def test_qkv_translate_engine_ctranslate2_translates_the_other_lines(ct2, tmp_path):
    _, d = ct2
    src = tmp_path / "in.txt"
    src.write_text("go .\n" + ("go . " * 520).rstrip() + "\ni lost .\n", encoding="utf-8")
    out, err = tmp_path / "out.txt", io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["translate", "--engine", "ctranslate2", "--model-dir", str(d), "--src",
                   str(src), "--output", str(out), "--beam", "1", "--split", "none"])  # fmt: skip
    assert rc == 0, err.getvalue()
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    assert lines[0] == Ct2Translator(d, threads=1).translate("go .", beam_size=1)
    assert "input 2: more source tokens than the CTranslate2 model's 1024" in err.getvalue()
    assert "Traceback" not in err.getvalue()


def test_a_translation_the_ctranslate2_table_stops_is_named(tmp_path, caplog):
    folder = save_model(_model(-1e4), SRC, TGT, tmp_path / "qkv")  # never ends by itself
    engine = Ct2Translator(export_ctranslate2(folder, tmp_path / "ct2"), threads=1)
    texts = ["go .", "go . " * 300]  # the rule allows 16 and 1,212 tokens
    with caplog.at_level(logging.WARNING, logger="qkv"):
        ids = engine.generate(texts, beam_size=1)
    assert [len(x) for x in ids] == [16, 1024]
    (msg,) = _warnings(caplog)
    assert msg.startswith("input 2: translation stopped at 1024 tokens, the CTranslate2 model's")


@pytest.mark.slow
def test_onnx_names_the_lines_its_positions_skip_or_stop(tmp_path, caplog):
    from qkv.export.onnx import OnnxTranslator, export_onnx

    model = _model(-1e4, max_len=32)  # never ends by itself; 32 positions in the graphs
    folder = save_model(model, SRC, TGT, tmp_path / "qkv")
    engine = OnnxTranslator(export_onnx(folder, tmp_path / "onnx"), threads=1)
    texts = ["go .", "go . " * 20, "i lost ."]  # 3, 41 and 4 tokens with <eos>
    with caplog.at_level(logging.WARNING, logger="qkv"):
        ids = engine.generate(texts)
    assert [len(x) for x in ids] == [16, 0, 18]
    assert ids[0] == engine.generate(["go ."])[0]
    msgs = _warnings(caplog)
    assert msgs[0].startswith("input 2: more source tokens than the ONNX graphs' 32 positions")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="qkv"):
        ids = engine.generate(["go . " * 10])  # 21 tokens: the rule allows 52
    assert [len(x) for x in ids] == [32]
    (msg,) = _warnings(caplog)
    assert msg.startswith("input 1: translation stopped at 32 tokens, the ONNX graphs' 32")
