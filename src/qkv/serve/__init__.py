"""``qkv serve``: a trained translator behind HTTP, with dynamic batching and a page.

* :func:`create_app` — the ASGI app (Starlette): a LibreTranslate-compatible ``POST /translate``,
  ``POST /attention`` (the data of the attention viewer), ``GET /languages``, ``/health``,
  ``/metrics`` (Prometheus text), ``/openapi.json`` and the page at ``/``;
  :class:`ServeConfig` its settings (languages, limits, batching, API key);
* :class:`~qkv.serve.batcher.Batcher` — the queue and worker thread that decode concurrent
  requests together;
* :func:`~qkv.serve.server.run` — uvicorn, stopping cleanly on SIGTERM or Ctrl-C.

Needs the ``serve`` extra (``pip install 'qkv[serve]'``: starlette, uvicorn)::

    from qkv.translate import Translator
    from qkv.serve import ServeConfig, create_app

    app = create_app(Translator.load("demo-out/translator"), ServeConfig())
    # any ASGI server runs it; `qkv serve --model-dir demo-out/translator` runs uvicorn
"""

from __future__ import annotations

from .app import LANGUAGE_NAMES, ApiError, ServeConfig, create_app, model_languages
from .batcher import Batcher, QueueFull

__all__ = [
    "LANGUAGE_NAMES",
    "ApiError",
    "Batcher",
    "QueueFull",
    "ServeConfig",
    "create_app",
    "model_languages",
]
