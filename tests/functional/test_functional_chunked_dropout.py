"""Dropout in the chunked backend: exact against a float64 reference given the same keep-mask,
forward and backward, reproducible with a seed, for the flash-able scores and the others."""

from __future__ import annotations

import math

import pytest
import torch

from qkv import functional as qf
from qkv.functional import chunked

B, H, LQ, LK, D = 2, 3, 37, 29, 6


def _recording_masks(monkeypatch):
    """Replace the block masks by slices of one full (B, H, LQ, LK) keep-mask, and return it."""
    g = torch.Generator().manual_seed(11)
    full = {}

    def keep_scale(drop, shape, q0, k0, dtype, device):
        p = drop[0]
        if "mask" not in full:
            full["mask"] = torch.rand(B, H, LQ, LK, generator=g) >= p
        lq, lk = shape[-2], shape[-1]
        m = full["mask"][:, :, q0 : q0 + lq, k0 : k0 + lk]
        return m.to(dtype) * (1.0 / (1.0 - p))

    monkeypatch.setattr(chunked, "_keep_scale", keep_scale)
    return full


def _reference(q, k, v, keep, p, valid_lens, score):
    """float64: (softmax(s) * keep / (1 - p)) @ v with masked keys, dead rows 0."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    if score == "alibi":
        qi = torch.arange(LQ).view(-1, 1)
        kj = torch.arange(LK).view(1, -1)
        s = s - 0.1 * (qi - kj).abs()
    blocked = torch.arange(LK).view(1, 1, 1, -1) >= valid_lens.view(-1, 1, 1, 1)
    s = s.masked_fill(blocked, -math.inf)
    w = torch.softmax(s, -1).nan_to_num(0.0)
    return (w * keep.double() / (1 - p)) @ v


@pytest.mark.parametrize("score", ["scaled_dot", "alibi"])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_chunked_dropout_equals_the_formula_with_the_same_mask(monkeypatch, score, p):
    masks = _recording_masks(monkeypatch)
    torch.manual_seed(0)
    q = torch.randn(B, H, LQ, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, H, LK, D, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, H, LK, D, dtype=torch.float64, requires_grad=True)
    lens = torch.tensor([29, 0])  # batch 1 sees no key: zeros, forward and backward
    mod = None if score == "scaled_dot" else (lambda s, b, h, qi, kj: s - 0.1 * (qi - kj).abs())
    kw = {"score": mod} if mod is not None else {}
    out, _ = qf.attention(q, k, v, valid_lens=lens, dropout_p=p, backend="chunked", **kw)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref = _reference(q, k, v, masks["mask"], p, lens, score)
    (ref * g).sum().backward()
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-9)
    for a, b in zip(got, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)
    assert out[1].abs().max() == 0


def test_chunked_dropout_is_reproducible_and_random():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 2, 300, 8, requires_grad=True) for _ in range(3))

    def run(seed):
        torch.manual_seed(seed)
        out, _ = qf.attention(q, k, v, is_causal=True, dropout_p=0.2, backend="chunked")
        out.square().sum().backward()
        grads = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        return out.detach(), grads

    a, ga = run(5)
    b, gb = run(5)
    c, _ = run(6)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, atol=0, rtol=0)
    assert not torch.equal(a, c)
    # on average dropout keeps the expectation: the mean output is near the one without
    plain, _ = qf.attention(q, k, v, is_causal=True, backend="chunked")
    torch.manual_seed(7)
    mean = sum(qf.attention(q, k, v, is_causal=True, dropout_p=0.2, backend="chunked")[0]
               for _ in range(40)) / 40  # fmt: skip
    assert (mean - plain).abs().mean() < 0.1 * plain.abs().mean()


def test_gradcheck_with_dropout(monkeypatch):
    _recording_masks(monkeypatch)
    torch.manual_seed(2)
    q = torch.randn(B, H, LQ, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, H, LK, D, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, H, LK, D, dtype=torch.float64, requires_grad=True)

    def f(q, k, v):
        return qf.attention(q, k, v, dropout_p=0.3, backend="chunked")[0]

    # fast_mode: the Jacobian checked along random directions (v^T J u against finite
    # differences), not column by column: a few evaluations instead of two per input (6,840)
    assert torch.autograd.gradcheck(f, (q, k, v), atol=1e-6, fast_mode=True)
