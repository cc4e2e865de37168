"""Every exported format checks itself: a qkv model folder, a CTranslate2 model and ONNX graphs
carry a manifest (the size and SHA-256 of each file) that their engine verifies before it
reads a file; a folder that was tampered with is refused in one line naming the file. An ONNX
export has a model card like the others, and --force replaces an export of any format.
Issue 27 row 3."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest
from _folders import flip, tamper, tamper_json
from _tiny_models import shared_translator

from qkv.cli import main
from qkv.export import save_model
from qkv.export.ctranslate2 import Ct2Translator, export_ctranslate2
from qkv.export.onnx import OnnxTranslator, export_onnx
from qkv.inference import CheckpointError
from qkv.translate import Translator

#: the weights of each format, relative to the folder an engine is given
WEIGHTS = {"qkv": "model.safetensors", "ct2": "ctranslate2/model.bin", "onnx": "encoder.onnx"}
#: a file every format reads, relative to that folder
TOKENIZER = {
    "qkv": "tokenizers/tgt/tokenizer.json",
    "ct2": "ctranslate2/tokenizers/tgt/tokenizer.json",
    "onnx": "tokenizers/tgt/tokenizer.json",
}


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    """One tiny model as a qkv model folder and a CTranslate2 export (ONNX: :func:`onnx`): the
    model of the other tests' exports, whose ONNX trace the run makes once."""
    model, src, tgt = shared_translator()
    root = tmp_path_factory.mktemp("exports")
    folder = save_model(model, src, tgt, root / "qkv", languages=("en", "fr"))
    export_ctranslate2(folder, root / "ct2")
    return {"qkv": folder, "ct2": root / "ct2"}


@pytest.fixture(scope="module")
def onnx(exports) -> Path:
    return export_onnx(exports["qkv"], exports["qkv"].parent / "onnx")


def _folder(fmt: str, exports: dict, request) -> Path:
    return request.getfixturevalue("onnx") if fmt == "onnx" else exports[fmt]


def _load(fmt: str, folder: Path):
    if fmt == "qkv":
        return Translator.load(folder)
    if fmt == "ct2":
        return Ct2Translator(folder, threads=1)
    return OnnxTranslator(folder, threads=1)


def _copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name, symlinks=True))


def _refused(fmt: str, folder: Path, *says: str) -> str:
    with pytest.raises((CheckpointError, ValueError)) as info:
        _load(fmt, folder)
    text = str(info.value)
    assert "\n" not in text and all(s in text for s in says), text
    return text


