"""AttentionKind and translation_attention: the plain-data contract of every picture."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv.viz import AttentionKind, translation_attention
from qkv.viz.data import as_kinds


def test_layers_as_one_array_or_a_list():
    w = torch.rand(3, 2, 4, 5)
    a = AttentionKind("k", w, list("abcd"), list("vwxyz"))
    b = AttentionKind("k", [w[i] for i in range(3)], list("abcd"), list("vwxyz"))
    assert a.num_layers == b.num_layers == 3 and a.shape == (4, 5) and a.heads(0) == 2
    for x, y in zip(a.layers, b.layers):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_allclose(a.matrix(1, "mean"), w[1].double().mean(0).numpy(), rtol=1e-12)
    np.testing.assert_allclose(a.matrix(-1, 1), w[2, 1].double().numpy())
    single = AttentionKind("one head", [np.eye(3)])  # (Lq, Lk): one head; tokens default
    assert single.heads(0) == 1 and single.query_tokens == ("0", "1", "2")


def test_layers_may_differ_in_heads():
    k = AttentionKind("k", [np.ones((2, 3, 3)) / 3, np.ones((4, 3, 3)) / 3])
    assert (k.heads(0), k.heads(1)) == (2, 4)


@pytest.mark.parametrize(
    ("layers", "tokens", "exc", "words"),
    [
        (np.ones((2, 2, 2)), None, ValueError, "wrap a single layer"),
        ([], None, ValueError, "at least one layer"),
        ([np.ones((1, 2, 3)), np.ones((1, 3, 3))], None, ValueError, r"layers\[1\]"),
        ([np.full((2, 2), -0.5)], None, ValueError, "non-negative"),
        ([np.full((2, 2), np.inf)], None, ValueError, "finite"),
        ([np.ones((2, 2, 2, 2))], None, ValueError, r"layers\[0\]"),
        ("weights", None, TypeError, "layers"),
        ([np.ones((2, 3))], (["a"], None), ValueError, "query_tokens"),
        ([np.ones((2, 3))], (None, ["a", "b"]), ValueError, "key_tokens"),
        ([np.ones((2, 3))], ("ab", None), TypeError, "query_tokens"),
    ],
)
def test_bad_input_names_the_argument(layers, tokens, exc, words):
    q, k = tokens if tokens else (None, None)
    with pytest.raises(exc, match=words):
        AttentionKind("k", layers, q, k)


def test_matrix_errors():
    k = AttentionKind("k", [np.ones((2, 2, 2)) / 2])
    with pytest.raises(ValueError, match="layer"):
        k.matrix(3)
    with pytest.raises(ValueError, match="head"):
        k.matrix(0, 2)
    with pytest.raises(TypeError, match="head"):
        k.matrix(0, "all")


def test_translation_attention_shapes_and_tokens():
    src, tgt = ["i", "am", "home", "."], ["je", "suis", "chez", "moi", "."]
    S, T = len(src), len(tgt)
    kinds = translation_attention(
        src,
        tgt,
        encoder=torch.rand(2, 4, S, S),
        decoder=torch.rand(2, 4, T, T),
        cross=torch.rand(2, 4, T, S),
        bahdanau=torch.rand(T, S),
    )
    assert [k.name for k in kinds] == [
        "encoder self-attention",
        "decoder self-attention",
        "cross-attention",
        "Bahdanau attention",
    ]
    assert kinds[2].query_tokens == tuple(tgt) and kinds[2].key_tokens == tuple(src)
    assert kinds[3].num_layers == 1 and kinds[3].heads(0) == 1
    with pytest.raises(ValueError, match="key_tokens"):
        translation_attention(src, tgt, cross=torch.rand(1, 1, T, S + 1))
    with pytest.raises(ValueError, match="at least one"):
        translation_attention(src, tgt)


def test_as_kinds():
    k = AttentionKind("k", [np.eye(2)])
    assert as_kinds(k) == [k]
    with pytest.raises(ValueError, match="distinct"):
        as_kinds([k, k])
    with pytest.raises(TypeError, match=r"kinds\[1\]"):
        as_kinds([k, np.eye(2)])
    with pytest.raises(ValueError, match="empty"):
        as_kinds([])
