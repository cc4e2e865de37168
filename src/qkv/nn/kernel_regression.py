"""Nadaraya-Watson kernel regression: attention pooling before attention had a name.

Given pairs ``(x_i, y_i)`` and a query ``x``, the Gaussian-kernel estimator is

    f(x) = sum_i softmax_i(-((x - x_i) w)^2 / 2) y_i

a softmax over scores ``-((x - x_i) w)^2 / 2`` — queries ``x``, keys ``x_i``, values ``y_i``.
With ``w = 1`` it is the book's nonparametric estimator; :class:`NWKernelRegression` learns ``w``
(the book's parametric version).  The softmax and the masks go through :mod:`qkv.functional`, so a
bool ``attn_mask`` (True = not allowed) gives leave-one-out training without the book's gather.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from qkv.functional.masks import check_masks
from qkv.functional.softmax import apply_masks, safe_softmax

__all__ = ["NWKernelRegression", "average_pooling", "gaussian_scores", "nadaraya_watson"]


def _describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__


def _check(queries: Tensor, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor, str]:
    """Bring the three to ``(B, Lq, 1)``, ``(B, 1|Lq, Lk)``, ``(B, 1|Lq, Lk, dv)``; say which form."""
    for name, t in (("queries", queries), ("keys", keys), ("values", values)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got {_describe(t)}")
    if queries.dim() == 1 and keys.dim() == 1:
        form = "shared"  # every query sees the same keys: (Lq,), (Lk,), (Lk[, dv])
        if values.dim() not in (1, 2) or values.shape[0] != keys.shape[0]:
            raise ValueError(
                f"values: expected shape ({keys.shape[0]},) or ({keys.shape[0]}, dv) like keys, "
                f"got {tuple(values.shape)}"
            )
        q, k = queries.view(1, -1, 1), keys.view(1, 1, -1)
        v = values.view(1, 1, *values.shape)
    elif queries.dim() == 1 and keys.dim() == 2:
        form = "per-query"  # the book's layout: query i with its own key row i: (n,), (n, m)
        if keys.shape[0] != queries.shape[0]:
            raise ValueError(
                f"keys: expected ({queries.shape[0]}, m), one row of keys per query, "
                f"got {tuple(keys.shape)}"
            )
        if values.shape[:2] != keys.shape or values.dim() not in (2, 3):
            raise ValueError(
                f"values: expected shape {tuple(keys.shape)} (or with a trailing dv) like keys, "
                f"got {tuple(values.shape)}"
            )
        q, k = queries.view(1, -1, 1), keys.unsqueeze(0)
        v = values.unsqueeze(0)
    elif queries.dim() == 2 and keys.dim() == 2:
        form = "batched"  # (B, Lq), (B, Lk), (B, Lk[, dv])
        B = queries.shape[0]
        if keys.shape[0] != B:
            raise ValueError(f"keys: expected batch {B} like queries, got {tuple(keys.shape)}")
        if values.dim() not in (2, 3) or values.shape[:2] != keys.shape:
            raise ValueError(
                f"values: expected shape {tuple(keys.shape)} (or with a trailing dv) like keys, "
                f"got {tuple(values.shape)}"
            )
        q, k = queries.unsqueeze(-1), keys.unsqueeze(1)
        v = values.unsqueeze(1)
    else:
        raise ValueError(
            "queries/keys: expected (Lq,) with (Lk,) keys, (n,) with (n, m) keys (one row per "
            f"query, the book's layout) or (B, Lq) with (B, Lk); got queries "
            f"{tuple(queries.shape)} and keys {tuple(keys.shape)}"
        )
    return q, k, v, form


def gaussian_scores(queries: Tensor, keys: Tensor, w: Tensor | float = 1.0) -> Tensor:
    """Scores ``-((q - k) w)^2 / 2`` for broadcastable ``queries`` and ``keys`` (e.g. ``(B, Lq, 1)``
    and ``(B, 1, Lk)`` give ``(B, Lq, Lk)``)."""
    return -(((queries - keys) * w) ** 2) / 2


def nadaraya_watson(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    w: Tensor | float = 1.0,
    *,
    attn_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Gaussian-kernel (Nadaraya-Watson) regression: a softmax of ``-((x - x_i) w)^2 / 2`` over keys.

    Args:
        queries: ``(Lq,)``, or ``(B, Lq)`` batched.
        keys: ``(Lk,)`` shared by all queries; ``(Lq, Lk)`` with 1-D queries (the book's layout,
            row ``i`` the keys of query ``i``); ``(B, Lk)`` with batched queries.
        values: like ``keys``, optionally with a trailing feature axis ``dv``.
        w: the kernel's inverse width, a float or a scalar tensor (learned by
            :class:`NWKernelRegression`); larger ``w`` looks closer.
        attn_mask: bool ``(Lq, Lk)`` or ``(B, Lq, Lk)``, True where a query may NOT use a key
            (``torch.eye(n, dtype=torch.bool)`` for leave-one-out), or a float mask added to the
            scores.

    Returns:
        ``(prediction, weights)``: prediction ``(Lq[, dv])`` or ``(B, Lq[, dv])``; weights
        ``(Lq, Lk)`` or ``(B, Lq, Lk)``, each row summing to 1 (0 for a query masked from
        every key).
    """
    q, k, v, form = _check(queries, keys, values)
    scores = gaussian_scores(q, k, w)  # (B, Lq, Lk)
    B, Lq, Lk = scores.shape
    spec = check_masks(
        B=B, H=1, Lq=Lq, Lk=Lk, device=scores.device, batched_heads=False, attn_mask=attn_mask
    )
    weights = safe_softmax(apply_masks(scores.unsqueeze(1), spec)).squeeze(1)
    # values (B, 1|Lq, Lk) or (B, 1|Lq, Lk, dv)
    out = (weights * v).sum(-1) if v.dim() == 3 else (weights.unsqueeze(-1) * v).sum(-2)
    if form != "batched":
        out, weights = out.squeeze(0), weights.squeeze(0)
    return out, weights


