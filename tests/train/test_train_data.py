"""The data file of `qkv train`: errors that name --data, and a refusal of mostly unreadable files."""

from __future__ import annotations

import logging
import re

import pytest
from _train_helpers import ENDED, tiny_config

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
    """``qkv train`` of 2 small updates (256-token batches), validated on 20 sentences."""
    small = ["--set", "max_tokens=256", "--set", "valid=20", "--set", "eval_sentences=20"]
    return main(["train", "--quiet", "--max-steps", "2", "--preset", "none", *small, *args])


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
        (
            ["--data", "HEADER", "--format", "tsv"],
            r"src_column: none of .* pass --src-column NAME \(src_column\) \(data '/.+/HEADER'\)",
        ),
        (["--data", "HEADER", "--src-column", "x"], "--src-column: 'x' is not among"),
        (["--data", "/dev/null"], "--data: '/dev/null' is a character device"),
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


# -- issue 17: named columns from the CLI, non-files, data that changed under a run --


def _args(*argv):
    from qkv.cli import build_parser
    from qkv.cli.train import train_config as _train_config

    return _train_config(build_parser().parse_args(["train", *argv]))[0]


def test_named_columns_from_the_cli(tmp_path):
    import json

    pairs = bundled_pairs()[:60]
    tsv = tmp_path / "data.tsv"
    tsv.write_text(
        "id\ten\tfr\n" + "".join(f"{i}\t{s}\t{t}\n" for i, (s, t) in enumerate(pairs)),
        encoding="utf-8",
    )
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text(
        "".join(json.dumps({"fr": t, "en": s, "n": i}) + "\n" for i, (s, t) in enumerate(pairs)),
        encoding="utf-8",
    )
    for path in (tsv, jsonl):
        config = _args("--data", str(path), "--src-column", "en", "--tgt-column", "fr")
        assert (config.src_column, config.tgt_column) == ("en", "fr")
        assert read_run_pairs(config)[0] == pairs
    # the other way round: French to English
    config = _args("--data", str(tsv), "--src-column", "fr", "--tgt-column", "en")
    assert read_run_pairs(config)[0] == [(t, s) for s, t in pairs]
    # in a config file or with --set too
    assert _args("--set", "src_column=en").src_column == "en"
    with pytest.raises(ValueError, match="src_column: expected a column or field name"):
        TrainConfig(src_column="")


def test_a_run_trains_on_named_jsonl_fields(tmp_path, capsys):
    import json

    data = tmp_path / "d.jsonl"
    rows = [{"de": t, "en": s} for s, t in bundled_pairs()[:300]]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "run"
    argv = ["--data", str(data), "--src-column", "en", "--tgt-column", "de", "--out", str(out)]
    assert _train(*argv, "--set", "tokenizer=word", "--set", "tune_decoding=false") in ENDED
    saved = json.loads(next((out / "checkpoints").glob("step-*/train.json")).read_text())
    assert (saved["src_column"], saved["tgt_column"]) == ("en", "de")


def test_a_fifo_is_refused_naming_the_flag(tmp_path, capsys):
    import os
    import threading
    import time

    fifo = tmp_path / "data.fifo"
    os.mkfifo(fifo)

    def writer():  # feeds a reader if one opens it (the old code did, and would hang without)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.01)
                continue
            os.write(fd, b"\n".join(f"{s}\t{t}".encode() for s, t in bundled_pairs()[:300]))
            os.close(fd)  # and serves the next open, until the deadline

    threading.Thread(target=writer, daemon=True).start()
    assert _train("--data", str(fifo), "--out", str(tmp_path / "run")) == 2
    err = capsys.readouterr().err
    assert "--data: '" in err and "is a FIFO (named pipe); expected a regular file" in err
    assert err.count("\n") == 1


def test_data_that_changed_under_a_run_names_the_file_and_the_way_out(tmp_path, capsys):
    from qkv.train import saved_run_pairs

    data = _fra(tmp_path / "d.txt", good=300)
    out = tmp_path / "run"
    common = ["--set", "tokenizer=word", "--set", "tune_decoding=false"]
    assert _train("--data", str(data), "--out", str(out), *common) in ENDED
    capsys.readouterr()
    _fra(data, good=299)  # a line lost
    assert _train("--data", str(data), "--out", str(out), "--resume", *common) == 2
    err = capsys.readouterr().err
    assert f"'{data}' changed since the run was split (it gives 299 pairs, the run was " in err
    assert "split from 300" in err and "--out NEW_DIR" in err and "--init-from" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    lines = _fra(data, good=300).read_text(encoding="utf-8").splitlines()
    data.write_text("\n".join(["Changed.\tChangé.", *lines[1:]]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"are not the text the run was split from.*evaluate"):
        saved_run_pairs(out)
    assert main(["evaluate", "--model-dir", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"qkv evaluate: error: data: '{data}' changed" in err
    assert "qkv evaluate --model-dir RUN --data FILE" in err
