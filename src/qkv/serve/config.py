"""The settings of ``qkv serve``: languages, limits, batching, the API key.

:class:`ServeConfig` imports neither starlette nor torch, so its defaults (the ones ``qkv serve
--help`` shows) are read without the ``serve`` extra.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, fields

from .._errors import SettingError
from ..viz import MAX_CELLS

__all__ = ["FRONTEND_TIMEOUT_MS", "LOOPBACK_HOSTS", "ServeConfig"]

#: the fields that are None (the model's, or no limit) or a count, an int >= 1
_OPTIONAL_COUNTS = ("beam", "char_limit", "req_limit")

#: milliseconds LibreTranslate's page waits after a keystroke before it translates (its default
#: ``--frontend-timeout``), answered in ``/frontend/settings``
FRONTEND_TIMEOUT_MS = 500

#: the names a request's ``Host`` may always give (with the address the request reached)
LOOPBACK_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")


@dataclass
class ServeConfig:
    """What ``qkv serve``'s flags set.

    Attributes:
        source_lang, target_lang: the language codes the model translates between (None: read
            from the model when it says, e.g. a model of the bundled corpus is ``en`` to ``fr``).
        beam: the default ``beam_size`` of a request (None: the model's, chosen by ``qkv
            train``).
        api_key: when set, ``/translate`` and ``/attention`` need it (compared in constant time).
        batching: False: each request decoded alone (no dynamic batching).
        max_batch_tokens: a batch's budget of source tokens (with ``<eos>``) times
            ``beam_size``.
        max_wait_ms: how long the first request of a batch waits for others.
        max_body_bytes: the largest request body.
        char_limit: the most characters in one text of a request's ``q`` (LibreTranslate's
            ``--char-limit``; None: no limit).
        max_sentences: the most sentences in one request, once its texts are cut into
            sentences (a text of a list counts one at least).
        max_chars: the most characters in one sentence (of a text, an HTML page or a file).
        req_limit: the most requests per minute from one client, LibreTranslate's
            ``--req-limit``: a request of a list of ``n`` texts counts ``n``, a file one per
            ``char_limit`` bytes; a client is its API key when the server has one and the
            request gives it, else its address (None: no limit).
        max_alternatives: the most ``alternatives`` a request may ask.
        max_beam: the widest ``beam_size`` a request may ask.
        max_queue: the most sentences waiting; beyond, 503.
        max_attention_cells: the most weights one ``/attention`` answer holds
            (:func:`qkv.viz.attention_cells`).
        files: ``POST /translate_file`` served (LibreTranslate's
            ``--disable-files-translation`` turns it off).
        max_file_bytes: the largest file ``/translate_file`` takes.
        max_file_chars: the most characters of text one file holds to translate.
        file_ttl: how long a translated file waits to be downloaded, seconds (it is
            removed once downloaded, or when its client left before it was done).
        model_dir: the folder the model was given as (informational, in ``/health``).
        memory_cap_mb: with several models (a :class:`~qkv.serve.registry.ModelRegistry`), the
            most memory the loaded ones may take together, in MB (10^6 bytes) of weights; the
            least recently used idle model is unloaded to make room (None: no cap).
        allowed_hosts: host names a request's ``Host`` header may give besides the loopback's
            (:data:`LOOPBACK_HOSTS`) and the address the request reached, which are always
            allowed; ``"*.example.org"`` allows every subdomain of ``example.org``, ``"*"`` any
            name. Any other is a 400 (a web page that rebinds its DNS name to the server's
            address cannot reach it). Names are kept lowercase, without a trailing dot.

    Raises:
        SettingError: (a ``ValueError``) a value out of range, named by its field.
    """

    source_lang: str | None = None
    target_lang: str | None = None
    beam: int | None = None
    api_key: str | None = None
    batching: bool = True
    max_batch_tokens: int = 4096
    max_wait_ms: float = 5.0
    max_body_bytes: int = 1_000_000
    char_limit: int | None = 5000
    max_sentences: int = 1000
    max_chars: int = 2000
    max_alternatives: int = 5
    max_beam: int = 8
    max_queue: int = 4096
    max_attention_cells: int = MAX_CELLS
    req_limit: int | None = None
    files: bool = True
    max_file_bytes: int = 10_000_000
    max_file_chars: int = 1_000_000
    file_ttl: float = 1800.0
    model_dir: str | None = None
    memory_cap_mb: float | None = None
    allowed_hosts: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        self.allowed_hosts = _host_names(self.allowed_hosts)
        for f in fields(self):
            v = getattr(self, f.name)
            is_count = f.name.startswith("max_") and f.name != "max_wait_ms"
            is_count |= f.name in _OPTIONAL_COUNTS and v is not None
            if is_count and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise SettingError(f.name, f"expected an int >= 1, got {v!r}")
        if self.max_alternatives + 1 > self.max_beam:
            raise SettingError(
                "max_alternatives",
                f"{self.max_alternatives} alternatives need a beam of "
                f"{self.max_alternatives + 1}, wider than max_beam {self.max_beam}",
            )
        ttl = self.file_ttl
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= 86400:
            raise SettingError("file_ttl", f"expected seconds in (0, 86400], got {ttl!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key):
            raise SettingError("api_key", "expected a non-empty string or None")
        cap = self.memory_cap_mb
        if cap is not None and (
            isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < 1e12
        ):
            raise SettingError("memory_cap_mb", f"expected a number > 0 or None, got {cap!r}")
        for name in ("source_lang", "target_lang"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip() or v == "auto"):
                raise SettingError(name, f"expected a language code such as 'en', got {v!r}")


def _host_names(names: object) -> tuple[str, ...]:
    """``allowed_hosts`` checked: a sequence of host names (no port, no scheme, no path), IP
    addresses (IPv6 with or without brackets), ``*.domain`` patterns or ``*``; lowercase,
    without a trailing dot."""
    if isinstance(names, str) or not isinstance(names, (tuple, list)):
        raise SettingError(
            "allowed_hosts", f"expected a list of host names, got {type(names).__name__}"
        )
    out = []
    for name in names:
        if not isinstance(name, str):
            raise SettingError(
                "allowed_hosts", f"expected host names (strings), got {type(name).__name__}"
            )
        host = name.strip().lower().rstrip(".")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        try:
            ipaddress.ip_address(host)
            out.append(host)
            continue
        except ValueError:
            pass
        label = host[2:] if host.startswith("*.") else host
        if host != "*" and (
            not label
            or len(host) > 253
            or not all(c.isascii() and (c.isalnum() or c in "-_.") for c in label)
        ):
            raise SettingError(
                "allowed_hosts",
                f"expected a host name such as 'translate.example.org', '*.example.org' or "
                f"'*' (no port, scheme or path), got {name!r}",
            )
        out.append(host)
    return tuple(dict.fromkeys(out))
