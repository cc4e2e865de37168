"""Where `qkv prepare` writes (issue 41 rows 1 and 2): one prepare per folder, under the run
lock `qkv train` takes, and never into a folder it did not write (a model, a run, an export,
other files)."""

from __future__ import annotations

import contextlib
import errno
import io
import threading
from pathlib import Path

import numpy as np
import pytest
from _folders import one_line
from _train_helpers import tiny_config

from qkv.cli import main
from qkv.data import Normalizer, WordTokenizer, bundled_pairs, write_pairs
from qkv.data.prepared import PreparedCorpus
from qkv.inference import load_model, save_model
from qkv.inference.layout import LOCK_NAME
from qkv.nn import Seq2SeqConfig, build_model
from qkv.train.corpus import prepare_corpus
from qkv.train.runlock import RunLock, RunLockedError


def _prepare_cli(*args: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["prepare", "--quiet", "--workers", "1", *args])
    return rc, err.getvalue()


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def two_files(tmp_path_factory) -> tuple[Path, Path]:
    """Two corpora of other pairs (the bundled pairs' first and second 400)."""
    root = tmp_path_factory.mktemp("two")
    pairs = bundled_pairs()
    a, b = root / "a.txt", root / "b.txt"
    write_pairs(a, pairs[:400])
    write_pairs(b, pairs[2000:2400])
    return a, b


def test_a_second_prepare_on_a_folder_in_use_refuses_and_the_first_keeps_its_data(
    tmp_path, two_files
):
    a, b = two_files
    out = tmp_path / "bin"
    reading, go_on = threading.Event(), threading.Event()
    result: dict[str, object] = {}

    def say(message: str) -> None:
        if message.startswith("read "):  # the first has read its file and holds the lock
            reading.set()
            go_on.wait(60)

    def first() -> None:
        try:
            result["out"] = prepare_corpus(tiny_config(data=str(a)), out, workers=1, say=say)
        except BaseException as e:
            result["error"] = e

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert reading.wait(60), result
        with pytest.raises(RunLockedError, match="is in use by another qkv process: pid"):
            prepare_corpus(tiny_config(data=str(b)), out, workers=1)
        rc, err = _prepare_cli("--data", str(b), "--out", str(out))
        line = one_line(err, "prepare")
        assert rc == 1 and f"--out: {str(out)!r} is in use by another qkv process" in line
        assert "qkv prepare" in line or "pytest" in line  # the holder's command
    finally:
        go_on.set()
        thread.join(120)
    assert "error" not in result, result.get("error")
    m = PreparedCorpus(out).manifest
    assert [r["path"] for r in m["sources"]] == [str(a.resolve())]
    fresh = prepare_corpus(tiny_config(data=str(a)), tmp_path / "fresh", workers=1)
    for name in ("train.src.tok", "train.src.idx", "train.tgt.tok", "valid.jsonl"):
        assert (out / name).read_bytes() == (fresh / name).read_bytes(), name  # the first's
    assert not (out / LOCK_NAME).exists() and not (out / ".work").exists()


def test_a_prepare_refuses_a_folder_a_trainer_holds(tmp_path, two_files):
    out = tmp_path / "bin"
    out.mkdir()
    with RunLock(out), pytest.raises(RunLockedError, match=r"pid \d+ on "):
        prepare_corpus(tiny_config(data=str(two_files[0])), out, workers=1)
    assert sorted(p.name for p in out.iterdir()) == []


def _model_folder(path: Path) -> Path:
    pairs = bundled_pairs()[:200]
    en = WordTokenizer.train([s for s, _ in pairs], normalizer=Normalizer.book(), min_freq=1)
    fr = WordTokenizer.train([t for _, t in pairs], normalizer=Normalizer.book(), min_freq=1)
    cfg = Seq2SeqConfig(src_vocab_size=en.vocab_size, tgt_vocab_size=fr.vocab_size,
                        num_hiddens=16, ffn_num_hiddens=32, num_heads=2, num_enc_layers=1,
                        num_dec_layers=1)  # fmt: skip
    return save_model(build_model(cfg), en, fr, path, languages=("en", "fr"))


