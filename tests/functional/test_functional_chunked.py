"""The chunked backend: exact in O(L) memory, forward and backward, for every score and mask."""

from __future__ import annotations

import zlib

import pytest
import torch
from _reference import reference_attention

from qkv import functional as qf
from qkv.functional.chunked import chunked_additive, chunked_attention, plan_blocks
from qkv.functional.masks import check_masks
from qkv.functional.scores import qk_multiplier

SCORES = ["scaled_dot", "dot", "cosine", "normalized", "length_scaled"]


def alibi(s, b, h, i, j):
    return s - 0.3 * (i - j).abs() / (h + 1)


def spec_for(q, k, **masks):
    B, H, Lq = q.shape[:3]
    return check_masks(B=B, H=H, Lq=Lq, Lk=k.shape[2], device=q.device, batched_heads=True, **masks)


MASKS = {
    "none": lambda B, Lq, Lk: {},
    "causal": lambda B, Lq, Lk: {"is_causal": True},
    "window": lambda B, Lq, Lk: {"window": 4},
    "window+causal": lambda B, Lq, Lk: {"window": 3, "is_causal": True},
    "valid_lens": lambda B, Lq, Lk: {"valid_lens": torch.randint(0, Lk + 1, (B,))},
    "valid_lens per query": lambda B, Lq, Lk: {"valid_lens": torch.randint(0, Lk + 1, (B, Lq))},
    "book 1..L": lambda B, Lq, Lk: {
        "valid_lens": torch.arange(1, Lq + 1).clamp(max=Lk).expand(B, Lq).contiguous()
    },
    "kpm+causal": lambda B, Lq, Lk: {
        "key_padding_mask": torch.rand(B, Lk) < 0.3,
        "is_causal": True,
    },
    "attn_mask bool": lambda B, Lq, Lk: {"attn_mask": torch.rand(Lq, Lk) < 0.3},
    "attn_mask float + valid_lens": lambda B, Lq, Lk: {
        "attn_mask": torch.randn(B, Lq, Lk),
        "valid_lens": torch.randint(0, Lk + 1, (B,)),
    },
}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("score", [*SCORES, alibi])
def test_forward_and_backward_match_reference(score, mask):
    B, H, Hk, Lq, Lk, d, dv = 2, 4, 2, 19, 23, 5, 3  # odd sizes, GQA, d != dv
    # a seed of its own per case, the same in every process (hash() of a str is not)
    name = getattr(score, "__name__", score)
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}/{mask}".encode()))
    q = torch.randn(B, H, Lq, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, Hk, Lk, d, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, Hk, Lk, dv, generator=g, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(int(g.initial_seed()))
    masks = MASKS[mask](B, Lq, Lk)
    mult = qk_multiplier(score, None, d, Lk)
    out = chunked_attention(q, k, v, spec_for(q, k, **masks), score, mult, block_q=4, block_k=3)
    ref, _ = reference_attention(q, k, v, score=score, **masks)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    go = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), go)
    ref_grads = torch.autograd.grad(ref, (q, k, v), go)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("score", ["scaled_dot", "normalized", alibi])
def test_gradients_float32_within_1e4_relative(score):
    B, H, Lq, Lk, d = 2, 3, 37, 29, 7
    q64, k64, v64 = (torch.randn(B, H, n, d, dtype=torch.float64) for n in (Lq, Lk, Lk))
    vl = torch.randint(1, Lk + 1, (B, Lq))
    go = torch.randn(B, H, Lq, d, dtype=torch.float64)
    q, k, v = (t.float().requires_grad_() for t in (q64, k64, v64))
    out = qf.attention(q, k, v, valid_lens=vl, score=score, backend="chunked")[0]
    grads = torch.autograd.grad(out, (q, k, v), go.float())
    q64, k64, v64 = (t.requires_grad_() for t in (q64, k64, v64))
    ref = reference_attention(q64, k64, v64, valid_lens=vl, score=score)[0]
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), go)
    for a, b in zip(grads, ref_grads):
        rel = (a.double() - b).norm() / b.norm()
        assert rel < 1e-4, rel


