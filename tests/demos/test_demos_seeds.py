"""The numbers of the demos of seeds 000 and 002, why sqrt(d_k) and why several heads are right:
float64 references, torch's modules, the theory (their figures: tests/viz/test_viz_demos.py)."""

from __future__ import annotations

import math

import pytest
import torch


# ---------------------------------------------------------------------------- seed 000
@pytest.fixture(scope="module")
def step_by_step():
    from qkv.demos.mha_step_by_step import compute

    return compute()


def test_step_by_step_matches_torch_and_the_seeds_formula(step_by_step):
    from qkv.demos.mha_step_by_step import HEADS, SOURCE, D

    r = step_by_step
    B, S, n = len(SOURCE), len(SOURCE[0]), HEADS
    assert [shape for _, shape in r.steps] == [
        (B, S, D),
        (B, S, n, D // n),
        (B, n, S, D // n),
        (B, n, S, S),
        (B, n, S, S),
        (B, n, S, D // n),
        (B, S, D),
        (B, S, D),
    ]
    for name, diff in r.diffs.items():
        assert diff < 2e-6, name  # float32 modules against each other and float64 by hand
    assert r.nan_rows == (True, False)  # torch: NaN where no key is visible; qkv: zeros
    torch.testing.assert_close(r.dead_row_output, r.out_proj_bias)
    w = r.encoder_weights
    assert w.shape == (B, n, S, S)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, n, S))
    assert float(w[0][..., r.key_padding_mask[0]].abs().max()) == 0.0  # <pad> keys get nothing
    assert r.shapes["view(B, d, Hi*Wi).permute(0, 2, 1)"] == (2, 12, D)
    assert r.shapes["its attention weights"] == (2, n, 12, 12)
    pa = r.pixel_attention
    torch.testing.assert_close(pa.sum((-1, -2)), torch.ones(2))
    assert float(pa[r.pixel_mask].abs().max()) == 0.0


def test_by_hand_is_torchs_forward_in_float64():
    """The demo's by-hand steps against torch's own functional MHA run in float64."""
    from qkv.demos.mha_step_by_step import by_hand

    torch.manual_seed(3)
    mha = torch.nn.MultiheadAttention(12, 3).double().eval()
    X = torch.randn(2, 6, 12, dtype=torch.float64)
    kpm = torch.tensor([[False] * 4 + [True] * 2, [False] * 6])
    out, w = by_hand(mha, X, kpm, [])
    x = X.transpose(0, 1)
    ref, ref_w = mha(x, x, x, key_padding_mask=kpm, average_attn_weights=False)
    torch.testing.assert_close(out, ref.transpose(0, 1).detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w, ref_w.detach(), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------- seed 002
def test_vit_data_flow_has_the_seeds_shapes():
    from qkv.demos.vit_qkv import data_flow

    B, N, C, H = 2, 196, 768, 8
    assert [s for _, s in data_flow(B, N, C, H)] == [
        (B, N, C),
        (B, N, 3 * C),
        (B, N, 3, H, C // H),
        (3, B, H, N, C // H),
        (B, H, N, C // H),
        (B, H, N, N),
        (B, H, N, C // H),
        (B, N, C),
    ]


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_vit_seed_forward_and_weights(qkv_bias):
    from qkv.demos.vit_qkv import attention_weights, seed_forward
    from qkv.nn import MultiHeadSelfAttention

    torch.manual_seed(0)
    m = MultiHeadSelfAttention(24, num_heads=4, qkv_bias=qkv_bias).double().eval()
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    with torch.no_grad():
        out, w = attention_weights(m, x)
        torch.testing.assert_close(out, m(x), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(seed_forward(m.state_dict(), x, 4), m(x), rtol=1e-12, atol=1e-12)
        # the weights, from the formula: softmax(q k^T / sqrt(d)) per head
        q, k, _ = m.qkv(x).view(2, 7, 3, 4, 6).permute(2, 0, 3, 1, 4)
        ref = (q @ k.transpose(-1, -2) / math.sqrt(6)).softmax(-1)
    torch.testing.assert_close(w, ref, rtol=1e-12, atol=1e-12)


def test_vit_squares_and_maps():
    from qkv.demos.vit_qkv import GRID, PATCH, SQUARE, compute_maps, squares

    g = torch.Generator().manual_seed(5)
    img, lab, foot = squares(50, g)
    assert img.shape == foot.shape == (50, GRID * PATCH, GRID * PATCH)
    assert bool((foot.sum((-1, -2)) == SQUARE * SQUARE).all())
    ys, xs = (foot.sum(2) > 0).float().argmax(1), (foot.sum(1) > 0).float().argmax(1)
    centre = ((ys + SQUARE // 2) // PATCH) * GRID + (xs + SQUARE // 2) // PATCH
    assert torch.equal(centre, lab)
    r = compute_maps()
    assert r.accuracy > 0.5 and r.chance == 1 / 16  # it learned
    assert r.maps.shape == (4, 2, GRID, GRID)
    assert bool((r.maps.sum((-1, -2)) <= 1 + 1e-6).all())  # the rest is on the class token
    assert max(r.on_square) > 2 * r.touched  # some head looks at the square


# ---------------------------------------------------------------------------- sqrt(d_k)
def test_sqrt_dk_measures_what_the_theory_says():
    from qkv.demos.sqrt_dk import DIMS, SCALINGS, compute

    r = compute()
    for name, (_, theory) in SCALINGS.items():
        for d, v in zip(DIMS, r.variance[name]):
            assert v == pytest.approx(theory(d), rel=0.15), (name, d)
    # scaled by sqrt(d), the softmax looks the same at every width; unscaled it saturates
    assert max(r.max_weight["sqrt(d)"]) - min(r.max_weight["sqrt(d)"]) < 0.05
    assert r.saturated["sqrt(d)"][-1] == 0.0
    assert r.saturated["none"][-1] > 0.5
    assert all(b > a for a, b in zip(r.max_weight["none"], r.max_weight["none"][1:]))
    assert r.grad["none"][-1] < r.grad["sqrt(d)"][-1] / 5
    # divided by d, the weights go flat: the largest weight tends to 1/n_keys
    assert r.max_weight["d"][-1] < 1.2 / r.n_keys


# ---------------------------------------------------------------------------- heads
def test_one_head_cannot_fetch_two_neighbours_two_can():
    from qkv.demos.heads import compute

    one, two = compute()
    assert one.heads == 1 and two.heads == 2
    assert 0.4 < one.test_loss < 0.6  # near the 0.5 of an average of two neighbours
    assert two.test_loss < 0.05
    assert sorted(two.offsets) == [-1, 1]  # one head looks left, the other right
    assert min(two.share) > 0.6
    assert one.offsets[0] in (-1, 1)
    torch.testing.assert_close(two.weights.sum(-1), torch.ones(2, 8))


def test_heads_task_targets_are_the_neighbours():
    from qkv.demos.heads import CONTENT, HeadsModel, L, batch

    x, t = batch(3, torch.Generator().manual_seed(0))
    content = x[..., :CONTENT]
    for i in range(L):
        torch.testing.assert_close(t[:, i, :CONTENT], content[:, (i - 1) % L])
        torch.testing.assert_close(t[:, i, CONTENT:], content[:, (i + 1) % L])
    # the layer is the drop-in: torch's module with its state_dict gives the same output
    m = HeadsModel(2).eval()
    ref = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
    ref.load_state_dict(m.attention.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(m.attention(x, x, x)[0], ref(x, x, x)[0], rtol=1e-5, atol=1e-5)