def test_prepare_into_a_model_folder_refuses_and_the_model_still_loads(tmp_path, two_files):
    model = _model_folder(tmp_path / "model")
    before = _snapshot(model)
    rc, err = _prepare_cli("--data", str(two_files[0]), "--out", str(model))
    line = one_line(err, "prepare")
    assert rc == 2 and line.startswith(f"qkv prepare: error: --out: {str(model)!r} is not a")
    assert "model folder" in line and "choose another --out" in line
    assert _snapshot(model) == before
    load_model(model)


@pytest.mark.parametrize(
    ("contents", "said"),
    [
        ({"checkpoints/step-00000002/x": b""}, "training run"),
        ({"ctranslate2/model.bin": b"x"}, "model folder"),
        ({"encoder.onnx": b"x", "onnx.json": b"{}"}, "model folder"),
        ({"manifest.json": b'{"format": "qkv.export"}'}, "manifest.json is another kind's"),
        ({"notes.txt": b"mine"}, "files qkv prepare does not write ('notes.txt')"),
        ({".notes.json.qkv-tmp-12": b"mine"}, "files qkv prepare does not write ('.notes.j"),
        # names a corpus has, but the user's files: no manifest, no trace of a prepare
        ({"tokenizers/my.model": b"mine"}, "'tokenizers' but no manifest.json"),
        ({"valid.jsonl": b"{}\n", "test.jsonl": b"{}\n"}, "'test.jsonl' but no manifest.json"),
    ],
)
def test_prepare_refuses_any_folder_it_did_not_write(tmp_path, two_files, contents, said):
    out = tmp_path / "out"
    for rel, data in contents.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    before = _snapshot(out)
    with pytest.raises(ValueError, match=r"^out: .* is not a prepared corpus") as e:
        prepare_corpus(tiny_config(data=str(two_files[0])), out, workers=1)
    assert said in str(e.value)
    assert _snapshot(out) == before and not (out / LOCK_NAME).exists()


def test_prepare_writes_into_an_empty_folder_its_own_corpus_and_a_killed_prepares(
    tmp_path, two_files
):
    a, b = two_files
    out = tmp_path / "bin"
    out.mkdir()
    prepare_corpus(tiny_config(data=str(a)), out, workers=1)  # an empty folder
    prepare_corpus(tiny_config(data=str(b)), out, workers=1)  # its own corpus, other data
    assert [r["path"] for r in PreparedCorpus(out).manifest["sources"]] == [str(b.resolve())]
    (out / "manifest.json").unlink()  # as a prepare killed before its manifest
    (out / ".manifest.json.qkv-tmp-4242").write_text("{", encoding="utf-8")  # while writing it
    prepare_corpus(tiny_config(data=str(a)), out, workers=1)
    assert [r["path"] for r in PreparedCorpus(out).manifest["sources"]] == [str(a.resolve())]
    assert np.all(PreparedCorpus(out).src.lengths > 0)


def test_a_full_disk_while_preparing_is_one_line_and_the_prepare_continues_after(
    tmp_path, two_files, monkeypatch
):
    import qkv.data.prepared as prepared

    a = two_files[0]
    out = tmp_path / "bin"
    real = prepared.TokenArraysWriter.append

    def append(self, lengths, tokens):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(prepared.TokenArraysWriter, "append", append)
    rc, err = _prepare_cli("--data", str(a), "--out", str(out), "--set", "tokenizer=word")
    line = one_line(err, "prepare")
    assert (
        rc == 1 and f"no space left on the device of {str(out.resolve())!r} while writing a" in line
    )
    assert "what it had done is kept in .work" in line and "run the same qkv prepare again" in line
    assert not (out / "manifest.json").exists() and (out / ".work" / "rows.json").is_file()
    monkeypatch.setattr(prepared.TokenArraysWriter, "append", real)
    assert _prepare_cli("--data", str(a), "--out", str(out), "--set", "tokenizer=word")[0] == 0
    fresh = tmp_path / "fresh"
    assert _prepare_cli("--data", str(a), "--out", str(fresh), "--set", "tokenizer=word")[0] == 0
    for name in ("train.src.tok", "train.src.idx", "train.tgt.tok", "train.tgt.len"):
        assert (out / name).read_bytes() == (fresh / name).read_bytes(), name
