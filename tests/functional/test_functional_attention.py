"""qkv.functional.attention against a float64 reference written from the formula."""

from __future__ import annotations

import math

import pytest
import torch
from _reference import reference_attention
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qkv import functional as qf

SCORES = ["scaled_dot", "dot", "cosine", "normalized", "length_scaled"]


def alibi(s, b, h, i, j):
    return s - 0.25 * (h + 1) * (i - j).abs()


def make(B=2, H=3, Lq=5, Lk=7, d=4, dv=6, Hk=None, dtype=torch.float32, three=False):
    Hk = H if Hk is None else Hk
    if three:
        return (
            torch.randn(B, Lq, d, dtype=dtype),
            torch.randn(B, Lk, d, dtype=dtype),
            torch.randn(B, Lk, dv, dtype=dtype),
        )
    return (
        torch.randn(B, H, Lq, d, dtype=dtype),
        torch.randn(B, Hk, Lk, d, dtype=dtype),
        torch.randn(B, Hk, Lk, dv, dtype=dtype),
    )


def random_masks(g: torch.Generator, B, H, Lq, Lk, kinds, float_masks=False):
    kw = {}
    if "valid_lens" in kinds:
        kw["valid_lens"] = torch.randint(0, Lk + 1, (B,), generator=g)
    if "valid_lens2" in kinds:
        kw["valid_lens"] = torch.randint(0, Lk + 1, (B, Lq), generator=g)
    if "kpm" in kinds:
        kpm = torch.rand(B, Lk, generator=g) < 0.3
        if float_masks:
            kpm = torch.zeros(B, Lk).masked_fill(kpm, float("-inf"))
        kw["key_padding_mask"] = kpm
    if "attn_mask" in kinds:
        shape = [(Lq, Lk), (B, Lq, Lk), (1, H, Lq, Lk), (B, 1, Lq, Lk)][
            int(torch.randint(0, 4, (1,), generator=g))
        ]
        am = torch.rand(*shape, generator=g) < 0.25
        if float_masks:
            am = torch.randn(*shape, generator=g).masked_fill(am, float("-inf"))
        kw["attn_mask"] = am
    if "causal" in kinds:
        kw["is_causal"] = True
    if "window" in kinds:
        kw["window"] = int(torch.randint(1, 4, (1,), generator=g))
    return kw


# ------------------------------------------------------------------ exactness vs reference
@pytest.mark.parametrize("score", [*SCORES, alibi])
@pytest.mark.parametrize("three", [False, True])
def test_matches_float64_reference_every_score(score, three):
    q, k, v = make(B=3, H=2, Lq=7, Lk=11, d=5, dv=3, dtype=torch.float64, three=three)
    g = torch.Generator().manual_seed(7)
    masks = random_masks(g, 3, 2, 7, 11, {"valid_lens2", "kpm", "causal"})
    out, w = qf.attention(q, k, v, score=score, need_weights=True, **masks)
    ref_out, ref_w = reference_attention(q, k, v, score=score, **masks)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w, ref_w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("scale", [0.1, 2.0])
@pytest.mark.parametrize("score", SCORES)
def test_scale_overrides_default(score, scale):
    q, k, v = make(dtype=torch.float64)
    out, _ = qf.attention(q, k, v, score=score, scale=scale)
    ref, _ = reference_attention(q, k, v, score=score, scale=scale)
    torch.testing.assert_close(out, ref)


