"""The seeds' demos: each writes its figures (not blank) and prints numbers that are right."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _folders import assert_not_blank_png

from qkv.cli import main

FILES = {
    "nadaraya-watson": [
        "nw-fits.png",
        "nw-weights-average.png",
        "nw-weights-gaussian.png",
        "nw-weights-learned.png",
        "nw-loss.png",
    ],
    "positional-encoding": ["positional-encoding-heatmap.png", "positional-encoding-columns.png"],
    "cat-milk": [
        "cat-milk-sweet-weights.png",
        "cat-milk-hungry-weights.png",
        "cat-milk-embeddings.png",
    ],
    "masks": [
        "masks-key-padding.png",
        "masks-attn-mask.png",
        "masks-merged.png",
        "masks-weights.png",
    ],
    # their numbers: tests/demos/test_demos_seeds.py
    "mha-step-by-step": ["mha-step-by-step-weights.png", "mha-step-by-step-detr.png"],
    "vit-qkv": ["vit-attention-maps.png"],
    "sqrt-dk": ["sqrt-dk-variance.png", "sqrt-dk-saturation.png"],
    "heads": ["heads-weights.png", "heads-loss.png"],
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_demo_writes_its_figures(name, tmp_path, capsys):
    assert main(["demo", name, "--out", str(tmp_path), "--quick"]) == 0
    printed = capsys.readouterr().out
    for f in FILES[name]:
        path = tmp_path / f
        assert path.exists(), f"{name} did not write {f}"
        assert f"wrote {path}" in printed
        img = assert_not_blank_png(path, min_side=200)
        drawn = (img.min(-1) < 200).mean()  # share of pixels clearly not background
        assert drawn > 0.02, f"{f} is almost empty ({drawn:.1%} drawn)"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES[name])


def test_demos_are_listed(capsys):
    assert main(["demo", "--list"]) == 0
    listed = capsys.readouterr().out
    for name in FILES:
        assert name in listed


# ------------------------------------------------------------------ Nadaraya-Watson
def test_nadaraya_watson_numbers():
    from qkv.demos.nadaraya_watson import compute, target

    r = compute()
    assert r.x_train.shape == (50,) and r.x_test.shape == (50,)
    assert bool((r.x_train[1:] >= r.x_train[:-1]).all())  # sorted, as the book plots them
    for name, w in r.weights.items():
        assert w.shape == (50, 50), name
        torch.testing.assert_close(w.sum(-1), torch.ones(50), msg=name)
        assert bool((w >= 0).all())
    torch.testing.assert_close(r.y_truth, target(r.x_test))
    assert r.losses[-1] < r.losses[0]  # training w by SGD lowers the loss
    assert all(b <= a + 1e-6 for a, b in zip(r.losses, r.losses[1:]))
    assert r.w_learned > r.w_initial  # it narrows the kernel
    mse = {k: float(((p - r.y_truth) ** 2).mean()) for k, p in r.predictions.items()}
    assert mse["Gaussian kernel"] < mse["average pooling"]
    assert mse["learned w"] < mse["average pooling"]
    # the book's Gaussian kernel, recomputed in float64 from the formula
    x, xs, ys = r.x_test.double(), r.x_train.double(), r.y_train.double()
    ref = torch.softmax(-((x[:, None] - xs[None]) ** 2) / 2, dim=1) @ ys
    torch.testing.assert_close(r.predictions["Gaussian kernel"].double(), ref, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ positional encoding
def test_positional_encoding_table():
    from qkv.demos.positional_encoding import sinusoidal_table

    P = sinusoidal_table(60, 32)
    assert P.shape == (60, 32) and P.dtype == torch.float64
    for i in (0, 7, 59):
        for j in (0, 3, 10, 31):
            angle = i / 10000 ** ((j - j % 2) / 32)
            want = math.sin(angle) if j % 2 == 0 else math.cos(angle)
            assert float(P[i, j]) == pytest.approx(want, abs=1e-14)
    with pytest.raises(ValueError, match="d"):
        sinusoidal_table(4, 3)
    from qkv.demos.positional_encoding import encoding_table

    table, _ = encoding_table(60, 32)  # the library's
    torch.testing.assert_close(table, P, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="max_len"):
        sinusoidal_table(0, 4)


# ------------------------------------------------------------------ cat and milk
def _softmax(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("key", ["sweet", "hungry"])
def test_cat_milk_matches_an_independent_float64_computation(key):
    from qkv.demos.cat_milk import SEED, compute

    vec = {"sweet": (0, 4), "milk": (1, 3), "it": (2, 2), "cat": (2, 2), "hungry": (4, 0)}
    tokens = ["cat", "milk", "it", key]
    X = np.array([[0.0, *vec[t], 0.0] for t in tokens])  # d = 4, the seed's "..." = 0
    scores = X @ X.T
    weights = _softmax(scores / math.sqrt(4))
    new = weights @ X
    r = compute()[key]
    np.testing.assert_array_equal(r.scores.numpy(), scores)
    np.testing.assert_array_equal(r.scores.numpy(), np.array(SEED[key]["scores"]))
    np.testing.assert_allclose(r.weights.numpy(), weights, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(r.weights.sum(-1).numpy(), 1.0, rtol=1e-14)
    np.testing.assert_allclose(r.new.numpy(), new, rtol=1e-13, atol=1e-14)
    it, milk, cat = new[2], new[1], new[0]
    assert r.sim["it·milk"] == pytest.approx(it @ milk, rel=1e-13)
    assert r.sim["it·cat"] == pytest.approx(it @ cat, rel=1e-13)
    assert r.sim_before == {"it·milk": 8.0, "it·cat": 8.0}
    # the seed's own conclusion holds with the exact numbers
    if key == "sweet":
        assert r.sim["it·milk"] > r.sim["it·cat"]
    else:
        assert r.sim["it·cat"] > r.sim["it·milk"]
    # the seed's printed embeddings are softmax(QK^T) V / sqrt(d), to their 3 decimals
    seed_new = _softmax(scores) @ X / 2
    np.testing.assert_allclose(seed_new[:, 1:3], np.array(SEED[key]["new"]), atol=5e-4)
    np.testing.assert_allclose(r.seed_new.numpy(), seed_new, rtol=1e-13, atol=1e-15)
    assert np.abs(new[:, 1:3] - np.array(SEED[key]["new"])).max() > 0.4  # and not the formula


def test_cat_milk_output_flags_the_seeds_discrepancies(tmp_path, capsys):
    main(["demo", "cat-milk", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "softmax(Q K^T) V / sqrt(d)" in out  # why the printed embeddings differ
    assert out.count("0.0625 is a typo for 0.625") == 2  # sim(it, milk) and sim(it, cat)
    assert "10.1677" in out and "9.1250" in out  # exact sims, sentence 1
    assert "7.7479" in out and "8.1250" in out  # exact sims, sentence 2
    assert out.count("the seed's conclusion holds") == 2


# ------------------------------------------------------------------ masks
def test_masks_merge_and_weights():
    from qkv.demos.masks import BATCH, compute

    r = compute()
    B, L = len(BATCH), len(BATCH[0])
    want_kpm = torch.tensor([[False, False, False, True, True], [False, False, True, True, True]])
    assert torch.equal(r.key_padding_mask, want_kpm)
    assert torch.equal(r.causal, torch.ones(L, L, dtype=torch.bool).triu(1))
    assert r.merged.shape == (B, L, L)
    for b in range(B):
        for i in range(L):
            for j in range(L):
                assert bool(r.merged[b, i, j]) == (j > i or bool(want_kpm[b, j]))
    assert bool((r.weights[r.merged] == 0).all())
    torch.testing.assert_close(r.weights.sum(-1), torch.ones(B, L))
    assert torch.isinf(r.causal_float[0, 1]) and r.causal_float[1, 0] == 0
