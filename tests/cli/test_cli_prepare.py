"""``qkv prepare``: the folder printed on stdout, progress on stderr, bad input one line."""

from __future__ import annotations

import json

from _train_helpers import qkv_here, run_qkv


def test_prepare_prints_the_folder_and_a_second_run_does_nothing(tmp_path, corpus_file):
    out = tmp_path / "bin"
    args = ("prepare", "--data", str(corpus_file), "--out", str(out), "--set", "valid=40",
            "--set", "test=40", "--set", "tokenizer=word", "--workers", "1")  # fmt: skip
    r = qkv_here(*args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"prepared: {out}"
    assert "encoding: " in r.stderr and "ETA" in r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sources"][0]["path"] == str(corpus_file)
    assert manifest["counts"]["valid"] >= 40
    again = qkv_here(*args)
    assert again.returncode == 0 and "nothing to do" in again.stderr


def test_bad_input_is_one_line_naming_the_flag(tmp_path):
    r = qkv_here("prepare", "--data", str(tmp_path / "missing.tsv"), "--out", str(tmp_path / "b"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("qkv prepare: error: --data: ") and "missing.tsv" in lines[-1]
    assert "Traceback" not in r.stderr
    r = qkv_here("prepare", "--data", "x.tsv", "--out", str(tmp_path / "b"), "--workers", "-1")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "qkv prepare: error: --workers: expected 0 (every core) or more, got -1"
    )


def test_a_mostly_unreadable_file_is_refused_as_a_run_refuses_it(tmp_path):
    """The stream (read in the workers' feeder) ends on the reader's check, as a run's read."""
    bad = tmp_path / "bad.txt"
    bad.write_text("a\tb\nbad line\nc\td\nanother bad\n", encoding="utf-8")
    prep = run_qkv("prepare", "--data", str(bad), "--out", str(tmp_path / "b"), "--workers", "2")
    run = qkv_here("train", "--data", str(bad), "--out", str(tmp_path / "r"),
                   "--prepare-data", "never")  # fmt: skip
    assert prep.returncode == run.returncode == 2
    why = prep.stderr.strip().splitlines()[-1].removeprefix("qkv prepare: error: ")
    assert why == run.stderr.strip().splitlines()[-1].removeprefix("qkv train: error: ")
    assert why.startswith(f"--data: 2 of the 4 lines of {bad} (50.0%) cannot be read")
