"""Fixtures for tests/serve: a tiny saved model, a real server on the loopback (uvicorn in a
thread, a port the system picks), and the headless Chromium of tests/viz for the page."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="qkv serve needs the serve extra")
pytest.importorskip("uvicorn", reason="qkv serve needs the serve extra")
pytest.importorskip("httpx", reason="the serve tests talk HTTP with httpx (dev extra)")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "viz"))  # _viz_chromium

from _serve_helpers import Live, live_server, tiny_model_folder

from qkv.translate import Translator


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model_folder(tmp_path_factory.mktemp("serve") / "model")


@pytest.fixture(scope="session")
def translator(model_dir) -> Translator:
    return Translator.load(model_dir)


@pytest.fixture(scope="module")
def live(translator) -> Iterator[Live]:
    """One server for a test module, batching on (20 ms wait)."""
    with live_server(translator, max_wait_ms=20) as s:
        yield s


@pytest.fixture(scope="session")
def ct2(model_dir, tmp_path_factory):
    """The tiny model exported to CTranslate2, on its engine."""
    pytest.importorskip("ctranslate2", reason="the ct2 extra (dev) runs the CTranslate2 engine")
    from qkv.export.ctranslate2 import Ct2Translator, export_ctranslate2

    out = export_ctranslate2(model_dir, tmp_path_factory.mktemp("serve-ct2") / "exported")
    return Ct2Translator(out, threads=1)


@pytest.fixture(scope="session")
def onnx(model_dir, tmp_path_factory):
    """The tiny model exported to ONNX, on onnxruntime."""
    pytest.importorskip("onnxruntime", reason="the onnx extra (dev) runs the ONNX engine")
    from qkv.export.onnx import OnnxTranslator, export_onnx

    return OnnxTranslator(export_onnx(model_dir, tmp_path_factory.mktemp("serve-onnx") / "m"))


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
