"""The training loss: label-smoothed cross-entropy over the real (non-padding) target tokens, and
the precision the logits it reads are computed in (:func:`forward_precision`)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._errors import SettingError

__all__ = ["forward_precision", "sequence_loss"]


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy of the rows of ``logits`` ``(N, V)`` whose ``keep``
    ``(N,)`` is true, with its gradient written from the formula: ``d loss / d logits = keep *
    (softmax - (1 - eps) * onehot(target) - eps / V)``.

    Autograd's composition of the same loss (log-softmax, gather, mean, where) keeps the log
    probabilities and, in the backward pass, a gradient for each of them before the logits' own:
    up to four ``(N, V)`` tensors at once besides the logits. This keeps one (the probabilities)
    and makes one (the gradient), which at a 32k vocabulary is most of a step's activations."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, logits: Tensor, target: Tensor, keep: Tensor, eps: float
    ) -> tuple[Tensor, Tensor]:
        dtype = torch.promote_types(logits.dtype, torch.float32)
        x = logits.to(dtype)
        lp = torch.log_softmax(x, dim=-1)  # (N, V)
        nll = -lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (N,)
        per_token = nll if eps == 0 else (1.0 - eps) * nll - eps * lp.mean(dim=-1)
        zero = per_token.new_zeros(())
        loss_sum = torch.where(keep, per_token, zero).sum()
        nll_sum = torch.where(keep, nll, zero).sum()
        probs = lp.exp_()  # the log probabilities are not needed any more: reuse their memory
        ctx.save_for_backward(probs, target, keep)
        ctx.eps = eps
        ctx.logits_dtype = logits.dtype
        ctx.mark_non_differentiable(nll_sum)
        return loss_sum, nll_sum

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        probs, target, keep = ctx.saved_tensors
        eps = ctx.eps
        grad = probs - eps / probs.shape[-1] if eps else probs.clone()
        grad.scatter_add_(-1, target.unsqueeze(-1), grad.new_full((grad.shape[0], 1), eps - 1.0))
        grad.mul_((keep.to(grad.dtype) * grad_loss).unsqueeze(-1))
        return grad.to(ctx.logits_dtype), None, None, None


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
    count for nothing. The log-softmax is taken in float32 (float64 for float64 logits) whatever
    the logits' dtype (bf16 autocast). Its gradient is written from the formula and keeps one
    ``(B, Lt, V)`` tensor for the backward pass (the probabilities), not autograd's four: the
    caller that drops ``logits`` after this call holds two such tensors at most in the backward.

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
        raise SettingError(
            "label_smoothing", f"expected a number in [0, 1), got {label_smoothing!r}"
        )
    V = logits.shape[-1]
    flat_target = target.reshape(-1)
    keep = flat_target != pad_id  # (B * Lt,)
    loss_sum, nll_sum = _SmoothedCrossEntropy.apply(
        logits.reshape(-1, V), flat_target, keep, float(label_smoothing)
    )
    return loss_sum, nll_sum, int(keep.sum())


def forward_precision(
    device: torch.device | str, bf16: bool
) -> contextlib.AbstractContextManager[object]:
    """The context a training or validation forward pass runs in: bfloat16 autocast on
    ``device``'s type when ``bf16``, else nothing (float32). The one spelling of it for the
    update, validation loss and the speed probe, so the probe measures what the run does."""
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
