"""A key/value cache for one attention layer, for incremental decoding.

:class:`KVCache` holds the projected keys and values ``(B, H, L, d)`` of one
:class:`qkv.nn.MultiHeadAttention`.  Two kinds:

* growing (``static=False``, decoder self-attention): each call appends the keys/values of the new
  positions; storage is preallocated and doubled when full, so appending one position costs
  ``O(1)`` amortised copies instead of concatenating the whole prefix;
* static (``static=True``, cross-attention over the encoder): filled by the first call, then
  reused as is; the encoder's keys and values are projected once per sentence.

Beam search reorders the rows (``B``) with :meth:`KVCache.reorder`.

:class:`TensorKVCache` is the same cache as plain tensors, for a graph of one decoder step
(``torch.export``, ONNX): the past keys and values come in as inputs, the step returns them with
the new positions appended (``torch.cat``, no preallocation, no Python-side length).  Ordinary
decoding keeps the preallocated :class:`KVCache`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..functional.scores import all_finite, mark_finite

__all__ = ["KVCache", "TensorKVCache"]


def _checked_finite(k: Tensor, v: Tensor) -> bool:
    """Whether ``k`` and ``v`` are known finite (read back on the CPU); never under
    ``torch.compile``/``torch.export``, where reading a value back breaks the graph."""
    return not torch.compiler.is_compiling() and bool(all_finite(k, v))


class KVCache:
    """Projected keys and values of one attention layer.

    Args:
        static: True for cross-attention (filled once, then reused); False for self-attention
            (grows by the new positions at every call).
        capacity: positions to preallocate for a growing cache (it doubles when exceeded).

    Attributes:
        length: the number of cached positions ``L``.
    """

    def __init__(self, *, static: bool = False, capacity: int | None = None) -> None:
        if not isinstance(static, bool):
            raise TypeError(f"static: expected a bool, got {type(static).__name__}")
        if capacity is not None and (
            isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1
        ):
            raise ValueError(f"capacity: expected a positive int or None, got {capacity!r}")
        self.static = static
        self.capacity = capacity
        self.length = 0
        self._k: Tensor | None = None  # (B, H, capacity, d)
        self._v: Tensor | None = None
        # every number stored is known finite (checked once, as stored): the keys and values
        # handed out are then marked, and attention does not scan them for NaN at every step
        self._finite = False
        self._spare: tuple[Tensor, Tensor] | None = None  # reorder's second buffer

    def __repr__(self) -> str:
        shape = None if self._k is None else tuple(self.keys.shape)
        return f"KVCache(static={self.static}, length={self.length}, keys={shape})"

    @property
    def empty(self) -> bool:
        return self.length == 0

    @property
    def keys(self) -> Tensor:
        """Cached keys ``(B, H, L, d)`` (a view of the storage; read-only)."""
        if self._k is None:
            raise RuntimeError("KVCache: the cache is empty")
        return self._k if self.static else self._k[:, :, : self.length]

    @property
    def values(self) -> Tensor:
        """Cached values ``(B, H, L, dv)`` (a view of the storage; read-only)."""
        if self._v is None:
            raise RuntimeError("KVCache: the cache is empty")
        return self._v if self.static else self._v[:, :, : self.length]

    def _check(self, k: Tensor, v: Tensor) -> None:
        if not isinstance(k, Tensor) or not isinstance(v, Tensor) or k.dim() != 4 or v.dim() != 4:
            raise ValueError("k, v: expected 4-D tensors (B, H, L, d)")
        if k.shape[:3] != v.shape[:3]:
            raise ValueError(
                f"v: expected (B, H, L) = {tuple(k.shape[:3])} like k, got {tuple(v.shape)}"
            )
        if self._k is not None and (
            k.shape[:2] != self._k.shape[:2]
            or k.shape[3] != self._k.shape[3]
            or v.shape[3] != self._v.shape[3]
        ):
            raise ValueError(
                f"k: expected (B, H, ., d) = {tuple(self.keys.shape)} like the cached keys, "
                f"got {tuple(k.shape)}"
            )

    def set(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``k (B, H, L, d)`` and ``v (B, H, L, dv)`` as the whole cache."""
        self._check(k, v)
        self._k, self._v, self.length = k, v, k.shape[2]
        self._finite = _checked_finite(k, v)
        if self._finite:
            mark_finite(k, v)
        return k, v

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k (B, H, n, d)``, ``v (B, H, n, dv)``; return all keys and values so far."""
        if self.static:
            raise RuntimeError("KVCache: a static cache is filled once with set()")
        self._check(k, v)
        n = k.shape[2]
        end = self.length + n
        if self._k is None or end > self._k.shape[2]:
            cap = max(end, 2 * (0 if self._k is None else self._k.shape[2]), self.capacity or 0)
            B, H = k.shape[:2]
            nk = k.new_empty(B, H, cap, k.shape[3])
            nv = v.new_empty(B, H, cap, v.shape[3])
            if self.length:
                nk[:, :, : self.length] = self.keys
                nv[:, :, : self.length] = self.values
            self._k, self._v = nk, nv
        self._k[:, :, self.length : end] = k
        self._v[:, :, self.length : end] = v
        self._finite = _checked_finite(k, v) and (self.length == 0 or self._finite)
        self.length = end
        keys, values = self.keys, self.values
        if self._finite:
            mark_finite(keys, values)
        return keys, values

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` ``(B',)`` of the batch, in that order (beam search)."""
        if self._k is None:
            return
        if self.static or index.numel() != self._k.shape[0]:
            self._k = self.keys.index_select(0, index)
            self._v = self.values.index_select(0, index)
            if not self.static:  # keep room to grow
                self._k, self._v = self._grow(self._k), self._grow(self._v)
            elif self._finite:  # rows of finite keys and values
                mark_finite(self._k, self._v)
            return
        # same rows count (beam search, every step): gathered straight into a second buffer of
        # the same capacity, which then becomes the cache (one copy, not a gather and a copy back)
        L = self.length
        if (
            self._spare is None
            or self._spare[0].shape != self._k.shape
            or self._spare[1].shape != self._v.shape
        ):
            self._spare = (torch.empty_like(self._k), torch.empty_like(self._v))
        sk, sv = self._spare
        torch.index_select(self._k[:, :, :L], 0, index, out=sk[:, :, :L])
        torch.index_select(self._v[:, :, :L], 0, index, out=sv[:, :, :L])
        self._spare = (self._k, self._v)
        self._k, self._v = sk, sv

    def _grow(self, t: Tensor) -> Tensor:
        cap = max(self.capacity or 0, t.shape[2])
        if cap == t.shape[2]:
            return t
        out = t.new_empty(*t.shape[:2], cap, t.shape[3])
        out[:, :, : t.shape[2]] = t
        return out

    def to(self, *args, **kwargs) -> KVCache:
        """Move or cast the stored tensors (like ``Tensor.to``); returns self."""
        if self._k is not None:
            self._k, self._v = self._k.to(*args, **kwargs), self._v.to(*args, **kwargs)
            self._finite = False  # a cast may overflow: unknown from here on
            self._spare = None
        return self


