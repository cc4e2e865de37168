"""Issue 17, item 7: one line instead of a traceback for what careless or hostile use gives qkv.

Each case here printed a traceback (or read a file outside the model folder) before: a bad or
truncated ``.gz``, ``--device mps|meta|cpu:99``, a tampered ``model.json`` or ``spm.model``
(with a manifest rewritten to match), ``d=0``, a tokenizer ``model_file`` pointing out of the
checkpoint.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from qkv import functional as qf
from qkv.cli import main
from qkv.data import Normalizer, build_tokenizers, bundled_pairs
from qkv.inference import CheckpointError, load_model, save_model
from qkv.nn.seq2seq import Seq2SeqConfig, build_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny untrained model folder with SentencePiece tokenizers (an spm.model each)."""
    pairs = bundled_pairs()[:300]
    src, tgt = build_tokenizers(
        pairs, "sentencepiece", joint=False, normalizer=Normalizer(), vocab_size=120
    )
    cfg = Seq2SeqConfig(
        src.vocab_size, tgt.vocab_size, num_hiddens=16, ffn_num_hiddens=32, num_heads=2,
        num_enc_layers=1, num_dec_layers=1,
    )  # fmt: skip
    return save_model(build_model(cfg), src, tgt, tmp_path_factory.mktemp("m") / "model")


def _copy(model_dir: Path, tmp_path: Path) -> Path:
    import shutil

    dst = tmp_path / "model"
    shutil.copytree(model_dir, dst)
    return dst


def _tamper(folder: Path, rel: str, data: bytes) -> None:
    """Replace file ``rel`` and rewrite the manifest to match (what a hostile edit does)."""
    (folder / rel).write_bytes(data)
    m = json.loads((folder / "manifest.json").read_text())
    m["files"][rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(m))


def _one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"qkv {command}: error: "), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# -- bad or truncated .gz