@pytest.mark.parametrize("score", ["scaled_dot", "cosine", alibi])
def test_gradcheck_chunked(score):
    q, k, v = (torch.randn(1, 2, n, 3, dtype=torch.float64, requires_grad=True) for n in (5, 7, 7))
    vl = torch.tensor([[1, 0, 3, 7, 4]])
    spec = spec_for(q, k, valid_lens=vl)

    def f(q, k, v):
        return chunked_attention(
            q, k, v, spec, score, qk_multiplier(score, None, 3, 7), block_q=2, block_k=3
        )

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_learned_temperature_gradient():
    q, k, v = (torch.randn(1, 2, n, 4, dtype=torch.float64) for n in (6, 9, 9))
    t = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    spec = spec_for(q, k, is_causal=True)
    assert torch.autograd.gradcheck(
        lambda t: chunked_attention(q, k, v, spec, "cosine", t.reshape(()), block_q=2, block_k=4),
        (t,),
    )


def test_additive_chunked_matches_reference_and_gradients():
    B, Lq, Lk, h, dv = 2, 17, 13, 6, 5
    q, k, v = (
        torch.randn(B, n, w, dtype=torch.float64, requires_grad=True)
        for n, w in ((Lq, h), (Lk, h), (Lk, dv))
    )
    w_v = torch.randn(h, dtype=torch.float64, requires_grad=True)
    vl = torch.tensor([[i % (Lk + 1) for i in range(Lq)], [Lk] * Lq])
    ref, _ = qf.additive_attention(q, k, v, w_v, valid_lens=vl, backend="reference")
    spec = check_masks(B=B, H=1, Lq=Lq, Lk=Lk, device=q.device, batched_heads=False, valid_lens=vl)
    out = chunked_additive(
        q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), w_v, spec, block_q=4, block_k=5
    ).squeeze(1)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    go = torch.randn_like(out)
    for a, b in zip(
        torch.autograd.grad(out, (q, k, v, w_v), go), torch.autograd.grad(ref, (q, k, v, w_v), go)
    ):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    o2, w = qf.additive_attention(q, k, v, w_v, valid_lens=vl, backend="chunked")
    torch.testing.assert_close(o2, ref)
    assert w is None


def test_plan_skips_masked_blocks():
    L = 64
    q = torch.zeros(1, 1, L, 4)
    causal = plan_blocks(spec_for(q, q, is_causal=True), 8, 8, 8)
    full = plan_blocks(spec_for(q, q), 8, 8, 8)
    pairs = sum(s.k1 - s.k0 for _, _, segs in causal for s in segs)
    pairs_full = sum(s.k1 - s.k0 for _, _, segs in full for s in segs)
    assert pairs_full == L * L // 8 and pairs <= (L * L / 2 + L * 8) / 8  # about half the work
    # only the diagonal segments need an index mask
    assert all((s.k0 > q0) == s.index for q0, _, segs in causal for s in segs)
    window = plan_blocks(spec_for(q, q, window=5), 8, 8, 8)
    for q0, q1, segs in window:
        assert min(s.k0 for s in segs) == max(0, q0 - 4) and max(s.k1 for s in segs) == q1
    vl = plan_blocks(spec_for(q, q, valid_lens=torch.tensor([10])), 8, 8, 8)
    assert all(s.k1 <= 10 for _, _, segs in vl for s in segs)


def test_generic_path_never_sees_a_full_score_matrix():
    shapes = []

    def spy(s, b, h, i, j):
        shapes.append(tuple(s.shape[-2:]))
        return s

    q, k, v = (torch.randn(1, 2, 300, 8) for _ in range(3))
    out, _ = qf.attention(q, k, v, score=spy, is_causal=True, backend="chunked")
    ref, _ = qf.attention(q, k, v, score=spy, is_causal=True, backend="reference")
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert max(a * b for a, b in shapes[:-1]) < 300 * 300


