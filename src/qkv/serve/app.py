"""The ASGI app of ``qkv serve`` (Starlette): a LibreTranslate-compatible API, the page, metrics.

Routes (the OpenAPI schema at ``/openapi.json`` and ``/spec``, and docs/serve.md describe each):

* ``POST /translate``: ``{"q": str | [str], "source", "target", "format", "alternatives",
  "beam", "api_key"}`` (and qkv's ``split``, ``layout``) as JSON or a form ->
  ``{"translatedText": str | [str]}`` (plus ``alternatives`` and ``detectedLanguage`` when
  asked, and ``pivot`` when no model translates the pair and two did, through that language),
  LibreTranslate's shape; each text's lines cut into sentences and put back with their layout,
  or (``format: "html"``) an HTML page's text translated and its markup kept
  (:mod:`qkv.serve.texts`, through :mod:`qkv.text`);
* ``POST /translate_file`` (a multipart form: ``file``, ``source``, ``target``, ``api_key``) ->
  ``{"translatedFileUrl"}``, then ``GET /download_file/NAME`` (once; :mod:`qkv.serve.files`);
* ``POST /attention``: one sentence -> its translation and every attention weight of it, the
  data the viewer draws (:func:`qkv.viz.attention_payload`);
* ``POST /detect``: ``q`` -> ``[{"language", "confidence"}]``, LibreTranslate's shape;
* ``GET /frontend/settings`` and ``POST /suggest`` (refused: no suggestions kept), as
  LibreTranslate answers them;
* ``GET /languages``, ``GET /health``, ``GET /metrics`` (Prometheus text), ``GET /`` (the page).

One translator is served as a registry of one (:meth:`~qkv.serve.registry.ModelRegistry.
of_one`) as it says (its pair, the default of every request; ``source: "auto"`` is its source
language); a :class:`~qkv.serve.registry.ModelRegistry` of several serves every pair they
reach, as LibreTranslate serves its installed models (see :func:`create_app`). A request is read
into an :class:`Asked`, which gives each model the :class:`~qkv.inference.Decoding` it decodes
with; the batcher's jobs are keyed by that value, and a request's sentences are one job.

Every error is JSON ``{"error": "field: what was expected, what came"}`` with a 4xx status:
400 malformed body, a language pair not served (naming those served), a text over
``char_limit`` or a file not read, 401 a missing or wrong API key, 403 ``/suggest`` or files
turned off, 404 no such route or file, 405 wrong method, 413 a body, a sentence, a request, a
file or an attention picture over its limit, 415 a body type not read, 422 a field of the
wrong type or out of range, 429 over ``req_limit`` (LibreTranslate's ``Slowdown``), 500 a model
that failed to load, 501 no detection library for "auto" or /detect, 503 the queue is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import ipaddress
import logging
import math
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._deps import MissingDependency, missing, require
from .._errors import SettingError
from ..data.languages import language_code, match_language
from ..inference import Decoding, TextTranslator
from ..text import Alignment, Plan, format_of
from ..viz import attention_cells, attention_payload
from . import detect as detection
from .batcher import Batcher, QueueFull
from .config import FRONTEND_TIMEOUT_MS, LOOPBACK_HOSTS, ServeConfig
from .files import FileStore, content_type, disposition, translated_name
from .metrics import Metrics
from .openapi import openapi_schema
from .page import page_html
from .ratelimit import RateLimiter, Slowdown, retry_header
from .registry import Lane, LoadError, ModelRegistry, display_name, shown_path, unserved
from .requests import (
    ApiError,
    JsonResponse,
    Upload,
    check_sentences,
    describe,
    error_response,
    int_field,
    int_or,
    json_bytes,
    parse_body,
    parse_multipart,
    read_body,
    request_texts,
)
from .texts import (
    Documents,
    Hypotheses,
    answer_texts,
    check_segments,
    layout_pieces,
    plan_for,
    read_file,
    request_format,
    request_split,
    supported_extensions,
)

__all__ = ["LANGUAGE_NAMES", "Asked", "ServeConfig", "create_app", "translator_languages"]

log = logging.getLogger(__name__)

#: names of the language codes /languages lists (others are listed by their code)
LANGUAGE_NAMES: dict[str, str] = {
    "ar": "Arabic",
    "cs": "Czech",
    "da": "Danish",
    "de": "German",
    "el": "Greek",
    "en": "English",
    "es": "Spanish",
    "fi": "Finnish",
    "fr": "French",
    "hi": "Hindi",
    "hu": "Hungarian",
    "it": "Italian",
    "ja": "Japanese",
    "ko": "Korean",
    "nl": "Dutch",
    "pl": "Polish",
    "pt": "Portuguese",
    "ro": "Romanian",
    "ru": "Russian",
    "sv": "Swedish",
    "tr": "Turkish",
    "uk": "Ukrainian",
    "zh": "Chinese",
}

#: the routes the metrics count by name (anything else counts as "other"; every
#: ``/download_file/NAME`` as ``/download_file``)
ROUTES = (
    "/",
    "/translate",
    "/translate_file",
    "/download_file",
    "/attention",
    "/detect",
    "/suggest",
    "/languages",
    "/frontend/settings",
    "/health",
    "/metrics",
    "/openapi.json",
    "/spec",
)

#: a request's texts longer than this (characters, together) are cut into sentences off the
#: event loop
_INLINE_CHARS = 20_000
#: how often the translated files whose time is up are removed, seconds
_SWEEP_EVERY_S = 10.0
#: what a multipart body may hold beyond its file (the other fields, the parts' headers)
_FORM_OVERHEAD = 64 * 1024
#: what LibreTranslate answers a suggestion when suggestions are off (qkv keeps none)
SUGGESTIONS_OFF = "Suggestions are disabled on this server."


def translator_languages(translator: TextTranslator) -> tuple[str, str] | None:
    """``(source, target)`` codes a translator serves when its model records them (its
    :attr:`~qkv.inference.TextTranslator.languages`); None when nothing says (then
    ``ServeConfig.source_lang`` and ``target_lang`` must)."""
    return translator.languages


# ---------------------------------------------------------------------------- the app
@dataclass(frozen=True)
class Asked:
    """What a ``/translate`` or ``/attention`` request asks, read from its body: its sentences
    (``single``: ``q`` was one string) and how to decode them.

    Attributes:
        texts: the sentences.
        single: ``q`` was a string (the answer's ``translatedText`` is one too).
        beam_size: the ``beam`` field (None: the model's, as served).
        alternatives: translations it asks beyond the best (LibreTranslate's field).
    """

    texts: tuple[str, ...]
    single: bool = False
    beam_size: int | None = None
    alternatives: int = 0

    def decoding(self, served: Decoding, *, last: bool = True) -> Decoding:
        """The :class:`~qkv.inference.Decoding` a model decodes this request with: its
        ``served`` one (:attr:`~qkv.serve.registry.Lane.decoding`) with the ``beam_size``
        asked and, on the ``last`` model of a route, the alternatives asked (a ``beam_size`` left
        to the model is widened to the translations asked); an earlier model of a pivot gives
        its best."""
        asked = self.alternatives + 1 if last else None
        return served.replace(beam_size=self.beam_size, n_best=asked)


@dataclass(frozen=True)
class _RequestRoute:
    """How a request's texts are translated: through ``legs`` (none: they come back as they
    are), with the language detected for ``source: "auto"`` and the pivot, when any."""

    source: str
    target: str
    legs: tuple[Lane, ...]
    detected: dict[str, Any] | None = None
    pivot: str | None = None


class _State:
    """What the routes share: the models (a registry, one translator being a registry of one:
    :meth:`ModelRegistry.of_one`; each model in a :class:`~qkv.serve.registry.Lane` with its
    batcher), the settings and the counters."""

    def __init__(self, models: TextTranslator | ModelRegistry, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.metrics = Metrics(ROUTES)
        self.pairs: dict[tuple[str, str, str], list[int]] = {}  # (src, tgt, pivot) -> [req, sent]
        if isinstance(models, ModelRegistry):
            self.registry = models
            models.set_memory_cap(cfg.memory_cap_mb)
            # the batcher's settings are checked now, not when the first model loads
            Batcher(lambda texts, decoding: [], **self._batching())
        else:
            self.registry = ModelRegistry.of_one(models, *self._languages_of(models, cfg))
        self.registry.attach(self._batcher)
        self.started = time.monotonic()
        self.limiter = RateLimiter(cfg.req_limit) if cfg.req_limit is not None else None
        self.files = FileStore(cfg.file_ttl)
        self.in_flight = 0
        self.arriving = 0  # /translate requests being read, not yet queued

    @staticmethod
    def _languages_of(translator: TextTranslator, cfg: ServeConfig) -> tuple[str, str]:
        langs = (cfg.source_lang, cfg.target_lang)
        if None in langs:
            known = translator.languages
            if known is None:
                raise SettingError(
                    "source_lang",
                    "the model does not record the languages it translates; give them (qkv "
                    "serve --source-lang CODE --target-lang CODE, e.g. en and fr)",
                )
            langs = (cfg.source_lang or known[0], cfg.target_lang or known[1])
        # BCP 47's spelling (zh-CN, as a registry of models shows it); another code lowercase
        return tuple(language_code(x) or x.strip().lower() for x in langs)  # type: ignore[return-value]

    def _batching(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "max_batch_tokens": cfg.max_batch_tokens,
            "max_wait_ms": cfg.max_wait_ms,
            "batching": cfg.batching,
            "max_queue": cfg.max_queue,
        }

    def _batcher(self, lane: Lane) -> Batcher:
        """A loaded lane's batcher (not started), and the decoding it serves (the model's, the
        server's default ``beam_size``, one translation, the batch budget)."""
        cfg, tr = self.cfg, lane.translator
        assert tr is not None  # called once the model is loaded
        served = tr.decoding.replace(beam_size=cfg.beam)
        widest = cfg.max_beam
        if served.beam_size > widest:
            wide = served.beam_size
            if lane.pinned:
                raise SettingError(
                    "beam", f"the default beam {wide} is wider than max_beam {widest}"
                )
            log.warning(
                "qkv serve: %s: the model's beam %d is wider than --max-beam; %d is used",
                lane.pair, wide, widest,
            )  # fmt: skip
            served = dataclasses.replace(served, beam_size=widest, n_best=1)
        lane.decoding = dataclasses.replace(served, n_best=1, max_tokens=cfg.max_batch_tokens)

        def counted(sentences: int, tokens: int, seconds: float) -> None:
            self.metrics.batch(sentences, tokens, seconds)
            lane.stats.batch(sentences, tokens, seconds)

        return Batcher(
            lane.decode, **self._batching(), on_batch=counted, pending=lambda: self.arriving
        )

    @property
    def source(self) -> str | None:
        """The source language of a server of one model (None: several)."""
        return None if self.registry.pair is None else self.registry.pair[0]

    @property
    def target(self) -> str | None:
        """The target language of a server of one model (None: several)."""
        return None if self.registry.pair is None else self.registry.pair[1]

    @property
    def languages(self) -> list[str]:
        """The languages served (what /detect chooses among)."""
        if self.registry.pair is not None:
            return list(dict.fromkeys(self.registry.pair))
        return self.registry.languages

    # -- runs in the worker thread
    def attention_answer(
        self, lane: Lane, asked: Asked, decoding: Decoding, choice: int, decimals: int
    ) -> bytes:
        """/attention's answer (JSON bytes): the translation and every weight the viewer draws."""
        tr = lane.translator
        assert tr is not None  # the request holds the lane
        (text,) = asked.texts
        ids, score = tr.hypotheses([text], decoding)[0][choice]
        if asked.alternatives and score == -math.inf:
            raise ApiError(422, f"choice: there is no translation {choice} of this text")
        # the picture's size is known once the translation is: refused before it is drawn
        # (the teacher-forced pass and the payload cost 7x the cap's memory at 7x the cap)
        self.check_cells(lane, len(tr.encode(text)), len(ids) + 1)
        sa = tr.attention(text, ids=ids)
        kinds = sa.kinds()
        cells = attention_cells(kinds)
        if cells > self.cfg.max_attention_cells:
            raise ApiError(413, self._too_many_cells(cells))
        payload = attention_payload(
            kinds, title=f"{text}  \u2192  {sa.translation}", decimals=decimals, max_cells=None
        )
        body = {
            "translatedText": sa.translation,
            "choice": choice,
            "srcTokens": sa.src_tokens,
            "tgtTokens": sa.tgt_tokens,
            "attention": payload,
        }
        return json_bytes(body)

    def _too_many_cells(self, cells: int) -> str:
        return (
            f"q: its attention holds {cells:,} weights, over the limit of "
            f"{self.cfg.max_attention_cells:,} (--max-attention-cells): send a shorter sentence"
        )

    # -- on the event loop
    def check_key_early(self, request: Request) -> None:
        """Before the body is read: a key given in a header or the query string is checked
        now, a wrong one refused (401, the connection closed) without reading the body; a key
        given nowhere there is the body's (:meth:`check_key`, once it is read)."""
        if self.cfg.api_key is not None and _key_outside_body(request) is not None:
            self.check_key(request, None, {"Connection": "close"})

    def check_key(
        self, request: Request, data: dict[str, Any] | None, more: dict[str, str] | None = None
    ) -> None:
        """Refuse (401) a request without the server's API key: given as an ``X-API-Key`` or
        ``Authorization: Bearer`` header, an ``api_key`` query parameter, or the body's
        ``api_key`` field (``data``), in that order. ``more``: headers of the refusal."""
        key = self.cfg.api_key
        if key is None:
            return
        given: Any = _key_outside_body(request)
        if given is None and data is not None:
            given = data.get("api_key")
        challenge = {"WWW-Authenticate": 'Bearer realm="qkv"', **(more or {})}
        if given is None or given == "":
            raise ApiError(
                401,
                "api_key: missing; this server needs an API key (the api_key field, or an "
                "Authorization: Bearer header)",
                challenge,
            )
        if not isinstance(given, str):
            raise ApiError(401, f"api_key: expected a string, got {describe(given)}", challenge)
        if not _same_key(given, key):
            raise ApiError(401, "api_key: wrong API key", challenge)

    def check_pair(self, data: dict[str, Any]) -> bool:
        """Refuse a pair the one model does not serve; True when the source was "auto"."""
        pair = f"this model translates {self.source} to {self.target}"
        for name, default in (("source", self.source), ("target", self.target)):
            v = data.get(name)
            if v is None or v == "":
                v = default
            if not isinstance(v, str):
                raise ApiError(422, f"{name}: expected a language code, got {describe(v)}")
            v = v.strip()
            if name == "source" and v.lower() == "auto":
                data[name] = "auto"
                continue
            found = match_language(v, [default])  # BCP 47's way: en-US for en, not zh-TW for zh
            if found is None:
                why = unserved(v, [default]).partition("; the languages served")[0]
                raise ApiError(400, f"{name}: {why}; {pair}")
            data[name] = found
        return data["source"] == "auto"

    def _code(self, data: dict[str, Any], name: str) -> str:
        """A request's ``source`` or ``target`` with several models: required, a string."""
        v = data.get(name)
        if v is None or (isinstance(v, str) and not v.strip()):
            auto = " or 'auto' (detected)" if name == "source" else ""
            raise ApiError(
                400,
                f"{name}: missing; expected a language code{auto}; the languages served are "
                f"{', '.join(self.registry.languages)} (GET /languages)",
            )
        if not isinstance(v, str):
            raise ApiError(422, f"{name}: expected a language code, got {describe(v)}")
        return v.strip()

    async def plan(self, data: dict[str, Any], texts: list[str]) -> _RequestRoute:
        """The route of a request (the one model's, checked; else the registry's, the source
        detected first when it is "auto").

        Raises:
            ApiError: 400 a language or a pair not served, naming what is; 422 a code that is
                not a string; 501 "auto" without the detection library.
        """
        if self.registry.pair is not None:  # one model: its pair, given or not
            auto = self.check_pair(data)
            detected = {"language": self.source, "confidence": 0.0} if auto else None
            legs = tuple(self.registry.lanes)
            return _RequestRoute(data["source"], data["target"], legs, detected)
        source, target = self._code(data, "source"), self._code(data, "target")
        try:
            target = self.registry.code("target", target)
            detected = None
            if source.lower() == "auto":
                detected = await self.detect(texts, one=True)
                if detected["confidence"] == 0:  # nothing to judge: the texts come back as given
                    return _RequestRoute(detected["language"], target, (), detected)
                source = detected["language"]
            route = self.registry.route(source, target)
        except SettingError as e:
            raise ApiError(400, str(e)) from None
        return _RequestRoute(route.source, route.target, route.legs, detected, route.pivot)

    async def detect(self, texts: list[str], *, one: bool = False) -> Any:
        """``/detect``'s answer for ``texts`` among the languages served (``one``: only the
        most likely, ``{"language", "confidence"}``), off the event loop."""
        try:
            require("detecting a language", detection.needs())
        except MissingDependency as e:
            raise ApiError(501, f"{'source' if one else 'q'}: {e}") from None
        langs = self.languages
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(None, detection.detect_answer, texts, langs)
        return found[0] if one else found

    def asked(self, data: dict[str, Any], texts: list[str], single: bool) -> Asked:
        """What a request asks (:class:`Asked`), its decoding fields checked against the
        server's limits."""
        cfg = self.cfg
        alternatives = int_or(data, "alternatives", 0, 0, cfg.max_alternatives)
        wide = int_field(data, "beam", 1, cfg.max_beam)
        asked = Asked(tuple(texts), single, wide, alternatives)
        if wide is not None and wide <= alternatives:
            raise ApiError(
                422,
                f"beam: {alternatives} alternatives need a beam of at least "
                f"{alternatives + 1}, got {wide}",
            )
        return asked

    async def run(
        self,
        route: _RequestRoute,
        segments: Sequence[str],
        asked: Asked,
        submitted: Callable[[], None],
        *,
        best_only: bool = False,
    ) -> Hypotheses:
        """Per segment its translations, best first, ``(text, score)``, along ``route``'s legs
        (a pivot: the first model's best translation is the second's source; the alternatives
        are the last model's; ``best_only``: the best alone, whatever ``asked`` asks); no legs:
        the segments as they are. All segments are one job of the batching queue.
        ``submitted()`` is called once the first job is queued."""
        current: Hypotheses = [[(t, 0.0)] for t in segments]
        if not current or not route.legs:
            submitted()
            return current
        for i, lane in enumerate(route.legs):
            last = i == len(route.legs) - 1 and not best_only
            texts = [found[0][0] for found in current]
            current = await self._leg(lane, texts, asked, last, submitted)
        return current

    async def _leg(
        self, lane: Lane, texts: list[str], asked: Asked, last: bool, submitted: Callable[[], None]
    ) -> Hypotheses:
        lane = await self.acquire(lane)
        try:
            assert lane.batcher is not None and lane.decoding is not None  # a loaded lane
            batcher, decoding = lane.batcher, asked.decoding(lane.decoding, last=last)
            tokens = lane.tokens(texts, decoding)
            job = _queued(lambda: batcher.submit(texts, decoding, tokens=tokens))
            submitted()
            return await self.wait(job)
        finally:
            self.registry.release(lane)

    async def align(
        self, route: _RequestRoute, docs: Documents, translations: Sequence[str]
    ) -> dict[int, Alignment | None]:
        """The alignments that place the inline markup of ``docs``' segments (those of
        :meth:`Documents.aligned`): the model's cross-attention between each and its
        translation, computed between batches; none through a pivot (two models) or an engine
        that cannot align (the text layer then places the markup by its own rule)."""
        picked = docs.aligned()
        if not picked or len(route.legs) != 1:
            return {}
        lane = await self.acquire(route.legs[0])
        try:
            tr = lane.translator
            assert tr is not None and lane.batcher is not None  # held by this request
            if not tr.aligns:
                return {}
            segments = docs.segments
            sources = [segments[i] for i in picked]
            targets = [translations[i] for i in picked]
            job = _queued(lambda: lane.batcher.call(lambda: tr.align_segments(sources, targets)))
            return dict(zip(picked, await self.wait(job)))
        finally:
            self.registry.release(lane)

    async def translate_plain(
        self,
        route: _RequestRoute,
        asked: Asked,
        split: str,
        submitted: Callable[[], None],
    ) -> tuple[Plan, Hypotheses]:
        """``asked``'s texts cut into sentences (their layout kept: :func:`texts.plan_for`)
        and translated: the plan and each segment's translations."""
        texts = list(asked.texts)
        if sum(len(t) for t in texts) > _INLINE_CHARS:  # a long text is cut off the event loop
            loop = asyncio.get_running_loop()
            plan = await loop.run_in_executor(
                None, plan_for, texts, route.source, route.target, split
            )
        else:
            plan = plan_for(texts, route.source, route.target, split)
        check_segments(plan.segments, self.cfg)
        return plan, await self.run(route, plan.segments, asked, submitted)

    async def translate_documents(
        self, route: _RequestRoute, docs: Documents, asked: Asked, submitted: Callable[[], None]
    ) -> list[bytes]:
        """``docs`` translated (their segments one job, their best translations) and written
        back, inline markup placed by the model's attention where it can be."""
        found = await self.run(route, docs.segments, asked, submitted, best_only=True)
        translations = [h[0][0] for h in found]
        alignments = await self.align(route, docs, translations)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, docs.render, translations, alignments)

    async def acquire(self, lane: Lane) -> Lane:
        """``lane`` loaded for a request (:meth:`ModelRegistry.acquire`); a model that fails
        to load is a 503 naming it, with when it is tried again (``Retry-After``)."""
        try:
            return await self.registry.acquire(lane)
        except LoadError as e:
            retry = {"Retry-After": str(max(1, math.ceil(e.retry_after)))}
            raise ApiError(503, f"model: {e}", retry) from None

    def one_model(self, plan: _RequestRoute) -> Lane:
        """The one model of a route (/attention shows one model's weights)."""
        if len(plan.legs) == 1:
            return plan.legs[0]
        if plan.pivot is not None:
            raise ApiError(
                400,
                f"target: {plan.source} to {plan.target} goes through {plan.pivot} (two models); "
                f"the attention is one model's: ask {plan.source} to {plan.pivot}, or "
                f"{plan.pivot} to {plan.target}",
            )
        if plan.detected is not None and not plan.detected["confidence"]:
            raise ApiError(400, "q: no language detected in it, so no model translates it")
        raise ApiError(
            400,
            f"target: {plan.target!r} is the source language: no model translates it, so there "
            "is no attention to show",
        )

    def count(self, plan: _RequestRoute, sentences: int) -> None:
        """Count a translated request by the pair it asked (and the pivot it took)."""
        key = (plan.source, plan.target, plan.pivot or "")
        n = self.pairs.setdefault(key, [0, 0])
        n[0] += 1
        n[1] += sentences

    def pair_lines(self) -> list[str]:
        """``/metrics``' lines of the pairs asked."""
        out = [
            "# HELP qkv_pair_requests_total Translations answered, by source, target and pivot.",
            "# TYPE qkv_pair_requests_total counter",
        ]
        rows = sorted(self.pairs.items())
        out += [f"qkv_pair_requests_total{_pair_labels(k)} {n[0]}" for k, n in rows]
        out += [
            "# HELP qkv_pair_sentences_total Sentences translated, by source, target and pivot.",
            "# TYPE qkv_pair_sentences_total counter",
        ]
        out += [f"qkv_pair_sentences_total{_pair_labels(k)} {n[1]}" for k, n in rows]
        return out

    async def wait(self, job: Any) -> Any:
        """The result of ``job``; a text the engine cannot translate is a 422."""
        try:
            return await asyncio.wrap_future(job.future)
        except (ValueError, TypeError) as e:
            raise ApiError(422, f"q: cannot be translated: {e}") from None

    def check_encoder_cells(self, lane: Lane, text: str) -> None:
        """413 before decoding when the encoder's attention alone is over the cap."""
        self.check_cells(lane, len(lane.translator.encode(text)), 0)  # type: ignore[union-attr]

    def check_cells(self, lane: Lane, src_len: int, tgt_len: int) -> None:
        """413 when the attention over ``src_len`` source and ``tgt_len`` decoder positions
        (``<bos>`` and the translation; 0: the encoder's alone) holds more weights than the
        cap: per matrix ``(H, Lq, Lk)`` the engine gives
        (:meth:`~qkv.inference.TextTranslator.attention_shapes`), ``(H + 1) * Lq * Lk``, the
        heads and their mean, as :func:`qkv.viz.attention_cells` counts them. An engine that
        does not know its shapes beforehand is checked once drawn (a Bahdanau model's one
        ``(T, S)`` picture is small)."""
        tr = lane.translator
        shapes = None if tr is None else tr.attention_shapes(src_len, tgt_len)
        if shapes is None:
            return
        cells = sum((H + (1 if H > 1 else 0)) * Lq * Lk for H, Lq, Lk in shapes)
        if cells > self.cfg.max_attention_cells:
            raise ApiError(413, self._too_many_cells(cells))

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """The app's lifespan: the batch workers run while the app does, and a task removes
        the translated files whose time is up; at shutdown each worker finishes every queued
        job and the files left are removed."""
        self.registry.start()
        sweeper = asyncio.create_task(self._sweep_files())
        try:
            yield
        finally:  # let the workers finish what is queued, off the event loop
            sweeper.cancel()
            await asyncio.get_running_loop().run_in_executor(None, self.registry.stop)
            self.files.close()

    async def _sweep_files(self) -> None:
        while True:
            await asyncio.sleep(_SWEEP_EVERY_S)
            self.files.sweep()

    def check_rate(self, request: Request, data: dict[str, Any], cost: int = 1) -> None:
        """LibreTranslate's request limit (``--req-limit``): a 429 ``{"error": "Slowdown: N
        per 1 minute"}`` when the client's last minute is full, else the request counted. The
        client is the API key when the server has one and the request gives it (checked
        already), else the address."""
        if self.limiter is None:
            return
        key = self.cfg.api_key if self.cfg.api_key is not None else None
        address = request.client.host if request.client is not None else None
        try:
            self.limiter.admit(self.limiter.client(key, address), cost)
        except Slowdown as e:
            raise ApiError(429, str(e), retry_header(e.retry_after)) from None

    def frontend_settings(self) -> dict[str, Any]:
        """``GET /frontend/settings``: LibreTranslate's fields, this server's values."""
        cfg = self.cfg
        if self.registry.pair is not None:
            source, target = self.registry.pair
        else:
            langs = self.registry.languages_answer()
            first = next((x for x in langs if any(t != x["code"] for t in x["targets"])), langs[0])
            source = "auto" if not missing(detection.needs()) else first["code"]
            target = next((t for t in first["targets"] if t != first["code"]), first["code"])
        files = cfg.files
        return {
            "charLimit": cfg.char_limit if cfg.char_limit is not None else -1,
            "frontendTimeout": FRONTEND_TIMEOUT_MS,
            "apiKeys": cfg.api_key is not None,
            "keyRequired": cfg.api_key is not None,
            "suggestions": False,
            "filesTranslation": files,
            "supportedFilesFormat": supported_extensions() if files else [],
            "language": {
                "source": {
                    "code": source,
                    "name": "Auto Detect" if source == "auto" else display_name(source),
                },
                "target": {"code": target, "name": display_name(target)},
            },
        }


def _same_key(given: str, key: str) -> bool:
    """Whether ``given`` is the server's ``key`` (compared in constant time)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), key.encode("utf-8"))


def _key_outside_body(request: Request) -> str | None:
    """The API key a request gives in its headers (``X-API-Key``, ``Authorization: Bearer``)
    or its query string (``api_key``), else None: an empty one says nothing, so that it does
    not hide the key given another way."""
    given = request.headers.get("x-api-key", "").strip() or None
    auth = request.headers.get("authorization", "")
    if given is None and auth[:7].lower() == "bearer ":
        given = auth[7:].strip() or None
    if given is None:
        given = request.query_params.get("api_key", "").strip() or None
    return given


def _pair_labels(key: tuple[str, str, str]) -> str:
    esc = [v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') for v in key]
    src, tgt, pivot = esc
    return f'{{source="{src}",target="{tgt}",pivot="{pivot}"}}'


def _queued(submit: Callable[[], Any]) -> Any:
    """``submit()``'s job; a full queue is a 503 that asks to retry."""
    try:
        return submit()
    except QueueFull as e:
        raise ApiError(503, f"queue: {e}", {"Retry-After": "1"}) from None


class _Arrival:
    """A request counted in ``st.arriving`` (being read, not queued yet: the batcher may wait
    for its company) until it is called, once its first job is queued or it fails before."""

    def __init__(self, st: _State) -> None:
        self.st, self.counted = st, True
        st.arriving += 1

    def __call__(self) -> None:
        if self.counted:
            self.counted = False
            self.st.arriving -= 1


def _flag(data: dict[str, Any], name: str) -> bool:
    """A yes/no field (``true``, or a form's ``"true"``/``"1"``)."""
    v = data.get(name)
    return v is True or (isinstance(v, str) and v.strip().lower() in ("true", "1"))


def _the_file(files: list[Upload]) -> Upload:
    """The ``file`` field of a ``/translate_file`` form."""
    found = [f for f in files if f.field == "file"]
    if not found:
        raise ApiError(
            400, "file: missing; expected the file to translate in the form's file field"
        )
    upload = found[0]
    if not upload.filename:
        raise ApiError(400, "file: no file name; expected one ending in its format's extension")
    if not upload.data:
        raise ApiError(400, f"file: {upload.filename!r} is empty")
    return upload


async def _unless_gone(
    request: Request, work: Awaitable[str], forget: Callable[[str], None]
) -> str | None:
    """``work``'s result (a stored file's name), unless the client disconnects first: then
    ``work`` is cancelled (its queued sentences are dropped) and None returned; a file written
    as the client left is ``forget``-ten."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            name = task.result()
            if gone.done():
                forget(name)
                return None
            return name
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ApiError):
            await task
        return None
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()


async def _disconnected(request: Request) -> None:
    """Returns once the client has disconnected (the body read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _one_model_health(lane: Lane, cfg: ServeConfig, full: bool) -> dict[str, Any]:
    """``/health``'s ``model`` of a server of one model (a registry of one); ``full``: its
    folders' whole paths, else their names (:func:`~qkv.serve.registry.shown_path`)."""
    tr, served = lane.translator, lane.decoding
    assert tr is not None and served is not None  # never unloaded
    return {
        "loaded": True,
        "model_dir": shown_path(cfg.model_dir, full=full),
        "path": shown_path(tr.path, cfg.model_dir, full=full),
        "step": lane.step,
        "kind": tr.kind,
        "engine": tr.engine,
        "device": str(tr.device),
        "source": lane.source,
        "target": lane.target,
        "beam": served.beam_size,
        "length_penalty": tr.decoding.length_penalty,
    }


class _Routes:
    """The endpoints of the app, one method each, around the shared :class:`_State`."""

    def __init__(self, st: _State) -> None:
        self.st, self.cfg = st, st.cfg

    def routes(self) -> list[Route]:
        return [
            Route("/", self.page, methods=["GET"]),
            Route("/translate", self.translate, methods=["POST"]),
            Route("/translate_file", self.translate_file, methods=["POST"]),
            Route(
                "/download_file/{name}", self.download_file, methods=["GET"], name="download_file"
            ),
            Route("/attention", self.attention, methods=["POST"]),
            Route("/detect", self.detect, methods=["POST"]),
            Route("/suggest", self.suggest, methods=["POST"]),
            Route("/languages", self.languages, methods=["GET"]),
            Route("/frontend/settings", self.frontend_settings, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
            Route("/spec", self.openapi, methods=["GET"]),
        ]

    async def _body(self, request: Request) -> dict[str, Any]:
        """The request's fields (JSON, a form or a multipart form), its key checked first
        where the headers or the query string give it."""
        self.st.check_key_early(request)
        body = await read_body(request, self.cfg.max_body_bytes)
        ctype = request.headers.get("content-type", "")
        if ctype.split(";")[0].strip().lower() == "multipart/form-data":
            data, _ = await parse_multipart(body, request.headers, max_files=0)
            return data
        data, _ = parse_body(body, ctype)
        return data

    async def translate(self, request: Request) -> Response:
        """LibreTranslate's ``/translate``: each text of ``q`` cut into sentences (line breaks,
        blank lines and spaces kept), or an HTML page (``format: "html"``) whose text is
        translated and markup kept; every sentence of the request one job of the batching
        queue."""
        st = self.st
        arrived = _Arrival(st)  # the batcher may wait for this request's company
        try:
            data = await self._body(request)
            st.check_key(request, data)
            texts, single = request_texts(data, self.cfg)
            st.check_rate(request, data, max(1, len(texts)))
            fmt, split = request_format(data), request_split(data)
            route = await st.plan(data, texts)
            asked = st.asked(data, texts, single)
            if fmt == "html":
                out, n = await self._html(route, asked, split, arrived)
            else:
                out, n = await self._plain(route, asked, split, arrived, _flag(data, "layout"))
        finally:
            arrived()
        if route.detected is not None:  # source "auto"
            out["detectedLanguage"] = route.detected if single else [route.detected] * len(texts)
        if route.pivot is not None:  # no model of the pair: through a common language
            out["pivot"] = route.pivot
        st.count(route, n)
        return JsonResponse(out)

    async def _plain(
        self,
        route: _RequestRoute,
        asked: Asked,
        split: str,
        arrived: Callable[[], None],
        layout: bool,
    ) -> tuple[dict[str, Any], int]:
        """A text request's answer (``layout``: with each text's sentences, for the page) and
        how many sentences it held."""
        plan, found = await self.st.translate_plain(route, asked, split, arrived)
        best, others = answer_texts(plan, found, asked.alternatives)
        out: dict[str, Any] = {"translatedText": best[0] if asked.single else best}
        if others is not None:
            out["alternatives"] = others[0] if asked.single else others
        if layout:
            pieces = layout_pieces(plan, [h[0][0] for h in found])
            out["layout"] = pieces[0] if asked.single else pieces
        return out, len(plan.segments)

    async def _html(
        self, route: _RequestRoute, asked: Asked, split: str, arrived: Callable[[], None]
    ) -> tuple[dict[str, Any], int]:
        """An HTML request's answer: each page with its text translated and its markup kept
        (no alternatives, as LibreTranslate gives none for HTML), and how many sentences."""
        cfg = self.cfg
        names = ["q"] if asked.single else [f"q[{i}]" for i in range(len(asked.texts))]
        src, tgt = route.source, route.target

        def read_all() -> Documents:
            return Documents(
                tuple(
                    read_file(t.encode("utf-8"), "html", src, tgt, split, cfg, name)
                    for t, name in zip(asked.texts, names)
                )
            )

        docs = await asyncio.get_running_loop().run_in_executor(None, read_all)
        check_segments(docs.segments, cfg)
        pages = [
            b.decode("utf-8")
            for b in await self.st.translate_documents(route, docs, asked, arrived)
        ]
        out: dict[str, Any] = {"translatedText": pages[0] if asked.single else pages}
        if asked.alternatives:
            out["alternatives"] = [] if asked.single else [[] for _ in pages]
        return out, len(docs.segments)

    async def translate_file(self, request: Request) -> Response:
        """LibreTranslate's ``/translate_file``: a multipart form (``file``, ``source``,
        ``target``, ``api_key``) -> ``{"translatedFileUrl": ".../download_file/NAME"}``; the
        translation waits there until downloaded (once), its time is up, or the server
        stops. A client that leaves before the answer leaves no file behind."""
        st, cfg = self.st, self.cfg
        if not cfg.files:
            raise ApiError(403, "file: files translation is disabled on this server")
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "multipart/form-data":
            raise ApiError(
                415,
                f"Content-Type: expected multipart/form-data (a form with the file), got "
                f"{ctype[:60]!r}",
            )
        st.check_key_early(request)
        body = await read_body(request, cfg.max_file_bytes + _FORM_OVERHEAD)
        data, files = await parse_multipart(body, request.headers, max_files=1)
        st.check_key(request, data)
        upload = _the_file(files)
        try:
            fmt = format_of(upload.filename)
        except SettingError as e:
            raise ApiError(400, f"file: {e.problem}") from None
        cost = 1 if cfg.char_limit is None else max(1, len(upload.data) // cfg.char_limit)
        st.check_rate(request, data, cost)
        work = self._translated_file(request, data, upload, fmt)
        name = await _unless_gone(request, work, st.files.remove)
        if name is None:
            return Response(status_code=499)  # nobody is listening
        url = str(request.url_for("download_file", name=name))
        return JsonResponse({"translatedFileUrl": url})

    async def _translated_file(
        self, request: Request, data: dict[str, Any], upload: Upload, fmt: str
    ) -> str:
        """The file read, translated, written back and stored: its stored name."""
        st, cfg = self.st, self.cfg
        split = request_split(data)
        loop = asyncio.get_running_loop()
        arrived = _Arrival(st)
        try:
            auto = str(data.get("source") or "").strip().lower() == "auto"
            if auto and st.registry.pair is None:  # detected on the file's first sentences
                doc = await loop.run_in_executor(
                    None, read_file, upload.data, fmt, None, None, split, cfg
                )
                route = await st.plan(data, list(doc.segments[:200]))
            else:
                route = await st.plan(data, [])
            doc = await loop.run_in_executor(
                None, read_file, upload.data, fmt, route.source, route.target, split, cfg
            )
            check_sentences("file", doc.segments, cfg.max_chars)
            docs = Documents((doc,))
            asked = st.asked(data, [], True)
            (translated,) = await st.translate_documents(route, docs, asked, arrived)
        finally:
            arrived()
        st.count(route, len(doc.segments))
        name = translated_name(upload.filename, route.target)
        return await loop.run_in_executor(None, st.files.put, translated, name)

    async def download_file(self, request: Request) -> Response:
        """A translated file, once: it is removed as it is sent."""
        name = request.path_params["name"]
        if not self.st.files.well_formed(name):
            raise ApiError(400, f"name: {describe(name)} is not the name of a translated file")
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(None, self.st.files.take, name)
        if found is None:
            raise ApiError(
                404,
                "name: no such translated file; a file is kept until it is downloaded, "
                f"{self.cfg.file_ttl:g} s at most (--file-ttl)",
            )
        data, download = found
        headers = {
            "Content-Disposition": disposition(download),
            "Cache-Control": "no-store",
            "Content-Security-Policy": "sandbox",
        }
        return Response(data, media_type=content_type(download), headers=headers)

    async def suggest(self, request: Request) -> Response:
        """LibreTranslate's ``/suggest`` on a server that keeps no suggestions: its 403."""
        raise ApiError(403, SUGGESTIONS_OFF)

    async def frontend_settings(self, request: Request) -> Response:
        """LibreTranslate's ``/frontend/settings``, what its page and apps read first."""
        return JsonResponse(self.st.frontend_settings())

    async def attention(self, request: Request) -> Response:
        st = self.st
        data = await self._body(request)
        st.check_key(request, data)
        (text,), _ = request_texts(data, self.cfg, one=True)
        st.check_rate(request, data)
        if request_format(data) != "text":
            raise ApiError(400, "format: /attention takes plain text ('text'), one sentence")
        plan = await st.plan(data, [text])
        asked = st.asked(data, [text], True)
        choice = int_or(data, "choice", 0, 0, asked.alternatives)
        decimals = int_or(data, "decimals", 4, 1, 6)
        lane = await st.acquire(st.one_model(plan))
        try:
            tr = lane.translator
            assert tr is not None  # held by this request
            if not tr.has_attention:
                raise ApiError(
                    501, f"attention: the {tr.engine} engine returns no attention weights"
                )
            assert lane.batcher is not None and lane.decoding is not None  # a loaded lane
            batcher, decoding = lane.batcher, asked.decoding(lane.decoding)
            st.check_encoder_cells(lane, text)  # the encoder's part alone, before decoding
            job = _queued(
                lambda: batcher.call(
                    lambda: st.attention_answer(lane, asked, decoding, choice, decimals)
                )
            )
            return JsonResponse(await st.wait(job))
        finally:
            st.registry.release(lane)

    async def detect(self, request: Request) -> Response:
        """LibreTranslate's ``/detect``: ``q`` (a text, or a list judged together) -> a list of
        ``{"language", "confidence"}`` among the languages served, confidence 0-100."""
        st = self.st
        data = await self._body(request)
        st.check_key(request, data)
        texts, _ = request_texts(data, self.cfg)
        st.check_rate(request, data)
        return JsonResponse(await st.detect(texts))

    async def languages(self, request: Request) -> Response:
        st = self.st
        if st.source is None or st.target is None:
            return JsonResponse(st.registry.languages_answer())
        out = [
            {
                "code": st.source,
                "name": LANGUAGE_NAMES.get(st.source, st.source),
                "targets": [st.target],
            }
        ]
        if st.target != st.source:
            out.append(
                {"code": st.target, "name": LANGUAGE_NAMES.get(st.target, st.target), "targets": []}
            )
        return JsonResponse(out)

    async def health(self, request: Request) -> Response:
        """The server's state; its models' folders by name, by whole path only to a client
        that gives the server's API key (a header or ``?api_key=``)."""
        st, cfg = self.st, self.cfg
        given = _key_outside_body(request)
        full = cfg.api_key is not None and given is not None and _same_key(given, cfg.api_key)
        out: dict[str, Any] = {"status": "ok"}
        if st.registry.pair is not None:
            out["model"] = _one_model_health(st.registry.lanes[0], cfg, full)
        else:
            out["models"] = [lane.health(full=full) for lane in st.registry.lanes]
            out["memory"] = {
                "loaded_bytes": st.registry.resident_bytes,
                "cap_bytes": st.registry.memory_cap,
            }
        out["batching"] = {
            "enabled": cfg.batching,
            "max_batch_tokens": cfg.max_batch_tokens,
            "max_wait_ms": cfg.max_wait_ms,
            "worker_running": all(
                lane.batcher.running for lane in st.registry.lanes if lane.batcher is not None
            ),
        }
        out["queue_depth"] = st.registry.queue_depth
        out["decoding_sentences"] = st.registry.in_progress
        out["uptime_seconds"] = round(time.monotonic() - st.started, 3)
        return JsonResponse(out)

    async def metrics(self, request: Request) -> Response:
        st = self.st
        text = st.metrics.render(
            queue_depth=st.registry.queue_depth,
            in_progress=st.registry.in_progress,
            in_flight=st.in_flight,
        )
        text += "\n".join([*st.registry.metrics_lines(), *st.pair_lines()]) + "\n"
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def page(self, request: Request) -> Response:
        nonce = secrets.token_urlsafe(16)
        html = page_html(
            nonce=nonce,
            source=self.st.source,
            target=self.st.target,
            key_required=self.cfg.api_key is not None,
            max_alternatives=self.cfg.max_alternatives,
            char_limit=self.cfg.char_limit,
            detect=self.st.registry.pair is None,
            pairs=[(lane.source, lane.target) for lane in self.st.registry.lanes],
            file_formats=supported_extensions() if self.cfg.files else [],
        )
        csp = (
            f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
            "connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'"
        )
        return Response(
            html, media_type="text/html; charset=utf-8", headers={"Content-Security-Policy": csp}
        )

    async def openapi(self, request: Request) -> Response:
        st = self.st
        return JsonResponse(openapi_schema(st.source, st.target, self.cfg, languages=st.languages))


# ---------------------------------------------------------------------------- errors answered
async def _api_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, ApiError):  # registered for ApiError only
        return await _internal(request, exc)
    return error_response(exc.status, exc.message, exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, HTTPException):  # registered for HTTPException only
        return await _internal(request, exc)
    if exc.status_code == 404:
        path = describe(request.url.path).removeprefix("the string ")
        return error_response(
            404, f"path: no route {request.method} {path}; the routes are {', '.join(ROUTES)}"
        )
    if exc.status_code == 405:
        return error_response(
            405,
            f"method: {request.method[:40]} is not allowed on {request.url.path}",
            dict(exc.headers or {}),
        )
    return error_response(exc.status_code, str(exc.detail), dict(exc.headers or {}))


async def _internal(request: Request, exc: Exception) -> Response:
    log.error("qkv serve: %s %s failed: %r", request.method, request.url.path, exc)
    return error_response(500, f"internal error: {type(exc).__name__}")


# ---------------------------------------------------------------------------- the app
def create_app(
    translator: TextTranslator | ModelRegistry, config: ServeConfig | None = None
) -> Starlette:
    """The ASGI app serving ``translator`` (any engine: :class:`qkv.translate.Translator`,
    CTranslate2's, ONNX's) with ``config``'s settings; ``/attention`` needs an engine that
    shows its weights (the qkv one).

    Given a :class:`~qkv.serve.registry.ModelRegistry` instead, it serves every pair of its
    models as LibreTranslate serves its installed ones: ``/translate`` routes by ``source`` and
    ``target`` (both required), through a common language when no model translates the pair,
    detects ``source: "auto"``; ``/languages`` lists each language with every target it
    reaches; each model is loaded when first asked for, with its own batcher, and unloaded
    (least recently used first) beyond ``config.memory_cap_mb``.

    Its lifespan starts the batch workers and, at shutdown, lets them finish every queued job.
    The app's ``state.qkv`` holds the shared state (registry, batchers, metrics).

    Raises:
        SettingError: (a ``ValueError``) a bad setting, named by its field (``max_wait_ms``, a
            default ``beam`` wider than ``max_beam``), or languages that neither ``config`` nor
            the model give (``source_lang``).
        TypeError: ``translator`` is not a TextTranslator or a ModelRegistry, or ``config`` not
            a ServeConfig.
    """
    if not isinstance(translator, (TextTranslator, ModelRegistry)):
        raise TypeError(
            f"translator: expected a qkv.inference.TextTranslator (qkv.translate.Translator, "
            f"an exported engine) or a qkv.serve.registry.ModelRegistry, got "
            f"{type(translator).__name__}"
        )
    cfg = config or ServeConfig()
    if not isinstance(cfg, ServeConfig):
        raise TypeError(f"config: expected a ServeConfig, got {type(cfg).__name__}")
    if isinstance(translator, ModelRegistry):
        for name in ("source_lang", "target_lang"):
            if getattr(cfg, name) is not None:
                raise SettingError(
                    name,
                    "names the languages of one model; with several, each model's own are "
                    "served (recorded in its model.json)",
                )
    st = _State(translator, cfg)
    app = _App(
        routes=_Routes(st).routes(),
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _internal},
        lifespan=st.lifespan,
    )
    app.state.qkv = st
    app.add_middleware(_TrustedHost, allowed=cfg.allowed_hosts)
    app.add_middleware(_Observe, state=st)  # outermost: counts the refusals too
    return app


#: a ``Host`` header's name (RFC 3986's reg-name as DNS names spell it, or an IPv4 address)
#: and port; an IPv6 address in brackets and port
_HOST = re.compile(r"(?P<name>[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?\.?)(?::(?P<port>[0-9]{0,5}))?")
_HOST_V6 = re.compile(r"\[(?P<name>[0-9a-f:.]+)\](?::(?P<port>[0-9]{0,5}))?")


def _host_name(header: str) -> str | None:
    """The host name of a ``Host`` header, lowercase, without a trailing dot: ``name``,
    ``name:port`` or ``[IPv6]:port`` (an IPv6 address, then nothing but a port); None for
    anything else (``[localhost]evil.example``, ``a b``, ``a:b:c``, a port over 65535)."""
    value = header.strip().lower()
    m = _HOST_V6.fullmatch(value) or _HOST.fullmatch(value)
    if m is None or (m["port"] and int(m["port"]) > 65535) or ".." in m["name"]:
        return None
    name = m["name"]
    if value.startswith("["):
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
    return name.rstrip(".")


class _TrustedHost:
    """Pure ASGI middleware: a request whose ``Host`` names neither the loopback
    (:data:`~qkv.serve.config.LOOPBACK_HOSTS`), nor the address the request reached, nor one
    of ``allowed`` (``*.domain``: its subdomains; ``*``: any) is answered 400 before routing,
    as Starlette's TrustedHostMiddleware answers it. So a web page whose DNS name is rebound
    to the server's address cannot use it, and the trailing-slash redirect only ever points
    at a name the server answers to. A request with no ``Host`` (HTTP/1.0; no browser sends
    one) is served."""

    def __init__(self, app: Any, allowed: tuple[str, ...]) -> None:
        self.app = app
        self.any = "*" in allowed
        self.names = frozenset((*LOOPBACK_HOSTS, *allowed))
        self.suffixes = tuple(name[1:] for name in allowed if name.startswith("*."))

    def allows(self, host: str, scope: dict) -> bool:
        """Whether a request to ``host`` (a name from :func:`_host_name`) is served."""
        if self.any or host in self.names or host.endswith(self.suffixes):
            return True
        server = scope.get("server")
        if not server:
            return False
        reached = str(server[0]).lower()  # on a dual-stack socket, IPv4 as ::ffff:a.b.c.d
        return host in (reached, reached.removeprefix("::ffff:"))

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name != b"host":
                continue
            header = value.decode("latin-1")
            host = _host_name(header)
            if host is None or not self.allows(host, scope):
                shown = describe(header).removeprefix("the string ")
                what = (
                    "is not a host name (expected name, name:port or [IPv6]:port)"
                    if host is None
                    else "is not a name this server answers to"
                )
                refusal = error_response(
                    400,
                    f"Host: {shown} {what}; it answers to localhost and the address it is "
                    "reached at, and to the names given with --allowed-hosts",
                    {"Connection": "close"},
                )
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _App(Starlette):
    """Starlette, but an error it answered with a 500 (logged in one line by :func:`_internal`)
    is not raised on to the server, which would log its traceback as well: no client input
    puts a traceback in the server's log."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except Exception:
            if scope["type"] != "http":
                raise
            # Starlette's ServerErrorMiddleware called _internal (one line logged, 500 sent)
            # and raises again "so that servers may log it": logged already


class _Observe:
    """Pure ASGI middleware: counts each request by route and status, times it, and adds the
    headers every answer carries."""

    HEADERS = ((b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"))

    def __init__(self, app: Any, state: _State) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500
        st = self.state
        st.in_flight += 1

        async def send_with(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), *self.HEADERS]}
            await send(message)

        try:
            await self.app(scope, receive, send_with)
        finally:
            st.in_flight -= 1
            path = scope.get("path", "")
            if path.startswith("/download_file/"):
                path = "/download_file"
            route = path if path in ROUTES else "other"
            st.metrics.request(route, scope.get("method", ""), status, time.perf_counter() - t0)
