"""Every way a user says "don't look there", turned into one canonical form, checked once.

Conventions (those of ``torch.nn.MultiheadAttention``, as the seeds teach):

* a **bool** mask is ``True`` where attention is **not** allowed;
* a **float** mask is **added** to the scores (``-inf`` forbids a position);
* ``key_padding_mask`` is ``(B, Lk)``, ``True`` at padding;
* ``valid_lens`` is d2l's ``(B,)`` (keys ``>= valid_len`` are padding for every query) or
  ``(B, Lq)`` (one length per query);
* ``is_causal`` lets query ``i`` see keys ``j <= i`` (top-left aligned, as
  ``torch.nn.functional.scaled_dot_product_attention``);
* ``window=W`` lets query ``i`` see only the last ``W`` keys up to its own position,
  ``i - W < j <= i`` (a causal sliding window; ``is_causal`` may be given too and changes nothing).

``torch.nn.functional.scaled_dot_product_attention`` uses the opposite bool convention (``True`` =
may attend); :meth:`MaskSpec.sdpa_mask` is the single place where qkv converts.

A query that may attend to nothing (a "dead" row) gets zero weights and a zero output on every
backend; each backend reads such rows off the mask or the masked scores it already built.

The masks computed from positions (``is_causal``, ``window``, ``valid_lens``) are
:class:`IndexMask` objects: each says which keys a query may not see (:meth:`IndexMask.blocked`)
and which keys a block of queries can see at all (:meth:`IndexMask.key_bounds`), and every
backend, the chunked planner included, asks them through :class:`MaskSpec`.  A new position-based
kind is one more :class:`IndexMask` subclass here, built in :meth:`MaskSpec.__post_init__` and
listed in :data:`INDEX_MASKS`; without ``key_bounds`` it is applied everywhere and nothing is
skipped, so the chunked backend can never ignore it.

A module that appends keys of its own to a call (``torch.nn.MultiheadAttention``'s
``add_bias_kv``/``add_zero_attn``) rewrites the call's masks over them with
:func:`append_visible_keys`, not by hand.
"""

from __future__ import annotations

import html as _html
import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "INDEX_MASKS",
    "Causal",
    "IndexMask",
    "MaskSpec",
    "ValidLens",
    "Window",
    "append_visible_keys",
    "check_masks",
]

_CPU = torch.device("cpu")


def _describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"{type(x).__name__} {x!r}"[:120]


# ---------------------------------------------------------------------------- index masks
KeyBounds = tuple[int, int, int, int]  # (lo, hi, full_lo, full_hi), see IndexMask.key_bounds


class IndexMask(ABC):
    """A mask computed from query and key positions (and per-batch lengths) alone.

    Subclasses say which keys each query may not see (:meth:`blocked`, required) and, so that the
    chunked backend can skip work, which keys a block of queries may see (:meth:`key_bounds`;
    the default claims nothing: every key is computed, this mask applied to all of them).
    """

    __slots__ = ()

    #: the mask varies with the query position: built, it is an ``(Lq, Lk)`` mask
    per_query: bool = True

    @abstractmethod
    def blocked(self, qi: Tensor, kj: Tensor, q0: int, q1: int) -> Tensor:
        """True where query ``qi`` may NOT see key ``kj``, for queries ``q0:q1``.

        ``qi`` is ``(lq, 1)`` (positions ``q0..q1-1``), ``kj`` ``(1, lk)``; the result is
        broadcastable to ``(B, 1, lq, lk)``.
        """

    def lead(self) -> tuple[int, int]:
        """The batch and head axes of the built mask: ``(B|1, H|1)``."""
        return (1, 1)

    def key_bounds(self, q0: int, q1: int, Lk: int) -> KeyBounds:
        """Key ranges for queries ``q0:q1``: ``(lo, hi, full_lo, full_hi)``.

        Some query of the block may see keys in ``lo:hi`` only (keys outside are masked for
        every query of the block and every batch element: the chunked backend skips them); every
        query of the block sees every key in ``full_lo:full_hi`` as far as this mask goes (there
        the mask need not be applied).  Bounds may be loose, never wrong.  The default,
        ``(0, Lk, 0, 0)``, skips nothing and applies the mask everywhere.
        """
        return 0, Lk, 0, 0


class Causal(IndexMask):
    """``is_causal``: query ``i`` sees keys ``j <= i`` (top-left aligned)."""

    __slots__ = ()

    def blocked(self, qi: Tensor, kj: Tensor, q0: int, q1: int) -> Tensor:
        return kj > qi

    def key_bounds(self, q0: int, q1: int, Lk: int) -> KeyBounds:
        return 0, min(Lk, q1), 0, min(Lk, q0 + 1)


