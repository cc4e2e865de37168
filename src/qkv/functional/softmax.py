"""Softmax over masked scores: the book's ``masked_softmax`` and the safe softmax behind it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .masks import MaskSpec, check_masks

__all__ = ["apply_masks", "masked_softmax", "safe_softmax", "softmax_and_dead"]

_HALF = (torch.float16, torch.bfloat16)


def apply_masks(
    scores: Tensor, spec: MaskSpec, *, inplace: bool = False, strict: bool = False
) -> Tensor:
    """Add the float masks to ``scores`` ``(B, H, Lq, Lk)`` and set forbidden positions to -inf.

    With ``inplace=True`` the caller's own temporary is modified (never a user's tensor).  With
    ``strict=True`` a float mask's ``-inf`` forbids its position whatever the score there (a
    NaN score plus ``-inf`` is ``-inf``, not NaN), as a bool mask does: only scores that are
    not all finite need it.
    """
    add = spec.additive(scores.dtype)
    if add is not None:
        scores = scores.add_(add) if inplace else scores + add
        if strict:
            scores.masked_fill_(torch.isneginf(add), float("-inf"))
        inplace = True
    blocked = spec.blocked()
    if blocked is not None:
        scores = (
            scores.masked_fill_(blocked, float("-inf"))
            if inplace
            else scores.masked_fill(blocked, float("-inf"))
        )
    return scores


def safe_softmax(scores: Tensor, dead: Tensor | None = None) -> Tensor:
    """Softmax over the last axis where a row of only ``-inf`` gives zeros, not NaN.

    Args:
        scores: ``(..., Lq, Lk)`` scores with forbidden positions at ``-inf``.
        dead: optional bool ``(..., Lq, 1)``, rows known to be dead; rows that are all ``-inf``
            in ``scores`` (whatever made them so: a mask, a ``score_mod``, a float mask that
            overflowed in half precision) are found from the scores in any case.

    Returns:
        Weights of the shape and dtype of ``scores``; half-precision inputs are normalised in
        float32.  Gradients are finite everywhere, zero through dead rows.  A row holding a NaN
        (or ``+inf``) score comes out NaN, as in ``torch.softmax``.
    """
    return softmax_and_dead(scores, dead)[0]


def softmax_and_dead(
    scores: Tensor, dead: Tensor | None = None, *, sync_free: bool = False
) -> tuple[Tensor, Tensor | None]:
    """:func:`safe_softmax`, and the dead rows it found: bool ``(..., Lq, 1)`` or None (none).

    With ``sync_free=True`` (the export backend) whether some row is dead is never read back:
    the bool tensor is returned (all False when none is) and applied anyway.
    """
    if scores.shape[-1]:
        found = torch.isneginf(scores.amax(dim=-1, keepdim=True))
        dead = found if dead is None else (dead | found)
    if dead is not None and not sync_free and not bool(dead.any()):
        dead = None
    if dead is not None:
        scores = scores.masked_fill(dead, 0.0)
    if scores.dtype in _HALF:
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
    else:
        weights = torch.softmax(scores, dim=-1)
    if dead is not None:
        weights = weights.masked_fill(dead, 0.0)
    return weights, dead


def masked_softmax(X: Tensor, valid_lens: Tensor | Sequence[int] | None = None) -> Tensor:
    """Softmax over the last axis of ``X`` keeping only the first ``valid_lens`` keys.

    The book's semantics (d2l ``masked_softmax``), except that a row whose valid length is 0
    gets all-zero weights (the book returns uniform weights there), and ``X`` is never modified.

    Args:
        X: scores ``(B, Lq, Lk)`` or ``(B, H, Lq, Lk)``.
        valid_lens: None, ``(B,)`` (one length per batch element) or ``(B, Lq)`` (one per query).

    Returns:
        Weights, same shape as ``X``; each row sums to 1, or to 0 when its valid length is 0.
    """
    if not isinstance(X, Tensor) or not X.is_floating_point():
        got = f"dtype {X.dtype}" if isinstance(X, Tensor) else type(X).__name__
        raise TypeError(f"X: expected a floating-point tensor, got {got}")
    if X.dim() not in (3, 4):
        raise ValueError(
            f"X: expected scores of shape (B, Lq, Lk) or (B, H, Lq, Lk), got {tuple(X.shape)}"
        )
    if valid_lens is None:
        return safe_softmax(X)
    X4 = X.unsqueeze(1) if X.dim() == 3 else X
    B, H, Lq, Lk = X4.shape
    spec = check_masks(
        B=B, H=H, Lq=Lq, Lk=Lk, device=X.device, batched_heads=True, valid_lens=valid_lens
    )
    weights = safe_softmax(apply_masks(X4, spec))
    return weights.squeeze(1) if X.dim() == 3 else weights
