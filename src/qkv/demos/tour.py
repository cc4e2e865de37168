"""A short tour of the attention core, printing real results computed on the spot."""

from __future__ import annotations

from pathlib import Path

import torch

from qkv import functional as qf

from . import register


def _show(title: str, t: torch.Tensor) -> None:
    print(f"\n{title}  shape {tuple(t.shape)}")
    print(t)


@register("tour", "a short tour of qkv.functional: masks, scores, backends")
def run(out: Path, quick: bool) -> None:
    torch.manual_seed(0)
    torch.set_printoptions(precision=4, sci_mode=False)
    print("qkv tour: the attention core (qkv.functional)")

    X = torch.rand(2, 2, 4)
    _show(
        "masked_softmax(rand(2, 2, 4), valid_lens=[2, 3])  (the book's example)",
        qf.masked_softmax(X, torch.tensor([2, 3])),
    )
    _show(
        "masked_softmax with per-query lengths [[1, 3], [2, 0]]: a length-0 row is all zeros",
        qf.masked_softmax(X, torch.tensor([[1, 3], [2, 0]])),
    )

    # seed 001's example: Q = K = V = (cat, milk, it, sweet); d = 4 with the "..." as zeros
    E = torch.tensor([[0, 2, 2, 0], [0, 1, 3, 0], [0, 2, 2, 0], [0, 0, 4, 0]], dtype=torch.float64)
    out_, w = qf.attention(E[None], E[None], E[None], need_weights=True)
    _show("seed 001: softmax(QK^T/sqrt(4)) for cat, milk, it, sweet", w[0])
    _show("seed 001: new embeddings softmax(QK^T/sqrt(4)) V (columns 2-3)", out_[0, :, 1:3])
    print("(`qkv demo cat-milk` compares these with the numbers the seed prints)")

    B, H, L, d = 2, 4, 7, 16
    q, k, v = (torch.randn(B, H, L, d) for _ in range(3))
    kpm = torch.zeros(B, L, dtype=torch.bool)
    kpm[1, 5:] = True
    print("\nbackends (qkv.functional.explain):")
    print("  need_weights=False ->", qf.explain(q, k, v, key_padding_mask=kpm))
    print("  need_weights=True  ->", qf.explain(q, k, v, key_padding_mask=kpm, need_weights=True))
    print("  score='normalized' ->", qf.explain(q, k, v, score="normalized"))
    o_f, _ = qf.attention(q, k, v, key_padding_mask=kpm, is_causal=True, backend="fused")
    o_r, _ = qf.attention(q, k, v, key_padding_mask=kpm, is_causal=True, backend="reference")
    print(f"  fused vs reference, padding + causal: max |diff| = {(o_f - o_r).abs().max():.2e}")

    print("\nscores on the same q, k (first query's weights, head 0, batch 0):")
    for score in ("scaled_dot", "dot", "cosine", "normalized", "length_scaled"):
        _, w = qf.attention(q, k, v, score=score, need_weights=True)
        print(f"  {score:>14}: {[round(x, 3) for x in w[0, 0, 0].tolist()]}")
    alibi = lambda s, b, h, i, j: s - 0.5 * (i - j).abs()  # noqa: E731
    _, w = qf.attention(q, k, v, score=alibi, need_weights=True)
    print(f"  {'score_mod':>14}: {[round(x, 3) for x in w[0, 0, 0].tolist()]}  (ALiBi-like bias)")

    kv = torch.randn(B, 2, L, d)
    o, _ = qf.attention(q, kv, kv)
    print(f"\ngrouped-query attention: 4 query heads over 2 key/value heads -> {tuple(o.shape)}")