class Window(IndexMask):
    """``window=W``: query ``i`` sees keys ``i - W < j <= i``."""

    __slots__ = ("W",)

    def __init__(self, W: int) -> None:
        self.W = W

    def blocked(self, qi: Tensor, kj: Tensor, q0: int, q1: int) -> Tensor:
        return (kj <= qi - self.W) | (kj > qi)

    def key_bounds(self, q0: int, q1: int, Lk: int) -> KeyBounds:
        return max(0, q0 - self.W + 1), min(Lk, q1), max(0, q1 - self.W), min(Lk, q0 + 1)


class ValidLens(IndexMask):
    """``valid_lens`` ``(B, 1, Lq|1, 1)``: query ``i`` of batch element ``b`` sees keys
    ``j < valid_lens[b, i]``."""

    __slots__ = ("_lens_range", "lens")

    def __init__(self, lens: Tensor, known_range: tuple[int, int] | None = None) -> None:
        self.lens = lens
        self._lens_range: tuple[list[int], list[int]] | None = None
        if known_range is not None and lens.shape[2] == 1:  # (B,) lengths read when checked
            self._lens_range = ([known_range[0]], [known_range[1]])

    @property
    def per_query(self) -> bool:  # type: ignore[override]
        return self.lens.shape[2] > 1

    def lead(self) -> tuple[int, int]:
        return (self.lens.shape[0], 1)

    def blocked(self, qi: Tensor, kj: Tensor, q0: int, q1: int) -> Tensor:
        vl = self.lens if self.lens.shape[2] == 1 else self.lens[:, :, q0:q1]
        return kj >= vl  # (B, 1, lq|1, lk)

    def key_bounds(self, q0: int, q1: int, Lk: int) -> KeyBounds:
        if self._lens_range is None:  # over the batch, once per call (one device sync)
            self._lens_range = (
                self.lens.amin(dim=0).flatten().tolist(),
                self.lens.amax(dim=0).flatten().tolist(),
            )
        lo_q, hi_q = self._lens_range
        if len(hi_q) == 1:
            return 0, min(Lk, hi_q[0]), 0, min(Lk, lo_q[0])
        return 0, min(Lk, max(hi_q[q0:q1])), 0, min(Lk, min(lo_q[q0:q1]))


CAUSAL = Causal()
#: Every position-based mask kind, by the argument of :func:`~qkv.functional.attention` that
#: asks for it.
INDEX_MASKS: dict[str, type[IndexMask]] = {
    "is_causal": Causal,
    "window": Window,
    "valid_lens": ValidLens,
}


