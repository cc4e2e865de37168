"""A float64 attention reference written from the formula, shared by the tests."""

from __future__ import annotations

import math

import torch


def _scale_or(scale, default):
    return default if scale is None else scale


def _dot(q, k):
    return torch.einsum("bhqd,bhkd->bhqk", q, k)


def _unit(x):
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def _normalized(q, k, allowed, scale):
    raw = _dot(q, k)
    norm = torch.where(allowed, raw, 0.0).norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return raw / norm * _scale_or(scale, 1.0)


# Each registered score kind, written from its definition (qkv.functional.scores): float64
# q (B, H, Lq, d), k (B, H, Lk, d), the bool mask of allowed keys (B, H, Lq, Lk) and the scale
# -> the scores.  A kind missing here makes every test that uses this reference fail with its name.
SCORE_FORMULAS = {
    "scaled_dot": lambda q, k, allowed, scale: (
        _dot(q, k) * _scale_or(scale, 1 / math.sqrt(q.shape[-1]))
    ),
    "dot": lambda q, k, allowed, scale: _dot(q, k) * _scale_or(scale, 1.0),
    "cosine": lambda q, k, allowed, scale: _dot(_unit(q), _unit(k)) * _scale_or(scale, 1.0),
    "normalized": _normalized,
    "length_scaled": lambda q, k, allowed, scale: (
        _dot(q, k) * _scale_or(scale, 1 / math.sqrt(q.shape[-1])) / math.sqrt(k.shape[2])
    ),
}


def _formula(score):
    if callable(score):  # a score_mod: applied to the scaled dot product, with absolute indices
        return None
    if score not in SCORE_FORMULAS:
        raise NotImplementedError(
            f"tests/_reference.py has no formula for score {score!r}: write it into "
            "SCORE_FORMULAS from the kind's definition"
        )
    return SCORE_FORMULAS[score]


def _allowed(B, H, Lq, Lk, valid_lens, key_padding_mask, attn_mask, is_causal, window):
    """(allowed (B, H, Lq, Lk) bool, additive float mask or None), with explicit loops."""
    allowed = torch.ones(B, H, Lq, Lk, dtype=torch.bool)
    if valid_lens is not None:
        for b in range(B):
            for i in range(Lq):
                n = int(valid_lens[b] if valid_lens.dim() == 1 else valid_lens[b, i])
                allowed[b, :, i, n:] = False
    add = None
    if key_padding_mask is not None:
        if key_padding_mask.dtype == torch.bool:
            for b in range(B):
                for j in range(Lk):
                    if key_padding_mask[b, j]:
                        allowed[b, :, :, j] = False
        else:
            add = key_padding_mask.double()[:, None, None, :].expand(B, H, Lq, Lk)
    if attn_mask is not None:
        am = attn_mask
        if am.dim() == 2:
            am = am[None, None]
        elif am.dim() == 3:
            am = am[:, None]
        am = am.expand(B, H, Lq, Lk)
        if am.dtype == torch.bool:
            allowed &= ~am
        else:
            add = am.double() if add is None else add + am.double()
    for i in range(Lq):
        for j in range(Lk):
            if is_causal and j > i:
                allowed[:, :, i, j] = False
            if window is not None and not (i - window < j <= i):
                allowed[:, :, i, j] = False
    return allowed, add


def _softmax_value(s, allowed, add, v):
    if add is not None:
        s = s + add
    allowed = allowed & ~torch.isneginf(s)
    s = torch.where(allowed, s, float("-inf"))
    m = torch.where(allowed.any(-1, keepdim=True), s.amax(-1, keepdim=True), 0.0)
    e = torch.where(allowed, torch.exp(s - m), 0.0)
    tot = e.sum(-1, keepdim=True)
    w = torch.where(tot > 0, e / torch.where(tot > 0, tot, 1.0), 0.0)
    return w @ v, w


def reference_attention(
    q,
    k,
    v,
    *,
    valid_lens=None,
    key_padding_mask=None,
    attn_mask=None,
    is_causal=False,
    window=None,
    scale=None,
    score="scaled_dot",
):
    """Attention in float64 from the formula, with explicit loops over the masks.

    Shapes as qkv.functional.attention (3-D or 4-D); returns (output, weights) in float64.
    """
    formula = _formula(score)
    three = q.dim() == 3
    if three:
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    q, k, v = q.double(), k.double(), v.double()
    B, H, Lq, d = q.shape
    Hk, Lk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(H // Hk, dim=1)
    v = v.repeat_interleave(H // Hk, dim=1)
    allowed, add = _allowed(
        B, H, Lq, Lk, valid_lens, key_padding_mask, attn_mask, is_causal, window
    )
    if formula is not None:
        s = formula(q, k, allowed, scale)
    else:
        s = _dot(q, k) * (1 / math.sqrt(d) if scale is None else scale)
        b = torch.arange(B).view(B, 1, 1, 1)
        h = torch.arange(H).view(1, H, 1, 1)
        i = torch.arange(Lq).view(1, 1, Lq, 1)
        j = torch.arange(Lk).view(1, 1, 1, Lk)
        s = score(s, b, h, i, j).double()
    out, w = _softmax_value(s, allowed, add, v)
    if three:
        out, w = out.squeeze(1), w.squeeze(1)
    return out, w


def reference_additive(q, k, v, w_v, **masks):
    """Additive (Bahdanau) attention ``s_ij = w_v . tanh(q_i + k_j)`` in float64, with loops.

    q ``(B, Lq, h)``, k ``(B, Lk, h)``, v ``(B, Lk, dv)``, w_v ``(h,)``; masks as
    :func:`reference_attention`.  Returns (output (B, Lq, dv), weights (B, Lq, Lk)).
    """
    q, k, v, w_v = q.double(), k.double(), v.double(), w_v.double()
    B, Lq, _ = q.shape
    Lk = k.shape[1]
    s = torch.empty(B, 1, Lq, Lk, dtype=torch.float64)
    for i in range(Lq):
        for j in range(Lk):
            s[:, 0, i, j] = torch.tanh(q[:, i] + k[:, j]) @ w_v
    allowed, add = _allowed(B, 1, Lq, Lk, **_mask_args(masks))
    out, w = _softmax_value(s, allowed, add, v[:, None])
    return out.squeeze(1), w.squeeze(1)


def _mask_args(masks):
    names = ("valid_lens", "key_padding_mask", "attn_mask", "is_causal", "window")
    unknown = set(masks) - set(names)
    if unknown:
        raise TypeError(f"reference_additive: unknown mask arguments {sorted(unknown)}")
    defaults = {"is_causal": False}
    return {n: masks.get(n, defaults.get(n)) for n in names}
