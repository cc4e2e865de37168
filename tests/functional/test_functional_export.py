"""The export backend of qkv.functional.attention: tensor operations only, the same answers.

It is what ``torch.export``, the ONNX exporter and ``torch.compile`` run (taken by itself under
``torch.compiler.is_compiling()``) and what ``backend="export"`` asks for.  Checked here: the
float64 formula of tests/_reference.py on odd sizes for every mask kind and score kind, rows with
no key at 0, the NaN rule, no host sync at all (a TorchFunctionMode refuses every one), what
``explain`` says, and a real ``torch.export`` of a call with masks and dynamic sizes.
"""

from __future__ import annotations

import pytest
import torch
from _reference import reference_attention
from torch.overrides import TorchFunctionMode

import qkv.functional as qf
from qkv.functional import scores

B, H, LQ, LK, D = 3, 2, 7, 11, 5  # odd sizes


def _qkv(seed: int, hkv: int = H, lq: int = LQ, lk: int = LK):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, lq, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, hkv, lk, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, hkv, lk, D + 2, generator=g, dtype=torch.float64)
    return q, k, v


def _masks(g: torch.Generator) -> dict[str, dict]:
    """Every mask kind, alone and combined, each with a row that sees no key."""
    lens = torch.tensor([LK, 4, 0])  # batch element 2 sees nothing
    per_query = torch.randint(0, LK + 1, (B, LQ), generator=g)
    per_query[1, 2] = 0
    kpm = torch.rand(B, LK, generator=g) < 0.3
    kpm[2] = True
    kpm_float = torch.zeros(B, LK, dtype=torch.float64).masked_fill(kpm, float("-inf"))
    kpm_float[0, 1] = 0.5
    am = torch.rand(LQ, LK, generator=g) < 0.3
    am[3] = True
    am3 = torch.rand(B, LQ, LK, generator=g) < 0.3
    am3[0, 1] = True
    am4 = torch.rand(B, H, LQ, LK, generator=g) < 0.3
    am4[1, 0, 2] = True
    am_float = torch.randn(LQ, LK, generator=g, dtype=torch.float64)
    am_float[5] = float("-inf")
    return {
        "none": {},
        "valid_lens": {"valid_lens": lens},
        "valid_lens_per_query": {"valid_lens": per_query},
        "valid_lens_causal_form": {"valid_lens": torch.arange(1, LQ + 1).expand(B, LQ)},
        "key_padding_mask": {"key_padding_mask": kpm},
        "key_padding_mask_float": {"key_padding_mask": kpm_float},
        "attn_mask_2d": {"attn_mask": am},
        "attn_mask_3d": {"attn_mask": am3},
        "attn_mask_4d": {"attn_mask": am4},
        "attn_mask_float": {"attn_mask": am_float},
        "is_causal": {"is_causal": True},
        "window": {"window": 3},
        "combined": {
            "valid_lens": per_query,
            "key_padding_mask": kpm,
            "attn_mask": am_float,
            "is_causal": True,
        },
    }


MASK_NAMES = list(_masks(torch.Generator()))


def _dead_rows(masks: dict) -> torch.Tensor:
    """(B, H, Lq) True where the reference's weights are all zero (a row with no key)."""
    q, k, v = _qkv(0)
    _, w = reference_attention(q, k, v, **masks)
    return w.sum(-1) == 0


@pytest.mark.parametrize("name", MASK_NAMES)
@pytest.mark.parametrize("hkv", [H, 1], ids=["mha", "gqa"])
def test_export_backend_equals_the_float64_formula_for_every_mask_kind(name, hkv):
    masks = _masks(torch.Generator().manual_seed(7))[name]
    q, k, v = _qkv(1, hkv)
    ref, ref_w = reference_attention(q, k, v, **masks)
    out, w = qf.attention(q, k, v, backend="export", **masks)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    assert w is None
    out_w, w = qf.attention(q, k, v, backend="export", need_weights=True, **masks)
    torch.testing.assert_close(out_w, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w, ref_w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", [n for n in MASK_NAMES if n != "none"])
def test_export_backend_gives_zero_for_a_row_with_no_key_forward_and_backward(name):
    masks = _masks(torch.Generator().manual_seed(7))[name]
    dead = _dead_rows(masks)
    if not dead.any():
        pytest.skip("this mask leaves every row a key")
    q, k, v = (t.requires_grad_() for t in _qkv(2))
    out, _ = qf.attention(q, k, v, backend="export", **masks)
    assert (out[dead] == 0).all()
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[dead] == 0).all()