# ---------------------------------------------------------------------------- the spec
@dataclass(frozen=True)
class MaskSpec:
    """Validated masks of one attention call, in canonical shapes.

    Attributes:
        B, H, Lq, Lk: the problem's sizes (``H`` is 1 for 3-D inputs).
        valid_lens: ``(B, 1, Lq|1, 1)`` int64 or None.
        key_padding_mask: ``(B, 1, 1, Lk)``; bool (True = padding) or float (added), or None.
        attn_mask: ``(B|1, H|1, Lq, Lk)``; bool (True = not allowed) or float (added), or None.
        is_causal: top-left causal masking from indices.
        window: sliding-window width ``W`` (query ``i`` sees keys ``i-W < j <= i``), or None.
        index_masks: the position-based masks above as :class:`IndexMask` objects (derived).
    """

    B: int
    H: int
    Lq: int
    Lk: int
    valid_lens: Tensor | None = None
    key_padding_mask: Tensor | None = None
    attn_mask: Tensor | None = None
    is_causal: bool = False
    window: int | None = None
    device: torch.device = _CPU
    index_masks: tuple[IndexMask, ...] = field(init=False, repr=False, compare=False)
    #: ``(min, max)`` of ``(B,)`` lengths when they were read on the host while checked (None:
    #: not read); spares the backends a second device sync for the same numbers
    lens_range: tuple[int, int] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: tuple[IndexMask, ...] = ()
        if self.window is not None:
            index = (Window(self.window),)  # a window is causal too
        elif self.is_causal:
            index = (CAUSAL,)
        if self.valid_lens is not None:
            index += (ValidLens(self.valid_lens, self.lens_range),)
        object.__setattr__(self, "index_masks", index)

    # ------------------------------------------------------------------ queries
    @property
    def empty(self) -> bool:
        """True when nothing is masked at all."""
        # len(): torch.compile traces no `not` of a tuple
        return (
            len(self.index_masks) == 0 and self.key_padding_mask is None and self.attn_mask is None
        )

    @property
    def has_float(self) -> bool:
        """True when some mask is additive (float)."""
        return any(
            m is not None and m.is_floating_point() for m in (self.key_padding_mask, self.attn_mask)
        )

    @property
    def only_causal(self) -> bool:
        """True when the one mask is ``is_causal`` (SDPA's own flag)."""
        return (
            self.index_masks == (CAUSAL,)
            and self.key_padding_mask is None
            and self.attn_mask is None
        )

    @property
    def no_dead_rows(self) -> bool:
        """True when every query is known to see some key without reading a mask's values: no
        masks but ``is_causal`` (query ``i`` sees key 0) and ``(B,)`` lengths known to be >= 1.
        False means "maybe": backends then look for rows that see no key."""
        if self.key_padding_mask is not None or self.attn_mask is not None or self.Lk == 0:
            return False
        if self.window is not None:
            return False
        return self.valid_lens is None or (self.lens_range is not None and self.lens_range[0] > 0)

    def key_bounds(self, q0: int, q1: int) -> KeyBounds:
        """``(lo, hi, full_lo, full_hi)`` for queries ``q0:q1`` from every position-based mask
        (see :meth:`IndexMask.key_bounds`): the chunked planner skips keys outside ``lo:hi`` and
        applies no index mask inside ``full_lo:full_hi``."""
        lo, hi, flo, fhi = 0, self.Lk, 0, self.Lk
        for m in self.index_masks:
            a, b, c, d = m.key_bounds(q0, q1, self.Lk)
            lo, hi, flo, fhi = max(lo, a), min(hi, b), max(flo, c), min(fhi, d)
        return lo, hi, flo, fhi

    def built_mask_elements(self) -> int:
        """Elements of the mask the fused kernel would need built from positions (0: none).

        Counted on the mask's real broadcast shape: a causal or window mask is ``(Lq, Lk)``, a
        per-query ``valid_lens`` or padding combined with them adds the batch axis.  The user's
        own masks, and ``(B, 1, 1, Lk)`` lengths, are passed as they are: they count 0.
        """
        if self.only_causal or not any(m.per_query for m in self.index_masks):
            return 0
        shapes = [(1, 1, self.Lq, self.Lk), *((*m.lead(), 1, 1) for m in self.index_masks)]
        for t in (self.key_padding_mask, self.attn_mask):
            if t is not None:
                shapes.append((*t.shape[:2], 1, 1))
        # the shapes are 4-D and broadcast-compatible (checked): the largest size per axis
        # (torch.broadcast_shapes would import sympy, 0.4 s, on a process's first call)
        return math.prod(max(sizes) for sizes in zip(*shapes))

    # ------------------------------------------------------------------ builders
    def blocked(
        self,
        q0: int = 0,
        q1: int | None = None,
        k0: int = 0,
        k1: int | None = None,
        *,
        index: bool = True,
    ) -> Tensor | None:
        """Bool tensor, True where attention is NOT allowed, from every non-float mask.

        Covers queries ``q0:q1`` and keys ``k0:k1``; shape broadcastable to
        ``(B, H, q1-q0, k1-k0)``.  Returns None when no such mask is present.  With
        ``index=False`` the masks computed from positions (:attr:`index_masks`) are left out:
        the chunked backend's plan already knows the block is entirely inside them.
        """
        q1 = self.Lq if q1 is None else q1
        k1 = self.Lk if k1 is None else k1
        dev = self._device()
        out: Tensor | None = None

        def merge(m: Tensor) -> None:
            nonlocal out
            out = m if out is None else out | m

        if index and self.index_masks:
            qi = torch.arange(q0, q1, device=dev).view(-1, 1)  # (lq, 1)
            kj = torch.arange(k0, k1, device=dev).view(1, -1)  # (1, lk)
            for m in self.index_masks:
                merge(m.blocked(qi, kj, q0, q1))
        if self.key_padding_mask is not None and not self.key_padding_mask.is_floating_point():
            merge(self.key_padding_mask[..., k0:k1])
        if self.attn_mask is not None and not self.attn_mask.is_floating_point():
            merge(self.attn_mask[..., q0:q1, k0:k1])
        return out

    def additive(
        self,
        dtype: torch.dtype,
        q0: int = 0,
        q1: int | None = None,
        k0: int = 0,
        k1: int | None = None,
    ) -> Tensor | None:
        """Float tensor added to the scores from the float masks only (None if there are none)."""
        q1 = self.Lq if q1 is None else q1
        k1 = self.Lk if k1 is None else k1
        out: Tensor | None = None
        if self.key_padding_mask is not None and self.key_padding_mask.is_floating_point():
            out = self.key_padding_mask[..., k0:k1].to(dtype)
        if self.attn_mask is not None and self.attn_mask.is_floating_point():
            m = self.attn_mask[..., q0:q1, k0:k1].to(dtype)
            out = m if out is None else out + m
        return out

    def bias(
        self,
        dtype: torch.dtype,
        q0: int = 0,
        q1: int | None = None,
        k0: int = 0,
        k1: int | None = None,
        *,
        index: bool = True,
    ) -> Tensor | None:
        """Every mask of the block as one float tensor added to the scores (-inf = forbidden).

        Shape broadcastable to ``(B, H, q1-q0, k1-k0)``; None when nothing is masked there.
        """
        blocked = self.blocked(q0, q1, k0, k1, index=index)
        add = self.additive(dtype, q0, q1, k0, k1)
        if blocked is None:
            return add
        if add is None:
            return blocked_bias(blocked, dtype)
        return add.masked_fill(blocked, float("-inf"))

    def key_extent(self) -> int:
        """One past the last key that some query may see, from the key-level masks alone.

        Keys from there on are masked for every batch element and query (padding shared by the
        whole batch, e.g. inputs padded to a fixed length), so backends may drop them.
        Returns ``Lk`` when nothing can be dropped, 0 when every key is masked.  Under
        ``torch.compile``/``torch.export`` (:func:`torch.compiler.is_compiling`) it returns
        ``Lk`` without looking: the answer would be read from the masks' values.
        """
        end = self.Lk
        if torch.compiler.is_compiling():
            return end
        for m in self.index_masks:
            if isinstance(m, ValidLens):  # the longest length (read once per call)
                end = min(end, m.key_bounds(0, self.Lq, self.Lk)[1])
        kpm = self.key_padding_mask
        if kpm is not None and kpm.dtype == torch.bool and end > 0:
            open_cols = (~kpm[..., :end]).flatten(0, -2).any(dim=0)  # (end,)
            idx = torch.nonzero(open_cols)
            end = int(idx[-1]) + 1 if idx.numel() else 0
        return end

    def trim_keys(self, end: int) -> MaskSpec:
        """This spec restricted to keys ``0:end`` (see :meth:`key_extent`)."""
        if end == self.Lk:
            return self
        vl = self.valid_lens.clamp(max=end) if self.valid_lens is not None else None
        kpm = self.key_padding_mask[..., :end] if self.key_padding_mask is not None else None
        am = self.attn_mask[..., :end] if self.attn_mask is not None else None
        known = self.lens_range
        if known is not None:
            known = (min(known[0], end), min(known[1], end))
        return replace(
            self,
            Lk=end,
            valid_lens=_drop_noop_lens(vl, end, known),
            lens_range=known,
            key_padding_mask=_drop_noop(kpm),
            attn_mask=am,
        )

    def select(self, b0: int, b1: int, h0: int = 0, h1: int | None = None) -> MaskSpec:
        """This spec restricted to batch elements ``b0:b1`` and heads ``h0:h1`` (a backend that
        runs the problem in slices that stay in cache); masks broadcast over an axis stay so."""
        h1 = self.H if h1 is None else h1
        if (b0, b1, h0, h1) == (0, self.B, 0, self.H):
            return self

        def cut(m: Tensor | None) -> Tensor | None:
            if m is None:
                return None
            if m.shape[0] != 1:
                m = m[b0:b1]
            return m[:, h0:h1] if m.shape[1] != 1 else m

        return replace(
            self,
            B=b1 - b0,
            H=h1 - h0,
            valid_lens=cut(self.valid_lens),
            lens_range=None,  # the slice's lengths are read again if needed
            key_padding_mask=cut(self.key_padding_mask),
            attn_mask=cut(self.attn_mask),
        )

    def sdpa_mask(self, dtype: torch.dtype) -> tuple[Tensor | None, bool]:
        """The mask for ``scaled_dot_product_attention`` and its ``is_causal`` flag.

        SDPA's bool convention is the opposite of qkv's (True = may attend); this is the one place
        that converts.  Returns ``(attn_mask, is_causal)``.
        """
        if self.empty:
            return None, False
        if self.only_causal:
            return None, True
        if self.has_float:  # one additive mask with -inf where forbidden
            return self.bias(dtype), False
        return ~self.blocked(), False  # bool masks only: flip to SDPA's convention

    def sdpa_mask_and_dead(
        self, dtype: torch.dtype, sync_free: bool = False
    ) -> tuple[Tensor | None, bool, Tensor | None]:
        """:meth:`sdpa_mask` made safe for rows that may see no key: ``(attn_mask, is_causal,
        dead)``, where ``dead`` is the bool ``(..., Lq, 1)`` of such rows (None: none) and the
        mask lets them see every key, so the kernel gives finite values and gradients there;
        the caller zeroes them.  With ``sync_free`` whether some row is dead is never read back
        (``dead`` is returned whenever the mask could leave one)."""
        mask, causal = self.sdpa_mask(dtype)
        if mask is None or self.no_dead_rows:
            return mask, causal, None
        # rows with no key allowed, read off the mask just built (SDPA: True = may attend)
        no_key = (
            ~mask.any(dim=-1, keepdim=True)
            if mask.dtype == torch.bool
            else torch.isneginf(mask).all(dim=-1, keepdim=True)
        )
        if not sync_free and not bool(no_key.any()):
            return mask, causal, None
        mask = mask | no_key if mask.dtype == torch.bool else mask.masked_fill(no_key, 0.0)
        return mask, causal, no_key

    def _device(self) -> torch.device:
        return self.device

    # ------------------------------------------------------------------ display
    def _arguments(self) -> list[tuple[str, str]]:
        """One ``(argument, what it holds)`` row per mask given (the displays' rows)."""
        rows = []
        vl = self.valid_lens
        if vl is not None:
            per = "one length per query" if vl.shape[2] > 1 else "one length per sequence"
            shown = f": {vl[:, 0, :, 0].tolist()}" if vl.numel() <= 32 else ""
            rows.append(("valid_lens", f"{per}, keys from there on hidden{shown}"))
        for name, m, bool_means in (
            ("key_padding_mask", self.key_padding_mask, "True at padding keys"),
            ("attn_mask", self.attn_mask, "True where a query may not look"),
        ):
            if m is not None:
                how = "added to the scores" if m.is_floating_point() else bool_means
                rows.append((name, f"{m.dtype} {tuple(m.shape)}, {how}"))
        if self.window is not None:
            rows.append(("window", f"query i sees keys i-{self.window} < j <= i"))
        elif self.is_causal:
            rows.append(("is_causal", "query i sees keys j <= i"))
        return rows

    def __repr__(self) -> str:
        masks = "; ".join(f"{name}: {what}" for name, what in self._arguments()) or "no mask"
        return f"MaskSpec(B={self.B}, H={self.H}, Lq={self.Lq}, Lk={self.Lk}; {masks})"

    def _repr_html_(self) -> str:
        """A table of the masks given and, for small problems, the merged mask per sequence
        (and head, where it differs by head): ✕ where a query may not look, the added value
        where a float mask adds one."""
        esc = _html.escape
        cell = 'style="border:1px solid #ccc;padding:2px 6px;text-align:left"'
        rows = "".join(
            f"<tr><td {cell}><code>{esc(a)}</code></td><td {cell}>{esc(w)}</td></tr>"
            for a, w in self._arguments() or [("(none)", "every query sees every key")]
        )
        out = [
            f"<div><b>MaskSpec</b> B={self.B}, H={self.H}, Lq={self.Lq}, Lk={self.Lk}"
            f'<table style="border-collapse:collapse;margin:4px 0">{rows}</table>'
        ]
        bias = self.bias(torch.float64)
        if bias is None or self.Lq * self.Lk > 24 * 24:
            if bias is not None:
                out.append(f"<p>(the merged mask is {self.Lq} x {self.Lk}: too large to draw)</p>")
            return "".join(out) + "</div>"
        bias = bias.expand(self.B, -1, self.Lq, self.Lk).cpu()
        grids = [(b, h) for b in range(self.B) for h in range(bias.shape[1])][:8]
        out.append('<div style="display:flex;flex-wrap:wrap;gap:12px">')
        for b, h in grids:
            label = f"sequence {b}" + (f", head {h}" if bias.shape[1] > 1 else "")
            out.append(_grid_html(bias[b, h], label))
        more = self.B * bias.shape[1] - len(grids)
        if more > 0:
            out.append(f"<p>({more} more not drawn)</p>")
        return "".join(out) + "</div></div>"


