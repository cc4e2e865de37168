"""Errors named by key: a library's :class:`~qkv._errors.SettingError` becomes the flag the
user typed through ``err.key``, never by reading the message."""

from __future__ import annotations

import sys

import pytest

from qkv._errors import SettingError, keyed
from qkv.cli import main
from qkv.cli._common import named_by_flag
from qkv.cli.serve import _FIELDS, _FLAGS
from qkv.serve.config import ServeConfig


def test_a_setting_error_is_named_by_its_flag():
    err = named_by_flag(SettingError("max_chars", "expected an int >= 1, got 0"), _FLAGS)
    assert isinstance(err, SettingError) and err.key == "max_chars"
    assert str(err) == "--max-chars: expected an int >= 1, got 0"


def test_the_key_is_read_not_the_message():
    """A message that merely starts like a key is left alone; an unknown key too."""
    plain = ValueError("max_chars: not a setting error")
    assert named_by_flag(plain, _FLAGS) is plain
    other = SettingError("elsewhere", "x")
    assert named_by_flag(other, _FLAGS) is other
    # an error of another kind about a setting carries its key too (keyed), keeping the type
    err = named_by_flag(keyed(FileNotFoundError, "path", "no such file 'x'"), {"path": "--data"})
    assert type(err) is FileNotFoundError and str(err) == "--data: no such file 'x'"
    assert str(named_by_flag(SettingError("out", "full"), {"out": "--out"})) == "--out: full"
    # and one that merely starts like a key is left alone, of any kind
    plain_missing = FileNotFoundError("path: no such file 'x'")
    assert named_by_flag(plain_missing, {"path": "--data"}) is plain_missing


#: ServeConfig's limits it checks itself (max_wait_ms: the batcher does, when create_app builds it)
CHECKED = [f for f in _FIELDS if f.startswith("max_") and f != "max_wait_ms"]


@pytest.mark.parametrize("field", CHECKED)
def test_every_serve_limit_error_names_its_flag(field):
    with pytest.raises(SettingError) as info:
        ServeConfig(**{field: 0})
    assert info.value.key == field
    assert str(named_by_flag(info.value, _FLAGS)).startswith(f"--{field.replace('_', '-')}: ")


def test_serve_names_the_flag_from_the_config(tmp_path, capsys):
    """The config's error comes before the model is looked for."""
    argv = ["serve", "--model-dir", str(tmp_path / "none"), "--max-queue", "0", "--quiet"]
    assert main(argv) == 2
    assert capsys.readouterr().err == "qkv serve: error: --max-queue: expected an int >= 1, got 0\n"


def test_train_names_the_librarys_missing_packages_as_the_command(monkeypatch, tmp_path, capsys):
    """qkv train has no list of its own: the library's (a user's corpus needs sentencepiece),
    checked before anything is read or written, said as ``qkv train needs``."""
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    data, out = tmp_path / "corpus.tsv", tmp_path / "run"
    assert main(["train", "--data", str(data), "--out", str(out), "--quiet"]) == 1
    assert capsys.readouterr().err == ("qkv train needs sentencepiece: pip install 'qkv[train]'\n")
    assert not out.exists()