def test_dead_rows_chunked():
    q, k, v = (torch.randn(2, 2, 6, 4, requires_grad=True) for _ in range(3))
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1] = True
    for score in ("scaled_dot", alibi):
        out, _ = qf.attention(
            q,
            k,
            v,
            key_padding_mask=kpm,
            valid_lens=torch.tensor([0, 6]),
            score=score,
            backend="chunked",
        )
        assert torch.all(out == 0)
        out.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_dispatch_memory_budget_and_errors():
    q, k, v = (torch.randn(1, 2, 64, 8) for _ in range(3))
    weights = 1 * 2 * 64 * 64 * 4
    c = qf.explain(q, k, v, score="normalized", memory_budget=weights)
    assert c.backend == "chunked" and "memory budget" in str(c)
    assert qf.explain(q, k, v, score="normalized").backend == "reference"
    # weights asked for keep the budget: refused over it, computed within it
    with pytest.raises(qf.AttentionMemoryError, match=r"need_weights=True .* over the memory"):
        qf.explain(q, k, v, need_weights=True, memory_budget=weights)
    assert qf.explain(q, k, v, need_weights=True, memory_budget=2 * weights).backend == "reference"
    # dropout over the budget: the chunked backend drops weights too
    c = qf.explain(q, k, v, score=alibi, dropout_p=0.1, memory_budget=weights)
    assert c.backend == "chunked" and "memory budget" in str(c)
    # more than the machine has: a clear error instead of dying
    huge = torch.randn(1, 1, 1 << 20, 1)
    with pytest.raises(qf.AttentionMemoryError, match=r"needs about 8\.0 TiB .* budget"):
        qf.attention(huge, huge, huge, need_weights=True)
    with pytest.raises(qf.AttentionMemoryError, match=r"needs about 8\.0 TiB .* available"):
        qf.attention(huge, huge, huge, need_weights=True, memory_budget=1 << 50)
    # dropout too big to materialise: the chunked backend drops weights in O(L) memory
    assert qf.explain(huge, huge, huge, score=alibi, dropout_p=0.1).backend == "chunked"
    assert qf.explain(huge, huge, huge, score=alibi).backend == "chunked"
    old = qf.set_memory_budget(weights)
    try:
        assert qf.get_memory_budget() == weights
        assert qf.explain(q, k, v, score=alibi).backend == "chunked"
    finally:
        qf.set_memory_budget(old)
    with pytest.raises(ValueError, match="memory_budget: expected a positive int"):
        qf.attention(q, k, v, memory_budget=-1)
    with pytest.raises(ValueError, match="nbytes: expected a positive int"):
        qf.set_memory_budget(0)
    with pytest.raises(ValueError, match="backend: 'chunked' cannot run"):
        qf.attention(q, k, v, need_weights=True, backend="chunked")