def average_pooling(queries: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """The estimator without attention: every query gets the mean of the values.

    Args:
        queries: ``(Lq,)``; only their number matters.
        values: ``(Lk,)`` or ``(Lk, dv)``.

    Returns:
        ``(prediction (Lq[, dv]), weights (Lq, Lk))`` with every weight ``1 / Lk``.
    """
    for name, t in (("queries", queries), ("values", values)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got {_describe(t)}")
    if queries.dim() != 1 or values.dim() not in (1, 2) or values.shape[0] == 0:
        raise ValueError(
            f"queries/values: expected (Lq,) and non-empty (Lk,) or (Lk, dv), got "
            f"{tuple(queries.shape)} and {tuple(values.shape)}"
        )
    Lq, Lk = queries.shape[0], values.shape[0]
    weights = torch.full((Lq, Lk), 1.0 / Lk, dtype=values.dtype, device=values.device)
    out = weights @ values
    return out, weights


class NWKernelRegression(nn.Module):
    """The book's parametric Nadaraya-Watson regression with a learned inverse width ``w``.

    ``f(x) = sum_i softmax_i(-((x - x_i) w)^2 / 2) y_i``; see :func:`nadaraya_watson` for the
    shapes.  After a forward pass ``self.attention_weights`` holds the weights, as in the book.

    Args:
        w: the initial ``w``; None draws it from ``U(0, 1)`` as the book does.
    """

    def __init__(self, w: float | None = None) -> None:
        super().__init__()
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, float))):
            raise TypeError(f"w: expected a float or None, got {type(w).__name__}")
        init = torch.rand(1) if w is None else torch.tensor([float(w)])
        self.w = nn.Parameter(init)
        self.attention_weights: Tensor | None = None

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, *, attn_mask: Tensor | None = None
    ) -> Tensor:
        """Predictions ``(Lq[, dv])`` or ``(B, Lq[, dv])``; shapes as :func:`nadaraya_watson`."""
        out, self.attention_weights = nadaraya_watson(
            queries, keys, values, self.w, attn_mask=attn_mask
        )
        return out

    def extra_repr(self) -> str:
        return f"w={float(self.w.detach()):.4g}"
