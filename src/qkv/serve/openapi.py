"""The OpenAPI 3.1 description of the server, served at ``/openapi.json``."""

from __future__ import annotations

from typing import Any

from .. import __version__

__all__ = ["openapi_schema"]


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _body(ref: str) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{ref}"}
    return {
        "required": True,
        "content": {
            "application/json": {"schema": schema},
            "application/x-www-form-urlencoded": {"schema": schema},
        },
    }


def _languages_fields(
    source: str | None, target: str | None, languages: list[str] | None
) -> dict[str, Any]:
    """``source`` and ``target``: one model's (defaults), or several models' (required)."""
    lang = {"type": "string", "description": "a language code"}
    if source is not None and target is not None:
        return {
            "source": {
                **lang,
                "default": source,
                "description": f"the source language: {source!r} or 'auto' (assumed {source!r}; "
                "nothing is detected; the answer's detectedLanguage says so)",
            },
            "target": {
                **lang,
                "default": target,
                "description": f"the target language: {target!r}",
            },
        }
    served = ", ".join(languages or [])
    return {
        "source": {
            **lang,
            "description": f"the source language (one of {served}; GET /languages lists each "
            "with its targets), or 'auto': detected among them (the answer's detectedLanguage "
            "says which, confidence 0-100)",
        },
        "target": {**lang, "description": f"the target language (one of {served})"},
    }


def openapi_schema(
    source: str | None, target: str | None, cfg: Any, *, languages: list[str] | None = None
) -> dict[str, Any]:
    """The schema, with this server's languages and limits (``cfg``: a ServeConfig); ``source``
    and ``target`` None: a server of several models, whose ``languages`` are listed."""
    common = {
        **_languages_fields(source, target, languages),
        "format": {
            "type": "string",
            "enum": ["text", "html"],
            "default": "text",
            "description": "text: each line a paragraph, cut into sentences, its layout kept "
            "(line breaks, blank lines, indentation); html: an HTML page or fragment, its text "
            "translated and its markup kept (inline markup placed on the words it covered by "
            'the model\'s attention; script, style, code, pre and translate="no" left as '
            "they are; no alternatives)",
        },
        "alternatives": {
            "type": "integer",
            "minimum": 0,
            "maximum": cfg.max_alternatives,
            "default": 0,
            "description": "how many other translations (the n-best of beam search) to return",
        },
        "beam": {
            "type": "integer",
            "minimum": 1,
            "maximum": cfg.max_beam,
            "description": "beam size (default: the server's; at least alternatives + 1)",
        },
        "api_key": {"type": "string", "description": "the API key, when the server has one"},
    }
    limit = cfg.char_limit
    text = {"type": "string"} if limit is None else {"type": "string", "maxLength": limit}
    key_note = (
        " Needs the API key (the api_key field, an Authorization: Bearer header, an "
        "X-API-Key header, or ?api_key= in the URL; one in a header or the URL is checked "
        "before the body is read)."
        if cfg.api_key is not None
        else ""
    )
    over = "" if limit is None else f", a text over {limit} characters (--char-limit)"
    errors = {
        "400": _error(
            "malformed body (a form not UTF-8 too), a language pair or format not served, a "
            f"Host header the server does not answer to{over}"
        ),
        "401": _error("missing or wrong API key"),
        "413": _error(
            f"body over {cfg.max_body_bytes} bytes, over {cfg.max_sentences} sentences (once "
            f"the texts are cut into sentences), a sentence over {cfg.max_chars} characters, "
            f"or an attention over {cfg.max_attention_cells} weights"
        ),
        "415": _error("a body that is neither JSON nor a form (text/plain too)"),
        "408": _error(
            "the body arrived too slowly (--body-timeout, --min-body-rate), or the server was "
            "full and this request was the slowest to arrive; the connection is closed"
        ),
        "422": _error("a field of the wrong type or out of range, or q missing"),
        "503": _error(
            f"more than {cfg.max_queue} sentences are waiting; retry later (or the server is "
            "stopping and its shutdown timeout ran out, or a model could not be loaded: "
            "Retry-After says when it is tried again)"
        ),
    }
    if cfg.req_limit is not None:
        errors["429"] = _error(
            f"more than {cfg.req_limit} requests in a minute from this client (its API key, "
            'else its address): LibreTranslate\'s {"error": "Slowdown: '
            f'{cfg.req_limit} per 1 minute"}}, with Retry-After'
        )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "qkv serve",
            "version": __version__,
            "description": "Translation with a qkv model, LibreTranslate-compatible, with the "
            'attention of each translation. Every error is {"error": "field: ..."}.',
        },
        "paths": _paths(key_note, errors, cfg),
        "components": {"schemas": _schemas(cfg, common, text, multi=source is None)},
    }


