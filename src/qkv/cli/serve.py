"""``qkv serve``: a model behind HTTP (:mod:`qkv.serve`) under uvicorn, until SIGTERM or Ctrl-C.

The flags that set a :class:`~qkv.serve.ServeConfig` field carry its name (``--max-chars`` sets
``max_chars``); one not given leaves the field's default, which ``--help`` reads from the
dataclass. An error about a field is named by its flag from the error's key.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import ipaddress
import logging
import os
import sys
from typing import Any

from .._deps import require
from .._errors import SettingError
from ._common import (
    add_decoding_flags,
    add_engine_flags,
    engine_needs,
    fail,
    flag,
    load_translator,
    named_by_flag,
    user_errors,
    with_decoding_flags,
    with_default,
)

NAME = "serve"

log = logging.getLogger(__name__)

#: ServeConfig's limits, each set by the flag of its name: field -> (type, metavar, help); the
#: help ends with the field's default, read from ServeConfig when --help shows it
_LIMITS: dict[str, tuple[type, str, str]] = {
    "max_batch_tokens": (int, "N", "a batch's budget: source tokens times the beam"),
    "max_wait_ms": (float, "MS", "how long a batch waits for more requests after its first"),
    "max_body_bytes": (int, "N", "largest request body"),
    "char_limit": (
        int,
        "N",
        "most characters per text of a request (LibreTranslate's; 400; -1: no limit)",
    ),
    "max_sentences": (int, "N", "most sentences per request, its texts cut into sentences"),
    "max_chars": (int, "N", "most characters per sentence"),
    "max_alternatives": (int, "K", "most alternatives per request"),
    "max_beam": (int, "N", "widest beam a request may ask"),
    "max_queue": (int, "N", "most sentences waiting; beyond, requests get 503"),
    "req_limit": (
        int,
        "N",
        "most requests per minute per client, its API key or address (LibreTranslate's; 429; "
        "a list of n texts counts n; -1: no limit)",
    ),
    "max_file_bytes": (int, "N", "largest file POST /translate_file takes"),
    "max_file_chars": (int, "N", "most characters of text in one file"),
    "file_ttl": (float, "S", "seconds a translated file waits to be downloaded (once)"),
}

#: every ServeConfig field given by the flag of its name (None or not given: the default)
_FIELDS = ("source_lang", "target_lang", "beam", *_LIMITS, "max_attention_cells", "memory_cap_mb")

#: library key -> flag, for the errors of ServeConfig, the app, the models and the socket
_FLAGS = {
    key: flag(key)
    for key in (
        *_FIELDS,
        "allowed_hosts",
        "header_timeout",
        "body_timeout",
        "min_body_rate",
        "max_connections",
        "max_connections_per_client",
        "shutdown_timeout",
        "host",
        "port",
        "model_dir",
        "models_dir",
    )
}


#: the limits LibreTranslate turns off with -1 (its flags' convention): None, no limit
_OFF_BY_MINUS_ONE = ("char_limit", "req_limit")


def _config_default(name: str) -> Any:
    from ..serve.config import ServeConfig

    value = {f.name: f.default for f in dataclasses.fields(ServeConfig)}[name]
    return "no limit" if value is None else value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``qkv serve``'s sub-parser."""
    p = subparsers.add_parser(
        NAME,
        help="serve a model over HTTP: a LibreTranslate-compatible API, batching, a page",
        description="Serve a trained model over HTTP (needs qkv[serve]): POST /translate "
        "(LibreTranslate's request shape), POST /attention, GET /languages, /health, /metrics "
        "(Prometheus), /openapi.json, and a page at / that translates and draws the attention. "
        "Concurrent requests are decoded together (dynamic batching). SIGTERM or Ctrl-C "
        "finishes the requests in flight and exits 0. See docs/serve.md.",
    )
    p.add_argument(
        "--model-dir",
        action="append",
        default=None,
        metavar="DIR",
        help="a qkv train --out folder (its final model, else its best checkpoint), a "
        "checkpoint folder, or a qkv export folder (CTranslate2 and ONNX ones too); repeat it "
        "to serve several pairs from one server, LibreTranslate's way (each model records its "
        "languages; loaded when first asked for)",
    )
    p.add_argument(
        "--models-dir",
        default=None,
        metavar="DIR",
        help="a folder of models, each subfolder one (as several --model-dir)",
    )
    p.add_argument(
        "--memory-cap-mb",
        type=float,
        default=None,
        metavar="MB",
        help="with several models: the most their loaded weights may take together; the least "
        "recently used idle model is unloaded to make room (default: no cap)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0: any free one)")
    p.add_argument(
        "--allowed-hosts",
        action="append",
        default=None,
        metavar="HOST[,HOST...]",
        help="the names a request's Host header may give besides localhost and the address it "
        "reached (and --host when it is a name); *.example.org: its subdomains; *: any. Others "
        "get 400, so a web page that rebinds its DNS name to this server cannot use it. "
        "Repeatable",
    )
    add_decoding_flags(
        p,
        beam="default beam size of a request (default: the model's, chosen on validation by "
        "qkv train; else 1)",
        length_penalty="beam length penalty (default: the model's)",
        no_repeat_ngram="never repeat an N-gram in a translation (default: the model's)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require this key on /translate and /attention (the api_key field, or an "
        "Authorization: Bearer header); default: $QKV_SERVE_API_KEY, else none",
    )
    p.add_argument(
        "--source-lang",
        default=None,
        metavar="CODE",
        help="the source language code (default: the model's when it records it, e.g. en for "
        "the bundled corpus)",
    )
    p.add_argument(
        "--target-lang", default=None, metavar="CODE", help="the target language code (same)"
    )
    add_engine_flags(
        p,
        quantize="int8 dynamic quantization (CPU); with --engine ctranslate2: CTranslate2's int8",
        engine="qkv (default), or ctranslate2: serve the CTranslate2 model that qkv export "
        "--format ctranslate2 wrote in --model-dir (needs qkv[ct2]; no /attention)",
    )
    p.add_argument(
        "--no-batching",
        action="store_true",
        help="decode each request alone, in arrival order (no dynamic batching)",
    )
    for name, (typ, metavar, text) in _LIMITS.items():
        shown = with_default(text, lambda n=name: _config_default(n))
        p.add_argument(flag(name), type=typ, default=argparse.SUPPRESS, metavar=metavar, help=shown)
    p.add_argument(
        "--disable-files-translation",
        action="store_true",
        help="refuse POST /translate_file (403), as LibreTranslate's flag of that name does",
    )
    p.add_argument(
        "--max-attention-cells",
        type=int,
        default=argparse.SUPPRESS,
        metavar="N",
        help="most attention weights one /attention answer holds (default: the viewer's cap, "
        "qkv.viz.MAX_CELLS)",
    )
    _add_connection_flags(p)
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        metavar="N",
        help="CPU threads torch decodes with (0: chosen from the machine's load, and followed)",
    )
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.add_argument("--quiet", action="store_true", help="warnings only on stderr")
    return p


