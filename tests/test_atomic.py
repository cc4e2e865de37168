"""qkv._atomic: files and folders written whole or not at all, by one module."""

from __future__ import annotations

import errno
import json
import os

import pytest

from qkv import _atomic


def test_write_json_replaces_a_file_whole(tmp_path):
    p = tmp_path / "state.json"
    _atomic.write_json(p, {"a": "é"})
    _atomic.write_json(p, {"a": 2}, temp=".state.json.tmp")
    assert json.loads(p.read_text(encoding="utf-8")) == {"a": 2}
    assert sorted(x.name for x in tmp_path.iterdir()) == ["state.json"]


def test_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    p = tmp_path / "best.json"
    p.write_text("old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(_atomic.NoSpaceError, match=r"no space left .* while writing best\.json"):
        _atomic.write_bytes(p, b"new")
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["best.json"]


def test_replace_renames_a_folder_into_a_free_name(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_text("x")
    _atomic.replace(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / "b" / "f").read_text() == "x" and not (tmp_path / "a").exists()


def _folder(path, text):
    path.mkdir()
    (path / "f").write_text(text)
    return path


def test_install_folder_replaces_the_old_one_and_removes_it(tmp_path):
    final = _folder(tmp_path / "final", "old")
    _atomic.install_folder(_folder(tmp_path / "tmp", "new"), final, tmp_path / "aside")
    assert (final / "f").read_text() == "new"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["final"]


def test_install_folder_puts_the_old_one_back_when_the_new_cannot_take_its_place(
    tmp_path, monkeypatch
):
    final = _folder(tmp_path / "final", "old")
    tmp = _folder(tmp_path / "tmp", "new")
    real = os.replace

    def refuse_the_new(src, dst):
        if str(src) == str(tmp):
            raise OSError(errno.EIO, "I/O error")
        real(src, dst)

    monkeypatch.setattr(os, "replace", refuse_the_new)
    with pytest.raises(OSError, match="I/O error"):
        _atomic.install_folder(tmp, final, tmp_path / "aside")
    assert (final / "f").read_text() == "old" and not (tmp_path / "aside").exists()
