"""Additive scores' exp-ratio form: ``tanh(a + b) = 1 - 2 P / (P + Q)`` with ``P = e^(-2a)`` per
query and ``Q = e^(2b)`` per key, what the no-grad forward runs on the CPU in float32 and
float64; its clamp for saturating inputs, its fall back to the sigmoid form where the range does
not fit, and the chunked engine's once-per-call set-up; each against the float64 tanh formula."""

from __future__ import annotations

import zlib

import pytest
import torch

from qkv import functional as qf
from qkv.functional.chunked import chunked_additive
from qkv.functional.masks import check_masks
from qkv.functional.scores import (
    ADDITIVE,
    _additive_setup,
    _exp_ratio_factors,
    _tanh_features,
    block_scratch,
)

DTYPES = [torch.float32, torch.float64]
B, LQ, LK, HID = 2, 23, 19, 11  # odd sizes


def _tanh64(q, k, w_v):
    """The formula in float64: ``w_v . tanh(q_i + k_j)``, ``(B, 1, Lq, Lk)``."""
    return torch.tanh(q.double().unsqueeze(-2) + k.double().unsqueeze(-3)) @ w_v.double()


def _inputs(seed, dtype, q_scale=1.0, k_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 1, LQ, HID, generator=g, dtype=dtype) * q_scale
    k = torch.randn(B, 1, LK, HID, generator=g, dtype=dtype) * k_scale
    w_v = torch.randn(HID, generator=g, dtype=dtype)
    return q, k, w_v


def _scores_no_grad(q, k, w_v):
    with torch.no_grad(), block_scratch():
        return _tanh_features(q, k, 0, 0, 1.0, w_v)


def _assert_formula(s, q, k, w_v):
    # to the dtype's accuracy: a few units in the last place of sum |w| (the sum cancels)
    atol = 8 * torch.finfo(q.dtype).eps * float(w_v.abs().sum())
    assert s.dtype == q.dtype and s.shape == (*q.shape[:-1], k.shape[-2])
    assert torch.isfinite(s).all()
    torch.testing.assert_close(s.double(), _tanh64(q, k, w_v), rtol=0, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [0.3, 1.0, 4.0, 15.0])
def test_exp_ratio_form_matches_the_float64_tanh_formula(dtype, scale):
    q, k, w_v = _inputs(int(scale * 10), dtype, scale, scale)
    assert _exp_ratio_factors(q, k) is not None  # the form is taken, not the fall back
    _assert_formula(_scores_no_grad(q, k, w_v), q, k, w_v)


