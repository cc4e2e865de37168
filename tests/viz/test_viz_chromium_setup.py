"""The Chromium set-up: found when present, a skip with the reason when missing, never installed by
a test; `make test` installs it (as root, with apt-get) or says in one line why it will not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import _viz_chromium as vc
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _no_chromium(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(vc, "CHROMIUM", str(tmp_path / "no-chromium"))
    monkeypatch.setattr(vc.shutil, "which", lambda name: None)


def test_missing_chromium_is_a_reason_and_nothing_is_run(monkeypatch, tmp_path):
    _no_chromium(monkeypatch, tmp_path)

    def refuse(*a, **k):
        raise AssertionError(f"a test ran a command to get Chromium: {a}")

    for name in ("run", "Popen", "call", "check_call", "check_output"):
        monkeypatch.setattr(vc.subprocess, name, refuse)
    monkeypatch.setattr(vc.os, "geteuid", lambda: 0, raising=False)  # even as root
    path, why = vc.find_chromium()
    assert path is None
    assert str(tmp_path / "no-chromium") in why and "make test" in why
    assert "tools/ensure_chromium.sh" in why and "QKV_CHROMIUM" in why


def test_chromium_is_found_at_its_path_or_on_the_path(monkeypatch, tmp_path):
    _no_chromium(monkeypatch, tmp_path)
    exe = tmp_path / "chromium"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setattr(vc, "CHROMIUM", str(exe))
    assert vc.find_chromium() == (str(exe), "")
    _no_chromium(monkeypatch, tmp_path)
    monkeypatch.setattr(vc.shutil, "which", lambda name: "/opt/bin/chromium")
    assert vc.find_chromium() == ("/opt/bin/chromium", "")


@pytest.mark.parametrize(
    ("require", "outcome"), [(None, "1 skipped"), ("1", "1 error")], ids=["skip", "required"]
)
def test_a_browser_test_without_chromium_skips_with_the_reason(tmp_path, require, outcome):
    """The real ``chromium_path`` fixture, in a pytest run with no Chromium anywhere: a skip
    naming the reason, or with ``QKV_REQUIRE_CHROMIUM=1`` (CI) an error."""
    here = Path(__file__).parent
    for name in ("conftest.py", "_viz_chromium.py"):
        shutil.copy(here / name, tmp_path / name)
    (tmp_path / "test_needs_a_browser.py").write_text(
        "def test_it(chromium_path):\n    raise AssertionError('ran without a browser')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("QKV_CHROMIUM", "QKV_REQUIRE_CHROMIUM")}
    env |= {"PATH": str(tmp_path), "QKV_CHROMIUM": str(tmp_path / "no-chromium")}
    if require:
        env["QKV_REQUIRE_CHROMIUM"] = require
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = r.stdout + r.stderr
    assert outcome in out and "ran without a browser" not in out, out
    assert "headless Chromium unavailable" in out and "no-chromium" in out, out


# ---------------------------------------------------------------- the Makefile's browser step
def _fake_bin(tmp_path: Path, uid: int, apt_get: str) -> Path:
    """A PATH holding only ``sh``, an ``id`` saying ``uid`` and, unless ``apt_get`` is empty, an
    ``apt-get`` that logs its arguments and then "installs" Chromium where QKV_CHROMIUM says
    (``"works"``) or fails (``"fails"``)."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    if not (d / "sh").exists():
        (d / "sh").symlink_to(shutil.which("sh"))
    (d / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    install = f'printf "#!/bin/sh\\n" > "$QKV_CHROMIUM"; {shutil.which("chmod")} +x "$QKV_CHROMIUM"'
    if apt_get == "fails":
        install = "echo 'E: Unable to locate package chromium' >&2; exit 100"
    if apt_get:
        (d / "apt-get").write_text(
            f'#!/bin/sh\necho "$@" >> "$APT_LOG"\ncase "$1" in install) {install};; esac\n'
        )
    for f in d.iterdir():
        if not f.is_symlink():
            f.chmod(0o755)
    return d


def _make_browser(tmp_path: Path, uid: int, apt_get: str) -> tuple[str, Path, Path]:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    target, log = tmp_path / "chromium", tmp_path / "apt.log"
    env = {"PATH": str(_fake_bin(tmp_path, uid, apt_get)), "APT_LOG": str(log)}
    r = subprocess.run(
        [make, "-s", "--no-print-directory", "-C", str(ROOT), "browser", f"QKV_CHROMIUM={target}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stdout
    return r.stdout, target, log


@pytest.mark.parametrize(
    ("uid", "apt_get", "why"), [(1000, "works", "not root"), (0, "", "no apt-get")]
)
def test_make_says_in_one_line_why_the_browser_tests_will_be_skipped(tmp_path, uid, apt_get, why):
    out, target, log = _make_browser(tmp_path, uid, apt_get)
    assert len(out.strip().splitlines()) == 1, out
    assert why in out and "the browser tests will be skipped" in out
    assert not target.exists() and not log.exists()  # nothing was installed


def test_make_installs_chromium_as_root_with_apt_get(tmp_path):
    out, target, log = _make_browser(tmp_path, 0, "works")
    assert os.access(target, os.X_OK), out
    assert log.read_text().splitlines() == ["update -qq", "install -y -qq chromium"]
    assert "skipped" not in out
    again, _, _ = _make_browser(tmp_path, 0, "works")
    assert again == "" and len(log.read_text().splitlines()) == 2  # present: nothing to do


def test_a_failed_install_is_said_and_the_tests_go_on(tmp_path):
    out, target, log = _make_browser(tmp_path, 0, "fails")  # make exits 0
    assert "Unable to locate package chromium" in out
    assert out.strip().splitlines()[-1] == (
        "make: installing Chromium failed (above): the browser tests will be skipped"
    )
    assert not target.exists() and len(log.read_text().splitlines()) == 2