def test_dispatch_takes_chunked_instead_of_building_a_large_mask():
    q = k = v = torch.randn(1, 1, 4100, 4)
    vl = (torch.arange(4100) // 2 + 1).view(1, 4100)  # per-query lengths, not causal
    c = qf.explain(q, k, v, valid_lens=vl)
    assert c.backend == "chunked" and "materialised" in c.reasons[0]
    assert qf.explain(q, k, v, window=64).backend == "chunked"
    assert qf.explain(q, k, v, is_causal=True).backend == "fused"
    qg = q.clone().requires_grad_()  # training: the fused kernel with a mask is faster
    assert qf.explain(qg, k, v, window=64).backend == "fused"
    # trailing padding shared by the batch is dropped first: then only the causal mask remains
    kpm = torch.zeros(1, 4100, dtype=torch.bool)
    kpm[:, 3000:] = True
    assert qf.explain(q, k, v, key_padding_mask=kpm, is_causal=True).backend == "fused"
    small = q[:, :, :64]
    assert qf.explain(small, small, small, valid_lens=vl[:, :64]).backend == "fused"


def test_book_per_query_lengths_become_causal():
    """The book's decoder mask, valid_lens (B, L) = 1..L, is the causal mask: fused kernel."""
    q, k, v = (torch.randn(2, 2, 300, 8, dtype=torch.float64) for _ in range(3))
    vl = torch.arange(1, 301).expand(2, 300)
    spec = spec_for(q, k, valid_lens=vl)
    assert spec.is_causal and spec.valid_lens is None
    assert qf.explain(q, k, v, valid_lens=vl).backend == "fused"
    out, _ = qf.attention(q, k, v, valid_lens=vl)
    ref, _ = reference_attention(q, k, v, valid_lens=vl)
    torch.testing.assert_close(out, ref)
    same = torch.tensor([[5] * 300, [7] * 300])
    assert spec_for(q, k, valid_lens=same).valid_lens.shape == (2, 1, 1, 1)


def test_window_semantics_match_reference_on_every_backend():
    q, k, v = (torch.randn(2, 2, 11, 4, dtype=torch.float64) for _ in range(3))
    ref, _ = reference_attention(q, k, v, window=3)
    for backend in ("fused", "reference", "chunked"):
        out, _ = qf.attention(q, k, v, window=3, backend=backend)
        torch.testing.assert_close(out, ref)


def test_learned_float_mask_keeps_its_gradient():
    q = torch.randn(1, 2, 40, 8, requires_grad=True)
    k = v = torch.randn(1, 2, 40, 8)
    bias = torch.zeros(1, 2, 40, 40, requires_grad=True)  # e.g. a learned relative bias
    c = qf.explain(q, k, v, attn_mask=bias, score=alibi, memory_budget=1024)
    assert c.backend == "reference"  # the chunked backend treats masks as constants
    with pytest.raises(ValueError, match="a float mask requires grad"):
        qf.attention(q, k, v, attn_mask=bias, backend="chunked")
    out, _ = qf.attention(q, k, v, attn_mask=bias, window=5)
    out.sum().backward()
    assert bias.grad is not None and bias.grad.abs().sum() > 0


@pytest.mark.parametrize("backend", ["fused", "reference", "chunked"])
def test_half_precision_dead_rows_from_overflowing_masks(backend):
    q = torch.randn(1, 1, 2, 4, dtype=torch.float16, requires_grad=True)
    m = torch.finfo(torch.float16).min  # the HuggingFace pattern: min + min -> -inf in fp16
    kpm = torch.full((1, 2), m, dtype=torch.float16)
    am = torch.full((2, 2), m, dtype=torch.float16)
    out, _ = qf.attention(q, q, q, key_padding_mask=kpm, attn_mask=am, backend=backend)
    assert torch.isfinite(out).all()
    out.float().sum().backward()
    assert torch.isfinite(q.grad).all()


@pytest.mark.parametrize("backend", ["reference", "chunked"])
def test_half_precision_normalized_and_cosine(backend):
    g = torch.Generator().manual_seed(3)
    q64 = torch.randn(1, 2, 64, 64, generator=g, dtype=torch.float64)
    k64 = torch.randn(1, 2, 2048, 64, generator=g, dtype=torch.float64)
    k64[0, :, -1] = 0  # a zero (padding) key
    kpm = torch.zeros(1, 2048, dtype=torch.bool)
    kpm[0, -1] = True
    for score in ("normalized", "cosine"):
        ref, _ = reference_attention(q64, k64, k64, score=score, key_padding_mask=kpm)
        q, k = q64.half().requires_grad_(), k64.half().requires_grad_()
        out, _ = qf.attention(q, k, k, score=score, key_padding_mask=kpm, backend=backend)
        assert (out.double() - ref).abs().max() < 2e-2
        out.float().sum().backward()
        assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
    vl = torch.tensor([[0] + [3] * 63])  # a dead row
    q = q64.half()
    out, _ = qf.attention(q, q, q, score="normalized", valid_lens=vl, backend=backend)
    assert torch.isfinite(out).all() and torch.all(out[0, :, 0] == 0)


def test_bfloat16_gradients_accumulate_in_float32():
    L = 1024
    q64, k64, v64 = (torch.randn(1, 2, L, 32, dtype=torch.float64) for _ in range(3))
    go = torch.randn(1, 2, L, 32, dtype=torch.float64)
    ref = reference_attention(*(t.requires_grad_() for t in (q64, k64, v64)), is_causal=True)[0]
    ref_g = torch.autograd.grad(ref, (q64, k64, v64), go)
    q, k, v = (t.detach().bfloat16().requires_grad_() for t in (q64, k64, v64))
    spec = spec_for(q, k, window=L)  # the window keeps the flash engine, 32 query blocks
    out = chunked_attention(q, k, v, spec, "scaled_dot", 32**-0.5, block_q=32)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), go.bfloat16()), ref_g):
        assert ((a.double() - b).norm() / b.norm()) < 2e-2


