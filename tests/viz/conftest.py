"""Fixtures for tests/viz: a headless Chromium (installed when missing), headless matplotlib."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Debian's Chromium, installed by tools/ensure_chromium.sh when missing and we are root."""
    from _viz_chromium import find_or_install_chromium

    path, why = find_or_install_chromium()
    if path is None:
        pytest.skip(f"headless Chromium unavailable: {why}")
    return path


@pytest.fixture(scope="module")
def browser(chromium_path):
    """One headless Chromium page, shared by a test module."""
    from _viz_chromium import Browser

    b = Browser(chromium_path)
    try:
        yield b
    finally:
        b.close()
