"""What a shared folder publishes: a run trained from a file in a private folder, exported to
every format, shows no local path (the data's folder, the run's, the user's home) in any file;
the data is described by name, size and SHA-256; the snippets the cards show translate as
``qkv translate`` does, and the ONNX export as the run itself (plain greedy)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import pytest
from _folders import folder_size, quiet_cli
from _train_helpers import ENDED

import qkv
from qkv.data import bundled_pairs, write_pairs
from qkv.inference import writing
from qkv.inference.writing import data_files, describe_data_files, published

EXPORTS = {
    "qkv": [],
    "ctranslate2": [],
    "ctranslate2-int8": ["--quantize", "int8"],
    "onnx": [],
    "huggingface": [],
}


@pytest.fixture(scope="module")
def trained_exports(tmp_path_factory) -> dict:
    """A tiny run (SentencePiece, as a user's data gets) from ``private/en-fr.txt``, and its
    exports to every format."""
    pytest.importorskip("ctranslate2")
    pytest.importorskip("onnxruntime")
    private = tmp_path_factory.mktemp("private")
    data = private / "en-fr.txt"
    write_pairs(data, bundled_pairs()[:500])
    config = private / "tiny.yaml"
    config.write_text(
        "model: {kind: transformer, num_hiddens: 32, ffn_num_hiddens: 64, num_heads: 2, "
        "num_enc_layers: 1, num_dec_layers: 1}\nvalid: 30\ntest: 30\nmax_steps: 10\n"
        "max_tokens: 512\nwarmup_steps: 5\neval_every: 10\neval_sentences: 10\n"
        "save_every: 10\npreset: none\nvocab_size: 400\n",
        encoding="utf-8",
    )
    run = private / "run"
    rc, _, err = quiet_cli("train", "--data", str(data), "--config", str(config), "--out", str(run))
    assert rc in ENDED, err  # 10 updates: a model to export, not one worth using (status 3)
    outs = {}
    for name, extra in EXPORTS.items():
        out = tmp_path_factory.mktemp("shared") / name
        fmt = name.split("-")[0]
        rc, said, err = quiet_cli(
            "export", "--model-dir", str(run), "--out", str(out), "--format", fmt, *extra
        )
        assert rc == 0, err
        outs[name] = (out, said)
    return {"data": data, "private": private, "run": run, "outs": outs}


def _text_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


@pytest.mark.parametrize("name", list(EXPORTS))
def test_no_file_of_an_export_shows_a_local_path(trained_exports, name):
    out, _ = trained_exports["outs"][name]
    private = str(trained_exports["private"].resolve())
    home = str(Path.home().resolve())
    # where the exporting machine keeps qkv and Python (the ONNX exporter records stack traces)
    code = str(Path(qkv.__file__).resolve().parent.parent)
    for p in _text_files(out):
        raw = p.read_bytes()
        for secret in {private, str(trained_exports["private"]), home + "/", code, sys.prefix}:
            assert secret.encode() not in raw, f"{p.relative_to(out)} shows {secret!r}"


def test_the_card_names_the_data_by_name_size_and_hash(trained_exports):
    data = trained_exports["data"]
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    out, _ = trained_exports["outs"]["qkv"]
    card = json.loads((out / "card.json").read_text(encoding="utf-8"))
    assert card["data_files"] == [
        {"file": "en-fr.txt", "bytes": data.stat().st_size, "sha256": digest}
    ]
    readme = (out / "README.md").read_text(encoding="utf-8")
    assert "`en-fr.txt` (" in readme and digest in readme
    hf_card = (trained_exports["outs"]["huggingface"][0] / "README.md").read_text(encoding="utf-8")
    assert "en-fr.txt" in hf_card and digest in hf_card


def test_the_runs_final_model_records_the_files_once(trained_exports):
    trainer = json.loads((trained_exports["run"] / "final" / "trainer.json").read_text("utf-8"))
    assert [r["file"] for r in trainer["data_files"]] == ["en-fr.txt"]


# ---------------------------------------------------------------------------- fast
def test_published_cuts_every_local_path_to_its_name():
    card = {
        "data": "/home/ann/corpora/en-fr.tsv",
        "settings": {
            "valid_data": ["/home/ann/v.en", "/home/ann/v.fr"],
            "tokenizer_model": "models/spm.model",
            "init_from": "~/runs/base",
            "lr": 0.001,
            "schedule": "inverse_sqrt",
        },
        "source": "Helsinki-NLP/opus-mt-en-fr",
        "notes": ["Validation scores are sacreBLEU's."],
    }
    assert published(card) == {
        "data": "en-fr.tsv",
        "settings": {
            "valid_data": ["v.en", "v.fr"],
            "tokenizer_model": "spm.model",
            "init_from": "base",
            "lr": 0.001,
            "schedule": "inverse_sqrt",
        },
        "source": "Helsinki-NLP/opus-mt-en-fr",  # a Hub name is not a local path
        "notes": ["Validation scores are sacreBLEU's."],
    }


def test_data_files_hashes_a_file_once_per_version(tmp_path, monkeypatch):
    f = tmp_path / "pairs.tsv"
    f.write_text("a\tb\n", encoding="utf-8")
    calls = []
    real = writing.sha256_file
    monkeypatch.setattr(writing, "sha256_file", lambda p: calls.append(p) or real(p))
    writing._file_record.cache_clear()
    first = data_files(str(f))
    assert data_files(str(f)) == first and len(calls) == 1
    assert first == [
        {"file": "pairs.tsv", "bytes": 4, "sha256": hashlib.sha256(b"a\tb\n").hexdigest()}
    ]
    f.write_text("a\tbc\n", encoding="utf-8")  # another version: hashed again
    assert data_files(str(f))[0]["bytes"] == 5 and len(calls) == 2
    assert data_files([str(f), str(tmp_path / "gone.fr")])[1] == {"file": "gone.fr"}
    assert describe_data_files(first).startswith("`pairs.tsv` (4 bytes, sha256 ")


# ---------------------------------------------------------------------------- what a CTranslate2 export holds


def test_an_int8_export_ships_no_float_weights_and_says_its_size(trained_exports):
    from qkv.engines import folder_engine
    from qkv.export.ctranslate2 import Ct2Translator
    from qkv.inference import CheckpointError, load_model

    out, said = trained_exports["outs"]["ctranslate2-int8"]
    assert not (out / "model.safetensors").exists()
    assert (out / "model.safetensors").name not in json.loads((out / "manifest.json").read_text())[
        "files"
    ]
    assert f"({folder_size(out) / 1e6:.1f} MB written in {out})" in said
    assert folder_engine(out) == "ctranslate2"  # qkv translate --model-dir OUT runs it
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "runs it on CTranslate2 (qkv's float32 weights are not in this folder)" in card
    assert "`ctranslate2/README.md` shows it with `ctranslate2`" in card
    texts = [s for s, _ in bundled_pairs()[600:606]]
    rc, printed, err = quiet_cli("translate", "--model-dir", str(out), *texts)
    assert rc == 0, err
    assert printed.splitlines() == Ct2Translator(out).translate(texts)
    with pytest.raises(CheckpointError, match=r"--engine ctranslate2.*--keep-float-weights"):
        load_model(out)
    float32, _ = trained_exports["outs"]["ctranslate2"]
    assert (float32 / "model.safetensors").is_file()  # float32: both engines read it


def test_keep_float_weights_keeps_qkvs_engine(trained_exports, tmp_path):
    out = tmp_path / "kept"
    args = ["export", "--model-dir", str(trained_exports["run"]), "--out", str(out)]
    rc, _, err = quiet_cli(
        *args, "--format", "ctranslate2", "--quantize", "int8", "--keep-float-weights"
    )
    assert rc == 0, err
    assert (out / "model.safetensors").is_file()
    rc, _, err = quiet_cli(*args, "--keep-float-weights")  # nothing to keep
    assert rc == 2 and "--keep-float-weights: only with --format ctranslate2 --quantize" in err


def _snippet(readme: str) -> str:
    blocks = readme.split("```python\n")
    assert len(blocks) == 2, "one Python block"
    return blocks[1].split("```")[0]


TEXTS = [s for s, _ in bundled_pairs()[3000:3024]] + ["Où est  la\u00a0gare ?", "Ça va.", ""]


def _run_snippet(folder: Path, texts: list[str]) -> list[str]:
    """The Python block of ``folder/README.md``, run in ``folder`` on ``texts``: its lines."""
    import subprocess
    import sys

    from qkv.export.readme import SAMPLE

    code = _snippet((folder / "README.md").read_text(encoding="utf-8"))
    assert code.count(repr(SAMPLE)) == 1
    code = code.replace(repr(SAMPLE), repr(texts))
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.split("\n")[: len(texts)]


@pytest.mark.parametrize("name", ["ctranslate2", "ctranslate2-int8"])
def test_the_readmes_snippet_translates_as_qkv_translate(trained_exports, name):
    out, _ = trained_exports["outs"][name]
    texts = TEXTS[:-1]
    got = _run_snippet(out / "ctranslate2", texts)
    rc, printed, err = quiet_cli(
        "translate", "--model-dir", str(out), "--engine", "ctranslate2", "--split", "none", *texts
    )
    assert rc == 0, err
    assert got == printed.splitlines()
    assert any(got), "translations to compare"


def test_the_readme_maps_a_beam_search(trained_exports, tmp_path):
    from qkv.export.ctranslate2 import Ct2Translator, export_ctranslate2
    from qkv.inference import Decoding, load_model

    saved = load_model(trained_exports["run"])
    beam = Decoding(beam_size=4, length_penalty=0.6, no_repeat_ngram=2, max_output_len=12)
    saved = dataclasses.replace(saved, decoding=beam)
    folder = export_ctranslate2(saved, tmp_path / "beam", quantize="int8")
    readme = (folder / "README.md").read_text(encoding="utf-8")
    for option in ("beam_size=4,", "length_penalty=0.6,", "no_repeat_ngram_size=2,"):
        assert option in readme
    assert "limit = min(12, 1024)" in readme
    assert _run_snippet(folder, TEXTS) == Ct2Translator(folder).translate(TEXTS)


def test_the_onnx_cards_snippet_translates_as_qkv_translate(trained_exports):
    """The ONNX export of a run (``qkv export --format onnx``): its card's snippet prints what
    ``qkv translate`` of the export prints, which is the run's own greedy translation."""
    from qkv.translate import Translator

    out, _ = trained_exports["outs"]["onnx"]
    texts = TEXTS[:-1]
    got = _run_snippet(out, texts)
    rc, printed, err = quiet_cli("translate", "--model-dir", str(out), "--split", "none", *texts)
    assert rc == 0, err
    assert got == printed.splitlines()
    assert any(got), "translations to compare"
    run = Translator.load(trained_exports["run"]).with_decoding(no_repeat_ngram=0)
    assert got == run.translate(texts, beam_size=1, split="none")  # plain greedy, as ONNX's
