"""``qkv serve``: a trained translator behind HTTP, with dynamic batching and a page.

* :func:`create_app` — the ASGI app (Starlette): LibreTranslate's API (``POST /translate`` of
  paragraphs and HTML, ``POST /translate_file`` and ``GET /download_file/NAME``, ``/detect``,
  ``/languages``, ``/frontend/settings``, ``/suggest``, ``/spec``), ``POST /attention`` (the
  data of the attention viewer), ``/health``, ``/metrics`` (Prometheus text),
  ``/openapi.json`` and the page at ``/``; :class:`ServeConfig` its settings (languages,
  limits, batching, API key, the request limit, files);
* :class:`~qkv.serve.batcher.Batcher` — the queue and worker thread that decode concurrent
  requests together;
* :class:`~qkv.serve.registry.ModelRegistry` — several models behind one app: routed by
  source and target, pivoting through a common language, loaded when first asked for and
  unloaded beyond a memory cap; :mod:`qkv.serve.detect` answers ``/detect`` and
  ``source: "auto"``;
* :func:`~qkv.serve.server.run` — uvicorn, stopping cleanly on SIGTERM or Ctrl-C.

Needs the ``serve`` extra (``pip install 'qkv[serve]'``: starlette, uvicorn)::

    from qkv.translate import Translator
    from qkv.serve import ServeConfig, create_app

    app = create_app(Translator.load("demo-out/translator"), ServeConfig())
    # any ASGI server runs it; `qkv serve --model-dir demo-out/translator` runs uvicorn

:class:`ServeConfig` alone needs neither the extra nor torch (``qkv serve --help`` reads its
defaults); the app and the batcher load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from .config import ServeConfig

if TYPE_CHECKING:
    from .app import LANGUAGE_NAMES, Asked, create_app, translator_languages
    from .batcher import Batcher, QueueFull
    from .registry import ModelRegistry
    from .requests import ApiError

__all__ = [
    "LANGUAGE_NAMES",
    "ApiError",
    "Asked",
    "Batcher",
    "ModelRegistry",
    "QueueFull",
    "ServeConfig",
    "create_app",
    "translator_languages",
]

#: the names that load their module (and starlette, torch) on first use -> that module
_ON_FIRST_USE = {
    "LANGUAGE_NAMES": "app",
    "ApiError": "requests",
    "Asked": "app",
    "create_app": "app",
    "translator_languages": "app",
    "Batcher": "batcher",
    "QueueFull": "batcher",
    "ModelRegistry": "registry",
}


__getattr__, __dir__ = lazy_names(__name__, _ON_FIRST_USE)
