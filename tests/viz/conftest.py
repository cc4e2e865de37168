"""Fixtures for tests/viz: a headless Chromium (the browser tests skip without it), headless
matplotlib."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Debian's Chromium, or a skip saying why not: no test installs it (`make test` does).

    With ``QKV_REQUIRE_CHROMIUM=1`` (CI) a missing browser is a failure, not a skip.
    """
    from _viz_chromium import find_chromium

    path, why = find_chromium()
    if path is None:
        if os.environ.get("QKV_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"headless Chromium unavailable and QKV_REQUIRE_CHROMIUM=1: {why}")
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
