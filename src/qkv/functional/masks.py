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
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

__all__ = ["MaskSpec", "check_masks"]

_CPU = torch.device("cpu")


def _describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"{type(x).__name__} {x!r}"[:120]


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

    # ------------------------------------------------------------------ queries
    @property
    def empty(self) -> bool:
        """True when nothing is masked at all."""
        return (
            self.valid_lens is None
            and self.key_padding_mask is None
            and self.attn_mask is None
            and not self.is_causal
            and self.window is None
        )

    @property
    def has_float(self) -> bool:
        """True when some mask is additive (float)."""
        return any(
            m is not None and m.is_floating_point() for m in (self.key_padding_mask, self.attn_mask)
        )

    @property
    def only_causal(self) -> bool:
        return self.is_causal and self.empty_except_causal

    @property
    def empty_except_causal(self) -> bool:
        return (
            self.valid_lens is None
            and self.key_padding_mask is None
            and self.attn_mask is None
            and self.window is None
        )

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
        ``index=False`` the masks computed from positions (``is_causal``, ``window``,
        ``valid_lens``) are left out: the chunked backend's plan already knows the block is
        entirely inside them.
        """
        q1 = self.Lq if q1 is None else q1
        k1 = self.Lk if k1 is None else k1
        dev = self._device()
        out: Tensor | None = None

        def merge(m: Tensor) -> None:
            nonlocal out
            out = m if out is None else out | m

        if index and (self.is_causal or self.window is not None or self.valid_lens is not None):
            qi = torch.arange(q0, q1, device=dev).view(-1, 1)  # (lq, 1)
            kj = torch.arange(k0, k1, device=dev).view(1, -1)  # (1, lk)
            if self.is_causal:
                merge(kj > qi)
            if self.window is not None:
                merge((kj <= qi - self.window) | (kj > qi))
            if self.valid_lens is not None:
                vl = self.valid_lens
                if vl.shape[2] != 1:
                    vl = vl[:, :, q0:q1]
                merge(kj >= vl)  # (B, 1, lq|1, lk)
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
            return torch.zeros(blocked.shape, dtype=dtype, device=blocked.device).masked_fill_(
                blocked, float("-inf")
            )
        return add.masked_fill(blocked, float("-inf"))

    def key_extent(self) -> int:
        """One past the last key that some query may see, from the key-level masks alone.

        Keys from there on are masked for every batch element and query (padding shared by the
        whole batch, e.g. inputs padded to a fixed length), so backends may drop them.
        Returns ``Lk`` when nothing can be dropped, 0 when every key is masked.
        """
        end = self.Lk
        if self.valid_lens is not None:
            end = min(end, int(self.valid_lens.max()))
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
        return replace(
            self,
            Lk=end,
            valid_lens=_drop_noop_lens(vl, end),
            key_padding_mask=_drop_noop(kpm),
            attn_mask=am,
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

    def _device(self) -> torch.device:
        return self.device


def _drop_noop(mask: Tensor | None) -> Tensor | None:
    """A bool mask that forbids nothing is no mask (the fast kernels run without one)."""
    if mask is not None and mask.dtype == torch.bool and not bool(mask.any()):
        return None
    return mask


def _drop_noop_lens(vl: Tensor | None, Lk: int) -> Tensor | None:
    if vl is not None and bool((vl >= Lk).all()):
        return None
    return vl


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

    Raises:
        TypeError / ValueError naming the argument, what was expected and what was received.
    """
    if type(is_causal).__name__ == "bool_":  # numpy.bool_
        is_causal = bool(is_causal)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal: expected a bool, got {_describe(is_causal)}")
    vl = None
    if valid_lens is not None:
        if not isinstance(valid_lens, Tensor):
            try:
                valid_lens = torch.as_tensor(valid_lens)
            except (TypeError, ValueError, RuntimeError) as e:
                raise TypeError(
                    f"valid_lens: expected an integer tensor of shape ({B},) or ({B}, {Lq}), "
                    f"got {_describe(valid_lens)}"
                ) from e
        if (
            valid_lens.is_floating_point()
            or valid_lens.is_complex()
            or valid_lens.dtype == torch.bool
        ):
            raise TypeError(
                f"valid_lens: expected an integer tensor (lengths), got {_describe(valid_lens)}"
            )
        if tuple(valid_lens.shape) not in ((B,), (B, Lq)):
            raise ValueError(
                f"valid_lens: expected shape ({B},) or ({B}, {Lq}) for batch {B} and "
                f"{Lq} queries, got shape {tuple(valid_lens.shape)}"
            )
        if valid_lens.numel():
            lo, hi = int(valid_lens.min()), int(valid_lens.max())
            if lo < 0 or hi > Lk:
                raise ValueError(
                    f"valid_lens: expected lengths in [0, {Lk}] (the number of keys), "
                    f"got values from {lo} to {hi}"
                )
        vl = valid_lens.to(device=device, dtype=torch.long)
        if vl.dim() == 2 and Lq > 0:
            # canonical forms: per-query lengths 1..Lq are the causal mask (the book's decoder
            # training mask); lengths equal across queries are a key-padding mask
            if torch.equal(vl, torch.arange(1, Lq + 1, device=device).clamp(max=Lk).expand(B, Lq)):
                vl, is_causal = None, True
            elif bool((vl == vl[:, :1]).all()):
                vl = vl[:, 0]
        if vl is not None:
            vl = vl.view(B, 1, 1, 1) if vl.dim() == 1 else vl.view(B, 1, Lq, 1)
        vl = _drop_noop_lens(vl, Lk)

    kpm = None
    if key_padding_mask is not None:
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
        kpm = _drop_noop(key_padding_mask.to(device).view(B, 1, 1, Lk))

    am = None
    if attn_mask is not None:
        if not isinstance(attn_mask, Tensor):
            raise TypeError(
                f"attn_mask: expected a bool or float tensor, got {_describe(attn_mask)}"
            )
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise TypeError(
                "attn_mask: expected dtype torch.bool (True = not allowed) or a float dtype "
                f"(added to the scores), got {attn_mask.dtype}"
            )
        shape = tuple(attn_mask.shape)
        ok = False
        if attn_mask.dim() == 2:
            ok = shape == (Lq, Lk)
            am = attn_mask.view(1, 1, Lq, Lk) if ok else None
        elif attn_mask.dim() == 3:
            ok = shape == (B, Lq, Lk)
            am = attn_mask.view(B, 1, Lq, Lk) if ok else None
        elif attn_mask.dim() == 4 and batched_heads:
            ok = shape[0] in (1, B) and shape[1] in (1, H) and shape[2:] == (Lq, Lk)
            am = attn_mask if ok else None
        if not ok:
            allowed = f"({Lq}, {Lk}) or ({B}, {Lq}, {Lk})"
            if batched_heads:
                allowed += f" or ({B}|1, {H}|1, {Lq}, {Lk})"
            raise ValueError(f"attn_mask: expected shape {allowed}, got {shape}")
        am = am.to(device)

    if window is not None:
        if isinstance(window, bool) or not isinstance(window, numbers.Integral):
            raise TypeError(f"window: expected a positive int, got {_describe(window)}")
        window = int(window)
        if window < 1:
            raise ValueError(f"window: expected a positive int, got {window}")
    return MaskSpec(B, H, Lq, Lk, vl, kpm, am, is_causal, window, torch.device(device))