def _add_connection_flags(p: argparse.ArgumentParser) -> None:
    """The server's connection flags: shutdown, header and body timeouts, connection cap."""
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="on SIGTERM, how long to wait for requests in flight; those still waiting then get "
        "503 and the exit status is 1 (default: 60)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds a connection has to send a request's headers, else it is closed "
        "(slowloris clients; default: 10)",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=20.0,
        metavar="S",
        help="seconds a request's body may go without a byte, and the grace before "
        "--min-body-rate applies; a body later than that gets 408 and the connection is "
        "closed (slow clients; default: 20)",
    )
    p.add_argument(
        "--min-body-rate",
        type=float,
        default=500.0,
        metavar="BYTES",
        help="bytes a second a request's body must average after --body-timeout's grace "
        "(0: no rate; default: 500)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=None,
        metavar="N",
        help="most connections open at once; beyond, 503 and closed (default: the open-file "
        "limit, ulimit -n, less 200)",
    )
    p.add_argument(
        "--max-connections-per-client",
        type=int,
        default=None,
        metavar="N",
        help="most connections one client address may hold; beyond, 503 and closed (default: "
        "no such cap; give one when clients reach the server directly, not through a proxy)",
    )


def serve_config(args: argparse.Namespace, api_key: str | None) -> Any:
    """The :class:`~qkv.serve.ServeConfig` the flags give: each field given by its flag, the
    others left at their defaults.

    Raises:
        SettingError: a value out of range, keyed by its field.
    """
    from ..serve.config import ServeConfig

    given = {name: getattr(args, name) for name in _FIELDS if getattr(args, name, None) is not None}
    for name in _OFF_BY_MINUS_ONE:
        if given.get(name) == -1:
            given[name] = None
    folders = args.model_dir or []
    one = str(folders[0]) if len(folders) == 1 and args.models_dir is None else None
    return ServeConfig(
        **given,
        api_key=api_key,
        batching=not args.no_batching,
        files=not args.disable_files_translation,
        model_dir=one,
        allowed_hosts=_allowed_hosts(args),
    )


