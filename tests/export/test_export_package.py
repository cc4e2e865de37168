"""The inference-only model folder: Translator.save, qkv.export.save_model/export_model and
`qkv export`, read back by every command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _folders import folder_size, quiet_cli
from _tiny_models import shared_translator

from qkv.data import bundled_pairs, write_pairs
from qkv.export import export_model, save_model
from qkv.inference import CheckpointError, load_model
from qkv.translate import Translator

PAIRS = bundled_pairs()[:600]
SOURCES = [s for s, _ in PAIRS[:40]] + ["", "zzz unseen ."]


@pytest.fixture(scope="module")
def python_model():
    """A model built in Python (random weights) with word tokenizers trained here."""
    return shared_translator()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny `qkv train` run folder (optimizer state, checkpoints, a final model)."""
    from qkv.train import TrainConfig, train

    data = tmp_path_factory.mktemp("data") / "en-fr.txt"
    write_pairs(data, PAIRS)
    out = tmp_path_factory.mktemp("run")
    cfg = TrainConfig().updated(
        {
            "data": str(data),
            "model": {
                "kind": "transformer",
                "num_hiddens": 32,
                "ffn_num_hiddens": 64,
                "num_heads": 2,
                "num_enc_layers": 1,
                "num_dec_layers": 1,
            },
            "valid": 40,
            "test": 40,
            "max_steps": 20,
            "max_tokens": 512,
            "warmup_steps": 5,
            "eval_every": 10,
            "eval_sentences": 20,
            "save_every": 10,
            "normalizer": "book",
            "tokenizer": "word",
            "preset": "none",
        }
    )
    train(cfg, out, progress=False)
    return out


# ---------------------------------------------------------------------------- fast
def test_model_built_in_python_saved_and_loaded_translates_the_same(python_model, tmp_path):
    model, src, tgt = python_model
    before = Translator(model, src, tgt).translate(SOURCES)
    out = save_model(model, src, tgt, tmp_path / "m", card={"data": "600 bundled pairs"})
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"model.safetensors", "model.json", "manifest.json", "README.md"} <= names
    assert not names & {"trainer.pt", "split.json", "train.json", "decoding.json"}
    assert json.loads((out / "card.json").read_text()) == {"data": "600 bundled pairs"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["files"]) == names - {"manifest.json"}  # every file checksummed
    loaded = load_model(out)
    assert loaded.decoding is None
    assert Translator.load(out).translate(SOURCES) == before
    assert "600 bundled pairs" in (out / "README.md").read_text()


def test_translator_save_keeps_its_decoding(python_model, tmp_path):
    model, src, tgt = python_model
    tr = Translator(model, src, tgt, decoding={"beam_size": 3, "length_penalty": 0.6})
    back = Translator.load(tr.save(tmp_path / "m"))
    assert back.decoding == tr.decoding
    assert back.translate(SOURCES[:10]) == tr.translate(SOURCES[:10])


def test_an_existing_folder_is_refused_unless_it_is_an_export_and_force(python_model, tmp_path):
    model, src, tgt = python_model
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not empty"):
        save_model(model, src, tgt, mine)
    with pytest.raises(ValueError, match="never replaced"):
        save_model(model, src, tgt, mine, force=True)
    assert (mine / "notes.txt").read_text() == "keep me"
    first = save_model(model, src, tgt, tmp_path / "m")
    with pytest.raises(ValueError, match="not empty"):
        save_model(model, src, tgt, first)
    save_model(model, src, tgt, first, card={"title": "second"}, force=True)
    assert (first / "README.md").read_text().startswith("# second")
    save_model(model, src, tgt, tmp_path / "empty-is-fine")  # an empty folder is new
    with pytest.raises(ValueError, match="holds the model being saved"):
        save_model(model, src, tgt, tmp_path, source=first, force=True)


def test_a_failed_write_leaves_nothing_behind(python_model, tmp_path):
    model, src, tgt = python_model

    def boom(folder: Path) -> None:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_model(model, src, tgt, tmp_path / "m", extra=boom)
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments_are_named(python_model, tmp_path):
    model, src, tgt = python_model
    with pytest.raises(ValueError, match="tokenizers: vocabularies"):
        save_model(model, tgt, src, tmp_path / "m")
    with pytest.raises(ValueError, match="card: unknown keys"):
        save_model(model, src, tgt, tmp_path / "m", card={"bleu": 3})
    with pytest.raises(ValueError, match="card: expected JSON-serialisable"):
        save_model(model, src, tgt, tmp_path / "m", card={"scores": {"BLEU": object()}})
    with pytest.raises(TypeError, match="model: expected an EncoderDecoder"):
        save_model(torch.nn.Linear(2, 2), src, tgt, tmp_path / "m")