def test_block_sizes_respect_their_budget():
    from qkv.functional.chunked import _block_sizes

    for Lq, Lk, per_pair in ((2048, 2048, 64 * 256), (7, 5000, 3), (100000, 100000, 1)):
        bq, bk = _block_sizes(Lq, Lk, per_pair)
        assert 1 <= bq <= Lq and 1 <= bk <= Lk
        assert bq * bk * per_pair <= max(1 << 22, per_pair)


def test_tensor_scale_is_validated():
    q = torch.randn(1, 1, 3, 4)
    with pytest.raises(ValueError, match="scale: expected a positive finite value"):
        qf.attention(q, q, q, score="cosine", scale=torch.tensor(-1.0))
    out, _ = qf.attention(q, q, q, score="cosine", scale=torch.tensor([2.0], dtype=torch.float64))
    assert out.dtype == torch.float32


def _book_additive64(q, k, v, w_v, vl):
    """The book's formula in float64: w_v . tanh(q_i + k_j), masked softmax, weights @ v."""
    s = torch.tanh(q[:, :, None].double() + k[:, None].double()) @ w_v.double()
    keep = torch.arange(k.shape[1])[None, None, :] < vl[:, None, None]
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v.double()


@pytest.mark.parametrize("backend", ["reference", "chunked"])
@pytest.mark.parametrize("spread", [1.0, 30.0])
def test_additive_float32_against_the_float64_tanh_formula(backend, spread):
    # float32 additive scores go through w . tanh(x) = 2 w . sigmoid(2x) - sum(w) with autograd,
    # and the exp-ratio form 1 - 2 e^-2a / (e^-2a + e^2b) in the chunked forward (spread 1; out
    # of its range at spread 30: the sigmoid form): against the book's tanh in float64, on
    # inputs whose sums saturate tanh (spread 30) or do not, forward and gradients
    torch.manual_seed(int(spread))
    B, Lq, Lk, h, dv = 3, 23, 19, 11, 7
    q = (torch.randn(B, Lq, h) * spread).requires_grad_()
    k = (torch.randn(B, Lk, h) * spread).requires_grad_()
    v = torch.randn(B, Lk, dv, requires_grad=True)
    w_v = torch.randn(h, requires_grad=True)
    vl = torch.tensor([Lk, 5, 12])
    out, _ = qf.additive_attention(q, k, v, w_v, valid_lens=vl, backend=backend)
    q64, k64, v64, w64 = (t.detach().double().requires_grad_() for t in (q, k, v, w_v))
    ref = _book_additive64(q64, k64, v64, w64, vl)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=2e-5)
    go = torch.randn(out.shape, dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v, w_v), go.float())
    want = torch.autograd.grad(ref, (q64, k64, v64, w64), go)
    for name, a, b in zip("qkvw", got, want):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, msg=name)