def _allowed_hosts(args: argparse.Namespace) -> tuple[str, ...]:
    """``--allowed-hosts`` (comma-separated, repeatable), and ``--host`` when it is a name
    (an address is allowed as the address a request reaches)."""
    names = [n.strip() for given in args.allowed_hosts or [] for n in given.split(",")]
    host = (args.host or "").strip().strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host:
            names.append(host)
    return tuple(n for n in names if n)


def _registry(args: argparse.Namespace) -> Any:
    """The :class:`~qkv.serve.registry.ModelRegistry` of several ``--model-dir`` and
    ``--models-dir``: every folder inspected now (what it translates, its engine), loaded when
    a request first asks for it.

    Raises:
        SettingError: keyed by the flag that named a bad folder, one line.
    """
    from ..engines import open_translator
    from ..serve.registry import ModelRegistry, inspect_folder, models_in

    if args.quantize is not None and args.device != "cpu" and args.engine == "qkv":
        raise ValueError(
            f"--quantize: {args.quantize} runs on the CPU only (torch's dynamic "
            f"quantization), got --device {args.device}"
        )
    folders = []
    for folder in args.model_dir or []:
        try:
            folders.append(inspect_folder(folder, engine=args.engine))
        except SettingError as e:
            named_err = named_by_flag(e, {"model_dir": "--model-dir", "engine": "--engine"})
            raise ValueError(str(named_err)) from None
    if args.models_dir is not None:  # what is not a model there is skipped, a line each
        try:
            folders += models_in(args.models_dir, engine=args.engine)
        except SettingError as e:
            flags = {"models_dir": "--models-dir", "engine": "--engine"}
            raise ValueError(str(named_by_flag(e, flags))) from None

    def load(folder: Any) -> Any:
        tr = open_translator(
            folder.path,
            engine=folder.engine,
            device=args.device,
            quantize=args.quantize,
            threads=args.threads,
        )
        return with_decoding_flags(tr, args)

    return ModelRegistry.from_folders(folders, load)


