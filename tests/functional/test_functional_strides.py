"""Any stride, any backend: non-contiguous, expanded (stride 0), transposed and sliced inputs give
what the float64 reference gives on the same values (issue 17, item 1).

The bug this guards: the chunked backend handed tensors whose last axis is not contiguous
(DETR's ``feat.flatten(2).transpose(1, 2)``) to torch's private CPU flash kernel, which read
them as if it were: outputs off by up to 6e33, or NaN, with no error.
"""

from __future__ import annotations

import pytest
import torch
from _reference import reference_attention
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qkv import functional as qf

# (B, H, L, d) values -> the same values in a tensor with another layout
LAYOUTS = {
    "contiguous": lambda t: t.contiguous(),
    # stored (B, H, d, L), read transposed: stride(-1) == L
    "last axis transposed": lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2),
    # stored (B, L, H, d), read as heads-first (what every multi-head module does)
    "heads transposed": lambda t: t.transpose(1, 2).contiguous().transpose(1, 2),
    # every other column of a wider tensor: stride(-1) == 2
    "sliced last axis": lambda t: torch.stack([t, torch.full_like(t, 1e30)], -1).flatten(-2)[
        ..., ::2
    ],
    # every other position of a longer tensor
    "sliced positions": lambda t: torch.stack([t, torch.full_like(t, 1e30)], 3).flatten(2, 3)[
        :, :, ::2
    ],
}


def expanded(shape, axis, g, dtype):
    """Random values repeated along ``axis`` with stride 0 (``expand``)."""
    small = list(shape)
    small[axis] = 1
    return torch.randn(*small, generator=g, dtype=dtype).expand(*shape)


def laid_out(shape, layout, g, dtype=torch.float32):
    if layout.startswith("expanded "):
        return expanded(shape, int(layout.split()[1]), g, dtype)
    return LAYOUTS[layout](torch.randn(*shape, generator=g, dtype=dtype))


ALL_LAYOUTS = [*LAYOUTS, "expanded 0", "expanded 1", "expanded 2", "expanded 3"]
MASKS = {
    "none": {},
    "causal": {"is_causal": True},
    "window": {"window": 3},
    "per-query lengths": "valid_lens2",
}


def masks_for(name, B, Lq, Lk, g):
    m = MASKS[name]
    if m == "valid_lens2":
        return {"valid_lens": torch.randint(1, Lk + 1, (B, Lq), generator=g)}
    return dict(m)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    backend=st.sampled_from(["auto", "fused", "reference", "chunked", "export"]),
    layouts=st.tuples(*[st.sampled_from(ALL_LAYOUTS)] * 3),
    score=st.sampled_from(["scaled_dot", "dot", "cosine", "length_scaled", "normalized"]),
    mask=st.sampled_from(list(MASKS)),
    B=st.integers(1, 2),
    H=st.integers(1, 3),
    L=st.integers(2, 9),
    d=st.sampled_from([1, 4, 8]),
    same_dv=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_any_stride_any_backend_matches_the_float64_reference(
    backend, layouts, score, mask, B, H, L, d, same_dv, seed
):
    if backend == "fused" and score == "normalized":
        return  # the fused kernel does not run this score (refused: not a stride question)
    g = torch.Generator().manual_seed(seed)
    dv = d if same_dv else d + 3  # equal widths: the chunked backend pads nothing
    q = laid_out((B, H, L, d), layouts[0], g)
    k = laid_out((B, H, L, d), layouts[1], g)
    v = laid_out((B, H, L, dv), layouts[2], g)
    masks = masks_for(mask, B, L, L, g)
    out, _ = qf.attention(q, k, v, score=score, backend=backend, **masks)
    ref, _ = reference_attention(q, k, v, score=score, **masks)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ALL_LAYOUTS)
@pytest.mark.parametrize("backend", ["fused", "reference", "chunked", "export"])
def test_gradients_do_not_depend_on_the_layout(layout, backend):
    """The chunked backward calls the kernel's backward on the saved inputs: same gradients."""
    g = torch.Generator().manual_seed(3)
    shape = (2, 2, 7, 8)
    q, k, v = (laid_out(shape, layout, g).requires_grad_() for _ in range(3))
    masks = {"window": 3}
    out, _ = qf.attention(q, k, v, backend=backend, **masks)
    gout = torch.randn(out.shape, generator=g)
    out.backward(gout)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _ = reference_attention(q64, k64, v64, **masks)
    ref.backward(gout.double())
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
    for t, r in ((q, q64), (k, k64), (v, v64)):
        torch.testing.assert_close(t.grad.double(), r.grad, rtol=1e-4, atol=1e-4)


def test_the_detr_layout_on_the_chunked_backend():
    """The issue's reproduction: a feature map flattened and transposed, ``window=``."""
    feat = torch.randn(2, 64, 20, 20)
    x = feat.flatten(2).transpose(1, 2)  # (B, L, d) with stride(-1) == 400
    assert x.stride(-1) != 1
    out, _ = qf.attention(x, x, x, window=128, backend="chunked")
    ref, _ = reference_attention(x, x, x, window=128)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
    # auto takes the chunked backend for per-query lengths on long inputs: the same answer
    lens = torch.randint(1, 401, (2, 400))
    out, _ = qf.attention(x, x, x, valid_lens=lens, backend="chunked")
    ref, _ = reference_attention(x, x, x, valid_lens=lens)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ALL_LAYOUTS)
@pytest.mark.parametrize("backend", ["reference", "chunked", "export"])
def test_additive_attention_any_stride(layout, backend):
    from _reference import reference_additive

    g = torch.Generator().manual_seed(5)
    q, k = (laid_out((2, 1, 6, 4), layout, g)[:, 0] for _ in range(2))  # (B, L, h)
    v = laid_out((2, 1, 6, 4), layout, g)[:, 0]
    w_v = torch.randn(8, generator=g)[::2]  # a strided vector too
    lens = torch.tensor([6, 3])
    out, _ = qf.additive_attention(q, k, v, w_v, valid_lens=lens, backend=backend)
    ref, _ = reference_additive(q, k, v, w_v, valid_lens=lens)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
