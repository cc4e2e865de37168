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
