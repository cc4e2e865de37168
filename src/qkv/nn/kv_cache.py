"""A key/value cache for one attention layer, for incremental decoding.

:class:`KVCache` holds the projected keys and values ``(B, H, L, d)`` of one
:class:`qkv.nn.MultiHeadAttention`.  Two kinds:

* growing (``static=False``, decoder self-attention): each call appends the keys/values of the new
  positions; storage is preallocated and doubled when full, so appending one position costs
  ``O(1)`` amortised copies instead of concatenating the whole prefix;
* static (``static=True``, cross-attention over the encoder): filled by the first call, then
  reused as is; the encoder's keys and values are projected once per sentence.

Beam search reorders the rows (``B``) with :meth:`KVCache.reorder`, or, in the Transformer's
fast decoding step, keeps a sentence's beams side by side in a :class:`BeamKVCache` that is
never reordered: a :class:`BeamRows` table says which beam wrote each position of each beam's
history.

:class:`TensorKVCache` is the same cache as plain tensors, for a graph of one decoder step
(``torch.export``, ONNX): the past keys and values come in as inputs, the step returns them with
the new positions appended (``torch.cat``, no preallocation, no Python-side length).  Ordinary
decoding keeps the preallocated :class:`KVCache`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..functional.masks import blocked_bias
from ..functional.scores import all_finite, mark_finite

__all__ = ["BeamKVCache", "BeamRows", "KVCache", "TensorKVCache"]


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


class BeamRows:
    """Which stored position each beam's history reads, for :class:`BeamKVCache`.

    Beam search keeps ``K`` hypotheses per sentence in consecutive rows (``b * K + r``); at
    every step each hypothesis continues one of its sentence's hypotheses of the step before.
    Instead of gathering every layer's cached keys and values into the new order at every step
    (the whole cache read and written), the keys stay where they were written and ``origin``
    ``(G, K, capacity)`` records, for beam ``r`` of sentence ``g`` and position ``p``, the slot
    (the beam of that step) that wrote its key.  One table serves every layer.

    Attributes:
        beams: ``K``, the rows per sentence.
        groups: ``G``, the sentences.
        length: the positions recorded.
    """

    def __init__(
        self, groups: int, beams: int, length: int, capacity: int, device: torch.device
    ) -> None:
        """``length`` positions so far, one history shared by every beam (each slot a copy:
        :meth:`BeamKVCache.from_cache`); room for ``capacity`` (it grows)."""
        self.groups, self.beams, self.length = groups, beams, length
        self._slots = torch.arange(beams, device=device)
        self.origin = torch.empty(
            groups, beams, max(capacity, length, 1), dtype=torch.long, device=device
        )
        self.origin[:, :, :length] = self._slots.view(1, beams, 1)  # beam r reads its own slot
        self._bias: Tensor | None = None  # this step's (G, 1, K, (t+1) K) mask, made once

    def advance(self, dtype: torch.dtype) -> Tensor:
        """Record a new position written by every beam in its own slot and return the mask
        its queries add to their scores: ``(G, 1, K, (t+1) * K)``, 0 where beam ``r``'s
        history reads slot ``j`` at position ``p`` (column ``p * K + j``), ``-inf``
        elsewhere."""
        t = self.length
        if t == self.origin.shape[2]:
            grown = self.origin.new_zeros(self.groups, self.beams, max(1, 2 * t))
            grown[:, :, :t] = self.origin
            self.origin = grown
        self.origin[:, :, t] = self._slots
        self.length = t + 1
        hidden = self.origin[:, :, : t + 1].unsqueeze(-1) != self._slots  # (G, K, t+1, K)
        bias = blocked_bias(hidden, dtype)
        self._bias = bias.view(self.groups, 1, self.beams, (t + 1) * self.beams)
        return self._bias

    @property
    def bias(self) -> Tensor:
        """The mask of the current step (:meth:`advance`)."""
        if self._bias is None:
            raise RuntimeError("BeamRows: no step recorded")
        return self._bias

    def within_groups(self, index: Tensor) -> bool:
        """Whether ``index`` ``(G * K,)`` keeps every row in its own sentence."""
        rows = torch.arange(index.numel(), device=index.device)
        return index.numel() == self.groups * self.beams and torch.equal(
            torch.div(index, self.beams, rounding_mode="floor"),
            torch.div(rows, self.beams, rounding_mode="floor"),
        )

    def whole_groups(self, index: Tensor) -> Tensor | None:
        """The sentences ``(G',)`` that ``index`` keeps whole and in order of beams (early
        exit), or None when it does something else."""
        K = self.beams
        if index.numel() == 0 or index.numel() % K:
            return None
        rows = index.view(-1, K)
        first = rows[:, 0]
        if bool((first % K != 0).any()) or not torch.equal(rows, first.unsqueeze(1) + self._slots):
            return None
        return torch.div(first, K, rounding_mode="floor")

    def reorder(self, index: Tensor) -> None:
        """Beam ``r`` now continues the history of row ``index[r]`` (within its sentence)."""
        flat = self.origin.view(self.groups * self.beams, -1)
        self.origin = flat.index_select(0, index).view_as(self.origin)

    def keep_groups(self, groups: Tensor) -> None:
        self.origin = self.origin.index_select(0, groups)
        self.groups = groups.numel()


class BeamKVCache:
    """A decoder layer's self-attention keys and values for beam search, never reordered.

    Storage ``(G, H, capacity, K, d)``: position ``p`` of a sentence's ``K`` beams side by side,
    so the keys of a sentence up to position ``t`` are one ``((t+1) K, d)`` matrix per head; the
    beams' own histories are picked by the mask of the shared :class:`BeamRows`.  Made from a
    :class:`KVCache` of one row per sentence by :meth:`from_cache`.

    Attributes:
        length: the cached positions ``L``.
        finite: every key and value stored is finite (checked as stored).
    """

    def __init__(self, keys: Tensor, values: Tensor, length: int, finite: bool) -> None:
        self._k, self._v, self.length, self.finite = keys, values, length, finite

    @classmethod
    def from_cache(cls, cache: KVCache, beams: int) -> BeamKVCache:
        """Every row of ``cache`` repeated for ``beams`` beams (each slot holds the same
        history), with room for the cache's ``capacity``."""
        k, v = cache.keys, cache.values  # (G, H, L, d)
        G, H, L, d = k.shape
        cap = max(L, cache.capacity or 0)
        nk = k.new_empty(G, H, cap, beams, d)
        nv = v.new_empty(G, H, cap, beams, v.shape[3])
        nk[:, :, :L] = k.unsqueeze(3)
        nv[:, :, :L] = v.unsqueeze(3)
        return cls(nk, nv, L, cache._finite)

    def __repr__(self) -> str:
        return f"BeamKVCache(length={self.length}, storage={tuple(self._k.shape)})"

    @property
    def empty(self) -> bool:
        return self.length == 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store one new position of every beam: ``k`` ``(G * K, H, 1, d)``, ``v`` likewise
        (row ``g * K + r`` in slot ``r``); return the stored keys and values of every position
        so far, ``(G, H, L * K, d)`` (column ``p * K + j``: position ``p``, slot ``j``)."""
        G, H, cap, K, d = self._k.shape
        t = self.length
        if t == cap:
            self._k, self._v = self._grow(self._k), self._grow(self._v)
        self._k[:, :, t] = k.view(G, K, H, d).transpose(1, 2)
        self._v[:, :, t] = v.view(G, K, H, v.shape[-1]).transpose(1, 2)
        self.finite = self.finite and _checked_finite(k, v)
        self.length = t + 1
        return self.stored()

    def stored(self) -> tuple[Tensor, Tensor]:
        G, H, _, K, d = self._k.shape
        L = self.length
        keys = self._k[:, :, :L].reshape(G, H, L * K, d)
        values = self._v[:, :, :L].reshape(G, H, L * K, self._v.shape[-1])
        if self.finite:
            mark_finite(keys, values)
        return keys, values

    def _grow(self, t: Tensor) -> Tensor:
        out = t.new_empty(t.shape[0], t.shape[1], 2 * t.shape[2], *t.shape[3:])
        out[:, :, : t.shape[2]] = t
        return out

    def rows(self, beams: BeamRows) -> tuple[Tensor, Tensor]:
        """Every beam's own keys and values, ``(G * K, H, L, d)`` each (gathered)."""
        G, H, _, K, _ = self._k.shape
        L = self.length
        origin = beams.origin[:, :, :L]  # (G, K, L)

        def gather(t: Tensor) -> Tensor:
            src = t[:, :, :L].unsqueeze(1).expand(G, K, H, L, K, t.shape[-1])
            idx = origin.view(G, K, 1, L, 1, 1).expand(G, K, H, L, 1, t.shape[-1])
            return src.gather(4, idx).view(G * K, H, L, t.shape[-1])

        return gather(self._k), gather(self._v)

    def to_cache(self, beams: BeamRows) -> KVCache:
        """A :class:`KVCache` of every beam's own keys and values (the beams' rows)."""
        cache = KVCache(capacity=self._k.shape[2])
        k, v = self.rows(beams)
        cache.append(k, v)
        return cache

    def keep_groups(self, groups: Tensor) -> None:
        self._k = self._k.index_select(0, groups)
        self._v = self._v.index_select(0, groups)