@pytest.mark.parametrize("dtype", DTYPES)
def test_exp_ratio_factors_are_the_exponentials_hidden_unit_first(dtype):
    q, k, _ = _inputs(3, dtype)
    p, e = _exp_ratio_factors(q, k)
    assert p.shape == (B, 1, HID, LQ) and e.shape == (B, 1, HID, LK)
    assert p.is_contiguous() and e.is_contiguous()
    # nothing clamped at these sizes: exactly e^(-2a) and e^(2b)
    torch.testing.assert_close(p, (-2.0 * q).exp().transpose(-1, -2), rtol=0, atol=0)
    torch.testing.assert_close(e, (2.0 * k).exp().transpose(-1, -2), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_saturating_inputs_are_clamped_into_range_and_stay_exact(dtype):
    # hidden units far beyond e^x's range on one side of the pair: their tanh is +-1 with
    # every key (or query), and the clamp brings them into range without changing that
    q, k, w_v = _inputs(5, dtype)
    sign = torch.where(torch.arange(LQ) % 2 == 0, 1.0, -1.0).to(dtype)
    q[..., 0] = 1e4 * sign  # +-1e4: far past e^(2a) in either dtype
    q[..., 1] = 60.0 * sign + torch.randn(LQ, dtype=dtype)  # past float32's range
    k[..., 2] = -800.0 * torch.where(torch.arange(LK) % 3 == 0, 1.0, -1.0).to(dtype)
    k[..., 3] = 30.0 + k[..., 3]  # shifted keys against queries near 0: some saturate
    q[..., 4] = -35.0 + q[..., 4]  # and the reverse: near -35 against keys near 0
    k[..., 4] = 35.0 + k[..., 4]  # ... whose pairs, near 0, do not saturate
    assert _exp_ratio_factors(q, k) is not None  # in range once clamped
    _assert_formula(_scores_no_grad(q, k, w_v), q, k, w_v)
    # a query that saturates every pair: its scores are sum(w) exactly
    q2 = q.clone()
    q2[..., :, :] = 1e4
    s2 = _scores_no_grad(q2, k, w_v)
    _assert_formula(s2, q2, k, w_v)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ranges_beyond_the_exponentials_fall_back_to_the_sigmoid_form(dtype):
    # queries and keys both spread far in the same hidden unit: pairs near 0 (not saturated)
    # need e^(2a) and e^(2b) beyond the dtype's range, so the form is not taken
    q, k, w_v = _inputs(7, dtype)
    big = 500.0 if dtype == torch.float64 else 60.0
    q[..., 0] = torch.linspace(-big, big, LQ, dtype=dtype)
    k[..., 0] = torch.linspace(big, -big, LK, dtype=dtype)
    assert _exp_ratio_factors(q, k) is None
    _assert_formula(_scores_no_grad(q, k, w_v), q, k, w_v)


def test_a_nan_input_falls_back_and_poisons_its_row_only():
    q, k, w_v = _inputs(9, torch.float32)
    q[1, 0, 4, 2] = float("nan")
    assert _exp_ratio_factors(q, k) is None
    s = _scores_no_grad(q, k, w_v)
    nan = torch.zeros(B, 1, LQ, LK, dtype=torch.bool)
    nan[1, 0, 4] = True
    assert torch.equal(s.isnan(), nan)
    ok = ~nan
    torch.testing.assert_close(s[ok].double(), _tanh64(q, k, w_v)[ok], rtol=0, atol=1e-5)


def _graph_ops(t):
    seen, todo = set(), [t.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and type(fn).__name__ not in seen:
            seen.add(type(fn).__name__)
            todo += [f for f, _ in fn.next_functions]
    return seen


def test_the_form_is_not_taken_with_autograd_or_off_the_cpu_checks():
    # with autograd the sigmoid form runs: exact gradients, one (lq, lk, h) tensor kept for the
    # backward (the exp-ratio form would keep two); the factors need the CPU
    q, k, w_v = _inputs(11, torch.float32)
    qg = q.clone().requires_grad_()
    s = _tanh_features(qg, k, 0, 0, 1.0, w_v)
    assert "SigmoidBackward0" in _graph_ops(s) and "DivBackward0" not in _graph_ops(s)
    _assert_formula(s.detach(), q, k, w_v)
    assert _exp_ratio_factors(q.to("meta"), k.to("meta")) is None
    assert _exp_ratio_factors(q[:, :, :0], k) is None  # no query: nothing to compute
    assert _exp_ratio_factors(q, k[:1]) is None  # leading shapes differ


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_setup_block_reads_the_factors_at_the_blocks_positions(dtype):
    q, k, w_v = _inputs(13, dtype, 2.0, 2.0)
    block = ADDITIVE.block_setup(q, k, w_v)
    assert block is not None and ADDITIVE.block_setup is _additive_setup
    for q0, q1, k0, k1 in [(0, 5, 0, 7), (5, 23, 7, 19), (17, 18, 3, 4), (9, 14, 0, 19)]:
        qb, kb = q[:, :, q0:q1], k[:, :, k0:k1]
        with torch.no_grad(), block_scratch():
            s = block(qb, kb, q0, k0, 1.0, w_v)
        _assert_formula(s, qb, kb, w_v)


def test_the_setup_declines_what_the_form_cannot_run():
    q, k, w_v = _inputs(15, torch.float32)
    assert _additive_setup(q.half(), k.half(), w_v.half()) is None  # half: tanh directly
    q[..., 0] = torch.linspace(-60.0, 60.0, LQ)
    k[..., 0] = torch.linspace(60.0, -60.0, LK)
    assert _additive_setup(q, k, w_v) is None  # out of range: the blocks take their own


def _book64(q, k, v, w_v, keep):
    s = torch.tanh(q.double()[:, :, None] + k.double()[:, None]) @ w_v.double()
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v.double()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["typical", "saturating", "out of range", "wide, one block fits"])
def test_chunked_additive_forward_without_grad_against_the_float64_formula(dtype, case):
    g = torch.Generator().manual_seed(zlib.crc32(case.encode()))  # the same in every process
    Lq, Lk, h, dv = 29, 31, 9, 5
    q = torch.randn(B, Lq, h, generator=g, dtype=dtype)
    k = torch.randn(B, Lk, h, generator=g, dtype=dtype)
    v = torch.randn(B, Lk, dv, generator=g, dtype=dtype)
    w_v = torch.randn(h, generator=g, dtype=dtype)
    big = 500.0 if dtype == torch.float64 else 60.0
    if case == "saturating":
        q[..., 0] = 1e4 * torch.where(torch.arange(Lq) % 2 == 0, 1.0, -1.0).to(dtype)
        k[..., 1] = 1e3 * torch.where(torch.arange(Lk) % 3 == 0, 1.0, -1.0).to(dtype)
    elif case == "out of range":  # every block's range too: the sigmoid form throughout
        q[..., 0] = big * torch.where(torch.arange(Lq) % 2 == 0, 1.0, -1.0).to(dtype)
        k[..., 0] = big * torch.where(torch.arange(Lk) % 2 == 0, -1.0, 1.0).to(dtype)
    elif case == "wide, one block fits":  # the whole range does not fit, the blocks' do
        q[..., 0] = torch.linspace(-big, big, Lq, dtype=dtype)
        k[..., 0] = torch.linspace(big, -big, Lk, dtype=dtype)
    lens = torch.tensor([Lk, 13])
    keep = torch.arange(Lk)[None, None, :] < lens[:, None, None]
    spec = check_masks(B=B, H=1, Lq=Lq, Lk=Lk, device=q.device, batched_heads=True, valid_lens=lens)
    q4, k4, v4 = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    with torch.no_grad():
        out, _ = qf.additive_attention(q, k, v, w_v, valid_lens=lens, backend="chunked")
        # blocks of 4 queries x 3 keys: each block's own range decides its form
        blocks = chunked_additive(q4, k4, v4, w_v, spec, block_q=4, block_k=3)[:, 0]
    ref = _book64(q, k, v, w_v, keep)
    tol = 2e-5 if dtype == torch.float32 else 1e-12
    for got in (out, blocks):
        assert got.dtype == dtype and torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol)


def test_chunked_additive_blocks_cut_small_with_a_window():
    # the once-per-call factors sliced at every block's offsets, blocks of 4 x 3, a window
    g = torch.Generator().manual_seed(17)
    Lq, Lk, h, dv = 21, 17, 7, 3
    q = torch.randn(B, 1, Lq, h, generator=g, dtype=torch.float64) * 3
    k = torch.randn(B, 1, Lk, h, generator=g, dtype=torch.float64) * 3
    v = torch.randn(B, 1, Lk, dv, generator=g, dtype=torch.float64)
    w_v = torch.randn(h, generator=g, dtype=torch.float64)
    spec = check_masks(B=B, H=1, Lq=Lq, Lk=Lk, device=q.device, batched_heads=True, window=5)
    with torch.no_grad():
        small = chunked_additive(q, k, v, w_v, spec, block_q=4, block_k=3)
    i, j = torch.arange(Lq)[:, None], torch.arange(Lk)[None, :]
    keep = (j <= i) & (j > i - 5)  # window=W: keys i - W < j <= i
    ref = _book64(q[:, 0], k[:, 0], v[:, 0], w_v, keep[None])
    torch.testing.assert_close(small[:, 0], ref, rtol=1e-12, atol=1e-12)