def _grid_html(bias: Tensor, label: str) -> str:
    """One ``(Lq, Lk)`` float64 mask as an HTML table: ✕ on grey where it is -inf, the value
    where it adds one, blank where it adds 0 (queries down, keys across)."""
    td = "width:1.6em;height:1.4em;text-align:center;border:1px solid #ddd;font-size:11px"
    lines = []
    for row in bias.tolist():
        cells = []
        for v in row:
            if v == float("-inf"):
                cells.append(f'<td style="{td};background:#555;color:#fff">✕</td>')
            else:
                cells.append(f'<td style="{td}">{"" if v == 0 else f"{v:.3g}"}</td>')
        lines.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<table style="border-collapse:collapse"><caption style="font-size:12px">'
        f"{_html.escape(label)}: queries down, keys across</caption>{''.join(lines)}</table>"
    )


def blocked_bias(blocked: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool mask (True = forbidden) as the float tensor added to the scores: ``-inf`` where
    ``blocked``, 0 elsewhere; the same shape."""
    out = torch.zeros(blocked.shape, dtype=dtype, device=blocked.device)
    return out.masked_fill_(blocked, float("-inf"))


def _drop_noop(mask: Tensor | None) -> Tensor | None:
    """A bool mask that forbids nothing is no mask (the fast kernels run without one)."""
    if mask is not None and mask.dtype == torch.bool and not bool(mask.any()):
        return None
    return mask


def _drop_noop_lens(
    vl: Tensor | None, Lk: int, known: tuple[int, int] | None = None
) -> Tensor | None:
    """Lengths that hide no key (all ``>= Lk``) are no mask; ``known`` is their ``(min, max)``
    when already read (no second device sync)."""
    if vl is None:
        return None
    if known is not None and vl.shape[2] == 1:
        return None if known[0] >= Lk else vl
    return None if bool((vl >= Lk).all()) else vl


def check_masks(
    *,
    B: int,
    H: int,
    Lq: int,
    Lk: int,
    device: torch.device,
    batched_heads: bool,
    valid_lens: Tensor | Sequence[int] | None = None,
    key_padding_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    window: int | None = None,
    sync_free: bool | None = None,
) -> MaskSpec:
    """Validate every mask argument and return them in canonical shapes.

    Args:
        B, H, Lq, Lk: sizes of the problem.
        batched_heads: whether the inputs carry a head axis (4-D); decides how a 3-D
            ``attn_mask`` is read (``(B, Lq, Lk)`` in both cases, broadcast over heads).
        valid_lens: ``(B,)`` or ``(B, Lq)`` integer lengths in ``[0, Lk]``.
        key_padding_mask: ``(B, Lk)``, bool (True = padding) or float (added to the scores).
        attn_mask: ``(Lq, Lk)``, ``(B, Lq, Lk)`` or (4-D inputs) ``(B|1, H|1, Lq, Lk)``;
            bool (True = not allowed) or float (added to the scores).
        is_causal: forbid keys after the query's position.
        window: sliding window, a positive int.
        sync_free: never read a mask's values back to the host (no ``.item()``, ``bool()``,
            ``torch.equal``): the types and shapes are checked, the ranges of ``valid_lens``
            are not (a length above ``Lk`` then sees every key, a negative one none), and the
            masks are kept as given (per-query lengths are not turned into ``is_causal``, masks
            that forbid nothing are not dropped).  None (the default): when
            :func:`torch.compiler.is_compiling` (``torch.export``, ``torch.compile``, the ONNX
            exporter).

    Raises:
        TypeError / ValueError naming the argument, what was expected and what was received.
    """
    if sync_free is None:
        sync_free = torch.compiler.is_compiling()
    is_causal = _check_is_causal(is_causal)
    vl, lens_range = None, None
    if valid_lens is not None:
        vl, lens_causal, lens_range = _check_valid_lens(valid_lens, B, Lq, Lk, device, sync_free)
        is_causal = is_causal or lens_causal
    kpm = None
    if key_padding_mask is not None:
        kpm = _check_key_padding_mask(key_padding_mask, B, Lk, device, sync_free)
    am = None
    if attn_mask is not None:
        am = _check_attn_mask(attn_mask, B, H, Lq, Lk, device, batched_heads)
    if window is not None:
        window = _check_window(window)
    return MaskSpec(
        B, H, Lq, Lk, vl, kpm, am, is_causal, window, torch.device(device), lens_range=lens_range
    )


def _check_is_causal(is_causal: object) -> bool:
    if type(is_causal).__name__ == "bool_":  # numpy.bool_
        is_causal = bool(is_causal)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal: expected a bool, got {_describe(is_causal)}")
    return is_causal


def _lens_tensor(valid_lens: Tensor | Sequence[int], B: int, Lq: int) -> Tensor:
    """``valid_lens`` as an integer tensor of shape ``(B,)`` or ``(B, Lq)``, else an error."""
    if not isinstance(valid_lens, Tensor):
        try:
            valid_lens = torch.as_tensor(valid_lens)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(
                f"valid_lens: expected an integer tensor of shape ({B},) or ({B}, {Lq}), "
                f"got {_describe(valid_lens)}"
            ) from e
    if valid_lens.is_floating_point() or valid_lens.is_complex() or valid_lens.dtype == torch.bool:
        raise TypeError(
            f"valid_lens: expected an integer tensor (lengths), got {_describe(valid_lens)}"
        )
    if tuple(valid_lens.shape) not in ((B,), (B, Lq)):
        raise ValueError(
            f"valid_lens: expected shape ({B},) or ({B}, {Lq}) for batch {B} and "
            f"{Lq} queries, got shape {tuple(valid_lens.shape)}"
        )
    return valid_lens


def _check_valid_lens(
    valid_lens: Tensor | Sequence[int],
    B: int,
    Lq: int,
    Lk: int,
    device: torch.device,
    sync_free: bool,
) -> tuple[Tensor | None, bool, tuple[int, int] | None]:
    """``valid_lens`` checked and canonical: ``(lens, causal, lens_range)``.

    ``lens`` is ``(B, 1, Lq|1, 1)`` int64, or None where the lengths hide no key or are the
    causal mask (``causal`` True: per-query lengths ``1..Lq``, the book's decoder training
    mask); ``lens_range`` is the ``(min, max)`` of ``(B, 1, 1, 1)`` lengths read on the host
    (None: not read, per query, or no lengths left).  With ``sync_free`` nothing is read back:
    the lengths are kept as given.
    """
    valid_lens = _lens_tensor(valid_lens, B, Lq)
    lens_range = None
    if valid_lens.numel() and not sync_free:
        lo, hi = (int(x) for x in torch.stack(torch.aminmax(valid_lens)).tolist())  # 1 sync
        lens_range = (lo, hi)
        if lo < 0 or hi > Lk:
            raise ValueError(
                f"valid_lens: expected lengths in [0, {Lk}] (the number of keys), "
                f"got values from {lo} to {hi}"
            )
    vl = valid_lens.to(device=device, dtype=torch.long)
    causal = False
    if vl.dim() == 2 and Lq > 0 and not sync_free:
        # canonical forms: per-query lengths 1..Lq are the causal mask (the book's decoder
        # training mask); lengths equal across queries are a key-padding mask
        if torch.equal(vl, torch.arange(1, Lq + 1, device=device).clamp(max=Lk).expand(B, Lq)):
            vl, causal = None, True
        elif bool((vl == vl[:, :1]).all()):
            vl = vl[:, 0]
    if vl is not None:
        vl = vl.view(B, 1, 1, 1) if vl.dim() == 1 else vl.view(B, 1, Lq, 1)
    if vl is None or vl.shape[2] != 1:
        lens_range = None  # the range read was of per-query lengths, or they are gone
    if not sync_free:
        vl = _drop_noop_lens(vl, Lk, lens_range)
    if vl is None:
        lens_range = None
    return vl, causal, lens_range


def _check_key_padding_mask(
    key_padding_mask: object, B: int, Lk: int, device: torch.device, sync_free: bool
) -> Tensor | None:
    """``key_padding_mask`` ``(B, Lk)`` checked, as ``(B, 1, 1, Lk)`` on ``device`` (None: a
    bool mask that hides nothing, unless ``sync_free``)."""
    if not isinstance(key_padding_mask, Tensor):
        raise TypeError(
            f"key_padding_mask: expected a bool or float tensor of shape ({B}, {Lk}), "
            f"got {_describe(key_padding_mask)}"
        )
    if key_padding_mask.dtype != torch.bool and not key_padding_mask.is_floating_point():
        raise TypeError(
            "key_padding_mask: expected dtype torch.bool (True = padding) or a float dtype "
            f"(added to the scores), got {key_padding_mask.dtype}"
        )
    if tuple(key_padding_mask.shape) != (B, Lk):
        raise ValueError(
            f"key_padding_mask: expected shape ({B}, {Lk}) (batch, keys), "
            f"got {tuple(key_padding_mask.shape)}"
        )
    kpm = key_padding_mask.to(device).view(B, 1, 1, Lk)
    return kpm if sync_free else _drop_noop(kpm)


def _check_attn_mask(
    attn_mask: object,
    B: int,
    H: int,
    Lq: int,
    Lk: int,
    device: torch.device,
    batched_heads: bool,
) -> Tensor:
    """``attn_mask`` checked, as ``(B|1, H|1, Lq, Lk)`` on ``device``: ``(Lq, Lk)``,
    ``(B, Lq, Lk)`` or, with ``batched_heads``, 4-D."""
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"attn_mask: expected a bool or float tensor, got {_describe(attn_mask)}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(
            "attn_mask: expected dtype torch.bool (True = not allowed) or a float dtype "
            f"(added to the scores), got {attn_mask.dtype}"
        )
    shape = tuple(attn_mask.shape)
    am = None
    if attn_mask.dim() == 2 and shape == (Lq, Lk):
        am = attn_mask.view(1, 1, Lq, Lk)
    elif attn_mask.dim() == 3 and shape == (B, Lq, Lk):
        am = attn_mask.view(B, 1, Lq, Lk)
    elif (
        attn_mask.dim() == 4
        and batched_heads
        and shape[0] in (1, B)
        and shape[1] in (1, H)
        and shape[2:] == (Lq, Lk)
    ):
        am = attn_mask
    if am is None:
        allowed = f"({Lq}, {Lk}) or ({B}, {Lq}, {Lk})"
        if batched_heads:
            allowed += f" or ({B}|1, {H}|1, {Lq}, {Lk})"
        raise ValueError(f"attn_mask: expected shape {allowed}, got {shape}")
    return am.to(device)


def _check_window(window: object) -> int:
    if isinstance(window, bool) or not isinstance(window, numbers.Integral):
        raise TypeError(f"window: expected a positive int, got {_describe(window)}")
    window = int(window)
    if window < 1:
        raise ValueError(f"window: expected a positive int, got {window}")
    return window


def append_visible_keys(
    extra: int,
    *,
    B: int,
    H: int,
    Lq: int,
    Lk: int,
    device: torch.device,
    valid_lens: Tensor | Sequence[int] | None = None,
    key_padding_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
) -> tuple[Tensor | None, Tensor | None]:
    """The masks of a call over ``Lk`` keys, rewritten for ``extra`` more keys appended after
    them that every query sees (``torch.nn.MultiheadAttention``'s ``add_bias_kv`` and
    ``add_zero_attn``).

    ``valid_lens`` count the ``Lk`` given keys, so they cannot stay lengths: ``(B,)`` lengths
    become a bool padding mask merged into ``key_padding_mask``, per-query ones a bool
    ``(B, H, Lq, Lk)`` mask merged into ``attn_mask`` (True or ``-inf`` where hidden, as the mask
    merged into is bool or float).  Both masks then get ``extra`` columns that hide nothing.

    Args:
        key_padding_mask: ``(B, Lk)``, bool or float, or None.
        attn_mask: ``(Lq, Lk)`` or ``(B|1, H|1, Lq, Lk)``, bool or float, or None.

    Returns:
        ``(key_padding_mask (B, Lk + extra) | None, attn_mask (..., Lq, Lk + extra) | None)``.
    """
    if valid_lens is not None:
        key_padding_mask, attn_mask = _lens_into_masks(
            valid_lens, key_padding_mask, attn_mask, B, H, Lq, Lk, device
        )
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, Tensor) or key_padding_mask.shape != (B, Lk):
            got = (
                tuple(key_padding_mask.shape)
                if isinstance(key_padding_mask, Tensor)
                else type(key_padding_mask).__name__
            )
            raise ValueError(f"key_padding_mask: expected shape ({B}, {Lk}), got {got}")
        key_padding_mask = F.pad(key_padding_mask, (0, extra))
    if attn_mask is not None:
        attn_mask = F.pad(attn_mask, (0, extra))
    return key_padding_mask, attn_mask


def _lens_into_masks(
    valid_lens: Tensor | Sequence[int],
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    B: int,
    H: int,
    Lq: int,
    Lk: int,
    device: torch.device,
) -> tuple[Tensor | None, Tensor | None]:
    """``valid_lens`` (checked by :func:`check_masks`) merged into ``key_padding_mask``
    ``(B, Lk)`` or, per query, ``attn_mask`` (see :func:`append_visible_keys`)."""
    spec = check_masks(
        B=B, H=1, Lq=Lq, Lk=Lk, device=device, batched_heads=True, valid_lens=valid_lens
    )
    blocked = spec.blocked()  # (B, 1, 1|Lq, Lk) or None (lengths that mask nothing)
    if blocked is None:
        return key_padding_mask, attn_mask
    if blocked.shape[2] == 1:
        pad = blocked.view(B, Lk)
        if key_padding_mask is None:
            return pad, attn_mask
        if key_padding_mask.dtype == torch.bool:
            return key_padding_mask | pad, attn_mask
        return key_padding_mask.masked_fill(pad, float("-inf")), attn_mask
    per_query = blocked.expand(B, H, Lq, Lk)
    if attn_mask is None:
        return key_padding_mask, per_query
    am = attn_mask if attn_mask.dim() == 4 else attn_mask.view(1, 1, Lq, Lk)
    if am.dtype == torch.bool:
        return key_padding_mask, am | per_query
    return key_padding_mask, am.masked_fill(per_query, float("-inf"))