class TensorKVCache:
    """The keys and values of one attention layer as tensors: the cache of a step graph.

    Used where a :class:`KVCache` is (``MultiHeadAttention(..., cache=)``, a decoder state),
    with the past given as tensors: ``TensorKVCache(past_k (B, H, T, d), past_v (B, H, T, dv))``
    (``T`` may be 0 and symbolic).  A growing cache returns ``torch.cat`` of the past and the new
    positions, kept as :attr:`keys`/:attr:`values` (the step's outputs); a static one
    (``static=True``) holds the encoder's projected keys and values, used as they are.

    Attributes:
        length: ``T``, the number of cached positions (a size: symbolic under ``torch.export``).
    """

    def __init__(self, keys: Tensor, values: Tensor, *, static: bool = False) -> None:
        if not isinstance(static, bool):
            raise TypeError(f"static: expected a bool, got {type(static).__name__}")
        for name, t in (("keys", keys), ("values", values)):
            if not isinstance(t, Tensor) or t.dim() != 4:
                got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"{name}: expected a 4-D tensor (B, H, T, d), got {got}")
        if keys.shape[:3] != values.shape[:3]:
            raise ValueError(
                f"values: expected (B, H, T) = {tuple(keys.shape[:3])} like keys, "
                f"got {tuple(values.shape)}"
            )
        self.static = static
        self._k, self._v = keys, values

    def __repr__(self) -> str:
        return f"TensorKVCache(static={self.static}, keys={tuple(self._k.shape)})"

    @property
    def length(self) -> int:
        return self._k.shape[2]

    @property
    def empty(self) -> bool:
        """False for a static cache (its keys are the encoder's, whatever their number)."""
        return False if self.static else self._k.shape[2] == 0

    @property
    def keys(self) -> Tensor:
        """All keys ``(B, H, T, d)`` (the new positions appended)."""
        return self._k

    @property
    def values(self) -> Tensor:
        """All values ``(B, H, T, dv)``."""
        return self._v

    def set(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Replace the whole cache by ``k (B, H, L, d)``, ``v (B, H, L, dv)``."""
        self._k, self._v = k, v
        return k, v

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k (B, H, n, d)``, ``v (B, H, n, dv)``; return all keys and values so far."""
        if self.static:
            raise RuntimeError("TensorKVCache: a static cache is not appended to")
        self._k = torch.cat([self._k, k], dim=2)
        self._v = torch.cat([self._v, v], dim=2)
        return self._k, self._v
