"""masked_softmax (the book's semantics) and every bad-input error of qkv.functional."""

from __future__ import annotations

import pytest
import torch

from qkv import functional as qf


def test_masked_softmax_book_example_shapes():
    X = torch.rand(2, 2, 4)
    w = qf.masked_softmax(X, torch.tensor([2, 3]))
    assert torch.all(w[0, :, 2:] == 0) and torch.all(w[1, :, 3:] == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2))
    torch.testing.assert_close(w[0, :, :2], torch.softmax(X[0, :, :2], -1))


def test_masked_softmax_per_query_and_zero_length():
    X = torch.rand(2, 2, 4, dtype=torch.float64)
    w = qf.masked_softmax(X, torch.tensor([[1, 3], [2, 0]]))
    assert w[0, 0].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert torch.all(w[1, 1] == 0)  # the book returns uniform weights here; qkv returns zeros
    torch.testing.assert_close(w[0, 1, :3], torch.softmax(X[0, 1, :3], -1))


def test_masked_softmax_4d_and_none():
    X = torch.randn(2, 3, 4, 5)
    w = qf.masked_softmax(X, torch.tensor([5, 1]))
    assert torch.all(w[1, :, :, 1:] == 0)
    torch.testing.assert_close(qf.masked_softmax(X), torch.softmax(X, -1))


def test_masked_softmax_gradients_finite_for_zero_rows():
    X = torch.randn(2, 3, 4, requires_grad=True)
    w = qf.masked_softmax(X, torch.tensor([0, 2]))
    (w * torch.randn_like(w)).sum().backward()
    assert torch.isfinite(X.grad).all() and torch.all(X.grad[0] == 0)


q4 = torch.randn(2, 4, 5, 8)
k4 = torch.randn(2, 4, 7, 8)
v4 = torch.randn(2, 4, 7, 3)

BAD = [
    # (kwargs overriding q/k/v or masks, exception, message fragment)
    (dict(query=torch.randn(5, 8)), ValueError, "query: expected shape"),
    (dict(query=torch.randint(0, 3, (2, 4, 5, 8))), TypeError, "query: expected a floating"),
    (dict(key=torch.randn(2, 7, 8)), ValueError, "key: expected 4 dimensions"),
    (dict(key=torch.randn(3, 4, 7, 8)), ValueError, "key: expected batch size 2"),
    (dict(key=torch.randn(2, 4, 7, 6)), ValueError, "key: expected width d=8"),
    (dict(value=torch.randn(2, 4, 6, 3)), ValueError, "value: expected 7 positions"),
    (
        dict(key=torch.randn(2, 3, 7, 8), value=torch.randn(2, 3, 7, 3)),
        ValueError,
        "key: expected a number of heads dividing",
    ),
    (dict(value=torch.randn(2, 2, 7, 3)), ValueError, "value: expected 4 heads"),
    (dict(key=k4.double()), TypeError, "key: expected dtype torch.float32"),
    (dict(query="q"), TypeError, "query: expected a tensor"),
    (dict(valid_lens=torch.tensor([1.0, 2.0])), TypeError, "valid_lens: expected an integer"),
    (
        dict(valid_lens=torch.tensor([1, -1])),
        ValueError,
        r"valid_lens: expected lengths in \[0, 7\]",
    ),
    (
        dict(valid_lens=torch.tensor([1, 8])),
        ValueError,
        r"valid_lens: expected lengths in \[0, 7\]",
    ),
    (dict(valid_lens=torch.tensor([1, 2, 3])), ValueError, r"valid_lens: expected shape \(2,\)"),
    (dict(valid_lens=torch.ones(2, 4, dtype=torch.long)), ValueError, "valid_lens: expected shape"),
    (dict(valid_lens=torch.tensor([True, False])), TypeError, "valid_lens: expected an integer"),
    (
        dict(key_padding_mask=torch.zeros(2, 6, dtype=torch.bool)),
        ValueError,
        r"key_padding_mask: expected shape \(2, 7\)",
    ),
    (
        dict(key_padding_mask=torch.zeros(2, 7, dtype=torch.long)),
        TypeError,
        "key_padding_mask: expected dtype torch.bool",
    ),
    (dict(key_padding_mask=[[0] * 7] * 2), TypeError, "key_padding_mask: expected a bool"),
    (dict(attn_mask=torch.zeros(5, 6, dtype=torch.bool)), ValueError, "attn_mask: expected shape"),
    (
        dict(attn_mask=torch.zeros(3, 5, 7, dtype=torch.bool)),
        ValueError,
        "attn_mask: expected shape",
    ),
    (
        dict(attn_mask=torch.zeros(2, 3, 5, 7, dtype=torch.bool)),
        ValueError,
        "attn_mask: expected shape",
    ),
    (
        dict(attn_mask=torch.zeros(5, 7, dtype=torch.int32)),
        TypeError,
        "attn_mask: expected dtype torch.bool",
    ),
    (dict(dropout_p=1.0), ValueError, r"dropout_p: expected a float in \[0, 1\)"),
    (dict(dropout_p=-0.1), ValueError, "dropout_p"),
    (dict(dropout_p="0.1"), TypeError, "dropout_p"),
    (dict(score="softmax"), ValueError, "score: expected one of"),
    (dict(scale=-1.0), ValueError, "scale: expected a positive"),
    (dict(scale=float("nan")), ValueError, "scale"),
    (dict(scale="big"), TypeError, "scale"),
    (dict(is_causal=1), TypeError, "is_causal: expected a bool"),
    (dict(window=0), ValueError, "window: expected a positive int"),
    (dict(window=2.0), TypeError, "window: expected a positive int"),
]


