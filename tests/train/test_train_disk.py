"""Issue 17: a full disk while writing, stale temporaries, and a checkpoint pruned while read.

A full disk is simulated by making a write raise ``OSError(ENOSPC)``, the way the kernel does.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from qkv._atomic import tree_bytes
from qkv.cli import main
from qkv.data import Normalizer, build_tokenizers, bundled_pairs, save_tokenizers
from qkv.inference import CheckpointError, NoSpaceError, load_model, save_model, writing
from qkv.inference.saved import load_checkpoint, verify_checkpoint
from qkv.nn.seq2seq import Seq2SeqConfig, build_model
from qkv.train.checkpoint import (
    atomic_write_json,
    find_checkpoints,
    remove_stale_temporaries,
    save_checkpoint,
)
from qkv.train.runlock import RunLock

FULL = OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture(scope="module")
def parts():
    pairs = bundled_pairs()[:200]
    src, tgt = build_tokenizers(pairs, "word", normalizer=Normalizer.book(), min_freq=1)
    cfg = Seq2SeqConfig(
        src.vocab_size, tgt.vocab_size, num_hiddens=16, ffn_num_hiddens=32, num_heads=2,
        num_enc_layers=1, num_dec_layers=1,
    )  # fmt: skip
    return build_model(cfg), cfg, src, tgt


def _save(root: Path, step: int, parts) -> Path:
    model, cfg, src, tgt = parts
    return save_checkpoint(
        root,
        step,
        model=model,
        model_config=cfg.to_dict(),
        train_config={"seed": 0},
        write_tokenizers=lambda d: save_tokenizers(d, src, tgt),
        split={"n": 0},
        trainer_state={"step": step},
        tensors={"optimizer": {"state": {}}, "rng": [1, 2, 3]},
    )


def _full_at(monkeypatch, name: str):
    """Make the write of file ``name`` (into any folder) fail: the disk is full."""
    real = writing._write_synced

    def write(path, data):
        if Path(path).name == name:
            raise FULL
        return real(path, data)

    monkeypatch.setattr(writing, "_write_synced", write)


@pytest.mark.parametrize("failing", ["model.json", "trainer.json", "manifest.json", "trainer.pt"])
def test_a_full_disk_keeps_the_earlier_checkpoints_and_leaves_nothing(
    tmp_path, parts, monkeypatch, failing
):
    root = tmp_path / "run" / "checkpoints"
    first = _save(root, 10, parts)
    atomic_write_json(root / "best.json", {"step": 10, "path": first.name, "bleu": 1.0})
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    if failing == "trainer.pt":  # torch.save writes through a Python file: ENOSPC as it is
        import torch

        def save(obj, f, *a, **k):
            raise FULL

        monkeypatch.setattr(torch, "save", save)
    else:
        _full_at(monkeypatch, failing)
    with pytest.raises(NoSpaceError) as e:
        _save(root, 20, parts)
    msg = str(e.value)
    assert msg.startswith(f"no space left on the device of '{root}' while writing step-00000020")
    assert f"(it needs about {tree_bytes(first) / 1e6:.1f} MB, " in msg  # the checkpoint before
    assert "B free there now)" in msg and "--resume" in msg and "\n" not in msg
    assert e.value.errno == errno.ENOSPC and isinstance(e.value, OSError)
    # its temporary folder is gone, the earlier checkpoint and best.json are as they were
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    verify_checkpoint(first)
    assert json.loads((root / "best.json").read_text())["path"] == first.name


def test_rewriting_a_step_on_a_full_disk_keeps_the_old_folder(tmp_path, parts, monkeypatch):
    root = tmp_path / "checkpoints"
    first = _save(root, 10, parts)
    _full_at(monkeypatch, "manifest.json")
    with pytest.raises(NoSpaceError):
        _save(root, 10, parts)  # the same step again (a resumed run stopped right there)
    verify_checkpoint(first)
    assert [p.name for p in root.iterdir()] == [first.name]


def test_a_full_disk_in_safetensors_is_named_too(tmp_path, parts, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    def save_file(*a, **k):  # safetensors reports the OS error as text only
        raise SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No '
            'space left on device" })'
        )

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    with pytest.raises(NoSpaceError, match="no space left"):
        _save(tmp_path / "checkpoints", 10, parts)
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_a_full_disk_writing_best_json(tmp_path, monkeypatch):
    target = tmp_path / "best.json"
    atomic_write_json(target, {"step": 1})
    real_replace = os.replace

    def replace(a, b):
        raise FULL

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(NoSpaceError, match=rf"no space left .*'{tmp_path}' while writing best"):
        atomic_write_json(target, {"step": 2})
    monkeypatch.setattr(os, "replace", real_replace)
    assert [p.name for p in tmp_path.iterdir()] == ["best.json"]
    assert json.loads(target.read_text()) == {"step": 1}


def test_qkv_export_on_a_full_disk_is_one_line(tmp_path, parts, monkeypatch, capsys):
    model, _, src, tgt = parts
    saved = save_model(model, src, tgt, tmp_path / "model")
    _full_at(monkeypatch, "model.json")
    out = tmp_path / "deploy"
    assert main(["export", "--model-dir", str(saved), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"qkv export: error: no space left on the device of '{tmp_path}'")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary left
    load_model(saved)  # the source is intact


def _train_argv(tmp_path: Path, out: Path) -> list[str]:
    """``qkv train`` of a tiny model for 4 updates on 300 pairs, a checkpoint every 2."""
    from _train_helpers import tiny_config

    data = tmp_path / "d.txt"
    data.write_text("".join(f"{s}\t{t}\n" for s, t in bundled_pairs()[:300]), encoding="utf-8")
    argv = ["train", "--quiet", "--data", str(data), "--out", str(out), "--preset", "none"]
    argv += ["--max-steps", "4", "--save-every", "2", "--eval-every", "4"]
    argv += ["--set", "tokenizer=word", "--set", "tune_decoding=false"]
    model = tiny_config().model_options | {"kind": "transformer"}
    return [*argv, "--set", f"model={json.dumps(model)}"]


class _FillsUp:
    """A file that takes ``room`` bytes, then fails as a full disk does."""

    def __init__(self, f, room: int) -> None:
        self.f, self.room = f, room

    def write(self, data) -> int:
        self.room -= len(data)
        if self.room < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def test_torchs_own_error_after_a_full_disk_is_one_line_and_the_checkpoint_before_loads(
    tmp_path, monkeypatch, capsys
):
    """torch.save's zip writer, closed after the failed write, raises a RuntimeError ("unexpected
    pos") whose context is the OSError: what a full disk gave (a 40-line traceback)."""
    import torch

    out = tmp_path / "run"
    argv = _train_argv(tmp_path, out)
    real = torch.save
    calls = {"n": 0}

    def save(obj, f, *a, **k):  # the second checkpoint's training state fills the disk
        calls["n"] += 1
        return real(obj, _FillsUp(f, 1000) if calls["n"] == 2 else f, *a, **k)

    monkeypatch.setattr(torch, "save", save)
    assert main(argv) == 1
    err = capsys.readouterr().err
    (kept,) = find_checkpoints(out / "checkpoints")
    assert err.startswith(
        f"qkv train: error: no space left on the device of '{out / 'checkpoints'}' while "
        f"writing step-00000004 (it needs about {tree_bytes(kept) / 1e6:.1f} MB, "
    )
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert kept.name == "step-00000002"
    load_checkpoint(kept)  # the checkpoint before still loads
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".qkv-")]


