"""``qkv translate``'s flags checked before any model is loaded or sentence translated, and the
CLI's logging: one-line errors naming the flag, nothing written, a handler only while ``main``
runs. No model is needed: every check here comes first (``--model-dir`` does not exist)."""

from __future__ import annotations

import logging

import pytest

import qkv.cli
from qkv.cli import main


def translate(tmp_path, *args: str) -> list[str]:
    return ["translate", "--model-dir", str(tmp_path / "no-model"), *args]


def one_line_error(capsys, flag: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"qkv translate: error: {flag}: ") and err.count("\n") == 1, err
    return err


def test_attention_at_a_folder_is_refused(tmp_path, capsys):
    (tmp_path / "pics.png").mkdir()  # a folder with a figure's name
    assert main(translate(tmp_path, "--attention", str(tmp_path / "pics.png"), "go .")) == 2
    assert "is a folder; expected a file name" in one_line_error(capsys, "--attention")


def test_attention_under_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine\n")
    path = tmp_path / "notes.txt" / "sub" / "a.html"
    assert main(translate(tmp_path, "--attention", str(path), "go .")) == 2
    err = one_line_error(capsys, "--attention")
    assert f"{str(tmp_path / 'notes.txt')!r} is a file, not a folder" in err
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_attention_in_a_missing_folder_is_refused_not_created(tmp_path, capsys):
    path = tmp_path / "new" / "deeper" / "a.png"
    assert main(translate(tmp_path, "--attention", str(path), "go .")) == 2
    assert "does not exist; create it first" in one_line_error(capsys, "--attention")
    assert not (tmp_path / "new").exists()


def test_attention_numbered_files_are_checked_too(tmp_path, capsys):
    """``a.png`` is fine but ``a-2.png``, the second sentence's, is a folder: refused."""
    (tmp_path / "a-2.png").mkdir()
    args = translate(tmp_path, "--attention", str(tmp_path / "a.png"), "go .", "i lost .")
    assert main(args) == 2
    assert "a-2.png' is a folder" in one_line_error(capsys, "--attention")


def test_output_checks(tmp_path, capsys):
    src = tmp_path / "en.txt"
    src.write_text("go .\n")
    assert main(translate(tmp_path, "--src", str(src), "--output", str(src))) == 2
    assert "is the --src file" in one_line_error(capsys, "--output")
    same = tmp_path / "." / "en.txt"  # another spelling of the same file
    assert main(translate(tmp_path, "--src", str(src), "--output", str(same))) == 2
    one_line_error(capsys, "--output")
    assert main(translate(tmp_path, "--src", str(src), "--output", str(tmp_path))) == 2
    assert "is a folder" in one_line_error(capsys, "--output")
    missing = tmp_path / "no" / "fr.txt"
    assert main(translate(tmp_path, "--src", str(src), "--output", str(missing))) == 2
    assert "does not exist" in one_line_error(capsys, "--output")
    assert src.read_text() == "go .\n"


def test_src_checks(tmp_path, capsys):
    assert main(translate(tmp_path, "--src", str(tmp_path / "none.txt"))) == 2
    assert "no such file" in one_line_error(capsys, "--src")
    (tmp_path / "en.txt").write_text("go .\n")
    assert main(translate(tmp_path, "--src", str(tmp_path / "en.txt"), "go .")) == 2
    assert "not both" in one_line_error(capsys, "--src")


def test_batch_tokens_below_one_is_refused(tmp_path, capsys):
    assert main(translate(tmp_path, "--batch-tokens", "0", "go .")) == 2
    assert "expected >= 1, got 0" in one_line_error(capsys, "--batch-tokens")


# ---------------------------------------------------------------------------- logging
def _logging_command(args):
    logging.getLogger("qkv.somewhere").info("a note")
    logging.getLogger("qkv.somewhere").warning("a warning")
    return 0


@pytest.mark.parametrize("quiet", [False, True])
def test_main_shows_library_messages_on_stderr_while_it_runs(monkeypatch, capsys, quiet):
    monkeypatch.setattr(qkv.cli.average, "run", _logging_command)
    top = logging.getLogger("qkv")
    before = (list(top.handlers), top.level)
    assert main(["average", "--out", "x", *(["--quiet"] if quiet else [])]) == 0
    captured = capsys.readouterr()
    want = "qkv: a warning\n" if quiet else "qkv: a note\nqkv: a warning\n"
    assert captured.err == want and captured.out == ""
    assert (list(top.handlers), top.level) == before  # removed when main returned
    logging.getLogger("qkv.somewhere").warning("after main")
    assert "after main" not in capsys.readouterr().err  # no CLI handler left behind
