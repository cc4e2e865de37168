"""Checkpoints: atomic writes, what a folder holds, pruning, and clear errors for bad ones."""

from __future__ import annotations

import itertools
import json
import shutil

import pytest
import torch
from _train_helpers import ENDED, tiny_config

from qkv.cli import main
from qkv.train import CheckpointError, TrainConfig, load_checkpoint, resolve_model_dir, train
from qkv.train.checkpoint import (
    atomic_write_json,
    find_checkpoints,
    latest_checkpoint,
    load_model_weights,
    remove_stale_temporaries,
    verify_checkpoint,
)
from qkv.train.runlock import RunLock
from qkv.translate import Translator


def test_folder_holds_everything(trained):
    root = trained["transformer"] / "checkpoints"
    ckpt = latest_checkpoint(root)
    assert ckpt.name == "step-00000030"
    names = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()}
    for f in (
        "manifest.json",
        "model.safetensors",
        "model.json",
        "train.json",
        "split.json",
        "trainer.json",
        "trainer.pt",
        "tokenizers/src/tokenizer.json",
        "tokenizers/tgt/tokenizer.json",
    ):
        assert f in names
    manifest = verify_checkpoint(ckpt)
    assert manifest["format"] == "qkv.checkpoint" and manifest["step"] == 30
    assert set(manifest["files"]) == names - {"manifest.json"}
    loaded = load_checkpoint(ckpt)
    assert set(loaded.tensors) == {"optimizer", "schedule", "rng"}
    assert loaded.trainer_state["data"]["epoch"] >= 0
    assert loaded.trainer_state["step"] == 30
    assert not (root / "latest.json").exists()  # the listing is the truth; no pointer to trust
    best = json.loads((root / "best.json").read_text())
    assert (root / best["path"]).is_dir()
    # a run folder resolves to its final model; without one, to its best checkpoint
    assert resolve_model_dir(trained["transformer"]) == trained["transformer"] / "final"
    assert resolve_model_dir(root) == root / best["path"]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


def test_keep_last_and_best(tmp_path, corpus_file):
    cfg = tiny_config(data=str(corpus_file), max_steps=20, save_every=4, eval_every=10, keep_last=2)
    train(cfg, tmp_path, progress=False)
    steps = [p.name for p in find_checkpoints(tmp_path / "checkpoints")]
    best = json.loads((tmp_path / "checkpoints" / "best.json").read_text())["path"]
    assert steps[-2:] == ["step-00000016", "step-00000020"]
    assert set(steps) == {"step-00000016", "step-00000020", best}