def test_qkv_train_on_a_full_disk_is_one_line(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    argv = _train_argv(tmp_path, out)
    real = writing._write_synced
    calls = {"n": 0}

    def write(path, data):  # the second checkpoint's first JSON file fills the disk
        if Path(path).name == "model.json":
            calls["n"] += 1
            if calls["n"] == 2:
                raise FULL
        return real(path, data)

    monkeypatch.setattr(writing, "_write_synced", write)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "qkv train: error: no space left on the device of" in err and "checkpoints" in err
    assert "Traceback" not in err
    (kept,) = find_checkpoints(out / "checkpoints")
    assert kept.name == "step-00000002"
    verify_checkpoint(kept)
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".qkv-")]
    assert not (out / ".lock").exists()  # the lock was released


# -- stale temporaries of a killed writer, cleaned on the next write (only when not in use) --


def _stale(root: Path, name: str, source: Path) -> Path:
    p = root / name
    shutil.copytree(source, p)
    return p


def test_the_next_checkpoint_write_removes_a_killed_writers_folder(tmp_path, parts):
    out = tmp_path / "run"
    root = out / "checkpoints"
    first = _save(root, 10, parts)
    dead = _stale(root, ".qkv-tmp-step-00000020-999999999", first)  # no such pid
    mine = root / ".qkv-tmp-step-00000030-999999998"
    mine.mkdir()
    (mine / "thesis.tex").write_text("not qkv's")  # holds what qkv never writes: kept
    with RunLock(out):
        # a live process's folder is the run's own (we hold its lock): stale as well
        live = _stale(root, f".qkv-tmp-step-00000040-{os.getppid()}", first)
        _save(root, 20, parts)
    assert not dead.exists() and not live.exists() and mine.exists()
    assert [p.name for p in find_checkpoints(root)] == ["step-00000010", "step-00000020"]


