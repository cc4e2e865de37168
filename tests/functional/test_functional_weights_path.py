"""The weights path (``need_weights=True``): trailing keys every query masks come back as zero
columns without being computed, and large inference problems run one sequence and a few heads
at a time.  Both must give exactly what the formula gives, for every mask, score and layout."""

from __future__ import annotations

import sys

import pytest
import torch
from _reference import reference_attention

from qkv import functional as qf
from qkv.nn import MultiheadAttention

attention_mod = sys.modules[
    "qkv.functional.attention"
]  # the module (the package exports a function)


def alibi(s, b, h, i, j):
    return s - 0.25 * (i - j).abs() / (h + 1)


def _masks(kind: str, B: int, H: int, Lq: int, Lk: int) -> dict:
    g = torch.Generator().manual_seed(7)
    pad = torch.zeros(B, Lk, dtype=torch.bool)
    pad[:, Lk - 5 :] = True  # padding shared by the batch: trimmed
    pad[1, Lk - 9 :] = True
    if kind == "none":
        return {}
    if kind == "shared padding":
        return {"key_padding_mask": pad}
    if kind == "float padding":
        return {"key_padding_mask": torch.zeros(B, Lk).masked_fill(pad, float("-inf"))}
    if kind == "lengths per query":
        return {"valid_lens": torch.randint(0, Lk - 3, (B, Lq), generator=g)}
    if kind == "per-head mask + padding":
        return {
            "attn_mask": torch.rand(B, H, Lq, Lk, generator=g) < 0.3,
            "key_padding_mask": pad,
        }
    if kind == "causal + lengths":
        return {"is_causal": True, "valid_lens": torch.tensor([Lk - 2, 3, Lk - 6])[:B]}
    if kind == "window":
        return {"window": 4}
    raise AssertionError(kind)


MASKS = [
    "none",
    "shared padding",
    "float padding",
    "lengths per query",
    "per-head mask + padding",
    "causal + lengths",
    "window",
]


@pytest.fixture
def sliced(monkeypatch):
    """Every problem runs in slices of one key/value head group; counts the sliced calls."""
    calls = []
    real = attention_mod._reference_sliced

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention_mod, "_SLICED_ABOVE", 0)
    monkeypatch.setattr(attention_mod, "_SLICE_ELEMENTS", 1)
    monkeypatch.setattr(attention_mod, "_reference_sliced", spy)
    return calls


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("score", ["scaled_dot", "normalized", "cosine"])
@pytest.mark.parametrize("Hkv", [6, 2])
def test_sliced_weights_match_the_formula(sliced, mask, score, Hkv):
    torch.manual_seed(3)
    B, H, Lq, Lk, d = 3, 6, 11, 17, 5
    q = torch.randn(B, H, Lq, d)
    k, v = torch.randn(B, Hkv, Lk, d), torch.randn(B, Hkv, Lk, 7)
    masks = _masks(mask, B, H, Lq, Lk)
    with torch.no_grad():
        out, w = qf.attention(q, k, v, score=score, need_weights=True, **masks)
    assert sliced, "the sliced path was not taken"
    ref_out, ref_w = reference_attention(q, k, v, score=score, **masks)
    assert w.shape == (B, H, Lq, Lk)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.double(), ref_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask", ["none", "per-head mask + padding"])
def test_a_score_mod_runs_in_one_piece(sliced, mask):
    # a score_mod reads absolute batch and head indices: never sliced, and exact
    torch.manual_seed(3)
    q, k, v = torch.randn(3, 6, 11, 5), torch.randn(3, 2, 17, 5), torch.randn(3, 2, 17, 7)
    masks = _masks(mask, 3, 6, 11, 17)
    with torch.no_grad():
        out, w = qf.attention(q, k, v, score=alibi, need_weights=True, **masks)
    assert not sliced
    ref_out, ref_w = reference_attention(q, k, v, score=alibi, **masks)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.double(), ref_w, rtol=1e-5, atol=1e-6)


def test_sliced_equals_one_piece_bit_for_bit_on_3d_inputs(sliced, monkeypatch):
    torch.manual_seed(4)
    q, k, v = torch.randn(5, 9, 8), torch.randn(5, 13, 8), torch.randn(5, 13, 3)
    vl = torch.tensor([13, 0, 4, 7, 13])  # a sequence that sees no key
    with torch.no_grad():
        out, w = qf.attention(q, k, v, valid_lens=vl, need_weights=True)
    assert sliced
    monkeypatch.setattr(attention_mod, "_SLICED_ABOVE", 1 << 40)
    with torch.no_grad():
        out1, w1 = qf.attention(q, k, v, valid_lens=vl, need_weights=True)
    assert len(sliced) == 1
    assert torch.equal(out, out1) and torch.equal(w, w1)
    assert (w[1] == 0).all() and (out[1] == 0).all()