def test_length_scaled_and_dot_formulas():
    q, k, v = make(d=9, Lk=16, dtype=torch.float64)
    _, w_len = qf.attention(q, k, v, score="length_scaled", need_weights=True)
    _, w_dot = qf.attention(q, k, v, score="dot", scale=1 / (3 * 4), need_weights=True)
    torch.testing.assert_close(w_len, w_dot)  # 1/(sqrt(9) sqrt(16))


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    B=st.integers(1, 3),
    Hk=st.integers(1, 2),
    G=st.integers(1, 3),
    Lq=st.integers(1, 9),
    Lk=st.integers(1, 9),
    d=st.integers(1, 8),
    dv=st.integers(1, 5),
    kinds=st.sets(
        st.sampled_from(["valid_lens", "valid_lens2", "kpm", "attn_mask", "causal", "window"])
    ),
    float_masks=st.booleans(),
    score=st.sampled_from(SCORES),
    seed=st.integers(0, 2**31 - 1),
)
def test_properties_random_shapes_and_masks(
    B, Hk, G, Lq, Lk, d, dv, kinds, float_masks, score, seed
):
    if "valid_lens" in kinds and "valid_lens2" in kinds:
        kinds = kinds - {"valid_lens"}
    H = Hk * G
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Lq, d, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hk, Lk, d, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hk, Lk, dv, generator=g, dtype=torch.float64)
    masks = random_masks(g, B, H, Lq, Lk, kinds, float_masks)
    out, w = qf.attention(q, k, v, score=score, need_weights=True, **masks)
    ref_out, ref_w = reference_attention(q, k, v, score=score, **masks)
    # rows sum to 1, or to 0 exactly when the query may see nothing
    sums = w.sum(-1)
    dead = ref_w.sum(-1) == 0
    assert torch.all(torch.isclose(sums[~dead], torch.ones(()).double()))
    assert torch.all(sums[dead] == 0)
    # forbidden positions get exactly zero weight
    assert torch.all(w[ref_w == 0] == 0)
    # output is weights @ value (grouped heads expanded)
    vv = v.repeat_interleave(G, dim=1)
    torch.testing.assert_close(out, w @ vv)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)
    assert torch.isfinite(out).all()
    # the fused backend (when it applies) agrees in float32
    if score != "normalized":
        o32, _ = qf.attention(q.float(), k.float(), v.float(), score=score, **masks)
        torch.testing.assert_close(o32.double(), ref_out, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ backends
@pytest.mark.parametrize("score", [s for s in SCORES if s != "normalized"])
@pytest.mark.parametrize(
    "kinds",
    [
        set(),
        {"causal"},
        {"kpm"},
        {"valid_lens"},
        {"valid_lens2", "attn_mask"},
        {"kpm", "causal", "attn_mask"},
        {"window"},
    ],
)
@pytest.mark.parametrize("float_masks", [False, True])
def test_fused_and_reference_agree_float32(score, kinds, float_masks):
    B, H, Lq, Lk = 3, 4, 13, 17
    q, k, v = make(B=B, H=H, Lq=Lq, Lk=Lk, d=24, dv=20, Hk=2)
    g = torch.Generator().manual_seed(11)
    masks = random_masks(g, B, H, Lq, Lk, kinds, float_masks)
    assert qf.explain(q, k, v, score=score, **masks).backend == "fused"
    of, _ = qf.attention(q, k, v, score=score, backend="fused", **masks)
    orf, _ = qf.attention(q, k, v, score=score, backend="reference", **masks)
    torch.testing.assert_close(of, orf, rtol=1e-5, atol=1e-5)


def test_explain_reasons():
    q, k, v = make()
    assert qf.explain(q, k, v).backend == "fused"
    c = qf.explain(q, k, v, need_weights=True)
    assert c.backend == "reference" and "need_weights" in c.reasons[0]
    assert "normalized" in str(qf.explain(q, k, v, score="normalized"))
    assert "score_mod" in str(qf.explain(q, k, v, score=alibi))
    assert qf.explain(q, k, v, backend="reference").backend == "reference"
    with pytest.raises(ValueError, match="backend: 'fused' cannot run"):
        qf.attention(q, k, v, need_weights=True, backend="fused")
    with pytest.raises(ValueError, match="backend"):
        qf.attention(q, k, v, backend="flash9")


# ------------------------------------------------------------------ dead rows, dtypes, grads
@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_dtypes_and_dead_rows(backend, dtype):
    q, k, v = make(B=2, H=2, Lq=6, Lk=5, d=8, dv=4, dtype=dtype)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[1] = True  # batch 1 sees nothing
    vl = torch.tensor([[0, 1, 2, 3, 4, 5], [5] * 6])
    try:
        out, _ = qf.attention(q, k, v, key_padding_mask=kpm, valid_lens=vl, backend=backend)
    except RuntimeError as e:  # pragma: no cover - a dtype torch lacks on this device
        pytest.skip(f"{dtype} unsupported by torch here: {e}")
    assert out.dtype == dtype
    assert torch.all(out[1] == 0) and torch.all(out[0, :, 0] == 0)
    ref, _ = reference_attention(
        q.detach(), k.detach(), v.detach(), key_padding_mask=kpm, valid_lens=vl
    )
    tol = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 3e-3}
    torch.testing.assert_close(out.double(), ref, rtol=tol[dtype], atol=tol[dtype])
    out.float().square().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.all(q.grad[1] == 0)


