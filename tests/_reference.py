"""A float64 attention reference written from the formula, shared by the tests."""

from __future__ import annotations

import math

import torch


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
    three = q.dim() == 3
    if three:
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    q, k, v = q.double(), k.double(), v.double()
    B, H, Lq, d = q.shape
    Hk, Lk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(H // Hk, dim=1)
    v = v.repeat_interleave(H // Hk, dim=1)
    if score == "cosine":
        q = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        k = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    raw = torch.einsum("bhqd,bhkd->bhqk", q, k)
    allowed = torch.ones(B, H, Lq, Lk, dtype=torch.bool)
    if valid_lens is not None:
        for b in range(B):
            for i in range(Lq):
                n = int(valid_lens[b] if valid_lens.dim() == 1 else valid_lens[b, i])
                allowed[b, :, i, n:] = False
    if key_padding_mask is not None and key_padding_mask.dtype == torch.bool:
        for b in range(B):
            for j in range(Lk):
                if key_padding_mask[b, j]:
                    allowed[b, :, :, j] = False
    am = None
    if attn_mask is not None:
        am = attn_mask
        if am.dim() == 2:
            am = am[None, None]
        elif am.dim() == 3:
            am = am[:, None]
        am = am.expand(B, H, Lq, Lk)
        if am.dtype == torch.bool:
            allowed &= ~am
            am = None
        else:
            am = am.double()
    for i in range(Lq):
        for j in range(Lk):
            if is_causal and j > i:
                allowed[:, :, i, j] = False
            if window is not None and not (i - window < j <= i):
                allowed[:, :, i, j] = False
    if score == "normalized":
        norm = torch.where(allowed, raw, 0.0).norm(dim=-1, keepdim=True).clamp_min(1e-12)
        s = raw / norm * (1.0 if scale is None else scale)
    elif score in ("dot", "cosine"):
        s = raw * (1.0 if scale is None else scale)
    elif score == "length_scaled":
        s = raw * (1 / math.sqrt(d) if scale is None else scale) / math.sqrt(Lk)
    else:
        s = raw * (1 / math.sqrt(d) if scale is None else scale)
        if callable(score):
            b = torch.arange(B).view(B, 1, 1, 1)
            h = torch.arange(H).view(1, H, 1, 1)
            i = torch.arange(Lq).view(1, 1, Lq, 1)
            j = torch.arange(Lk).view(1, 1, 1, Lk)
            s = score(s, b, h, i, j).double()
    if key_padding_mask is not None and key_padding_mask.dtype != torch.bool:
        s = s + key_padding_mask.double()[:, None, None, :]
    if am is not None:
        s = s + am
    allowed = allowed & ~torch.isneginf(s)
    s = torch.where(allowed, s, float("-inf"))
    m = torch.where(allowed.any(-1, keepdim=True), s.amax(-1, keepdim=True), 0.0)
    e = torch.where(allowed, torch.exp(s - m), 0.0)
    tot = e.sum(-1, keepdim=True)
    w = torch.where(tot > 0, e / torch.where(tot > 0, tot, 1.0), 0.0)
    out = w @ v
    if three:
        out, w = out.squeeze(1), w.squeeze(1)
    return out, w