#: the formats these tests are new for (a qkv model folder's are tests/export/test_export_package.py's
#: and tests/inference/test_inference_bounds.py's; ``_load`` reads it too, for comparison)
FORMATS = ["ct2", pytest.param("onnx", marks=pytest.mark.slow)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_intact_export_loads_and_a_flipped_weight_file_is_refused(
    fmt, exports, request, tmp_path
):
    d = _copy(_folder(fmt, exports, request), tmp_path)
    assert _load(fmt, d).translate(["go ."]) is not None
    flip(d / WEIGHTS[fmt], offset=(d / WEIGHTS[fmt]).stat().st_size // 2)
    _refused(fmt, d, Path(WEIGHTS[fmt]).name, "corrupt")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_linked_file_is_refused_even_with_the_same_bytes(fmt, exports, request, tmp_path):
    d = _copy(_folder(fmt, exports, request), tmp_path)
    outside = tmp_path / "elsewhere.json"
    shutil.copyfile(d / TOKENIZER[fmt], outside)
    (d / TOKENIZER[fmt]).unlink()
    os.symlink(outside, d / TOKENIZER[fmt])
    _refused(fmt, d, "tokenizer.json", "link")


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_added_or_a_missing_file_is_refused(fmt, exports, request, tmp_path):
    d = _copy(_folder(fmt, exports, request), tmp_path)
    added = Path(TOKENIZER[fmt]).parent / "extra.json"
    (d / added).write_text("{}")
    _refused(fmt, d, "extra.json", "not listed")
    (d / added).unlink()
    (d / TOKENIZER[fmt]).unlink()
    _refused(fmt, d, "tokenizer.json", "missing")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_folder_without_a_manifest_is_refused(fmt, exports, request, tmp_path):
    d = _copy(_folder(fmt, exports, request), tmp_path)
    for m in d.rglob("manifest.json"):
        m.unlink()
    _refused(fmt, d, "manifest.json")


@pytest.mark.parametrize("fmt", FORMATS)
def test_weights_replaced_with_the_manifest_rewritten_are_one_line(fmt, exports, request, tmp_path):
    d = _copy(_folder(fmt, exports, request), tmp_path)
    size = (d / WEIGHTS[fmt]).stat().st_size  # as large: no size bound refuses it first
    tamper(d, WEIGHTS[fmt], (b"\x00garbage, not a model\xff" * size)[:size])
    _refused(fmt, d, Path(WEIGHTS[fmt]).name)


@pytest.mark.parametrize(
    "fmt, rel, change, key",
    [
        ("ct2", "ctranslate2/qkv.json", {"positions": 10**12}, "positions"),
        ("ct2", "ctranslate2/qkv.json", {"decoding": {"beam_size": 10**6}}, "beam_size"),
        pytest.param("onnx", "onnx.json", {"layers": 10**9}, "layers", marks=pytest.mark.slow),
        pytest.param("onnx", "onnx.json", {"eos_id": "2"}, "eos_id", marks=pytest.mark.slow),
        pytest.param(
            "onnx", "onnx.json", {"tgt_vocab_size": 7}, "vocabularies", marks=pytest.mark.slow
        ),
    ],
)
def test_sizes_out_of_bounds_name_the_file(fmt, rel, change, key, exports, request, tmp_path):
    d = _copy(_folder(fmt, exports, request), tmp_path)
    tamper_json(d, rel, **change)
    _refused(fmt, d, Path(rel).name, "invalid", key)


def test_the_ctranslate2_folder_copied_alone_checks_itself(exports, tmp_path):
    alone = Path(shutil.copytree(exports["ct2"] / "ctranslate2", tmp_path / "ct2-alone"))
    assert json.loads((alone / "manifest.json").read_text())["format"] == "qkv.ctranslate2"
    assert Ct2Translator(alone, threads=1).translate(["go ."]) is not None
    flip(alone / "model.bin", offset=(alone / "model.bin").stat().st_size // 2)
    _refused("ct2", alone, "model.bin", "corrupt")


def test_qkv_translate_engine_ctranslate2_refuses_a_damaged_model_in_one_line(exports, tmp_path):
    d = _copy(exports["ct2"], tmp_path)
    flip(d / "ctranslate2" / "model.bin", offset=4096)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(
            ["translate", "--engine", "ctranslate2", "--model-dir", str(d), "go .", "--quiet"]
        )
    line = err.getvalue()
    assert rc == 2 and out.getvalue() == "", line
    assert line.startswith("qkv translate: error: ") and line.count("\n") == 1
    assert "model.bin" in line and "Traceback" not in line


# ---------------------------------------------------------------------------- ONNX's card, --force
@pytest.mark.slow
def test_an_onnx_export_has_a_card_and_a_manifest(onnx):
    manifest = json.loads((onnx / "manifest.json").read_text())
    assert manifest["format"] == "qkv.onnx"
    assert {"encoder.onnx", "decoder_step.onnx", "onnx.json", "README.md", "card.json"} <= set(
        manifest["files"]
    )
    card = (onnx / "README.md").read_text()
    assert card.startswith("---\nlanguage:\n- en\n- fr\n") and "OnnxTranslator" in card
    assert json.loads((onnx / "card.json").read_text())["languages"] == ["en", "fr"]
    assert OnnxTranslator(onnx).card_rows()[1] == ("languages", "en \u2192 fr")


def _export(*args: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["export", *args, "--quiet"])
    return rc, err.getvalue()


@pytest.mark.slow
def test_force_replaces_an_earlier_export_of_any_format(exports, onnx, tmp_path):
    # ONNX graphs exported before ONNX folders had a manifest
    old = tmp_path / "old"
    old.mkdir()
    for name in ("encoder.onnx", "decoder_step.onnx", "onnx.json", "tokenizers"):
        (shutil.copytree if name == "tokenizers" else shutil.copyfile)(onnx / name, old / name)
    src = str(exports["qkv"])
    rc, err = _export("--model-dir", src, "--out", str(old), "--format", "onnx")
    assert rc == 2 and "--force" in err
    rc, err = _export("--model-dir", src, "--out", str(old), "--format", "onnx", "--force")
    assert rc == 0, err
    assert OnnxTranslator(old).translate(["go ."]) == OnnxTranslator(onnx).translate(["go ."])
    rc, err = _export("--model-dir", src, "--out", str(old), "--format", "qkv", "--force")
    assert rc == 0, err
    assert not (old / "encoder.onnx").exists() and (old / "model.safetensors").is_file()
    # never what qkv did not write
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "encoder.onnx").write_text("mine")
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    rc, err = _export("--model-dir", src, "--out", str(tmp_path / "mine"), "--format", "onnx",
                      "--force")  # fmt: skip
    assert rc == 2 and "not a model folder" in err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"


def test_a_ctranslate2_vocabulary_that_is_not_the_tokenizers_is_refused(exports, tmp_path):
    d = _copy(exports["ct2"], tmp_path)
    rel = "ctranslate2/target_vocabulary.json"
    words = json.loads((d / rel).read_text())
    words[4], words[5] = words[5], words[4]  # two ids swapped, the manifest rewritten
    tamper(d, rel, json.dumps(words).encode())
    _refused("ct2", d, "target_vocabulary.json", "not the target tokenizer's vocabulary")
