"""NaN and infinities in the inputs: one behaviour on every backend, never a silent zero.

The rule (``attention``'s docstring): a row whose own query, or whose sequence's keys or values
(masked positions included), hold a NaN or an infinity comes out NaN; a row that sees no key
comes out 0 whatever its inputs; every other row is what it is with finite inputs.
"""

from __future__ import annotations

import pytest
import torch

from qkv import functional as qf
from qkv.functional import scores

B, H, HKV, LQ, LK, D = 2, 4, 2, 6, 7, 5
NAN, INF = float("nan"), float("inf")
# (tensor, position (batch 0, head 0 for 4-D inputs), value): position is a query row or a key
BAD = {
    "nan_query": ("q", 1, NAN),
    "inf_query": ("q", 1, INF),
    "nan_key": ("k", 2, NAN),
    "+inf_key": ("k", 2, INF),
    "-inf_key": ("k", 2, -INF),
    "nan_value": ("v", 2, NAN),
}


def masks_for(kind: str, dtype) -> dict:
    """Masks under which some rows of batch 0 see no key and some rows cannot see key 2."""
    if kind == "none":
        return {}
    if kind == "causal":  # rows 0 and 1 cannot see key 2
        return {"is_causal": True}
    if kind == "valid_lens":  # row 3 sees no key, rows 0, 2, 4 not key 2; batch 1: only row 5
        lens = torch.tensor([[2, 5, 1, 0, 2, 7], [0, 0, 0, 0, 0, 3]])
        return {"valid_lens": lens}
    if kind == "padding_causal":  # key 2 of batch 0 is padding; batch 1 is padding throughout
        kpm = torch.zeros(B, LK, dtype=torch.bool)
        kpm[0, 2] = True
        kpm[1] = True
        return {"key_padding_mask": kpm, "is_causal": True}
    if kind == "float_mask":  # -inf forbids: row 0 sees no key, row 1 not key 2; biases elsewhere
        am = torch.randn(LQ, LK, dtype=dtype)
        am[0] = -INF
        am[1, 2] = -INF
        return {"attn_mask": am}
    raise AssertionError(kind)


def make(three: bool, dtype):
    if three:
        shapes = [(B, LQ, D), (B, LK, D), (B, LK, 3)]
    else:
        shapes = [(B, H, LQ, D), (B, HKV, LK, D), (B, HKV, LK, 3)]
    return [torch.randn(*s, dtype=dtype) for s in shapes]


def spoil(q, k, v, bad: str):
    name, pos, value = BAD[bad]
    q, k, v = q.clone(), k.clone(), v.clone()
    t = {"q": q, "k": k, "v": v}[name]
    row = t[0] if t.dim() == 3 else t[0, 0]
    row[pos, 0] = value
    return q, k, v


def expected_rows(q, k, v, dead):
    """The rule, in bools ``(B, H, Lq)`` (``(B, Lq)`` for 3-D): which rows must be NaN."""
    four = q.dim() == 4
    q4, k4, v4 = (t if four else t.unsqueeze(1) for t in (q, k, v))
    G = q4.shape[1] // k4.shape[1]
    bad_row = ~torch.isfinite(q4).all(-1)
    bad_seq = ~(torch.isfinite(k4).all(-1).all(-1) & torch.isfinite(v4).all(-1).all(-1))
    nan = (bad_row | bad_seq.repeat_interleave(G, dim=1).unsqueeze(-1)) & ~(
        dead if four else dead.unsqueeze(1)
    )
    return nan if four else nan.squeeze(1)


def runs(need_weights: bool):
    backends = ["auto", "reference"] if need_weights else ["auto", "fused", "reference", "chunked"]
    return [(b, need_weights) for b in backends]


@pytest.mark.parametrize("backend, need_weights", runs(False) + runs(True))
@pytest.mark.parametrize("mask", ["none", "causal", "valid_lens", "padding_causal", "float_mask"])
@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("dtype, three", [(torch.float32, False), (torch.float64, True)])
def test_nonfinite_inputs_give_nan_rows_on_every_backend(
    backend, need_weights, mask, bad, dtype, three
):
    torch.manual_seed(0)
    q, k, v = make(three, dtype)
    masks = masks_for(mask, dtype)
    clean_out, clean_w = qf.attention(q, k, v, need_weights=True, backend="reference", **masks)
    dead = (clean_w == 0).all(-1)  # rows that see no key
    bq, bk, bv = spoil(q, k, v, bad)
    out, w = qf.attention(bq, bk, bv, need_weights=need_weights, backend=backend, **masks)

    nan = expected_rows(bq, bk, bv, dead)
    assert nan.any()
    assert torch.isnan(out[nan]).all(), "a row whose inputs hold NaN/inf must be NaN"
    assert torch.equal(out[dead], torch.zeros_like(out[dead])), "a row with no key must be 0"
    rest = ~nan & ~dead
    assert torch.isfinite(out[rest]).all()
    torch.testing.assert_close(out[rest], clean_out[rest])
    if need_weights:
        assert torch.isnan(w[nan]).all()
        assert torch.equal(w[dead], torch.zeros_like(w[dead]))
        torch.testing.assert_close(w[rest], clean_w[rest])


