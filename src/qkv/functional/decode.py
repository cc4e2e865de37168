"""Attention for a decoding step, planned once instead of at every step.

A decoder that generates one token at a time calls attention twice per layer and step: over its
growing self-attention cache (no mask: every cached key is in the past) and over the encoder's
keys and values (the source padding masked), which do not change while a batch is decoded.
:func:`~qkv.functional.attention` validates, canonicalises the masks, picks a backend and
checks the inputs for NaN at every one of those calls; for a step of a small model that Python
work costs as much as the arithmetic.  The two functions here give the same results with the
planning done once:

* :func:`plan_keys` runs :func:`~qkv.functional.attention`'s own planner once on fixed keys and
  values (and their ``valid_lens``) and keeps what it decided: the keys every query masks
  dropped, the fused kernel's mask, the rows that see no key, whether the keys and values are
  finite; :func:`planned_attention` then attends a query over them;
* :func:`cached_attention`: a query over keys and values with no mask at all (a decoder's
  self-attention cache);
* :func:`grouped_attention`: several queries over shared keys, each query's keys picked by an
  additive mask (beam search's beams over their sentence's cache, which is never reordered:
  :class:`~qkv.nn.kv_cache.BeamKVCache`).

They return what :func:`~qkv.functional.attention` returns for the same arguments
(``score="scaled_dot"``, default scale, no dropout), up to float rounding: for one query per
row (a decoding step) on the CPU they compute the scores, the softmax and the weighted values
with three small tensor operations (:func:`matmul_attention`, what the reference backend
computes), which is faster there than the fused kernel for so small a problem; for several queries they run the fused kernel as
:func:`~qkv.functional.attention` does.  Rows that see no key are zero.  The rule for NaN and
infinities is kept by falling back: when the query is not finite, or when the keys or values
are not known to be finite, the call goes through :func:`~qkv.functional.attention` itself.  On
devices where reading a value back forces a sync (anything but the CPU) they always fall back.

:func:`matmul_attention` is written for TorchScript too: the scripted decoding step of
:mod:`qkv.nn._scripted` calls it, so no module outside :mod:`qkv.functional` computes
attention's softmax.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import attention, plan_call
from .masks import blocked_bias
from .scores import SYNC_FREE, acc_dtype, all_finite, known_finite, score_kind

__all__ = [
    "PlannedKeys",
    "cached_attention",
    "grouped_attention",
    "matmul_attention",
    "plan_keys",
    "planned_attention",
]

_SCALED_DOT = score_kind("scaled_dot")[0]


def _finite(t: Tensor) -> bool:
    """Whether every number of ``t`` is finite: one sum, read back (CPU only)."""
    acc = acc_dtype(t.dtype)
    return math.isfinite((t.sum() if acc == t.dtype else t.sum(dtype=acc)).item())


def _fast_device(t: Tensor) -> bool:
    return t.device.type in SYNC_FREE and not torch.compiler.is_compiling()


_MATH_DTYPES = (torch.float32, torch.float64)
# queries per row up to which a planned attention is three small products (a decoding step: one
# query, or a sentence's beams), not the fused kernel
_FEW_QUERIES = 16


def matmul_attention(
    query: Tensor, key_t: Tensor, value: Tensor, mult: float, bias: Tensor | None
) -> Tensor:
    """Attention of ``query`` ``(B, H, Lq, d)`` (one query per row, or a few) over ``key_t``
    ``(B, H, d, Lk)`` (the keys transposed) and ``value`` ``(B, H, Lk, dv)``, as three tensor
    operations: the scores times ``mult``, their softmax, the weighted values.  ``bias``
    ``(B, 1, 1 or Lq, Lk)`` is added to the scores (-inf: masked).  Rows must see some key
    (callers zero the others).  Returns ``(B, H, Lq, dv)``.

    It is written for TorchScript too: the scripted decoding step
    (:func:`qkv.nn._scripted.decode_step`) calls it, so that a step's attention arithmetic is
    this one function whether Python or TorchScript runs it."""
    scores = torch.matmul(query, key_t).mul_(mult)  # (B, H, Lq, Lk)
    if bias is not None:
        scores.add_(bias)
    return torch.matmul(torch.softmax(scores, dim=-1), value)


@dataclass(frozen=True)
class PlannedKeys:
    """Fixed keys and values with :func:`~qkv.functional.attention`'s plan for them.

    Built by :func:`plan_keys`; read by :func:`planned_attention`.

    Attributes:
        key, value: ``(B, Hkv, Lk, d)``, ``(B, Hkv, Lk, dv)`` as given (the general path's).
        valid_lens: the ``(B,)`` lengths given, or None.
        heads: the number of query heads ``H`` the plan is for.
        fused: whether the fused kernel runs these keys (False: every call takes the general
            path).
        kernel_key, kernel_value: what the kernel reads: trailing keys that every row masks
            dropped, as the planner does (``(B, Hkv, Lk', d)``).
        mask: the kernel's bool mask (True = may attend) ``(B, 1, 1, Lk')``, or None.
        dead: ``(B, 1, 1, 1)`` True for rows that see no key (their output is zero), or None.
        mult: the multiplier of ``q . k``.
        finite: every key and value is finite (checked once).
        key_t, bias: for one query per row: the kernel's keys transposed ``(B, H, d, Lk')``
            and the mask as ``-inf`` added to the scores ``(B, 1, 1, Lk')`` (or None); None
            when that path does not apply (grouped heads, half precision).
    """

    key: Tensor
    value: Tensor
    valid_lens: Tensor | None
    heads: int
    fused: bool
    kernel_key: Tensor
    kernel_value: Tensor
    mask: Tensor | None
    dead: Tensor | None
    mult: float
    finite: bool
    key_t: Tensor | None = None
    bias: Tensor | None = None


def plan_keys(
    key: Tensor,
    value: Tensor,
    *,
    valid_lens: Tensor | Sequence[int] | None = None,
    heads: int | None = None,
) -> PlannedKeys:
    """Plan attention over fixed ``key`` ``(B, Hkv, Lk, d)`` and ``value`` ``(B, Hkv, Lk, dv)``.

    ``valid_lens`` ``(B,)``: keys ``>= valid_lens[b]`` are padding (as in
    :func:`~qkv.functional.attention`); ``heads``: the number of query heads (default ``Hkv``).
    The arguments are validated here, once, with :func:`~qkv.functional.attention`'s checks.
    """
    if not isinstance(key, Tensor) or key.dim() != 4:
        got = tuple(key.shape) if isinstance(key, Tensor) else type(key).__name__
        raise ValueError(f"key: expected a 4-D tensor (B, Hkv, Lk, d), got {got}")
    H = key.shape[1] if heads is None else heads
    if isinstance(H, bool) or not isinstance(H, int) or H < 1:
        raise ValueError(f"heads: expected a positive int or None, got {heads!r}")
    probe = key.new_empty(key.shape[0], H, 1, key.shape[-1])  # one query: the decoding step's
    if valid_lens is not None and not isinstance(valid_lens, Tensor):
        valid_lens = torch.as_tensor(valid_lens, device=key.device)
    if valid_lens is not None and valid_lens.dim() != 1:
        raise ValueError(
            f"valid_lens: expected (B,) lengths for planned keys, got shape "
            f"{tuple(valid_lens.shape)}"
        )
    # attention()'s own planner
    plan = plan_call(
        query=probe,
        key=key,
        value=value,
        valid_lens=valid_lens,
        key_padding_mask=None,
        attn_mask=None,
        is_causal=False,
        window=None,
        scale=None,
        score="scaled_dot",
        dropout_p=0.0,
        need_weights=False,
        backend="auto",
        memory_budget=None,
    )
    fused = plan.choice.backend == "fused" and _fast_device(key)
    mask = dead = None
    if fused:
        # the fused backend's mask and dead rows (the same as _fused's), built once
        mask, causal, dead = plan.spec.sdpa_mask_and_dead(key.dtype)
        fused = not causal
    # keys and values a cache checked when it stored them are not summed again
    finite = fused and ((known_finite(key) and known_finite(value)) or bool(all_finite(key, value)))
    key_t = bias = None
    kernel_value = plan.value
    if finite and key.shape[1] == H and key.dtype in _MATH_DTYPES:
        # laid out once for the two products of every step (no copy inside them)
        key_t = plan.key.transpose(-2, -1).contiguous()
        kernel_value = kernel_value.contiguous()
        if mask is not None:  # dead rows see every key here (as in the kernel's mask): zeroed
            bias = blocked_bias(~mask, key.dtype)
    return PlannedKeys(
        key=key,
        value=value,
        valid_lens=valid_lens,
        heads=H,
        fused=fused,
        kernel_key=plan.key,
        kernel_value=kernel_value,
        mask=mask,
        dead=dead,
        mult=float(plan.mult) if fused else 0.0,
        finite=finite,
        key_t=key_t,
        bias=bias,
    )


def planned_attention(query: Tensor, keys: PlannedKeys) -> Tensor:
    """``attention(query, keys.key, keys.value, valid_lens=keys.valid_lens)``'s output, with
    the plan of :func:`plan_keys`.

    Shapes: query ``(B, H, Lq, d)`` -> ``(B, H, Lq, dv)``.
    """
    k = keys.key
    if (
        keys.fused
        and keys.finite
        and isinstance(query, Tensor)
        and query.dim() == 4
        and query.shape[0] == k.shape[0]
        and query.shape[1] == keys.heads
        and query.shape[-1] == k.shape[-1]
        and query.shape[2] > 0
        and query.dtype == k.dtype
        and query.device == k.device
        and _finite(query)
    ):
        if keys.key_t is not None and query.shape[2] <= _FEW_QUERIES:
            out = matmul_attention(query, keys.key_t, keys.kernel_value, keys.mult, keys.bias)
        else:
            gqa = {"enable_gqa": True} if keys.heads != k.shape[1] else {}
            out = F.scaled_dot_product_attention(
                query,
                keys.kernel_key,
                keys.kernel_value,
                attn_mask=keys.mask,
                scale=keys.mult,
                **gqa,
            )
        return out if keys.dead is None else out.masked_fill(keys.dead, 0.0)
    return attention(query, k, keys.value, valid_lens=keys.valid_lens)[0]


def cached_attention(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
    """``attention(query, key, value)``'s output (no mask, ``score="scaled_dot"``, default
    scale): a decoder's query over its self-attention cache.

    Keys and values a :class:`~qkv.nn.kv_cache.KVCache` checked when it stored them are not
    checked again.  Shapes: query ``(B, H, Lq, d)``, key ``(B, H, Lk, d)``, value
    ``(B, H, Lk, dv)`` -> ``(B, H, Lq, dv)``.
    """
    if (
        isinstance(query, Tensor)
        and isinstance(key, Tensor)
        and isinstance(value, Tensor)
        and query.dim() == key.dim() == value.dim() == 4
        and query.shape[0] == key.shape[0] == value.shape[0]
        and query.shape[1] == key.shape[1] == value.shape[1]
        and query.shape[-1] == key.shape[-1]
        and key.shape[2] == value.shape[2] > 0
        and query.shape[2] > 0
        and query.dtype == key.dtype == value.dtype
        and query.device == key.device == value.device
        and _fast_device(query)
        and (known_finite(key) or _finite(key))
        and (known_finite(value) or _finite(value))
        and _finite(query)
    ):
        d, Lk = query.shape[-1], key.shape[2]
        mult = float(_SCALED_DOT.multiplier(None, d, Lk))
        if query.shape[2] == 1 and query.dtype in _MATH_DTYPES:
            return matmul_attention(query, key.transpose(-2, -1), value, mult, None)
        return F.scaled_dot_product_attention(query, key, value, scale=mult)
    return attention(query, key, value)[0]


def grouped_attention(
    query: Tensor, key: Tensor, value: Tensor, bias: Tensor, *, known_finite: bool
) -> Tensor | None:
    """``attention(query, key, value, attn_mask=bias)``'s output (``score="scaled_dot"``,
    default scale), or None where it is not computed here: keys or values not known finite, a
    query that is not finite, a dtype other than float32/float64, a device other than the CPU
    (the caller takes the general path then).

    ``bias`` is added to the scores: 0 for a key the query sees, ``-inf`` for one it does not;
    every query must see at least one key.  Shapes: query ``(G, H, Lq, d)``, key
    ``(G, H, Lk, d)``, value ``(G, H, Lk, dv)``, bias ``(G, 1, Lq, Lk)`` -> ``(G, H, Lq, dv)``.
    """
    if not (
        known_finite
        and query.dtype in _MATH_DTYPES
        and query.dtype == key.dtype == value.dtype == bias.dtype
        and _fast_device(query)
        and _finite(query)
    ):
        return None
    d, Lk = query.shape[-1], key.shape[2]
    mult = float(_SCALED_DOT.multiplier(None, d, Lk))
    return matmul_attention(query, key.transpose(-2, -1), value, mult, bias)