def test_sliced_keeps_the_nan_rule(sliced):
    # an infinity in sequence 1's keys makes its rows NaN (weights too); the others are exact
    torch.manual_seed(5)
    q, k, v = torch.randn(3, 4, 6, 8), torch.randn(3, 4, 9, 8), torch.randn(3, 4, 9, 8)
    k[1, 2, 3, 0] = float("inf")
    with torch.no_grad():
        out, w = qf.attention(q, k, v, need_weights=True)
    assert sliced
    assert out[1, 2].isnan().all() and w[1, 2].isnan().all()
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[1, 2] = False
    ref_out, ref_w = reference_attention(q, k.nan_to_num(posinf=0.0), v)
    torch.testing.assert_close(out[keep].double(), ref_out[keep], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w[keep].double(), ref_w[keep], rtol=1e-5, atol=1e-6)


def test_autograd_and_dropout_run_in_one_piece(sliced):
    torch.manual_seed(6)
    q = torch.randn(2, 3, 5, 4, requires_grad=True)
    k, v = torch.randn(2, 3, 7, 4), torch.randn(2, 3, 7, 4)
    out, w = qf.attention(q, k, v, need_weights=True)
    (out.sum() + w.square().sum()).backward()
    with torch.no_grad():
        qf.attention(q, k, v, need_weights=True, dropout_p=0.5)
    assert not sliced
    q64 = q.detach().double().requires_grad_()
    ref_out, ref_w = reference_attention(q64, k, v)
    (ref_out.sum() + ref_w.square().sum()).backward()
    torch.testing.assert_close(q.grad.double(), q64.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask", ["shared padding", "float padding", "causal + lengths"])
def test_trimmed_keys_come_back_as_zero_columns(mask):
    # keys every query masks are not computed, and their weights are exactly 0
    torch.manual_seed(8)
    B, H, Lq, Lk = 3, 2, 7, 19
    q, k, v = torch.randn(B, H, Lq, 6), torch.randn(B, H, Lk, 6), torch.randn(B, H, Lk, 6)
    masks = _masks(mask, B, H, Lq, Lk)
    out, w = qf.attention(q, k, v, need_weights=True, **masks)
    ref_out, ref_w = reference_attention(q, k, v, **masks)
    assert w.shape == (B, H, Lq, Lk)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.double(), ref_w, rtol=1e-5, atol=1e-6)
    dead_cols = ref_w.sum((0, 1, 2)) == 0
    assert dead_cols.any() and (w[..., dead_cols] == 0).all()


def test_trimming_is_counted_in_the_memory_budget():
    # the weights returned have every key: their size is part of what the budget must hold
    q, k, v = torch.randn(1, 1, 64, 8), torch.randn(1, 1, 64, 8), torch.randn(1, 1, 64, 8)
    pad = torch.zeros(1, 64, dtype=torch.bool)
    pad[:, 1:] = True  # one key left: the computation alone would be tiny
    full = 64 * 64 * 4
    with pytest.raises(qf.AttentionMemoryError, match="need_weights=True"):
        qf.attention(q, k, v, key_padding_mask=pad, need_weights=True, memory_budget=full - 1)
    _, w = qf.attention(q, k, v, key_padding_mask=pad, need_weights=True, memory_budget=2 * full)
    assert w.shape == (1, 1, 64, 64) and torch.equal(w[..., 0], torch.ones(1, 1, 64))


@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
def test_mha_weights_with_shared_padding_match_torch(average, batch_first):
    # qkv's module projects only the keys some query sees, and gives the weights of all
    torch.manual_seed(9)
    E, H, B, L = 12, 3, 4, 10
    peer = torch.nn.MultiheadAttention(E, H, batch_first=batch_first).eval()
    ours = MultiheadAttention(E, H, batch_first=batch_first).eval()
    ours.load_state_dict(peer.state_dict())
    x = torch.randn(B, L, E) if batch_first else torch.randn(L, B, E)
    kpm = torch.zeros(B, L, dtype=torch.bool)
    kpm[:, 6:] = True
    kpm[2, 4:] = True
    with torch.no_grad():
        o1, w1 = peer(x, x, x, key_padding_mask=kpm, average_attn_weights=average)
        o2, w2 = ours(x, x, x, key_padding_mask=kpm, average_attn_weights=average)
    assert w2.shape == w1.shape
    torch.testing.assert_close(o2, o1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w2, w1, rtol=1e-5, atol=1e-6)
    assert (w2[..., 6:] == 0).all()
