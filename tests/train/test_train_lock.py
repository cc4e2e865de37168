"""One trainer per run folder (OUT/.lock), and --out checked before any data is read."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from _train_helpers import tiny_config

from qkv.cli import main
from qkv.train import RunLockedError, train
from qkv.train.runlock import LOCK_NAME, RunLock, check_out

# a second process that holds the lock of argv[1] until its stdin closes
HOLD = (
    "import sys; from qkv.train.runlock import RunLock; lock = RunLock(sys.argv[1]); "
    "lock.acquire(); print('locked', flush=True); sys.stdin.read(); lock.release()"
)


@pytest.fixture
def holder(tmp_path):
    """A real second process holding the lock of ``tmp_path / "run"``."""
    out = tmp_path / "run"
    out.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "locked"
    yield out, proc
    proc.stdin.close()
    proc.wait(timeout=30)


@pytest.fixture
def no_data(monkeypatch):
    """Reading the data fails the test: what is checked must be checked before."""

    def read(*a, **k):
        raise AssertionError("the data was read")

    monkeypatch.setattr("qkv.train.prepare.read_run_files", read)


def test_a_second_trainer_is_refused_naming_the_holder(holder, no_data):
    out, proc = holder
    with pytest.raises(RunLockedError) as info:
        train(tiny_config(), out, progress=False)
    text = str(info.value)
    assert "\n" not in text
    assert f"pid {proc.pid} on {socket.gethostname()} since " in text
    assert str(out / LOCK_NAME) in text and "in use by another trainer" in text
    assert info.value.holder.pid == proc.pid
    # the holder's lock is untouched
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == proc.pid


def test_the_cli_refuses_a_second_trainer_in_one_line(holder, no_data, capsys):
    out, proc = holder
    assert main(["train", "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"qkv train: error: --out: {str(out)!r} is in use by another trainer")
    assert f"pid {proc.pid} on " in err


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = {
        "pid": dead.pid,
        "host": socket.gethostname(),
        "started": "2020-01-01T00:00:00+00:00",
        "command": "qkv train --out x",
    }
    (tmp_path / LOCK_NAME).write_text(json.dumps(stale))
    lock = RunLock(tmp_path)
    with caplog.at_level(logging.WARNING, logger="qkv"):
        lock.acquire()
    assert f"left by pid {dead.pid} on {socket.gethostname()}" in caplog.text
    assert "that process is gone" in caplog.text
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_the_lock_is_released_when_a_run_fails(tmp_path):
    out = tmp_path / "new" / "run"
    with pytest.raises((FileNotFoundError, ValueError), match=r"missing\.tsv"):
        train(tiny_config(data=str(tmp_path / "missing.tsv")), out, progress=False)
    assert not (out / LOCK_NAME).exists()
    assert not out.exists(), "the folder the failed run created is left behind"
    # and a run that reaches the loop releases it too (taken again at once)
    with RunLock(tmp_path):
        assert (tmp_path / LOCK_NAME).is_file()
    assert not (tmp_path / LOCK_NAME).exists()


def test_out_naming_a_file_is_refused_before_the_data(tmp_path, no_data, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for out, what in ((a_file, "is a file"), (a_file / "run", "lies under")):
        with pytest.raises(ValueError, match=rf"^out: .*{what}"):
            train(tiny_config(), out, progress=False)
        assert main(["train", "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("qkv train: error: --out: ") and what in err
        assert err.count("\n") == 1
    assert a_file.read_text() == "mine"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write anywhere")
def test_out_in_an_unwritable_folder_is_refused(tmp_path):
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    with pytest.raises(ValueError, match=r"^out: cannot create"):
        check_out(locked / "run")
    with pytest.raises(ValueError, match=r"^out: .* is not writable"):
        check_out(locked)


def test_out_that_cannot_be_created_or_written_is_refused(tmp_path, monkeypatch, no_data, capsys):
    def denied(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))

    with monkeypatch.context() as m:
        m.setattr(Path, "mkdir", denied)
        with pytest.raises(ValueError, match=r"^out: cannot create .*: Permission denied$"):
            check_out(tmp_path / "run")
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    with pytest.raises(ValueError, match=r"^out: .* is not writable by this user$"):
        train(tiny_config(), tmp_path, progress=False)
    assert main(["train", "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == f"qkv train: error: --out: {str(tmp_path)!r} is not writable by this user\n"


def test_without_flock_the_file_is_created_exclusively(tmp_path, monkeypatch, caplog):
    import errno

    import qkv.train.runlock as runlock

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(runlock.fcntl, "flock", no_locks)
    first = RunLock(tmp_path)
    first.acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    with pytest.raises(
        RunLockedError, match=rf"pid {os.getpid()} on .*delete {re.escape(str(tmp_path))}"
    ):
        RunLock(tmp_path).acquire()  # a live holder (this very process)
    first.release()
    assert not (tmp_path / LOCK_NAME).exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = {"pid": dead.pid, "host": socket.gethostname(), "started": "then", "command": "x"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(stale))
    with caplog.at_level(logging.WARNING, logger="qkv"), RunLock(tmp_path):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert f"left by pid {dead.pid}" in caplog.text and "that process is gone" in caplog.text