@pytest.mark.parametrize("truncated", [False, True], ids=["not gzip", "truncated"])
def test_a_bad_gz_is_one_line(tmp_path, capsys, model_dir, truncated):
    text = "".join(f"{s}\t{t}\n" for s, t in bundled_pairs()[:300]).encode()
    bad = tmp_path / "d.txt.gz"
    bad.write_bytes(gzip.compress(text)[:-20] if truncated else text)
    want = "is truncated" if truncated else "is not a valid gzip file"
    assert main(["train", "--data", str(bad), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert f"--data: '{bad}' {want}" in _one_line(capsys, "train")
    args = ["evaluate", "--model-dir", str(model_dir), "--data", str(bad), "--quiet"]
    assert main(args) == 2
    assert f"--data: '{bad}' {want}" in _one_line(capsys, "evaluate")


# -- devices


@pytest.mark.parametrize("device", ["mps", "meta", "cpu:99", "xpu", "cuda:99"])
def test_a_device_qkv_does_not_run_on_is_one_line(model_dir, capsys, device):
    assert main(["translate", "--model-dir", str(model_dir), "--device", device, "Go."]) == 2
    err = _one_line(capsys, "translate")
    assert f"device: {device!r}" in err or f"got {device!r}" in err


def test_train_names_the_device_flag(tmp_path, capsys):
    data = tmp_path / "d.txt"
    data.write_text("".join(f"{s}\t{t}\n" for s, t in bundled_pairs()[:300]), encoding="utf-8")
    args = ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--quiet"]
    assert main([*args, "--device", "meta", "--max-steps", "1"]) == 2
    assert "--device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got 'meta'" in _one_line(
        capsys, "train"
    )


def test_pick_device_keeps_what_works():
    from qkv.inference import pick_device

    assert pick_device("cpu") == pick_device("cpu:0") == torch.device("cpu")
    assert pick_device("auto").type in ("cpu", "cuda")


# -- a tampered model.json or spm.model (the manifest rewritten to match)


@pytest.mark.parametrize(
    "change",
    [
        {"num_hiddens": 2**40, "ffn_num_hiddens": 2**40},  # an allocation no machine has
        {"max_len": 2**40},
        "aliases",
    ],
    ids=["huge width", "huge positions", "aliases not a table"],
)
def test_a_tampered_model_json_is_one_line(model_dir, tmp_path, capsys, change):
    folder = _copy(model_dir, tmp_path)
    meta = json.loads((folder / "model.json").read_text())
    if change == "aliases":
        meta["aliases"] = ["not", "a", "table"]
    else:
        meta["config"].update(change)
        meta["config"]["num_heads"] = 1
    _tamper(folder, "model.json", json.dumps(meta).encode())
    with pytest.raises(CheckpointError, match=r"model\.json in .* is invalid"):
        load_model(folder)
    assert main(["translate", "--model-dir", str(folder), "Go."]) == 2
    assert "checkpoint: model.json in" in _one_line(capsys, "translate")


def test_a_corrupt_spm_model_is_one_line(model_dir, tmp_path, capsys):
    folder = _copy(model_dir, tmp_path)
    rel = "tokenizers/src/spm.model"
    _tamper(folder, rel, (folder / rel).read_bytes()[:100] + b"\xff" * 50)
    with pytest.raises(CheckpointError, match=r"spm\.model' is corrupt"):
        load_model(folder)
    assert main(["translate", "--model-dir", str(folder), "Go."]) == 2
    assert "the tokenizers in" in _one_line(capsys, "translate")


@pytest.mark.parametrize(
    "model_file", ["/etc/hostname", "../../../../etc/hostname", "../tgt/spm.model", ".."]
)
def test_a_model_file_out_of_the_checkpoint_is_refused(model_dir, tmp_path, capsys, model_file):
    folder = _copy(model_dir, tmp_path)
    rel = "tokenizers/src/tokenizer.json"
    cfg = json.loads((folder / rel).read_text())
    cfg["model_file"] = model_file
    _tamper(folder, rel, json.dumps(cfg).encode())
    with pytest.raises(CheckpointError, match=r"names the SentencePiece model .* expected a file"):
        load_model(folder)
    assert main(["translate", "--model-dir", str(folder), "Go."]) == 2
    _one_line(capsys, "translate")


def test_a_linked_spm_model_is_refused(model_dir, tmp_path):
    folder = _copy(model_dir, tmp_path)
    rel = "tokenizers/src/spm.model"
    outside = tmp_path / "elsewhere.model"
    outside.write_bytes((folder / rel).read_bytes())
    (folder / rel).unlink()
    os.symlink(outside, folder / rel)  # same bytes, so the manifest's hash still matches
    with pytest.raises(CheckpointError, match="is a link"):
        load_model(folder)


# -- a zero width


@pytest.mark.parametrize("backend", ["auto", "reference", "fused", "chunked", "export"])
def test_a_zero_width_is_a_value_error(backend):
    q = torch.randn(2, 5, 0)
    with pytest.raises(ValueError, match=r"query: expected a width d >= 1 .* \(2, 5, 0\)"):
        qf.attention(q, q, torch.randn(2, 5, 3), backend=backend)
    with pytest.raises(ValueError, match="query: expected a width d >= 1"):
        qf.additive_attention(q, q, torch.randn(2, 5, 3), torch.randn(0))
    from qkv import nn as qnn

    with pytest.raises(ValueError, match="width d >= 1"):
        qnn.DotProductAttention(0.0)(q, q, torch.randn(2, 5, 3))
    # a zero value width is an empty output, not an error
    out, _ = qf.attention(torch.randn(2, 5, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 0))
    assert out.shape == (2, 5, 0)


def test_a_zero_model_width_from_the_cli_is_one_line(tmp_path, capsys):
    args = ["train", "--out", str(tmp_path / "run"), "--quiet", "--set", "model.num_hiddens=0"]
    assert main(args) == 2
    assert "num_hiddens" in _one_line(capsys, "train")