def _one_model(args: argparse.Namespace) -> Any:
    """The translator of one ``--model-dir`` on the engine its folder holds (an ONNX export's
    on onnxruntime), else ``--engine``."""
    from ..engines import folder_engine

    folder = args.model_dir[0]
    return load_translator(args, folder, folder_engine(folder, args.engine))


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or Ctrl-C; 0 once the requests in flight are answered, 1 when
    the shutdown timeout cut some off (each answered 503)."""
    require(f"qkv {NAME}", [*engine_needs(args), "starlette", "uvicorn", "python_multipart"])
    from ..serve import create_app
    from ..serve.server import bind, check_limits
    from ..serve.server import run as serve_on

    api_key = args.api_key if args.api_key is not None else os.environ.get("QKV_SERVE_API_KEY")
    several = len(args.model_dir or []) > 1 or args.models_dir is not None
    try:
        if api_key is not None and not api_key:
            raise ValueError("--api-key: expected a non-empty key")
        if not args.model_dir and args.models_dir is None:
            raise ValueError("--model-dir: expected a model folder (or --models-dir DIR)")
        cfg = serve_config(args, api_key)
        check_limits(
            args.header_timeout,
            args.max_connections,
            args.shutdown_timeout,
            body_timeout=args.body_timeout,
            min_body_rate=args.min_body_rate,
            max_connections_per_client=args.max_connections_per_client,
        )
        if args.threads < 0:
            raise ValueError(f"--threads: expected >= 0, got {args.threads}")
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        models = _registry(args) if several else _one_model(args)
        app = create_app(models, cfg)
        _follow_load(app, fixed=bool(args.threads))
        sock = bind(args.host, args.port)
    except user_errors() as e:
        return fail(NAME, named_by_flag(e, _FLAGS))
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
    if api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s with no --api-key: anyone who reaches it can use it", args.host)
    if args.host in ("0.0.0.0", "::", "") and not args.allowed_hosts:
        log.info(
            "answering requests whose Host is localhost or the address they reach; name the "
            "others (a DNS name, a proxy's) with --allowed-hosts"
        )
    ready = f"qkv serve: {_serving(app.state.qkv, cfg)} on {url}"
    stopped = serve_on(
        app,
        sock,
        log_level="warning" if args.quiet else "info",
        access_log=args.access_log,
        shutdown_timeout=args.shutdown_timeout,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        min_body_rate=args.min_body_rate,
        max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
        on_ready=lambda: print(ready, file=sys.stderr, flush=True),
    )
    if not stopped.started:
        print("qkv serve: error: the server did not start (see above)", file=sys.stderr)
        return 1
    if stopped.cut_off:
        print(
            f"qkv serve: error: stopped before answering {stopped.cut_off} request(s): "
            f"--shutdown-timeout ({args.shutdown_timeout:g} s) ran out, and each got a 503",
            file=sys.stderr,
            flush=True,
        )
        return 1
    print("qkv serve: stopped", file=sys.stderr, flush=True)
    return 0


def _serving(st: Any, cfg: Any) -> str:
    """What the ready line says the server serves."""
    batching = (
        f"batching up to {cfg.max_batch_tokens} tokens, {cfg.max_wait_ms:g} ms wait"
        if cfg.batching
        else "batching off"
    )
    registry = st.registry
    if registry.pair is not None:  # one model
        (lane,) = registry.lanes
        how = f"beam {lane.decoding.beam_size}"
        return f"{lane.translator.path} ({st.source} -> {st.target}, {how}, {batching})"
    pairs = ", ".join(lane.pair for lane in registry.lanes)
    cap = registry.memory_cap
    memory = "no memory cap" if cap is None else f"memory cap {cap / 1e6:g} MB"
    return (
        f"{len(registry.lanes)} models ({pairs}; each loaded when first asked for, "
        f"{memory}; {batching})"
    )


def _follow_load(app: Any, fixed: bool) -> None:
    """Unless the thread count is the user's, switch it on the batch worker (where decoding
    runs) when the machine's load changes for good (:class:`qkv.runtime.LoadWatch`)."""
    import torch

    from ..runtime import LoadWatch, follow_in_background

    st = app.state.qkv

    def switch(n: int) -> None:  # on every loaded model's worker
        for lane in st.registry.lanes:
            if lane.batcher is not None:
                lane.batcher.call(functools.partial(torch.set_num_threads, n))

    follow_in_background(
        LoadWatch.for_this_process(fixed),
        switch,
    )
