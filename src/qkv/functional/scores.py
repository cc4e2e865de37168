"""Score functions: how a query and a key become one number before the softmax.

Every scaling seed 001 lists, plus FlexAttention-style user modifications:

===================  =========================================================  ================
``score``            score ``s_ij``                                             default ``scale``
===================  =========================================================  ================
``"scaled_dot"``     ``scale * q_i . k_j``                                      ``1/sqrt(d)``
``"dot"``            ``scale * q_i . k_j`` (a temperature is ``scale=1/T``)     ``1``
``"cosine"``         ``scale * (q_i/|q_i|) . (k_j/|k_j|)`` (pre-normalisation)  ``1``
``"normalized"``     ``scale * (q_i . k_j) / |q_i . K|`` (L2 norm of the row    ``1``
                     over the keys the query may see)
``"length_scaled"``  ``scale * q_i . k_j / sqrt(Lk)``                           ``1/sqrt(d)``
callable             ``score_mod(scale * q_i . k_j, b, h, i, j)``               ``1/sqrt(d)``
===================  =========================================================  ================

A ``score_mod`` is called once on a whole block of scores ``(B, H, lq, lk)`` with broadcastable
integer index tensors ``b (B,1,1,1)``, ``h (1,H,1,1)``, ``q_idx (1,1,lq,1)``, ``k_idx (1,1,1,lk)``
(absolute positions), and must return a tensor of the same shape, for example
``lambda s, b, h, q, k: s - 0.1 * (q - k).abs()`` (an ALiBi-like bias).  It may return ``-inf``
to forbid a position.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, Union

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "SCORES",
    "Score",
    "ScoreMod",
    "check_score",
    "grouped_qk",
    "grouped_wv",
    "normalize_rows",
    "prepare_qk",
    "qk_multiplier",
    "run_score_mod",
]

ScoreName = Literal["scaled_dot", "dot", "cosine", "normalized", "length_scaled"]
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
Score = Union[ScoreName, ScoreMod]  # noqa: UP007 - a runtime alias, kept py3.10-friendly
SCORES: tuple[str, ...] = ("scaled_dot", "dot", "cosine", "normalized", "length_scaled")


def check_score(score: object) -> None:
    """Raise a clear error unless ``score`` is a known name or a callable."""
    if callable(score):
        return
    if not isinstance(score, str) or score not in SCORES:
        raise ValueError(
            f"score: expected one of {', '.join(repr(s) for s in SCORES)} or a callable "
            f"score_mod(scores, b, h, q_idx, k_idx), got {score!r}"
        )


def qk_multiplier(score: Score, scale: float | Tensor | None, d: int, Lk: int) -> float | Tensor:
    """The factor applied to ``q . k`` (for ``"normalized"``: applied after normalising)."""
    if score in ("dot", "cosine", "normalized"):
        return 1.0 if scale is None else scale
    base = 1.0 / math.sqrt(d) if scale is None else scale
    if score == "length_scaled":
        return base / math.sqrt(max(Lk, 1))
    return base  # "scaled_dot" and callables


def prepare_qk(q: Tensor, k: Tensor, score: Score) -> tuple[Tensor, Tensor]:
    """L2-normalise q and k per row for ``"cosine"``; pass them through otherwise."""
    if score == "cosine":  # in float32 for half precision: eps=1e-12 underflows in float16
        return _unit(q), _unit(k)
    return q, k


def _unit(x: Tensor) -> Tensor:
    if x.dtype in (torch.float16, torch.bfloat16):
        return F.normalize(x.float(), dim=-1).to(x.dtype)
    return F.normalize(x, dim=-1)


def grouped_qk(q: Tensor, k: Tensor) -> Tensor:
    """``q @ k^T`` with grouped-query heads, without copying keys.

    Args:
        q: ``(B, H, Lq, d)``.
        k: ``(B, Hkv, Lk, d)`` with ``H % Hkv == 0``; query head ``h`` uses key head ``h // (H/Hkv)``.

    Returns:
        ``(B, H, Lq, Lk)``.
    """
    B, H, Lq, d = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    if Hkv == H:
        return q @ k.transpose(-2, -1)
    G = H // Hkv
    # (B, Hkv, G*Lq, d) @ (B, Hkv, d, Lk) -> (B, Hkv, G*Lq, Lk): keys are shared, not repeated
    return (q.reshape(B, Hkv, G * Lq, d) @ k.transpose(-2, -1)).view(B, H, Lq, Lk)


def grouped_wv(w: Tensor, v: Tensor) -> Tensor:
    """``w @ v`` with grouped-query heads: ``w (B, H, Lq, Lk)``, ``v (B, Hkv, Lk, dv)``."""
    B, H, Lq, Lk = w.shape
    Hkv, dv = v.shape[1], v.shape[-1]
    if Hkv == H:
        return w @ v
    G = H // Hkv
    return (w.reshape(B, Hkv, G * Lq, Lk) @ v).view(B, H, Lq, dv)


def normalize_rows(
    scores: Tensor, blocked: Tensor | None, multiplier: float | Tensor, eps: float = 1e-12
) -> Tensor:
    """Divide each query's row of scores by its L2 norm over the keys it may see."""
    visible = scores if blocked is None else scores.masked_fill(blocked, 0.0)
    # the norm in float32 at least: squares overflow float16, and eps underflows it
    norm = torch.linalg.vector_norm(visible, dim=-1, keepdim=True, dtype=_acc(scores.dtype))
    return scores / norm.clamp_min(eps).to(scores.dtype) * multiplier


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def run_score_mod(fn: ScoreMod, scores: Tensor, q0: int = 0, k0: int = 0) -> Tensor:
    """Apply a user ``score_mod`` to a block ``(B, H, lq, lk)`` starting at query q0, key k0."""
    B, H, lq, lk = scores.shape
    dev = scores.device
    b = torch.arange(B, device=dev).view(B, 1, 1, 1)
    h = torch.arange(H, device=dev).view(1, H, 1, 1)
    qi = torch.arange(q0, q0 + lq, device=dev).view(1, 1, lq, 1)
    ki = torch.arange(k0, k0 + lk, device=dev).view(1, 1, 1, lk)
    out = fn(scores, b, h, qi, ki)
    if not isinstance(out, Tensor):
        raise TypeError(
            f"score: the score_mod callable returned {type(out).__name__}, not a tensor"
        )
    if out.shape != scores.shape:
        try:
            out = out.expand(scores.shape)
        except RuntimeError as e:
            raise ValueError(
                f"score: the score_mod callable must return scores of shape "
                f"{tuple(scores.shape)}, got {tuple(out.shape)}"
            ) from e
    return out.to(scores.dtype)