def _paths(key_note: str, errors: dict[str, Any], cfg: Any) -> dict[str, Any]:
    """Every route's description."""
    return {
        **_post_paths(key_note, errors),
        **_file_paths(key_note, errors, cfg),
        **_get_paths(),
    }


def _json(ref: str, description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}},
    }


def _file_paths(key_note: str, errors: dict[str, Any], cfg: Any) -> dict[str, Any]:
    """``/translate_file``, ``/download_file/{name}``, ``/suggest``, ``/frontend/settings``."""
    form = {
        "type": "object",
        "required": ["file"],
        "properties": {
            "file": {
                "type": "string",
                "format": "binary",
                "description": f"the file, at most {cfg.max_file_bytes} bytes and "
                f"{cfg.max_file_chars} characters of text; its name's extension says its "
                "format (GET /frontend/settings lists them)",
            },
            "source": {"type": "string", "description": "the source language, or 'auto'"},
            "target": {"type": "string", "description": "the target language"},
            "api_key": {"type": "string", "description": "the API key, when the server has one"},
        },
    }
    refused = {
        **errors,
        "403": _error("files translation is disabled on this server"),
        "413": _error(
            f"a body over {cfg.max_file_bytes} bytes, a file of more than {cfg.max_file_chars} "
            f"characters of text, or a sentence over {cfg.max_chars} characters"
        ),
    }
    return {
        "/translate_file": {
            "post": {
                "summary": "Translate a file (LibreTranslate's): the answer says where to "
                "download the translation, which is kept until downloaded (once) or "
                f"{cfg.file_ttl:g} s." + key_note,
                "requestBody": {
                    "required": True,
                    "content": {"multipart/form-data": {"schema": form}},
                },
                "responses": {
                    "200": _json("TranslateFileResponse", "where the translated file waits"),
                    **refused,
                },
            }
        },
        "/download_file/{name}": {
            "get": {
                "summary": "A translated file, as an attachment named like the original with "
                "_TARGET before its extension; removed once sent.",
                "parameters": [
                    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": {
                        "description": "the file",
                        "content": {"application/octet-stream": {"schema": {"type": "string"}}},
                    },
                    "400": _error("not the name of a translated file"),
                    "404": _error("no such file (downloaded already, or its time was up)"),
                },
            }
        },
        "/suggest": {
            "post": {
                "summary": "LibreTranslate's suggestions: this server keeps none, and answers "
                "as LibreTranslate does when they are off.",
                "responses": {"403": _error("Suggestions are disabled on this server.")},
            }
        },
        "/frontend/settings": {
            "get": {
                "summary": "LibreTranslate's settings of its web page, apps and extensions.",
                "responses": {"200": _json("FrontendSettings", "the settings")},
            }
        },
    }