@pytest.mark.parametrize("override,exc,msg", BAD)
def test_bad_input_raises_clear_error(override, exc, msg):
    kw = dict(query=q4, key=k4, value=v4)
    kw.update(override)
    q, k, v = kw.pop("query"), kw.pop("key"), kw.pop("value")
    with pytest.raises(exc, match=msg):
        qf.attention(q, k, v, **kw)
    with pytest.raises(exc, match=msg):
        qf.explain(q, k, v, **kw)


def test_bad_score_mod_output():
    with pytest.raises(ValueError, match="score: the score_mod callable must return"):
        qf.attention(q4, k4, v4, score=lambda s, b, h, i, j: s[..., :2])
    with pytest.raises(TypeError, match="score: the score_mod callable returned"):
        qf.attention(q4, k4, v4, score=lambda s, b, h, i, j: 1.0)


def test_masked_softmax_bad_input():
    with pytest.raises(ValueError, match="X: expected scores of shape"):
        qf.masked_softmax(torch.randn(4, 5))
    with pytest.raises(
        TypeError, match=r"X: expected a floating-point tensor, got dtype torch\.int64"
    ):
        qf.masked_softmax(torch.ones(2, 3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="valid_lens"):
        qf.masked_softmax(torch.randn(2, 3, 4), torch.tensor([5, 1]))


def test_additive_attention_book_shapes_and_masks():
    B, Lq, Lk, h = 2, 3, 6, 5
    q, k, v = torch.randn(B, Lq, h), torch.randn(B, Lk, h), torch.randn(B, Lk, 4)
    w_v = torch.randn(h)
    out, w = qf.additive_attention(q, k, v, w_v, valid_lens=torch.tensor([2, 0]), need_weights=True)
    s = torch.tanh(q[:, :, None] + k[:, None]) @ w_v
    expect = torch.softmax(s[0, :, :2], -1)
    torch.testing.assert_close(w[0, :, :2], expect)
    assert torch.all(w[1] == 0) and torch.all(out[1] == 0)
    with pytest.raises(ValueError, match="w_v: expected a vector of shape"):
        qf.additive_attention(q, k, v, torch.randn(h + 1))


def test_shared_trailing_padding_is_trimmed_exactly():
    q, k, v = (torch.randn(3, 2, 9, 4, dtype=torch.float64) for _ in range(3))
    kpm = torch.zeros(3, 9, dtype=torch.bool)
    kpm[:, 6:] = True
    kpm[1, 2] = True
    spec = qf.check_masks(
        B=3,
        H=2,
        Lq=9,
        Lk=9,
        device=q.device,
        batched_heads=True,
        key_padding_mask=kpm,
        valid_lens=torch.tensor([9, 8, 7]),
    )
    assert spec.key_extent() == 6
    assert spec.trim_keys(6).key_padding_mask.shape == (3, 1, 1, 6)
    for extra in ({}, {"is_causal": True}, {"window": 3}, {"attn_mask": torch.randn(9, 9)}):
        a, _ = qf.attention(q, k, v, key_padding_mask=kpm, backend="fused", **extra)
        b, _ = qf.attention(q, k, v, key_padding_mask=kpm, backend="reference", **extra)
        torch.testing.assert_close(a, b)
    all_pad = torch.ones(3, 9, dtype=torch.bool)
    s2 = qf.check_masks(
        B=3, H=2, Lq=9, Lk=9, device=q.device, batched_heads=True, key_padding_mask=all_pad
    )
    assert s2.key_extent() == 0


def test_lengths_are_read_once_and_say_whether_a_row_can_be_dead():
    from qkv.functional.masks import check_masks

    def spec(lens, **kw):
        return check_masks(
            B=3, H=1, Lq=2, Lk=6, device=torch.device("cpu"), batched_heads=True,
            valid_lens=torch.tensor(lens), **kw
        )  # fmt: skip

    s = spec([4, 1, 5])
    assert s.lens_range == (1, 5) and s.no_dead_rows and s.key_extent() == 5
    assert not spec([4, 0, 5]).no_dead_rows  # row 1 sees no key
    assert spec([6, 6, 6]).valid_lens is None  # hides nothing: no mask, no range
    kpm = torch.zeros(3, 6, dtype=torch.bool)
    assert not spec([4, 1, 5], key_padding_mask=kpm | True).no_dead_rows  # unknown: look
    trimmed = s.trim_keys(s.key_extent())
    assert trimmed.lens_range == (1, 5) and trimmed.Lk == 5
    per_query = spec([[1, 2], [2, 2], [0, 3]])
    assert per_query.lens_range is None and not per_query.no_dead_rows
