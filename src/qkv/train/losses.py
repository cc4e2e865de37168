"""The training loss: label-smoothed cross-entropy over the real (non-padding) target tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["sequence_loss"]


def sequence_loss(
    logits: Tensor,
    target: Tensor,
    *,
    pad_id: int = 0,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Tensor, int]:
    """Summed token losses of a batch of sequences.

    With ``eps = label_smoothing`` the loss of one token is ``(1 - eps) * nll + eps * mean_v
    (-log p_v)``, the same as ``torch.nn.functional.cross_entropy(..., label_smoothing=eps)``:
    the smoothing mass is spread over the whole vocabulary. Positions where ``target == pad_id``
    count for nothing. The log-softmax is taken in float32 whatever the logits' dtype (bf16
    autocast).

    Shapes: logits ``(B, Lt, V)``, target ``(B, Lt)`` int64.

    Returns:
        ``(loss_sum, nll_sum, num_tokens)``: the smoothed loss summed over real tokens (what is
        differentiated), the plain negative log-likelihood summed likewise (detached; for
        perplexity), and the number of real tokens.
    """
    if not isinstance(logits, Tensor) or logits.dim() != 3:
        got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits: expected shape (B, Lt, V), got {got}")
    if not isinstance(target, Tensor) or target.shape != logits.shape[:2]:
        got = tuple(target.shape) if isinstance(target, Tensor) else type(target).__name__
        raise ValueError(f"target: expected shape {tuple(logits.shape[:2])}, got {got}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing: expected a number in [0, 1), got {label_smoothing!r}")
    lp = F.log_softmax(logits.float(), dim=-1)  # (B, Lt, V)
    keep = target != pad_id  # (B, T)
    nll = -lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
    if label_smoothing > 0:
        smooth = -lp.mean(dim=-1)  # (B, T)
        per_token = (1.0 - label_smoothing) * nll + label_smoothing * smooth
    else:
        per_token = nll
    zero = torch.zeros((), dtype=per_token.dtype, device=per_token.device)
    loss_sum = torch.where(keep, per_token, zero).sum()
    nll_sum = torch.where(keep, nll.detach(), zero).sum()
    return loss_sum, nll_sum, int(keep.sum())
