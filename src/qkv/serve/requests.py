"""Reading a request and answering it: the JSON answers and errors of ``qkv serve``, a body read
within its limit, JSON, forms and multipart forms parsed, and the fields checked.

Every error is an :class:`ApiError`, answered ``{"error": "field: what was expected, what
came"}`` with its status.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from .config import ServeConfig

__all__ = [
    "INTEGER",
    "ApiError",
    "JsonResponse",
    "Upload",
    "check_sentences",
    "check_text",
    "describe",
    "error_response",
    "form_fields",
    "int_field",
    "int_or",
    "json_bytes",
    "parse_body",
    "parse_multipart",
    "read_body",
    "request_texts",
]


# ---------------------------------------------------------------------------- errors, JSON
class ApiError(Exception):
    """An error answered as ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def json_bytes(content: Any) -> bytes:
    """``content`` as compact UTF-8 JSON; as ASCII escapes when it holds a lone surrogate (a
    text echoed from a request), which UTF-8 cannot encode."""
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(
            content, ensure_ascii=True, allow_nan=False, separators=(",", ":")
        ).encode()


class JsonResponse(Response):
    """A JSON answer (:func:`json_bytes`; bytes are sent as they are)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return content if isinstance(content, bytes) else json_bytes(content)


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return JsonResponse({"error": message}, status_code=status, headers=headers)


def describe(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return f"the number {v!r}"
    if isinstance(v, str):
        return f"the string {v[:40]!r}" + ("..." if len(v) > 40 else "")
    if isinstance(v, list):
        return f"a list of {len(v)}"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


# ---------------------------------------------------------------------------- reading a body
#: an integer as the docs promise it: ASCII digits, an optional sign (``str.isdigit`` and ``int``
#: accept Unicode digits such as "²" or "③", which must be refused as such); at most 18 digits,
#: so ``int`` never meets a string over its digit limit
INTEGER = re.compile(r"[+-]?[0-9]{1,18}", re.ASCII)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, up to ``limit`` bytes; refused before the rest is read, with the connection
    closed after the answer (the server reads and drops what is still coming, a bounded while:
    :mod:`qkv.serve.server`), so that a kept-alive connection does not carry it on."""
    over = f"over the limit of {limit:,} bytes (--max-body-bytes)"
    close = {"Connection": "close"}
    length = request.headers.get("content-length")
    if length is not None:
        if not re.fullmatch(r"[0-9]{1,18}", length.strip(), re.ASCII):
            raise ApiError(
                400, f"Content-Length: expected a number of bytes, got {length!r}", close
            )
        if int(length) > limit:
            raise ApiError(413, f"body: {int(length):,} bytes, {over}", close)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"body: more than {limit:,} bytes, {over}", close)
            chunks.append(chunk)
    except ClientDisconnect:  # the client's doing, not an error of the server's: not logged
        if request.scope.get("qkv.body_late"):  # the server answered 408 (qkv.serve.server)
            raise ApiError(408, f"body: arriving too slowly; {size:,} bytes read") from None
        raise ApiError(
            400, f"body: the connection closed after {size:,} bytes, before the end of it"
        ) from None
    return b"".join(chunks)


def _form_utf8(name: str, value: str) -> None:
    """400 for a form field whose %-escapes decode to bytes that are not UTF-8 (``q=caf%E9``
    is Latin-1), rather than a translation of U+FFFD."""
    for what, text in (("body", name), (name, value)):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            shown = "a field name" if what == "body" else "its value"
            raise ApiError(
                400,
                f"{what[:40]}: {shown} is not UTF-8 once its %-escapes are decoded (character "
                f"{e.start}); send the text as UTF-8 (q=caf%C3%A9 for café)",
            ) from None