def _post_paths(key_note: str, errors: dict[str, Any]) -> dict[str, Any]:
    return {
        "/translate": {
            "post": {
                "summary": "Translate one text or a list of texts (LibreTranslate's shape)."
                + key_note,
                "requestBody": _body("TranslateRequest"),
                "responses": {
                    "200": {
                        "description": "the translations",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/TranslateResponse"}
                            }
                        },
                    },
                    **errors,
                },
            }
        },
        "/attention": {
            "post": {
                "summary": "One sentence's translation and every attention weight of it."
                + key_note,
                "requestBody": _body("AttentionRequest"),
                "responses": {
                    "200": {
                        "description": "the translation and its attention",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/AttentionResponse"}
                            }
                        },
                    },
                    **errors,
                },
            }
        },
        "/detect": {
            "post": {
                "summary": "The language of a text, or of a list judged together, among the "
                "languages served (LibreTranslate's shape)." + key_note,
                "requestBody": _body("DetectRequest"),
                "responses": {
                    "200": {
                        "description": "the languages it may be, most likely first",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "array",
                                    "items": {"$ref": "#/components/schemas/Detection"},
                                }
                            }
                        },
                    },
                    **errors,
                    "501": _error("no language detection library (pip install 'qkv[langid]')"),
                },
            }
        },
    }


