"""qkv.nn.kernel_regression: the Nadaraya-Watson estimators against a float64 formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv.nn.kernel_regression import (
    NWKernelRegression,
    average_pooling,
    gaussian_scores,
    nadaraya_watson,
)


def _formula(x, xs, ys, w=1.0, exclude=None):
    """f(x) = sum_i softmax_i(-((x - x_i) w)^2 / 2) y_i, in numpy float64, one query at a time."""
    out, weights = [], []
    for n, q in enumerate(np.asarray(x, dtype=np.float64)):
        s = -(((q - np.asarray(xs, dtype=np.float64)) * w) ** 2) / 2
        if exclude is not None:
            s[exclude[n]] = -np.inf
        e = np.exp(s - s.max())
        a = e / e.sum()
        weights.append(a)
        out.append(a @ np.asarray(ys, dtype=np.float64))
    return np.array(out), np.array(weights)


def test_gaussian_kernel_matches_the_formula():
    g = torch.Generator().manual_seed(0)
    xs, _ = torch.sort(torch.rand(30, generator=g, dtype=torch.float64) * 5)
    ys = torch.randn(30, generator=g, dtype=torch.float64)
    x = torch.arange(0, 5, 0.25, dtype=torch.float64)
    for w in (1.0, 3.5):
        out, weights = nadaraya_watson(x, xs, ys, w)
        ref_out, ref_w = _formula(x, xs, ys, w)
        np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(weights.numpy(), ref_w, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(weights.sum(-1).numpy(), 1.0, rtol=1e-12)


def test_leave_one_out_mask_equals_the_books_gather():
    n = 12
    xs = torch.linspace(0, 3, n, dtype=torch.float64)
    ys = torch.sin(xs)
    eye = torch.eye(n, dtype=torch.bool)
    keys = xs.repeat(n, 1)[~eye].reshape(n, n - 1)  # the book's layout: (n, n-1)
    values = ys.repeat(n, 1)[~eye].reshape(n, n - 1)
    net = NWKernelRegression(w=2.0).double()
    a = net(xs, keys, values)
    b = net(xs, xs, ys, attn_mask=eye)
    assert net.attention_weights.shape == (n, n)
    assert bool((net.attention_weights.diagonal() == 0).all())
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    ref, _ = _formula(xs, xs, ys, 2.0, exclude=np.eye(n, dtype=bool))
    np.testing.assert_allclose(b.detach().numpy(), ref, rtol=1e-12)


def test_batched_and_vector_values_and_gradient():
    q = torch.rand(2, 5, dtype=torch.float64)
    k = torch.rand(2, 7, dtype=torch.float64)
    v = torch.rand(2, 7, 3, dtype=torch.float64)
    net = NWKernelRegression(w=1.5).double()
    out = net(q, k, v)
    assert out.shape == (2, 5, 3) and net.attention_weights.shape == (2, 5, 7)
    for b in range(2):
        ref = np.stack([_formula(q[b], k[b], v[b, :, j], 1.5)[0] for j in range(3)], -1)
        np.testing.assert_allclose(out[b].detach().numpy(), ref, rtol=1e-12)
    out.sum().backward()
    assert net.w.grad is not None and torch.isfinite(net.w.grad).all()
    assert "w=1.5" in repr(net)


def test_scores_and_average_pooling():
    s = gaussian_scores(torch.tensor([[0.0], [1.0]]), torch.tensor([[0.0, 2.0]]), 2.0)
    torch.testing.assert_close(s, torch.tensor([[0.0, -8.0], [-2.0, -2.0]]))
    out, w = average_pooling(torch.zeros(3), torch.tensor([1.0, 2.0, 6.0]))
    torch.testing.assert_close(out, torch.full((3,), 3.0))
    torch.testing.assert_close(w.sum(-1), torch.ones(3))


@pytest.mark.parametrize(
    ("args", "exc", "words"),
    [
        ((torch.rand(3), torch.rand(4), torch.rand(5)), ValueError, "values"),
        ((torch.rand(3), torch.rand(2, 4), torch.rand(2, 4)), ValueError, "keys"),
        ((torch.rand(2, 3), torch.rand(4), torch.rand(4)), ValueError, "queries"),
        ((torch.arange(3), torch.rand(3), torch.rand(3)), TypeError, "queries"),
        (([0.0], torch.rand(3), torch.rand(3)), TypeError, "queries"),
    ],
)
def test_errors_name_the_argument(args, exc, words):
    with pytest.raises(exc, match=words):
        nadaraya_watson(*args)


def test_bad_mask_and_init():
    with pytest.raises(ValueError, match="attn_mask"):
        nadaraya_watson(torch.rand(3), torch.rand(4), torch.rand(4), attn_mask=torch.eye(3) > 0)
    with pytest.raises(TypeError, match="w"):
        NWKernelRegression(w="1")
    torch.manual_seed(0)
    assert 0.0 <= float(NWKernelRegression().w.detach()) < 1.0  # the book's U(0, 1) start
