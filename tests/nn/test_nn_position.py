"""Positional encodings: the book's sinusoidal table, learned positions, rotary embeddings."""

from __future__ import annotations

import math

import pytest
import torch

from qkv.nn import MultiHeadAttention
from qkv.nn.kv_cache import KVCache
from qkv.nn.position import (
    LearnedPositionalEncoding,
    NoPositionalEncoding,
    PositionalEncoding,
    RotaryEmbedding,
    apply_rotary,
    make_positional_encoding,
    sinusoidal_encoding,
)


def book_table(max_len: int, d: int) -> torch.Tensor:
    """The book's P, from its formula (float64)."""
    P = torch.zeros(max_len, d, dtype=torch.float64)
    for i in range(max_len):
        for j in range(0, d, 2):
            angle = i / 10000 ** (j / d)
            P[i, j] = math.sin(angle)
            if j + 1 < d:
                P[i, j + 1] = math.cos(angle)
    return P


def test_sinusoidal_matches_the_book_formula_and_example():
    enc = PositionalEncoding(32, 0.0, max_len=60).eval()
    X = torch.zeros(1, 60, 32)
    torch.testing.assert_close(enc(X)[0].double(), book_table(60, 32), rtol=1e-6, atol=1e-6)
    assert enc.P.shape == (1, 60, 32)
    assert "P" not in enc.state_dict()  # a buffer, not a parameter to save


def test_sinusoidal_odd_width_and_offsets():
    torch.testing.assert_close(
        sinusoidal_encoding(torch.arange(7), 5).double(), book_table(7, 5), rtol=1e-6, atol=1e-6
    )
    enc = PositionalEncoding(8, 0.0, max_len=10).eval()
    X = torch.randn(2, 4, 8)
    full = enc(torch.cat([torch.zeros(2, 3, 8), X], 1))[:, 3:]
    torch.testing.assert_close(enc(X, offset=3), full)


def test_sinusoidal_beyond_the_table():
    small = PositionalEncoding(16, 0.0, max_len=8).eval()
    big = PositionalEncoding(16, 0.0, max_len=64).eval()
    X = torch.randn(2, 40, 16)
    torch.testing.assert_close(small(X), big(X))
    torch.testing.assert_close(small(X[:, :3], offset=30), big(X[:, :3], offset=30))


def test_sinusoidal_dropout_in_training_only():
    enc = PositionalEncoding(16, 0.5)
    X = torch.randn(3, 5, 16)
    assert (enc(X) == 0).any()
    enc.eval()
    assert not (enc(X) == 0).any()


def test_learned_positions():
    enc = LearnedPositionalEncoding(8, 0.0, max_len=6).eval()
    X = torch.zeros(2, 4, 8)
    torch.testing.assert_close(enc(X)[0], enc.embedding.weight[:4])
    torch.testing.assert_close(enc(X[:, :1], offset=5)[0, 0], enc.embedding.weight[5])
    with pytest.raises(ValueError, match="max_len=6"):
        enc(X, offset=3)


def test_none_is_dropout_only_and_factory():
    X = torch.randn(2, 3, 8)
    torch.testing.assert_close(NoPositionalEncoding(8).eval()(X, offset=4), X)
    assert isinstance(make_positional_encoding("rotary", 8), NoPositionalEncoding)
    assert isinstance(make_positional_encoding("learned", 8), LearnedPositionalEncoding)
    with pytest.raises(ValueError, match="pos_encoding"):
        make_positional_encoding("alibi", 8)


def test_rotary_is_relative():
    """The rotated q . k depends on the positions' difference only, and norms are kept."""
    rope = RotaryEmbedding(16)
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    rope = rope.double()

    def dot(m: int, n: int) -> torch.Tensor:
        qm = rope(q.view(1, 1, 1, 16).expand(1, 1, m + 1, 16))[0, 0, m]
        kn = rope(k.view(1, 1, 1, 16).expand(1, 1, n + 1, 16))[0, 0, n]
        return qm @ kn

    torch.testing.assert_close(dot(3, 1), dot(10, 8))
    torch.testing.assert_close(dot(0, 0), q @ k)
    x = torch.randn(2, 3, 7, 16, dtype=torch.float64)
    torch.testing.assert_close(rope(x).norm(dim=-1), x.norm(dim=-1))
    # offsets and positions beyond the table
    small = RotaryEmbedding(16, max_len=4).double()
    torch.testing.assert_close(small(x, offset=9), rope(x, offset=9))
    torch.testing.assert_close(rope(x[:, :, 2:], offset=2), rope(x)[:, :, 2:])


def test_apply_rotary_rotates_pairs():
    x = torch.tensor([[1.0, 0.0, 0.0, 1.0]])  # pairs (x0, x2) and (x1, x3)
    a = torch.tensor([[math.pi / 2, 0.0]])
    out = apply_rotary(x, a.cos(), a.sin())
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0, 1.0, 1.0]]), atol=1e-6, rtol=0)


def test_rotary_inside_multihead_attention_with_cache():
    rope = RotaryEmbedding(8)
    mha = MultiHeadAttention(16, 2, rotary=rope).eval()
    X = torch.randn(2, 5, 16)
    full = mha(X, X, X, is_causal=True)
    cache, steps = KVCache(), []
    for t in range(5):
        x = X[:, t : t + 1]
        steps.append(mha(x, x, x, cache=cache))
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(full, MultiHeadAttention(16, 2).eval()(X, X, X, is_causal=True))
    with pytest.raises(ValueError, match="head_dim=8"):
        MultiHeadAttention(16, 4, rotary=rope)
    with pytest.raises(ValueError, match="static"):
        mha(X, X, X, cache=KVCache(static=True))


@pytest.mark.parametrize(
    ("make", "arg"),
    [
        (lambda: PositionalEncoding(0, 0.1), "num_hiddens"),
        (lambda: PositionalEncoding(8, 1.5), "dropout"),
        (lambda: PositionalEncoding(8, 0.1, max_len=0), "max_len"),
        (lambda: LearnedPositionalEncoding(8, 0.1, max_len=-1), "max_len"),
        (lambda: RotaryEmbedding(7), "head_dim"),
        (lambda: RotaryEmbedding(8, base=1.0), "base"),
    ],
)
def test_constructor_errors_name_the_argument(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()


def test_forward_errors():
    enc = PositionalEncoding(8)
    with pytest.raises(ValueError, match=r"X: expected a tensor of shape \(B, L, 8\)"):
        enc(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="offset"):
        enc(torch.zeros(2, 3, 8), offset=-1)