def _get_paths() -> dict[str, Any]:
    return {
        "/languages": {
            "get": {
                "summary": "The languages served (LibreTranslate's shape).",
                "responses": {
                    "200": {
                        "description": "one entry per language",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "array",
                                    "items": {"$ref": "#/components/schemas/Language"},
                                }
                            }
                        },
                    }
                },
            }
        },
        "/health": {
            "get": {
                "summary": "The model loaded (its folder, step, languages) and the queue.",
                "responses": {
                    "200": {
                        "description": "the server is up",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus text: requests by route and status, latency, batch "
                "sizes, queue depth.",
                "responses": {
                    "200": {
                        "description": "text format 0.0.4",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/": {
            "get": {
                "summary": "The page: translate, and see the attention of a translation.",
                "responses": {
                    "200": {
                        "description": "HTML",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/openapi.json": _this(),
        "/spec": _this(),
    }


def _this() -> dict[str, Any]:
    """``/openapi.json`` and ``/spec`` (the path LibreTranslate serves its own at)."""
    return {
        "get": {
            "summary": "This description.",
            "responses": {
                "200": {
                    "description": "OpenAPI 3.1",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            },
        }
    }


def _translate_schemas(
    cfg: Any, common: dict[str, Any], text: dict[str, Any], *, multi: bool
) -> dict[str, Any]:
    """``/translate``'s request and answer, ``/translate_file``'s answer and
    ``/frontend/settings``' (``multi``: a server of several models)."""
    detected = (
        "with source 'auto': {language, confidence}, the language detected among those served "
        "and its probability, 0-100 (a list, one per text, for a list q)"
        if multi
        else "with source 'auto': the model's source language (assumed, confidence 0)"
    )
    return {
        "TranslateRequest": {
            "type": "object",
            "required": ["q"],
            "properties": {
                "q": {
                    "description": "a text, or a list of texts; at most "
                    f"{cfg.max_sentences} sentences in all, once each text is cut into them",
                    "oneOf": [
                        text,
                        {"type": "array", "items": text, "maxItems": cfg.max_sentences},
                    ],
                },
                **common,
                "split": {
                    "type": "string",
                    "enum": ["sentences", "none"],
                    "default": "sentences",
                    "description": "qkv's: sentences, each line cut into sentences; none, each "
                    "line translated as one sentence (text cut already)",
                },
                "layout": {
                    "type": "boolean",
                    "default": False,
                    "description": "qkv's: the answer's layout gives each text's sentences with "
                    "their translations (format text)",
                },
            },
        },
        "TranslateResponse": {
            "type": "object",
            "required": ["translatedText"],
            "properties": {
                "translatedText": {
                    "description": "a string for a string q, a list for a list",
                    "oneOf": [
                        {"type": "string"},
                        {"type": "array", "items": {"type": "string"}},
                    ],
                },
                "alternatives": {
                    "description": "with alternatives > 0: the other translations, "
                    "best first (a list of lists for a list q)",
                    "type": "array",
                },
                "detectedLanguage": {"description": detected},
                "pivot": {
                    "type": "string",
                    "description": "when no model translates the pair: the language the text "
                    "went through (two models)",
                },
                "layout": {
                    "description": "with layout true: per text (a list for a list q) its "
                    "translation in pieces, a string kept as it was (line breaks, spaces) or "
                    "{source, translation} for a sentence; joined, they are translatedText",
                    "type": "array",
                },
            },
        },
        "TranslateFileResponse": {
            "type": "object",
            "required": ["translatedFileUrl"],
            "properties": {
                "translatedFileUrl": {
                    "type": "string",
                    "description": "GET it for the translated file (once)",
                }
            },
        },
        "FrontendSettings": _settings_schema(),
    }


def _schemas(
    cfg: Any, common: dict[str, Any], text: dict[str, Any], *, multi: bool
) -> dict[str, Any]:
    """The request and answer schemas (``multi``: a server of several models)."""
    return {
        **_translate_schemas(cfg, common, text, multi=multi),
        **_attention_schemas(common, text),
        "Language": {
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "name": {"type": "string"},
                "targets": {"type": "array", "items": {"type": "string"}},
            },
        },
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "string",
                    "description": "names the field, what was expected and what came",
                }
            },
        },
        "DetectRequest": {
            "type": "object",
            "required": ["q"],
            "properties": {
                "q": {
                    "description": "a text, or a list of texts judged together",
                    "oneOf": [text, {"type": "array", "items": text}],
                },
                "api_key": common["api_key"],
            },
        },
        "Detection": {
            "type": "object",
            "properties": {
                "language": {"type": "string"},
                "confidence": {"type": "number", "minimum": 0, "maximum": 100},
            },
        },
    }


def _attention_schemas(common: dict[str, Any], text: dict[str, Any]) -> dict[str, Any]:
    """``/attention``'s request and answer."""
    return {
        "AttentionRequest": {
            "type": "object",
            "required": ["q"],
            "properties": {
                "q": text,
                **common,
                "choice": {
                    "type": "integer",
                    "minimum": 0,
                    "default": 0,
                    "description": "which translation: 0 the best, i the i-th of the "
                    "alternatives (at most alternatives)",
                },
                "decimals": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 6,
                    "default": 4,
                    "description": "weights are sent times 10**decimals, rounded",
                },
            },
        },
        "AttentionResponse": {
            "type": "object",
            "properties": {
                "translatedText": {"type": "string"},
                "choice": {"type": "integer"},
                "srcTokens": {"type": "array", "items": {"type": "string"}},
                "tgtTokens": {"type": "array", "items": {"type": "string"}},
                "attention": {
                    "description": "the viewer's data (qkv.viz.attention_payload): "
                    "{title, scale, kinds: [{name, q, k, layers: [{heads, mean}]}]}; "
                    "each matrix a flat row-major list of len(q) * len(k) integers, "
                    "the weights times scale",
                    "type": "object",
                },
            },
        },
    }


def _settings_schema() -> dict[str, Any]:
    """``/frontend/settings``' answer, LibreTranslate's fields."""
    language = {
        "type": "object",
        "properties": {"code": {"type": "string"}, "name": {"type": "string"}},
    }
    return {
        "type": "object",
        "properties": {
            "charLimit": {"type": "integer", "description": "characters per text; -1: none"},
            "frontendTimeout": {
                "type": "integer",
                "description": "milliseconds a page waits after a keystroke to translate",
            },
            "apiKeys": {"type": "boolean", "description": "the server takes API keys"},
            "keyRequired": {"type": "boolean", "description": "a request needs one"},
            "suggestions": {"type": "boolean", "description": "always false: none kept"},
            "filesTranslation": {"type": "boolean", "description": "POST /translate_file served"},
            "supportedFilesFormat": {
                "type": "array",
                "items": {"type": "string"},
                "description": "the file extensions /translate_file reads",
            },
            "language": {
                "type": "object",
                "description": "the source and target a page chooses first",
                "properties": {"source": language, "target": language},
            },
        },
    }
