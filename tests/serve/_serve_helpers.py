"""A tiny saved model (random weights, word tokenizers trained on the bundled corpus) and an
in-process client for the serve tests."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
from _tiny_models import SHARED_EOS_BOOST, SHARED_PAIRS, tiny_translator

from qkv.data import bundled_pairs
from qkv.inference import save_model
from qkv.serve import ServeConfig, create_app
from qkv.serve.server import bind, make_server
from qkv.translate import Translator

PAIRS = bundled_pairs()[:SHARED_PAIRS]
SOURCES = [s for s, _ in PAIRS[:60]]


def tiny_model_folder(
    out: Path,
    languages: tuple[str, str] | None = None,
    *,
    seed: int | None = None,
    reverse: bool = False,
) -> Path:
    """Save a 1+1-layer, 2-head Transformer (random weights, seeded) to ``out``: a model folder
    as ``qkv export`` writes, which ``Translator.load`` and ``qkv serve`` read.

    ``languages``: recorded in its model.json as ``qkv train`` records them (None: none);
    ``seed``: its weights moved by a seeded nudge, so models of several pairs differ;
    ``reverse``: tokenizers trained French -> English (the bundled pairs reversed)."""
    pairs = [(t, s) for s, t in PAIRS] if reverse else PAIRS
    model, src, tgt = tiny_translator(pairs, eos_boost=SHARED_EOS_BOOST)  # shared_translator's
    if seed is not None:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return save_model(model, src, tgt, out, languages=languages)


@dataclass
class Live:
    """A server running in a thread: its URL, its app and a client."""

    url: str
    app: Any
    client: Any
    server: Any = None  # the uvicorn server

    @property
    def state(self) -> Any:
        return self.app.state.qkv

    @property
    def lane(self) -> Any:
        """The lane of a server of one model (its translator, its batcher)."""
        (lane,) = self.state.registry.lanes
        return lane

    def post(self, path: str, **kw: Any) -> Any:
        return self.client.post(self.url + path, **kw)

    def get(self, path: str, **kw: Any) -> Any:
        return self.client.get(self.url + path, **kw)


@contextlib.contextmanager
def live_server(translator: Translator, **settings: Any) -> Iterator[Live]:
    """Serve ``translator`` with ``ServeConfig(source_lang="en", target_lang="fr", **settings)``
    on 127.0.0.1 (any free port) until the block ends; the server is stopped gracefully."""
    cfg = ServeConfig(**{"source_lang": "en", "target_lang": "fr", **settings})
    with live_app(create_app(translator, cfg)) as s:
        yield s


@contextlib.contextmanager
def live_app(app: Any, **server_options: Any) -> Iterator[Live]:
    """Serve the app ``create_app`` made on 127.0.0.1 (any free port) until the block ends;
    the server is stopped gracefully. ``server_options``: :func:`make_server`'s."""
    sock = bind("127.0.0.1", 0)
    ready = threading.Event()
    server = make_server(app, log_level="warning", on_ready=ready.set, **server_options)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    if not ready.wait(30):
        server.should_exit = True
        raise RuntimeError("the test server did not start")
    port = sock.getsockname()[1]
    try:
        with httpx.Client(timeout=60) as client:
            yield Live(f"http://127.0.0.1:{port}", app, client, server)
    finally:
        server.should_exit = True
        thread.join(60)


def wait_until(condition, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}")
        time.sleep(0.01)