def test_atomic_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "x.json"
    atomic_write_json(target, {"a": 1})
    atomic_write_json(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_unfinished_folders_are_not_checkpoints(tmp_path, trained):
    root = tmp_path / "checkpoints"
    root.mkdir()
    good = latest_checkpoint(trained["transformer"] / "checkpoints")
    shutil.copytree(good, root / ".qkv-tmp-step-00000040-123")  # a writer killed before the rename
    shutil.copytree(good, root / ".qkv-old-step-00000020-123")  # ... before removing the old one
    (root / ".best.json.qkv-tmp-123").write_text("{")  # ... inside atomic_write_json
    shutil.copytree(good, root / "step-00000050")
    (root / "step-00000050" / "manifest.json").unlink()  # never finalised
    shutil.copytree(good, root / "step-00000030")
    assert latest_checkpoint(root).name == "step-00000030"
    with RunLock(tmp_path):  # as a run's start: the run's lock held, no one else writes there
        assert len(remove_stale_temporaries(root)) == 3
    assert sorted(p.name for p in root.iterdir()) == ["step-00000030", "step-00000050"]


def test_clean_up_touches_only_what_qkv_wrote(tmp_path, corpus_file):
    # a folder of the user's, with names like the temporaries qkv used to clean up by prefix
    out = tmp_path / "mine"
    root = out / "checkpoints"
    (root / ".old-draft").mkdir(parents=True)
    (root / ".old-draft" / "thesis.tex").write_text("years of work")
    (root / ".tmp-notes").write_text("notes")
    (root / "notes.tmp-1").write_text("notes")
    (root / ".tmp-step-00000001-5").write_text("mine")
    (root / ".old-model").mkdir()  # a backup of the user's, in files qkv also writes
    (root / ".old-model" / "model.safetensors").write_bytes(b"their weights")
    # even qkv's own temporary name is left alone when it holds something qkv never writes
    (root / ".qkv-tmp-step-00000001-7").mkdir()
    (root / ".qkv-tmp-step-00000001-7" / "thesis.tex").write_text("more work")
    user = {p.relative_to(out) for p in out.rglob("*")}
    train(tiny_config(data=str(corpus_file), max_steps=2, eval_every=2, save_every=2,
                      tune_decoding=False), out, progress=False)  # fmt: skip
    assert user <= {p.relative_to(out) for p in out.rglob("*")}
    assert (root / ".old-draft" / "thesis.tex").read_text() == "years of work"
    assert (root / "step-00000002" / "manifest.json").is_file()


@pytest.fixture
def ckpt_copy(tmp_path, trained):
    src = latest_checkpoint(trained["transformer"] / "checkpoints")
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def _corrupt_byte(path, offset=-10):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _manifest_files(d, files):
    m = json.loads((d / "manifest.json").read_text())
    m["files"] = files
    (d / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize(
    "files", [["model.safetensors"], "x", {"model.safetensors": 12}, {"../x": {"bytes": 1}}]
)
def test_a_manifest_with_a_bad_file_list_is_a_clear_error(ckpt_copy, files):
    _manifest_files(ckpt_copy, files)
    with pytest.raises(CheckpointError, match=r"manifest\.json is corrupt"):
        Translator.load(ckpt_copy)


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda d: _corrupt_byte(d / "model.safetensors"), "model.safetensors .* is corrupt"),
        (lambda d: _corrupt_byte(d / "model.json", 5), "model.json .* is corrupt"),
        (
            lambda d: (d / "tokenizers/src/tokenizer.json").unlink(),
            "incomplete: tokenizers/src/tokenizer.json is missing",
        ),
        (lambda d: (d / "manifest.json").write_text("{not json"), "corrupt"),
        (lambda d: (d / "manifest.json").unlink(), "not a qkv checkpoint"),
        (
            lambda d: (d / "manifest.json").write_text(json.dumps({"format": "fairseq"})),
            "not a qkv checkpoint",
        ),
    ],
)
def test_corrupt_or_foreign_checkpoint_is_a_clear_error(ckpt_copy, damage, match, capsys):
    damage(ckpt_copy)
    with pytest.raises(CheckpointError, match=match):
        Translator.load(ckpt_copy)
    assert main(["translate", "--model-dir", str(ckpt_copy), "go ."]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv translate: error: ") and "Traceback" not in err
    assert "checkpoint" in err


def test_weights_of_another_model_are_refused(ckpt_copy, trained):
    other = latest_checkpoint(trained["bahdanau"] / "checkpoints")
    from qkv.nn import build_model

    model = build_model(load_checkpoint(ckpt_copy, with_tensors=False).model_config)
    with pytest.raises(CheckpointError, match="do not fit the model"):
        load_model_weights(other, model)


def test_a_plain_torch_file_is_not_a_model_dir(tmp_path, capsys):
    torch.save({"w": torch.ones(2)}, tmp_path / "model.pt")
    with pytest.raises(CheckpointError, match="is a file"):
        resolve_model_dir(tmp_path / "model.pt")
    with pytest.raises(CheckpointError, match="holds no qkv checkpoint"):
        resolve_model_dir(tmp_path)
    assert main(["evaluate", "--model-dir", str(tmp_path), "--json"]) == 2
    assert "holds no qkv checkpoint" in capsys.readouterr().err


def test_translation_reads_and_verifies_only_what_it_needs(ckpt_copy, capsys):
    # translating never reads the training state: a damaged trainer.pt or split.json of a
    # checkpoint does not stop its weights from translating
    (ckpt_copy / "trainer.pt").write_bytes((ckpt_copy / "trainer.pt").read_bytes()[:100])
    _corrupt_byte(ckpt_copy / "split.json", 3)
    assert Translator.load(ckpt_copy).translate("go .")
    assert main(["translate", "--model-dir", str(ckpt_copy), "go ."]) == 0
    assert capsys.readouterr().out.strip()
    # reading the run's state reads them, and says which is damaged
    with pytest.raises(CheckpointError, match=r"split\.json .* is corrupt"):
        load_checkpoint(ckpt_copy, with_tensors=False)
    _corrupt_byte(ckpt_copy / "split.json", 3)  # restored
    assert load_checkpoint(ckpt_copy, with_tensors=False).split
    with pytest.raises(CheckpointError, match=r"trainer\.pt .* is corrupt"):
        load_checkpoint(ckpt_copy)


def _unlist(d, name):
    m = json.loads((d / "manifest.json").read_text())
    del m["files"][name]
    (d / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize(
    "name, read",
    [
        ("trainer.pt", lambda d: load_checkpoint(d)),
        ("trainer.json", lambda d: load_checkpoint(d, with_tensors=False)),
        ("model.safetensors", lambda d: Translator.load(d)),
        ("tokenizers/src/tokenizer.json", lambda d: Translator.load(d)),
    ],
)
def test_a_file_the_manifest_does_not_list_is_never_read(ckpt_copy, name, read):
    _unlist(ckpt_copy, name)  # then it could be anything: it is refused, not read unchecked
    with pytest.raises(CheckpointError, match=rf"{name} in .* is not listed in its manifest"):
        read(ckpt_copy)


def test_unlisted_files_a_reader_would_pick_up_are_refused(ckpt_copy):
    (ckpt_copy / "decoding.json").write_text('{"beam_size": 4}')  # read when present
    with pytest.raises(CheckpointError, match=r"decoding\.json in .* is not listed"):
        Translator.load(ckpt_copy)
    (ckpt_copy / "decoding.json").unlink()
    (ckpt_copy / "tokenizers" / "src" / "extra.model").write_bytes(b"x")  # in a folder read
    with pytest.raises(CheckpointError, match=r"tokenizers/src/extra\.model in .* is not listed"):
        Translator.load(ckpt_copy)
    (ckpt_copy / "tokenizers" / "src" / "extra.model").unlink()
    (ckpt_copy / "NOTES.txt").write_text("a user's note")  # never read: no harm
    assert Translator.load(ckpt_copy).translate("go .")


class _Payload:  # what a hostile trainer.pt holds instead of tensors
    pass


def test_a_tampered_trainer_pt_is_refused_without_torchs_advice(ckpt_copy, tmp_path, capsys):
    from qkv.inference.saved import sha256_file

    pt = ckpt_copy / "trainer.pt"
    torch.save({"optimizer": _Payload()}, pt)
    m = json.loads((ckpt_copy / "manifest.json").read_text())  # the manifest rewritten to match
    m["files"]["trainer.pt"] = {"bytes": pt.stat().st_size, "sha256": sha256_file(pt)}
    (ckpt_copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match=r"trainer\.pt in .* is not training state") as e:
        load_checkpoint(ckpt_copy)
    assert "weights_only" not in str(e.value) and "trust" not in str(e.value)
    out = tmp_path / "run"  # the same through `qkv train --resume`
    shutil.copytree(ckpt_copy, out / "checkpoints" / "step-00000030")
    assert main(["train", "--out", str(out), "--resume", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv train: error: ") and err.count("\n") == 1
    assert "trainer.pt" in err and "weights_only" not in err and "Traceback" not in err


@pytest.mark.parametrize("pointer", ["/etc", "../../elsewhere/step-00000001", "final", 7])
def test_a_pointer_out_of_the_run_folder_is_refused(tmp_path, trained, pointer, capsys):
    out = tmp_path / "run"
    shutil.copytree(trained["transformer"], out)
    shutil.rmtree(out / "final")  # the run folder resolves through best.json
    (out / "checkpoints" / "best.json").write_text(json.dumps({"path": pointer}))
    with pytest.raises(CheckpointError, match="follows no pointer out of a run folder"):
        resolve_model_dir(out)
    assert main(["translate", "--model-dir", str(out), "go ."]) == 2
    err = capsys.readouterr().err
    assert "best.json" in err and "Traceback" not in err


def test_a_checkpoint_linked_from_outside_is_not_followed(tmp_path, trained):
    out = tmp_path / "run"
    shutil.copytree(trained["transformer"], out)
    shutil.rmtree(out / "final")
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(latest_checkpoint(out / "checkpoints"), elsewhere)
    (out / "checkpoints" / "step-00000099").symlink_to(elsewhere)
    (out / "checkpoints" / "best.json").write_text(json.dumps({"path": "step-00000099"}))
    with pytest.raises(CheckpointError, match="follows no pointer"):
        resolve_model_dir(out)


def test_a_second_run_into_the_same_folder_is_refused(tmp_path, trained, capsys):
    out = tmp_path / "run"
    shutil.copytree(trained["transformer"], out)
    assert main(["train", "--out", str(out), "--max-steps", "40"]) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_resume_refuses_changed_settings(tmp_path, trained):
    out = tmp_path / "run"
    shutil.copytree(trained["transformer"], out)
    saved = load_checkpoint(latest_checkpoint(out / "checkpoints"), with_tensors=False)
    from qkv.train import TrainConfig

    cfg = TrainConfig.from_dict(saved.train_config).updated({"lr": 0.5})
    with pytest.raises(ValueError, match="lr: checkpoint"):
        train(cfg, out, resume=True, progress=False)


def test_crash_before_best_json_keeps_the_best_checkpoint(tmp_path, corpus_file, monkeypatch):
    from types import SimpleNamespace

    import qkv.train.checkpoint as checkpoint
    import qkv.train.validation as validation

    bleus = itertools.chain([5.0, 9.0], itertools.repeat(1.0))
    monkeypatch.setattr(
        validation,
        "validation_bleu",
        lambda *a, **k: SimpleNamespace(
            bleu=next(bleus), chrf=1.0, n=1, hypotheses=[t for _, t in a[1]]
        ),
    )
    real = checkpoint.atomic_write_json

    def crash(path, obj):  # power cut right after step 10 (the new best) was renamed into place
        if path.name == "best.json" and obj["step"] == 10:
            raise KeyboardInterrupt("crash")
        return real(path, obj)

    monkeypatch.setattr(checkpoint, "atomic_write_json", crash)
    cfg = tiny_config(data=str(corpus_file), max_steps=20, eval_every=5, save_every=100,
                      keep_last=1)  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path, progress=False)
    root = tmp_path / "checkpoints"
    assert json.loads((root / "best.json").read_text())["step"] == 5  # stale pointer
    monkeypatch.setattr(checkpoint, "atomic_write_json", real)
    res = train(cfg, tmp_path, resume=True, progress=False)
    assert res.best_step == 10 and res.best_checkpoint.name == "step-00000010"
    assert (root / "step-00000010" / "manifest.json").is_file()
    assert json.loads((root / "best.json").read_text())["path"] == "step-00000010"
    # the run's final model is the best checkpoint's weights (averaging and beams scored 1.0)
    final = Translator.load(tmp_path).path
    assert final.name == "final"
    assert json.loads((final / "trainer.json").read_text())["weights"]["steps"] == [10]


def test_resume_accepts_model_options_at_their_default(tmp_path, trained):
    from qkv.nn.seq2seq import Seq2SeqConfig

    out = tmp_path / "run"
    shutil.copytree(trained["transformer"], out)
    default = Seq2SeqConfig(2, 2).dropout
    base = ["train", "--out", str(out), "--resume", "--quiet", "--set"]
    assert main([*base, f"model.dropout={default}", "--max-steps", "32"]) in ENDED
    assert latest_checkpoint(out / "checkpoints").name == "step-00000032"
    with pytest.raises(ValueError, match=r"model_options: checkpoint \{'dropout'"):
        train(
            TrainConfig.from_dict(
                load_checkpoint(latest_checkpoint(out / "checkpoints")).train_config
            ).updated({"model.dropout": default + 0.2}),
            out,
            resume=True,
            progress=False,
        )