@pytest.mark.parametrize("score", [*qf.SCORES, "score_mod"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_export_backend_runs_every_score_kind(score, need_weights):
    def alibi(s, b, h, i, j):
        return s - 0.25 * (i - j).abs()

    fn = alibi if score == "score_mod" else score
    masks = _masks(torch.Generator().manual_seed(3))["combined"]
    q, k, v = _qkv(4)
    ref, ref_w = reference_attention(q, k, v, score=fn, scale=0.7, **masks)
    out, w = qf.attention(
        q, k, v, score=fn, scale=0.7, backend="export", need_weights=need_weights, **masks
    )
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    if need_weights:
        torch.testing.assert_close(w, ref_w, rtol=1e-10, atol=1e-12)


def test_export_backend_takes_a_tensor_scale_and_additive_attention():
    q, k, v = _qkv(5)
    temp = torch.tensor(0.6, dtype=torch.float64)
    ref, _ = reference_attention(q, k, v, scale=0.6, valid_lens=torch.tensor([3, 0, 11]))
    out, _ = qf.attention(
        q, k, v, scale=temp, backend="export", valid_lens=torch.tensor([3, 0, 11])
    )
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    g = torch.Generator().manual_seed(6)
    qa, ka = torch.randn(B, LQ, 4, generator=g), torch.randn(B, LK, 4, generator=g)
    va, w_v = torch.randn(B, LK, 3, generator=g), torch.randn(4, generator=g)
    lens = torch.tensor([2, 0, 9])
    want, want_w = qf.additive_attention(qa, ka, va, w_v, valid_lens=lens, need_weights=True)
    got, got_w = qf.additive_attention(
        qa, ka, va, w_v, valid_lens=lens, backend="export", need_weights=True
    )
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_w, want_w)


@pytest.mark.parametrize("name", ["none", "valid_lens", "key_padding_mask_float", "combined"])
def test_export_backend_keeps_the_nan_rule(name):
    """A row whose query, or whose sequence's keys or values, hold a NaN or an infinity comes
    out NaN (masked positions included), unless it sees no key (then 0, whatever its inputs);
    the other rows are untouched."""
    masks = _masks(torch.Generator().manual_seed(7))[name]
    q, k, v = _qkv(8)
    clean, _ = reference_attention(q, k, v, **masks)
    q[0, 1, 2, 0] = float("nan")  # one query row
    k[1, :, LK - 1, 3] = float("inf")  # a (maybe masked) key of batch element 1
    for need_weights in (False, True):
        out, w = qf.attention(q, k, v, backend="export", need_weights=need_weights, **masks)
        nan = torch.zeros(B, H, LQ, dtype=torch.bool)
        nan[0, 1, 2] = True
        nan[1] = True
        nan &= ~_dead_rows(masks)
        assert out[nan].isnan().all()
        torch.testing.assert_close(out[~nan], clean[~nan], rtol=1e-10, atol=1e-12)
        if need_weights:
            assert w[nan].isnan().all()
        # the same answer as the other backends
        same, _ = qf.attention(q, k, v, backend="reference", **masks)
        torch.testing.assert_close(out, same, rtol=1e-10, atol=1e-12, equal_nan=True)


_SYNCS = {
    torch.Tensor.item,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
    torch.Tensor.tolist,
    torch.Tensor.nonzero,
    torch.nonzero,
    torch.equal,
}


class _NoHostSync(TorchFunctionMode):
    """Fails on every call that reads a tensor's value back to Python."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _SYNCS:
            raise AssertionError(f"host sync: {getattr(func, '__name__', func)}")
        return func(*args, **(kwargs or {}))


def test_the_no_host_sync_guard_catches_the_other_backends():
    masks = _masks(torch.Generator().manual_seed(7))["valid_lens"]
    q, k, v = _qkv(9)
    with _NoHostSync(), pytest.raises(AssertionError, match="host sync"):
        qf.attention(q, k, v, **masks)


@pytest.mark.parametrize("name", MASK_NAMES)
@pytest.mark.parametrize("need_weights", [False, True])
def test_export_backend_reads_nothing_back_to_the_host(name, need_weights):
    masks = _masks(torch.Generator().manual_seed(7))[name]
    q, k, v = _qkv(10)
    with _NoHostSync():
        qf.attention(q, k, v, backend="export", need_weights=need_weights, **masks)
        qf.attention(q, k, v, backend="export", score="normalized", **masks)
        qf.explain(q, k, v, backend="export", **masks)


def test_explain_reports_the_export_backend_and_what_it_runs(monkeypatch):
    q, k, v = _qkv(11)
    lens = torch.tensor([3, 0, 11])
    fused = qf.explain(q, k, v, valid_lens=lens, backend="export")
    assert fused.backend == "export"
    assert "requested by the caller" in fused.reasons
    assert "runs scaled_dot_product_attention" in str(fused)
    weights = qf.explain(q, k, v, valid_lens=lens, backend="export", need_weights=True)
    assert "materialises the scores" in str(weights) and "need_weights=True" in str(weights)
    normalized = qf.explain(q, k, v, backend="export", score="normalized")
    assert scores.SCORE_KINDS["normalized"].not_fused in normalized.reasons
    # under torch.export / torch.compile every call takes it, whatever backend "auto" would
    assert qf.explain(q, k, v, valid_lens=lens).backend != "export"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    auto = qf.explain(q, k, v, valid_lens=lens)
    assert auto.backend == "export"
    assert any("is_compiling" in r for r in auto.reasons)
    forced = qf.explain(q, k, v, valid_lens=lens, backend="chunked")
    assert forced.backend == "export" and "backend='chunked'" in str(forced)


def test_a_bad_backend_is_still_refused_by_name():
    q, k, v = _qkv(12)
    with pytest.raises(ValueError, match=r"backend: expected 'auto' or one of .*'export'"):
        qf.attention(q, k, v, backend="exprot")


class _Masked(torch.nn.Module):
    def forward(self, q, k, v, lens, kpm):
        return qf.attention(q, k, v, valid_lens=lens, key_padding_mask=kpm, is_causal=True)[0]


def test_torch_export_of_a_masked_call_with_dynamic_sizes_equals_eager():
    from torch.export import Dim

    q, k, v = (t.float() for t in _qkv(13, lq=LK))
    lens = torch.tensor([LK, 4, 0])
    kpm = torch.zeros(B, LK, dtype=torch.bool)
    kpm[1, 2] = True
    b, n = Dim("b", min=1, max=64), Dim("n", min=2, max=512)
    ep = torch.export.export(
        _Masked(),
        (q, k, v, lens, kpm),
        dynamic_shapes={
            "q": {0: b, 2: n},
            "k": {0: b, 2: n},
            "v": {0: b, 2: n},
            "lens": {0: b},
            "kpm": {0: b, 1: n},
        },
    )
    g = torch.Generator().manual_seed(14)
    q2, k2 = torch.randn(5, H, 9, D, generator=g), torch.randn(5, H, 9, D, generator=g)
    v2 = torch.randn(5, H, 9, D + 2, generator=g)
    lens2 = torch.tensor([9, 0, 1, 5, 7])
    kpm2 = torch.rand(5, 9, generator=g) < 0.3
    want = qf.attention(q2, k2, v2, valid_lens=lens2, key_padding_mask=kpm2, is_causal=True)[0]
    torch.testing.assert_close(ep.module()(q2, k2, v2, lens2, kpm2), want)


def _additive_inputs(seed: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    qa, ka = torch.randn(B, LQ, 4, generator=g, dtype=dtype), torch.randn(B, LK, 4, generator=g)
    va, w_v = torch.randn(B, LK, 3, generator=g), torch.randn(4, generator=g)
    return qa, ka.to(dtype), va.to(dtype), w_v.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_export_backend_additive_reads_nothing_back_without_grad(dtype):
    # without autograd, eager additive scores check their range on the host (the exp-ratio
    # form); the export backend must not
    qa, ka, va, w_v = _additive_inputs(15, dtype)
    lens = torch.tensor([2, 0, 9])
    want, _ = qf.additive_attention(qa, ka, va, w_v, valid_lens=lens, backend="reference")
    with torch.no_grad(), _NoHostSync():
        got, w = qf.additive_attention(
            qa, ka, va, w_v, valid_lens=lens, backend="export", need_weights=True
        )
    torch.testing.assert_close(got, want.detach())
    assert w is not None and torch.isfinite(w).all()


class _Additive(torch.nn.Module):
    def forward(self, q, k, v, w_v, lens):
        return qf.additive_attention(q, k, v, w_v, valid_lens=lens)[0]


@pytest.mark.parametrize("strict", [False, True])
def test_torch_export_of_additive_attention_without_grad_equals_eager(strict):
    qa, ka, va, w_v = _additive_inputs(16)
    lens = torch.tensor([LK, 4, 0])
    with torch.no_grad():
        ep = torch.export.export(_Additive(), (qa, ka, va, w_v, lens), strict=strict)
        want = _Additive()(qa, ka, va, w_v, lens)
    torch.testing.assert_close(ep.module()(qa, ka, va, w_v, lens), want)
