"""Decoding: greedy and beam search with a KV cache, for every :class:`qkv.nn.EncoderDecoder`.

:func:`generate` is the entry point; :func:`greedy_search` and :func:`beam_search` return the
same results with more control; :class:`KVCache` is the per-layer key/value cache the Transformer
decoder keeps when ``use_cache=True``.
"""

from ..nn.kv_cache import KVCache
from .search import Hypothesis, beam_search, generate, greedy_search

__all__ = ["Hypothesis", "KVCache", "beam_search", "generate", "greedy_search"]
