"""The Chromium set-up: found when present, a clear reason when it cannot be installed."""

from __future__ import annotations

import _viz_chromium as vc


def test_missing_chromium_without_root_gives_a_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(vc, "CHROMIUM", str(tmp_path / "no-chromium"))
    monkeypatch.setattr(vc.shutil, "which", lambda name: None)
    monkeypatch.setattr(vc.os, "geteuid", lambda: 1000, raising=False)
    path, why = vc.find_or_install_chromium()
    assert path is None
    assert "needs root" in why and "ensure_chromium.sh" in why


def test_install_script_is_there_and_checks_for_root():
    text = vc.ENSURE_SCRIPT.read_text()
    assert "apt-get install" in text and "id -u" in text