def test_without_the_lock_a_live_writers_folder_is_left_alone(tmp_path, parts):
    # no trainer holds this folder's lock: another live process may be writing there
    root = tmp_path / "models"
    first = _save(root, 10, parts)
    live = _stale(root, f".qkv-tmp-step-00000020-{os.getppid()}", first)
    dead = _stale(root, ".qkv-old-step-00000010-999999999", first)
    _save(root, 30, parts)
    assert live.exists() and not dead.exists()
    assert remove_stale_temporaries(root) == []  # the run's start: the same rule


def test_qkv_export_removes_a_killed_exports_folder(tmp_path, parts):
    model, _, src, tgt = parts
    saved = save_model(model, src, tgt, tmp_path / "model")
    dead = _stale(tmp_path, ".qkv-tmp-deploy-999999999", saved)
    save_model(model, src, tgt, tmp_path / "deploy")
    assert not dead.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy", "model"]


# -- a checkpoint pruned while it is read --


def test_a_checkpoint_pruned_while_read_is_in_use_not_missing(tmp_path, parts, monkeypatch):
    from qkv.inference import saved as saved_module

    out = tmp_path / "run"
    root = out / "checkpoints"
    ckpt = _save(root, 10, parts)
    real = saved_module.sha256_file

    def prune_during(path):  # the trainer prunes the folder just after model.json was checked
        digest = real(path)
        if Path(path).name == "model.json":
            shutil.rmtree(ckpt)
        return digest

    monkeypatch.setattr(saved_module, "sha256_file", prune_during)
    with RunLock(out):  # a trainer runs in the run folder
        for read in (lambda: load_checkpoint(ckpt), lambda: load_model(ckpt)):
            _save(root, 10, parts)
            with pytest.raises(CheckpointError) as e:
                read()
            msg = str(e.value)
            assert f"checkpoint: '{ckpt}' is in use: the trainer running in that run folder" in msg
            assert f"pid {os.getpid()}" in msg and str(out / ".lock") in msg
            assert "best checkpoint" in msg
        # asked for after it was pruned: in use too, not "not a folder"
        with pytest.raises(CheckpointError, match="is in use"):
            load_checkpoint(ckpt)


def test_translate_on_a_pruned_checkpoint_is_one_line(tmp_path, parts, monkeypatch, capsys):
    out = tmp_path / "run"
    ckpt = _save(out / "checkpoints", 10, parts)
    from qkv.inference import saved as saved_module

    def prune_during(path, _real=saved_module.sha256_file):
        digest = _real(path)
        shutil.rmtree(ckpt, ignore_errors=True)
        return digest

    monkeypatch.setattr(saved_module, "sha256_file", prune_during)
    with RunLock(out):
        assert main(["translate", "--model-dir", str(ckpt), "Go."]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qkv translate: error: checkpoint: '{ckpt}' is in use")
    assert err.count("\n") == 1
