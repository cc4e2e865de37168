"""Files qkv writes get the modes the user's umask gives (``0o666 & ~umask``, folders
``0o777 & ~umask``), whoever wrote their bytes (safetensors writes 0600, ``mkstemp`` too): every
model folder (a checkpoint, an average, an export of each format), the run's ``best.json``, the
file of ``qkv translate --output``. Issue 27 row 8."""

from __future__ import annotations

import contextlib
import io
import os
import stat
from pathlib import Path

import pytest
from _folders import expected_modes, modes, umask
from _tiny_models import shared_translator

from qkv.cli import main
from qkv.data import save_tokenizers
from qkv.export import save_model
from qkv.export.ctranslate2 import export_ctranslate2
from qkv.train.checkpoint import average_checkpoints, save_checkpoint, write_best_pointer

MASKS = [0o022, 0o002, 0o027]


@pytest.fixture(scope="module")
def python_model():
    return shared_translator()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", MASKS)
def test_every_model_folder_gets_the_umask_modes(python_model, tmp_path, mask):
    model, src, tgt = python_model
    with umask(mask):
        folders = [save_model(model, src, tgt, tmp_path / "export")]
        root = tmp_path / "run" / "checkpoints"
        ckpts = [
            save_checkpoint(root, step, model=model, model_config=model.config.to_dict(),
                            train_config={}, split={}, trainer_state={}, tensors={"n": step},
                            write_tokenizers=lambda d: save_tokenizers(d, src, tgt))
            for step in (1, 2)
        ]  # fmt: skip
        folders += ckpts
        folders.append(average_checkpoints(ckpts, tmp_path / "average"))
        folders.append(export_ctranslate2(folders[0], tmp_path / "ct2").parent)
        write_best_pointer(root, 2, 1.0)
    for folder in folders:
        assert modes(folder) == expected_modes(folder, mask), folder.name
    assert _mode(root / "best.json") == 0o666 & ~mask


@pytest.mark.parametrize("mask", MASKS)
def test_qkv_translate_output_gets_the_umask_mode(python_model, tmp_path, mask):
    model, src, tgt = python_model
    folder = save_model(model, src, tgt, tmp_path / "m")
    out = tmp_path / "out.txt"
    with umask(mask), contextlib.redirect_stdout(io.StringIO()):
        assert main(["translate", "--model-dir", str(folder), "go .", "--output", str(out)]) == 0
    assert _mode(out) == 0o666 & ~mask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "out.txt"]  # no temporary left


def test_an_atomic_file_is_written_whole_or_not_at_all(tmp_path):
    from qkv.inference.writing import atomic_file, current_umask

    with umask(0o027):
        assert current_umask() == 0o027  # read, not changed
        assert current_umask() == 0o027
    p = tmp_path / "f.txt"
    p.write_text("old")
    with pytest.raises(RuntimeError), atomic_file(p, "w", encoding="utf-8") as f:
        f.write("new, half")
        raise RuntimeError("stopped")
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["f.txt"]
    with umask(0o022), atomic_file(p, "w", encoding="utf-8") as f:
        f.write("new")
    assert p.read_text() == "new" and _mode(p) == 0o644


@pytest.mark.slow
def test_an_onnx_export_gets_the_umask_modes(python_model, tmp_path):
    from qkv.export.onnx import export_onnx

    model, src, tgt = python_model
    folder = save_model(model, src, tgt, tmp_path / "m")
    with umask(0o027):
        out = export_onnx(folder, tmp_path / "onnx")
    assert modes(out) == expected_modes(out, 0o027)
