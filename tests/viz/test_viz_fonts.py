"""Figures draw CJK, Cyrillic and Arabic tokens with fonts that have their glyphs (issue 26),
and say once which Debian package to install when no font has them."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from qkv.viz import heatmaps as H

TOKENS = ["猫在", "椅子", "Кошка", "القطة", "こんにちは", "안녕", "Haus"]


def _has_cjk_font() -> bool:
    fam = H.font_family(["猫"])
    return len(fam) > 1


@pytest.mark.parametrize("ext", ["png", "svg", "pdf"])
def test_cjk_cyrillic_and_arabic_tokens_have_glyphs(tmp_path, ext):
    if not _has_cjk_font():
        pytest.skip("no font with CJK glyphs installed (apt-get install fonts-noto-cjk)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        H.show_heatmaps(
            np.random.default_rng(0).random((1, 1, len(TOKENS), len(TOKENS))), "keys", "queries",
            xticklabels=TOKENS, yticklabels=TOKENS, path=tmp_path / f"a.{ext}",
        )  # fmt: skip
    missing = [str(w.message) for w in caught if "missing from" in str(w.message)]
    assert not missing, missing
    assert (tmp_path / f"a.{ext}").stat().st_size > 0


def test_latin_text_keeps_the_default_font():
    assert H._font(["Haus", "maison", "Кошка"]) == {}  # DejaVu Sans has Cyrillic: as before


def test_no_font_with_the_glyphs_warns_once_naming_the_package(monkeypatch):
    monkeypatch.setattr(H, "_coverage", lambda path: frozenset(range(0x3000)))
    monkeypatch.setattr(H, "_add_system_fonts", lambda: False)
    monkeypatch.setattr(H, "_warned", set())
    with pytest.warns(UserWarning, match="fonts-noto-cjk"):
        assert H.font_family(["猫"]) == H.font_family([])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        H.font_family(["猫"])  # once per process
