"""Decoding: greedy and beam search with a KV cache, for every :class:`qkv.nn.EncoderDecoder`.

:func:`generate` is the entry point of keywords; :func:`search_hypotheses` takes the options as
one :class:`Decoding` and gives every sentence's hypotheses; :func:`greedy_search` and
:func:`beam_search` return the same results with more control; :class:`KVCache` is the
per-layer key/value cache the Transformer decoder keeps when ``use_cache=True``.

Each name is loaded from its module on first use, so that :class:`Decoding` (no torch) reads
without torch: ``qkv translate --help`` shows its defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:  # what the names below are, for type checkers and editors
    from ..nn.kv_cache import KVCache
    from .options import Decoding, default_max_len, default_output_len
    from .search import Hypothesis, beam_search, generate, greedy_search, search_hypotheses

#: each public name and the module that defines it (relative to this package)
_WHERE: dict[str, str] = {
    "Decoding": ".options",
    "Hypothesis": ".search",
    "KVCache": "..nn.kv_cache",
    "beam_search": ".search",
    "default_max_len": ".options",
    "default_output_len": ".options",
    "generate": ".search",
    "greedy_search": ".search",
    "search_hypotheses": ".search",
}

__all__ = [
    "Decoding",
    "Hypothesis",
    "KVCache",
    "beam_search",
    "default_max_len",
    "default_output_len",
    "generate",
    "greedy_search",
    "search_hypotheses",
]


__getattr__, __dir__ = lazy_names(__name__, _WHERE)
