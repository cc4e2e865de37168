"""Fixtures for tests/viz: a headless Chromium (the browser tests skip without it), headless
matplotlib."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Debian's Chromium, or a skip (a failure with QKV_REQUIRE_CHROMIUM=1) saying why not."""
    from _viz_chromium import chromium_or_skip

    return chromium_or_skip()


@pytest.fixture(scope="module")
def browser(chromium_path):
    """One headless Chromium page, shared by a test module."""
    from _viz_chromium import opened_browser

    with opened_browser(chromium_path) as b:
        yield b