def test_a_damaged_export_is_refused(python_model, tmp_path):
    model, src, tgt = python_model
    out = save_model(model, src, tgt, tmp_path / "m")
    data = bytearray((out / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (out / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256"):
        load_model(out)


def test_cli_export_flags_are_checked(tmp_path):
    rc, _, err = quiet_cli("export", "--model-dir", str(tmp_path), "--out", str(tmp_path / "o"),
                      "--quantize", "int8")  # fmt: skip
    assert rc == 2 and "--quantize: only for --format ctranslate2" in err
    rc, _, err = quiet_cli(
        "export", "--model-dir", str(tmp_path / "none"), "--out", str(tmp_path / "o")
    )
    assert rc == 2 and "does not exist" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("fmt", ["qkv", "onnx"])
def test_an_out_under_a_file_is_one_line(python_model, tmp_path, fmt):
    model, src, tgt = python_model
    folder = save_model(model, src, tgt, tmp_path / "m")
    (tmp_path / "file").write_text("not a folder")
    rc, _, err = quiet_cli("export", "--model-dir", str(folder), "--out", str(tmp_path / "file" / "sub"),
                      "--format", fmt)  # fmt: skip
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("qkv export: error: --out: ") and "is a file, not a folder" in err
    with pytest.raises(ValueError, match=r"out: .* is a file, not a folder"):
        save_model(model, src, tgt, tmp_path / "file" / "sub" / "deeper")
    assert (tmp_path / "file").read_text() == "not a folder"


# ---------------------------------------------------------------------------- a trained run
@pytest.mark.slow
def test_export_of_a_run_translates_as_the_run_and_is_a_fraction_of_its_size(run, tmp_path):
    rc, out, err = quiet_cli("export", "--model-dir", str(run), "--out", str(tmp_path / "m"))
    assert rc == 0 and "-> " in out, err
    exported = tmp_path / "m"
    ratio = folder_size(exported) / folder_size(run)
    print(f"run {folder_size(run)} bytes, export {folder_size(exported)} bytes, ratio {ratio:.3f}")
    assert ratio < 0.5
    a, b = Translator.load(run), Translator.load(exported)
    assert b.decoding == a.decoding
    assert b.translate(SOURCES[:12], beam_size=1) == a.translate(SOURCES[:12], beam_size=1)
    assert b.translate(SOURCES[:3]) == a.translate(SOURCES[:3])  # the run's chosen decoding
    rc, _, err = quiet_cli("export", "--model-dir", str(run), "--out", str(exported))
    assert rc == 2 and "--out:" in err and "not empty" in err
    assert quiet_cli("export", "--model-dir", str(run), "--out", str(exported), "--force")[0] == 0


@pytest.mark.slow
def test_model_card_names_data_scores_settings_date_and_version(run, tmp_path):
    from qkv import __version__

    card = (export_model(run, tmp_path / "m") / "README.md").read_text()
    assert "en-fr.txt" in card  # the training data
    assert "validation BLEU" in card and "validation chrF" in card
    assert "max_steps: 20" in card and "num_hiddens: 32" in card
    assert f"qkv {__version__}" in card and "Trained for 20 updates" in card


@pytest.mark.slow
def test_every_command_accepts_the_exported_folder(run, tmp_path):
    m = export_model(run, tmp_path / "m")
    assert load_model(m).model.config.num_hiddens == 32
    rc, out, err = quiet_cli("translate", "--model-dir", str(m), "go .", "i lost .")
    assert rc == 0 and len(out.splitlines()) == 2, err
    page = tmp_path / "att.html"
    rc, _, err = quiet_cli("translate", "--model-dir", str(m), "--attention", str(page), "go .")
    assert rc == 0 and page.stat().st_size > 0, err  # the attention viewer
    data = tmp_path / "test.txt"
    write_pairs(data, PAIRS[:20])
    rc, out, err = quiet_cli("evaluate", "--model-dir", str(m), "--data", str(data), "--json")
    assert rc == 0 and json.loads(out)["n"] == 20, err
    rc, _, err = quiet_cli("evaluate", "--model-dir", str(m))
    assert rc == 2 and "--data:" in err and "exported model" in err and "Traceback" not in err
    m2 = export_model(m, tmp_path / "again")  # an export exported again keeps its card
    assert Translator.load(m2).translate(SOURCES[:5]) == Translator.load(m).translate(SOURCES[:5])
    assert "en-fr.txt" in (m2 / "README.md").read_text()


@pytest.mark.slow
def test_cli_export_to_ctranslate2_translates_as_qkv(run, tmp_path):
    """A run exported by ``qkv export --format ctranslate2`` translates as the run's plain
    greedy (a run exported to ONNX: test_the_onnx_cards_snippet_translates_as_qkv_translate in
    tests/export/test_export_published.py, whose run is traced once for all its tests)."""
    from qkv.export.ctranslate2 import Ct2Translator

    out = tmp_path / "ctranslate2"
    args = ["--out", str(out), "--format", "ctranslate2"]
    rc, _, err = quiet_cli("export", "--model-dir", str(run), *args)
    assert rc == 0, err
    qkv = Translator.load(run).with_decoding(no_repeat_ngram=0)
    got = Ct2Translator(out).translate(SOURCES[:12], beam_size=1, no_repeat_ngram=0)
    assert got == qkv.translate(SOURCES[:12], beam_size=1)