@pytest.mark.parametrize("score", [*SCORES, alibi])
@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_gradcheck_float64(score, backend):
    if backend == "fused" and (score == "normalized" or callable(score)):
        pytest.skip("the fused kernel does not run this score")
    q, k, v = make(B=2, H=2, Lq=4, Lk=5, d=3, dv=2, dtype=torch.float64)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    vl = torch.tensor([[1, 0, 3, 5], [2, 2, 5, 4]])  # one dead row
    am = torch.randn(4, 5, dtype=torch.float64)

    def f(q, k, v):
        return qf.attention(q, k, v, valid_lens=vl, attn_mask=am, score=score, backend=backend)[0]

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_gradcheck_learned_temperature():
    q, k, v = make(B=1, H=2, Lq=3, Lk=4, d=3, dv=2, dtype=torch.float64)
    t = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda t: qf.attention(q, k, v, score="cosine", scale=t)[0], (t,)
    )


def test_dropout_applies_and_weights_match_output():
    q, k, v = make(B=2, H=2, Lq=16, Lk=32, d=8, dv=8, dtype=torch.float64)
    out, w = qf.attention(q, k, v, dropout_p=0.5, need_weights=True)
    zeros = (w == 0).double().mean()
    assert 0.35 < zeros < 0.65
    torch.testing.assert_close(out, w @ v)
    # surviving weights are scaled by 1/(1-p)
    _, w0 = qf.attention(q, k, v, need_weights=True)
    torch.testing.assert_close(w[w != 0], 2 * w0[w != 0])
    o1, _ = qf.attention(q.float(), k.float(), v.float(), dropout_p=0.3)
    o2, _ = qf.attention(q.float(), k.float(), v.float(), dropout_p=0.3)
    assert not torch.equal(o1, o2)


def test_gqa_does_not_copy_and_matches_repeat():
    q, k, v = make(B=2, H=6, Hk=2, Lq=5, Lk=7, d=4, dv=3, dtype=torch.float64)
    out, w = qf.attention(q, k, v, need_weights=True, backend="reference")
    out_rep, w_rep = qf.attention(
        q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), need_weights=True
    )
    torch.testing.assert_close(out, out_rep)
    torch.testing.assert_close(w, w_rep)


def test_inputs_not_modified():
    q, k, v = make(dtype=torch.float64)
    kpm = torch.rand(2, 7) < 0.3
    am = torch.randn(5, 7, dtype=torch.float64)
    vl = torch.tensor([3, 6])
    before = [t.clone() for t in (q, k, v, kpm, am, vl)]
    for backend in ("fused", "reference"):
        qf.attention(q, k, v, key_padding_mask=kpm, attn_mask=am, valid_lens=vl, backend=backend)
    for score in SCORES:
        qf.attention(q, k, v, key_padding_mask=kpm, score=score, need_weights=True)
    X = torch.randn(2, 3, 7)
    X0 = X.clone()
    qf.masked_softmax(X, torch.tensor([2, 0]))
    for a, b in zip((q, k, v, kpm, am, vl, X), (*before, X0)):
        assert torch.equal(a, b)


def test_causal_top_left_with_unequal_lengths():
    for Lq, Lk in ((6, 3), (3, 6)):
        q, k, v = make(Lq=Lq, Lk=Lk, dtype=torch.float64)
        for backend in ("fused", "reference"):
            out, _ = qf.attention(q, k, v, is_causal=True, backend=backend)
            ref, _ = reference_attention(q, k, v, is_causal=True)
            torch.testing.assert_close(out, ref)


def test_empty_keys_give_zeros():
    q, k, v = make(Lk=0, dtype=torch.float64)
    out, w = qf.attention(q, k, v, need_weights=True)
    assert out.shape == (2, 3, 5, 6) and torch.all(out == 0) and w.shape == (2, 3, 5, 0)


def test_seed001_cat_milk_example():
    # seed 001: Q = K = V = (cat, milk, it, sweet) with d = 4 ("..." = 0)
    E = torch.tensor([[2, 2], [1, 3], [2, 2], [0, 4]], dtype=torch.float64)
    X = torch.nn.functional.pad(E, (1, 1))[None]  # (1, 4, 4)
    out, w = qf.attention(X, X, X, need_weights=True)
    S = E @ E.T
    assert S.tolist() == [[8, 8, 8, 8], [8, 10, 8, 12], [8, 8, 8, 8], [8, 12, 8, 16]]
    expect_w = torch.softmax(S / 2, -1)
    torch.testing.assert_close(w[0], expect_w)
    torch.testing.assert_close(out[0, :, 1:3], expect_w @ E)
    assert math.isclose(out[0, 0, 1].item(), 1.25, rel_tol=1e-12)
