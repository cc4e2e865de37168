"""qkv.functional.decode: attention planned once for a decoding step gives what attention() gives
(fresh random inputs, odd sizes, float32 and float64, padding, rows with no key, NaN and inf)."""

from __future__ import annotations

import pytest
import torch

from qkv.functional import attention
from qkv.functional.decode import cached_attention, plan_keys, planned_attention
from qkv.functional.scores import mark_finite

TOL = {torch.float32: dict(atol=2e-6, rtol=2e-5), torch.float64: dict(atol=1e-12, rtol=1e-12)}


def _qkv(B, H, Lq, Lk, d, dv, dtype, seed, Hkv=None):
    g = torch.Generator().manual_seed(seed)
    Hkv = H if Hkv is None else Hkv
    q = torch.randn(B, H, Lq, d, generator=g, dtype=dtype)
    k = torch.randn(B, Hkv, Lk, d, generator=g, dtype=dtype)
    v = torch.randn(B, Hkv, Lk, dv, generator=g, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("B", "H", "Lq", "Lk", "d", "dv", "lens"),
    [
        (5, 3, 1, 7, 5, 6, [7, 3, 1, 7, 2]),  # one query per row: the three-op path
        (4, 2, 1, 9, 8, 3, [4, 9, 0, 2]),  # a row with no key: zero
        (3, 1, 1, 6, 7, 7, [2, 3, 1]),  # the longest shorter than Lk: trailing keys dropped
        (3, 2, 4, 5, 3, 2, [5, 0, 2]),  # several queries: the fused kernel
        (2, 3, 1, 4, 6, 5, None),  # no padding
    ],
)
def test_planned_attention_equals_attention(dtype, B, H, Lq, Lk, d, dv, lens):
    for seed in range(3):
        q, k, v = _qkv(B, H, Lq, Lk, d, dv, dtype, seed)
        vl = None if lens is None else torch.tensor(lens)
        keys = plan_keys(k, v, valid_lens=vl, heads=H)
        assert keys.fused and keys.finite
        want = attention(q, k, v, valid_lens=vl)[0]
        got = planned_attention(q, keys)
        torch.testing.assert_close(got, want, **TOL[dtype])
        if lens is not None and 0 in lens:
            assert (got[torch.tensor(lens) == 0] == 0).all()


def test_planned_attention_grouped_heads_and_repeated_use():
    q, k, v = _qkv(3, 6, 1, 5, 4, 4, torch.float32, 1, Hkv=2)
    vl = torch.tensor([5, 1, 3])
    keys = plan_keys(k, v, valid_lens=vl, heads=6)
    assert keys.key_t is None  # grouped heads: the fused kernel
    for seed in range(3):  # one plan, fresh queries at every step
        q = torch.randn(3, 6, 1, 4, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(planned_attention(q, keys), attention(q, k, v, valid_lens=vl)[0])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_planned_attention_keeps_the_nan_rule(bad):
    q, k, v = _qkv(4, 2, 1, 6, 3, 3, torch.float32, 2)
    vl = torch.tensor([6, 2, 0, 4])
    keys = plan_keys(k, v, valid_lens=vl, heads=2)
    q[1, 0, 0, 2] = bad  # a non-finite query: the general path, its row NaN
    want = attention(q, k, v, valid_lens=vl)[0]
    got = planned_attention(q, keys)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert got[1, 0].isnan().all() and not got[0].isnan().any()
    # non-finite keys: never the fast path, the rows of that sequence NaN as attention() says
    k2 = k.clone()
    k2[3, 1, 5, 0] = bad  # a masked position (length 4) still poisons its sequence
    keys2 = plan_keys(k2, v, valid_lens=vl, heads=2)
    assert not keys2.finite
    q2 = torch.randn(4, 2, 1, 3)
    torch.testing.assert_close(
        planned_attention(q2, keys2), attention(q2, k2, v, valid_lens=vl)[0], equal_nan=True
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("B", "H", "Lq", "Lk", "d"), [(3, 5, 1, 1, 7), (2, 3, 1, 11, 5), (4, 2, 3, 6, 4)]
)
def test_cached_attention_equals_attention(dtype, B, H, Lq, Lk, d):
    for seed in range(3):
        q, k, v = _qkv(B, H, Lq, Lk, d, d + 1, dtype, seed)
        if seed == 1:
            mark_finite(k, v)  # a cache's checked keys: not summed again, same answer
        torch.testing.assert_close(cached_attention(q, k, v), attention(q, k, v)[0], **TOL[dtype])


def test_cached_attention_keeps_the_nan_rule():
    q, k, v = _qkv(3, 2, 1, 5, 4, 4, torch.float32, 3)
    v[2, 1, 0, 0] = float("nan")
    want = attention(q, k, v)[0]
    got = cached_attention(q, k, v)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert got[2, 1].isnan().all() and not got[:2].isnan().any()


def test_plan_keys_rejects_bad_arguments():
    k = torch.randn(2, 3, 4, 5)
    with pytest.raises(ValueError, match="key: expected a 4-D tensor"):
        plan_keys(k[0], k[0])
    with pytest.raises(ValueError, match="heads: expected a positive int"):
        plan_keys(k, k, heads=0)
    with pytest.raises(ValueError, match=r"valid_lens: expected \(B,\) lengths"):
        plan_keys(k, k, valid_lens=torch.ones(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="valid_lens"):  # attention()'s own check, once
        plan_keys(k, k, valid_lens=torch.tensor([4, 9]))
