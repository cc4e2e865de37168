"""The data file of `qkv train`: errors that name --data, and a refusal of mostly unreadable files."""

from __future__ import annotations

import logging
import re

import pytest
from _train_helpers import tiny_config

from qkv.cli import main
from qkv.data import bundled_pairs
from qkv.train import TrainConfig, train
from qkv.train.run_data import read_run_pairs


def _fra(path, good: int, bad: int = 0, blank: int = 0):
    """``good`` pairs, then ``bad`` one-column lines and ``blank`` blank lines, interleaved."""
    pairs = bundled_pairs()[:good]
    lines = [f"{s}\t{t}" for s, t in pairs]
    for i in range(bad):
        lines.insert(2 * i + 1, f"broken line {i}")
    lines += [""] * blank
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _train(*args):
    return main(["train", "--quiet", "--max-steps", "2", "--preset", "none", *args])


def test_a_mostly_unreadable_file_is_refused_with_the_numbers(tmp_path, capsys):
    data = _fra(tmp_path / "bad.txt", good=23, bad=77)
    out = tmp_path / "run"
    assert _train("--data", str(data), "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv train: error: --data: 77 of the 100 lines of ") and "bad.txt" in err
    assert "(77.0%) cannot be read, at most 10.0% may be (max_skipped=0.1, --max-skipped)" in err
    assert "wrong number of columns: 77 (lines 2, 4, 6, 8, 10, ...)" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (out / "checkpoints").exists()  # refused before any work
    # the threshold is the user's to set
    config = TrainConfig(data=str(data), max_skipped=0.8)
    pairs, _ = read_run_pairs(config)
    assert len(pairs) == 23
    with pytest.raises(ValueError, match=r"^data: 77 of the 100 lines"):
        read_run_pairs(config.updated({"max_skipped": 0.7}))


def test_strict_refuses_a_single_bad_line(tmp_path, capsys):
    data = _fra(tmp_path / "one.txt", good=200, bad=1, blank=3)
    assert _train("--data", str(data), "--out", str(tmp_path / "run"), "--strict") == 2
    err = capsys.readouterr().err
    assert "--data: 1 of the 201 lines" in err and "none may be (max_skipped=0, --strict)" in err
    assert err.endswith("blank lines are not counted: wrong number of columns: 1 (line 2)\n")
    assert _train("--data", str(data), "--strict", "--max-skipped", "0.5") == 2
    assert "--strict: refuses any unreadable line" in capsys.readouterr().err
    # blank lines lose nothing: a file with blank lines only is not refused by --strict
    clean = _fra(tmp_path / "blank.txt", good=200, blank=3)
    pairs, _ = read_run_pairs(TrainConfig(data=str(clean), max_skipped=0.0))
    assert len(pairs) == 200


def test_skipped_lines_are_reported_through_logging(tmp_path, caplog):
    data = _fra(tmp_path / "few.txt", good=200, bad=3)
    with caplog.at_level(logging.WARNING, logger="qkv"):
        pairs, _ = read_run_pairs(TrainConfig(data=str(data)))
    assert len(pairs) == 200
    (record,) = [r for r in caplog.records if r.name.startswith("qkv.")]
    assert record.levelno == logging.WARNING
    assert record.getMessage().endswith(
        "few.txt (fra): 3 of 203 lines skipped: wrong number of columns: 3 (lines 2, 4, 6)"
    )


def test_a_clean_file_trains(tmp_path, corpus_file, caplog):
    with caplog.at_level(logging.WARNING, logger="qkv"):
        res = train(
            tiny_config(data=str(corpus_file), max_steps=2, eval_every=2, max_skipped=0.0,
                        tune_decoding=False),
            tmp_path,
            progress=False,
        )  # fmt: skip
    assert res.step == 2
    assert not [r for r in caplog.records if "skipped" in r.getMessage()]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data", "missing.txt"], "--data: no such file '/.+/missing.txt'"),
        (["--data", "sub"], "--data: expected a file, got the directory '/.+/sub'"),
        (["--data", "HEADER", "--format", "tsv"], "--data: '/.+/HEADER': src_column: none of"),
        (["--data", "CLEAN", "--format", "xml"], "--format: expected one of"),
        (["--data", "CLEAN", "--max-skipped", "2"], "--max-skipped: expected a fraction"),
    ],
)
def test_data_errors_name_the_flag(tmp_path, monkeypatch, args, message, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "HEADER").write_text("a\tb\nGo.\tVa !\n", encoding="utf-8")
    _fra(tmp_path / "CLEAN", good=50)
    (tmp_path / "sub").mkdir()
    assert _train(*args, "--out", "run") == 2
    err = capsys.readouterr().err
    assert re.match(f"qkv train: error: {message}", err), err
    assert "path:" not in err and "Traceback" not in err and err.count("\n") == 1