def form_fields(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """A form's fields: the first of a repeated field, as LibreTranslate reads it, but every
    ``q`` (or ``q[]``), a list when there are several; a form's line ends (``\\r\\n``, what
    a text box sends) made ``\\n``, as LibreTranslate makes them."""
    data: dict[str, Any] = {}
    qs = [v.replace("\r\n", "\n").replace("\r", "\n") for k, v in pairs if k in ("q", "q[]")]
    for k, v in pairs:
        if k not in ("q", "q[]"):
            data.setdefault(k, v)
    if qs:
        data["q"] = qs[0] if len(qs) == 1 and not any(k == "q[]" for k, _ in pairs) else qs
    return data


@dataclass(frozen=True)
class Upload:
    """A file of a multipart form: its field, the name the client gave it, its bytes."""

    field: str
    filename: str
    data: bytes


async def parse_multipart(
    body: bytes, headers: Any, *, max_files: int
) -> tuple[dict[str, Any], list[Upload]]:
    """A ``multipart/form-data`` body (read whole already): its fields (as
    :func:`form_fields` reads a form's) and at most ``max_files`` files.

    Raises:
        ApiError: 400 a malformed form, a field that is not UTF-8, or more files than
            ``max_files``.
    """
    from starlette.datastructures import UploadFile
    from starlette.formparsers import MultiPartException, MultiPartParser

    async def stream() -> Any:
        yield body

    parser = MultiPartParser(
        headers, stream(), max_files=max_files, max_fields=10_000, max_part_size=len(body) + 1
    )
    try:
        form = await parser.parse()
    except MultiPartException as e:
        raise ApiError(400, f"body: a malformed multipart form: {e.message}") from None
    try:
        pairs, files = [], []
        for k, v in form.multi_items():
            if isinstance(v, UploadFile):
                files.append(Upload(k, v.filename or "", await v.read()))
            else:
                _form_utf8(k, v)
                pairs.append((k, v))
    finally:
        await form.close()
    return form_fields(pairs), files


def parse_body(body: bytes, content_type: str) -> tuple[dict[str, Any], bool]:
    """The request's fields and whether they came from a form (strings everywhere); not a
    multipart one (:func:`parse_multipart`)."""
    ctype = content_type.split(";")[0].strip().lower()
    if ctype == "application/x-www-form-urlencoded":
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ApiError(
                400, f"body: the form is not UTF-8 ({e.reason} at byte {e.start})"
            ) from None
        try:  # %-escapes decoded to bytes kept as surrogates, so that invalid UTF-8 is found
            pairs = urllib.parse.parse_qsl(
                text,
                keep_blank_values=True,
                strict_parsing=False,
                max_num_fields=10_000,
                errors="surrogateescape",
            )
        except ValueError as e:
            raise ApiError(413, f"body: {e}") from None
        for k, v in pairs:
            _form_utf8(k, v)
        return form_fields(pairs), True
    # text/plain is not JSON: a web page may send it anywhere without asking (no CORS preflight)
    if ctype not in ("", "application/json") and not ctype.endswith("+json"):
        raise ApiError(
            415,
            f"Content-Type: {ctype!r} is not read; send JSON (application/json) or a form "
            "(application/x-www-form-urlencoded or multipart/form-data)",
        )
    if not body.strip():
        raise ApiError(
            400,
            'body: empty; expected a JSON object such as {"q": "Hello.", "source": "en", '
            '"target": "fr"}',
        )
    try:
        data = json.loads(body)
    except UnicodeDecodeError as e:
        raise ApiError(400, f"body: malformed JSON: not UTF-8 ({e.reason})") from None
    except ValueError as e:  # json.JSONDecodeError
        raise ApiError(400, f"body: malformed JSON: {e}") from None
    except RecursionError:
        raise ApiError(400, "body: malformed JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError(422, f"body: expected a JSON object of fields, got {describe(data)}")
    return data, False


# ---------------------------------------------------------------------------- fields
def int_field(data: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    """Field ``name`` as an int in ``[lo, hi]`` (a form's digits too), or None when absent."""
    v = data.get(name)
    if v is None or v == "":
        return None
    if isinstance(v, str) and INTEGER.fullmatch(v.strip()):
        v = int(v.strip())
    elif isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(422, f"{name}: expected an integer in [{lo}, {hi}], got {describe(v)}")
    if not lo <= v <= hi:
        raise ApiError(422, f"{name}: expected an integer in [{lo}, {hi}], got {v}")
    return v


def int_or(data: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    v = int_field(data, name, lo, hi)
    return default if v is None else v


def check_text(name: str, text: str, char_limit: int | None) -> None:
    """400 for a text over LibreTranslate's ``char_limit`` (None: none), 422 for one that is
    not valid Unicode."""
    if char_limit is not None and len(text) > char_limit:
        raise ApiError(
            400,
            f"{name}: {len(text):,} characters, over the limit of {char_limit:,} per text "
            "(--char-limit)",
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(
            422, f"{name}: not valid Unicode (a lone surrogate at character {e.start})"
        ) from None


def check_sentences(name: str, sentences: Any, max_chars: int) -> None:
    """413 for a sentence (of a text cut into sentences) over ``max_chars`` characters."""
    for sentence in sentences:
        if len(sentence) > max_chars:
            shown = sentence[:40] + ("..." if len(sentence) > 40 else "")
            raise ApiError(
                413,
                f"{name}: a sentence of {len(sentence):,} characters ({shown!r}), over the "
                f"limit of {max_chars:,} per sentence (--max-chars)",
            )


def request_texts(
    data: dict[str, Any], cfg: ServeConfig, *, one: bool = False
) -> tuple[list[str], bool]:
    """``q`` as a list of texts, and whether it was a single string (``one``: it must be, one
    sentence, as ``/attention`` takes it)."""
    if "q" not in data or data["q"] is None:
        raise ApiError(
            422,
            "q: missing; expected the text to translate, a string"
            + ("" if one else " or a list of strings"),
        )
    q = data["q"]
    if isinstance(q, str):
        check_text("q", q, cfg.char_limit)
        if one:
            check_sentences("q", [q], cfg.max_chars)
        return [q], True
    if one:
        raise ApiError(422, f"q: expected one sentence, a string, got {describe(q)}")
    if not isinstance(q, list):
        raise ApiError(422, f"q: expected a string or a list of strings, got {describe(q)}")
    if len(q) > cfg.max_sentences:
        raise ApiError(
            413,
            f"q: {len(q):,} texts, over the limit of {cfg.max_sentences:,} sentences per "
            "request (--max-sentences)",
        )
    for i, t in enumerate(q):
        if not isinstance(t, str):
            raise ApiError(422, f"q[{i}]: expected a string, got {describe(t)}")
        check_text(f"q[{i}]", t, cfg.char_limit)
    return list(q), False
