"""KVCache, and MultiHeadAttention's incremental decoding with it."""

from __future__ import annotations

import pytest
import torch

from qkv.nn import MultiHeadAttention
from qkv.nn.kv_cache import KVCache


def test_growing_cache_appends_and_doubles():
    c = KVCache(capacity=2)
    k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 6)
    for t in range(5):
        keys, values = c.append(k[:, :, t : t + 1], v[:, :, t : t + 1])
        assert c.length == t + 1
        torch.testing.assert_close(keys, k[:, :, : t + 1])
        torch.testing.assert_close(values, v[:, :, : t + 1])
    assert c._k.shape[2] >= 5
    c.append(k[:, :, :3], v[:, :, :3])  # several at once
    torch.testing.assert_close(c.keys, torch.cat([k, k[:, :, :3]], 2))


def test_reorder_rows():
    c = KVCache()
    k = torch.randn(3, 1, 4, 2)
    c.append(k, k)
    c.reorder(torch.tensor([2, 2, 0]))
    torch.testing.assert_close(c.keys, k[[2, 2, 0]])
    c.reorder(torch.tensor([1, 0]))  # fewer rows
    torch.testing.assert_close(c.values, k[[2, 2]])
    c.append(k[:2, :, :1], k[:2, :, :1])
    assert c.keys.shape == (2, 1, 5, 2)


def test_static_cache():
    c = KVCache(static=True)
    k = torch.randn(2, 1, 4, 2)
    c.set(k, k)
    assert c.keys.data_ptr() == k.data_ptr()  # stored, not copied
    with pytest.raises(RuntimeError, match="static"):
        c.append(k, k)


def test_errors():
    with pytest.raises(ValueError, match="capacity"):
        KVCache(capacity=0)
    c = KVCache()
    with pytest.raises(RuntimeError, match="empty"):
        c.keys  # noqa: B018
    c.append(torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4))
    with pytest.raises(ValueError, match="k: expected"):
        c.append(torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4))


def test_multihead_attention_incremental_equals_causal():
    mha = MultiHeadAttention(16, 4, bias=True).eval()
    X = torch.randn(3, 6, 16)
    full = mha(X, X, X, is_causal=True)
    cache = KVCache()
    steps = [mha(X[:, t : t + 1], X[:, t : t + 1], X[:, t : t + 1], cache=cache) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_multihead_attention_static_cache_for_cross_attention():
    mha = MultiHeadAttention(16, 4).eval()
    Q, E = torch.randn(2, 3, 16), torch.randn(2, 7, 16)
    vl = torch.tensor([7, 4])
    ref = mha(Q, E, E, vl)
    cache = KVCache(static=True)
    torch.testing.assert_close(mha(Q, E, E, vl, cache=cache), ref)
    torch.testing.assert_close(mha(Q, None, None, vl, cache=cache), ref)  # keys reused


def test_existing_behaviour_unchanged_without_cache():
    mha = MultiHeadAttention(16, 4, 0.0).eval()
    X = torch.randn(2, 5, 16)
    assert mha(X, X, X, torch.tensor([3, 5])).shape == (2, 5, 16)
    assert mha.rotary is None
    assert sorted(mha.state_dict()) == ["W_k.weight", "W_o.weight", "W_q.weight", "W_v.weight"]


# ---------------------------------------------------------------------------- NaN through caches
# A cache checks what it stores once and attention then skips summing it again; the NaN rule
# (a row whose sequence's keys or values hold a NaN comes out NaN, the others are untouched)
# must hold all the same, whenever the NaN arrives.


def _decode_rows(mha: MultiHeadAttention, x: torch.Tensor, enc: torch.Tensor, lens, cross):
    """Step-by-step self-attention over ``x`` (B, T, D) with a growing cache, then
    cross-attention over ``enc`` with a static cache; the outputs (B, T, D)."""
    self_cache, out = KVCache(capacity=2), []
    for t in range(x.shape[1]):
        y = mha(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], cache=self_cache)
        out.append(cross(y, enc, enc, lens))
    return torch.cat(out, 1)


@pytest.mark.parametrize("where", ["self_step_0", "self_step_3", "cross"])
def test_a_nan_stored_in_a_cache_still_reaches_its_row_and_only_its_row(where):
    torch.manual_seed(0)
    B, T, S, D = 3, 5, 7, 8
    mha = MultiHeadAttention(D, 2).eval()
    cross_mha = MultiHeadAttention(D, 2).eval()
    x, enc = torch.randn(B, T, D), torch.randn(B, S, D)
    lens = torch.tensor([7, 3, 5])
    cache = KVCache(static=True)

    def cross(y, k, v, vl):
        return cross_mha(y, k, v, vl, cache=cache)

    with torch.inference_mode():
        clean = _decode_rows(mha, x, enc, lens, cross)
        assert torch.isfinite(clean).all()
        bad_x, bad_enc = x.clone(), enc.clone()
        first_bad = 0
        if where == "cross":
            bad_enc[1, 6] = float("nan")  # a padded position of row 1: NaN all the same
        else:
            first_bad = int(where[-1])
            bad_x[1, first_bad] = float("nan")
        cache = KVCache(static=True)
        dirty = _decode_rows(mha, bad_x, bad_enc, lens, cross)
    assert torch.isnan(dirty[1, first_bad:]).all()
    torch.testing.assert_close(dirty[1, :first_bad], clean[1, :first_bad])
    torch.testing.assert_close(dirty[[0, 2]], clean[[0, 2]])


def test_finite_marks_follow_the_cache_through_reorder_and_cast():
    from qkv.functional.scores import known_finite

    c = KVCache(static=True)
    k = torch.randn(3, 1, 4, 2)
    c.set(k, k.clone())
    assert known_finite(c.keys) and known_finite(c.values)
    c.reorder(torch.tensor([2, 0]))
    assert known_finite(c.keys)
    c.to(torch.float16)  # a cast may overflow: no longer vouched for
    assert not known_finite(c.keys)
    g = KVCache()
    keys, _ = g.append(k, k)
    assert known_finite(keys)
    bad = k.clone()
    bad[0, 0, 0, 0] = float("inf")
    keys, _ = g.append(bad[:, :, :1], k[:, :, :1])
    assert not known_finite(keys)
    keys, _ = g.append(k[:, :, :1], k[:, :, :1])  # an infinity stays in the cache
    assert not known_finite(keys)


def test_many_reorders_and_appends_equal_a_plain_gathered_cache():
    """Beam search's pattern: append one position, reorder the rows, again and again (the cache
    swaps two buffers); every step's keys and values equal a cache kept by torch.cat."""
    g = torch.Generator().manual_seed(4)
    c = KVCache(capacity=3)
    ref_k = ref_v = None
    for _ in range(9):
        k, v = torch.randn(4, 2, 1, 3, generator=g), torch.randn(4, 2, 1, 5, generator=g)
        keys, values = c.append(k, v)
        ref_k = k if ref_k is None else torch.cat([ref_k, k], 2)
        ref_v = v if ref_v is None else torch.cat([ref_v, v], 2)
        torch.testing.assert_close(keys, ref_k, atol=0, rtol=0)
        torch.testing.assert_close(values, ref_v, atol=0, rtol=0)
        index = torch.randint(0, 4, (4,), generator=g)
        c.reorder(index)
        ref_k, ref_v = ref_k[index], ref_v[index]
        torch.testing.assert_close(c.keys, ref_k, atol=0, rtol=0)
        torch.testing.assert_close(c.values, ref_v, atol=0, rtol=0)