@pytest.mark.parametrize("backend", ["auto", "fused", "reference", "chunked"])
def test_a_row_with_no_key_stays_zero_even_with_a_nan_query(backend):
    q, k, v = make(False, torch.float32)
    lens = torch.tensor([[2, 5, 1, 0, 2, 7], [1, 1, 1, 1, 1, 1]])
    q[0, :, 3] = NAN  # row 3 of batch 0 sees no key
    v[0, :, 6] = NAN  # and its sequence holds a NaN value
    out, _ = qf.attention(q, k, v, valid_lens=lens, backend=backend)
    assert torch.equal(out[0, :, 3], torch.zeros_like(out[0, :, 3]))
    assert torch.isnan(out[0, :, [0, 1, 2, 4, 5]]).all()
    assert torch.isfinite(out[1]).all()


def alibi(s, b, h, i, j):
    return s - 0.25 * (h + 1) * (i - j).abs()


def drop_scores(s, b, h, i, j):
    """A score_mod that does not read the scores: the NaN must come back all the same."""
    return torch.zeros_like(s).masked_fill(j > i, -INF)


@pytest.mark.parametrize("backend", ["auto", "reference", "chunked"])
@pytest.mark.parametrize("score", ["normalized", alibi, drop_scores])
@pytest.mark.parametrize("bad", ["nan_query", "+inf_key", "nan_value"])
def test_nonfinite_inputs_with_scores_the_fused_kernel_cannot_run(backend, score, bad):
    torch.manual_seed(0)
    q, k, v = spoil(*make(False, torch.float32), bad)
    lens = torch.tensor([[2, 5, 1, 0, 2, 7], [7, 7, 7, 7, 7, 7]])
    out, _ = qf.attention(q, k, v, valid_lens=lens, score=score, backend=backend)
    dead = torch.zeros(B, H, LQ, dtype=torch.bool)
    dead[0, :, 3] = True
    nan = expected_rows(q, k, v, dead)
    assert torch.isnan(out[nan]).all()
    assert torch.equal(out[dead], torch.zeros_like(out[dead]))
    assert torch.isfinite(out[~nan & ~dead]).all()


@pytest.mark.parametrize("backend", ["auto", "reference", "chunked"])
@pytest.mark.parametrize("bad", ["nan_query", "-inf_key", "nan_value"])
def test_additive_attention_follows_the_same_rule(backend, bad):
    torch.manual_seed(0)
    q, k, v = spoil(*make(True, torch.float64), bad)
    w_v = torch.randn(D, dtype=torch.float64)
    lens = torch.tensor([7, 0])  # batch 1 sees no key
    out, _ = qf.additive_attention(q, k, v, w_v, valid_lens=lens, backend=backend)
    dead = torch.zeros(B, LQ, dtype=torch.bool)
    dead[1] = True
    nan = expected_rows(q, k, v, dead)
    assert torch.isnan(out[nan]).all()
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.isfinite(out[~nan & ~dead]).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", ["auto", "reference", "chunked"])
def test_half_precision_keeps_its_dtype_and_the_rule(dtype, backend):
    q, k, v = spoil(*make(False, dtype), "nan_query")
    out, _ = qf.attention(q, k, v, is_causal=True, backend=backend)
    assert out.dtype == dtype
    assert torch.isnan(out[0, 0, 1]).all()
    assert torch.isfinite(out[0, 1:]).all() and torch.isfinite(out[1]).all()


def test_large_finite_inputs_are_not_taken_for_infinite():
    q, k, v = make(False, torch.float32)
    out, _ = qf.attention(q * 1e20, k * 1e-20, v * 1e25, backend="reference")
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("backend", ["fused", "reference", "chunked"])
def test_backward_runs_and_leaves_the_other_sequences_finite(backend):
    q, k, v = (t.requires_grad_() for t in spoil(*make(False, torch.float32), "nan_query"))
    out, _ = qf.attention(q, k, v, is_causal=True, backend=backend)
    out.sum().backward()
    assert torch.isnan(out[0, 0, 1]).all()
    # the other batch element's gradients are untouched by batch 0's NaN
    assert torch.isfinite(q.grad[1]).all() and torch.isfinite(k.grad[1]).all()


@pytest.mark.parametrize("backend", ["auto", "fused", "reference", "chunked"])
def test_without_a_cheap_sync_finite_inputs_give_the_same_output(backend, monkeypatch):
    """On a GPU the check adds a zero tensor instead of reading a sum back: same results."""
    torch.manual_seed(0)
    q, k, v = make(False, torch.float64)
    masks = masks_for("valid_lens", torch.float64)
    synced, _ = qf.attention(q, k, v, backend=backend, **masks)
    monkeypatch.setattr(scores, "SYNC_FREE", frozenset())
    assert scores.nonfinite_rows(q, k, v) is not None
    unsynced, _ = qf.attention(q, k, v, backend=backend, **masks)
    assert torch.equal(unsynced, synced)


@pytest.mark.parametrize("need_weights", [False, True])
def test_keys_every_query_masks_count_too(need_weights):
    """Trailing keys masked in the whole batch are dropped before a backend runs (without
    weights): a NaN there still makes the rows NaN, as with the weights asked for."""
    q, k, v = make(False, torch.float32)
    v[0, 1, 6] = NAN  # key 6 is padding for every sentence
    out, _ = qf.attention(q, k, v, valid_lens=torch.tensor([5, 6]), need_weights=need_weights)
    assert torch.isnan(out[0, 2:]).all()  # query heads 2 and 3 read key/value head 1
    assert torch.isfinite(out[0, :2]).all() and torch.isfinite(out[1]).all()
