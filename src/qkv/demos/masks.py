"""Seed 003's two masks, drawn: ``key_padding_mask``, the causal ``attn_mask`` and their merge.

Conventions (those of ``torch.nn.MultiheadAttention``, as the seed teaches): a bool mask is True
where attention is NOT allowed; ``key_padding_mask`` is ``(B, Lk)``, True at padding, and hides
key *columns*; the causal ``attn_mask`` ``(Lq, Lk)`` hides the upper triangle; a float mask is
added to the scores (``-inf`` hides).  The merged mask is what :mod:`qkv.functional.masks` builds
(``check_masks(...).blocked()``): the two OR-ed, broadcast to ``(B, 1, Lq, Lk)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from qkv import functional as qf
from qkv.functional.masks import check_masks

from . import register

__all__ = ["BATCH", "MaskDemo", "compute", "run"]

#: seed 003's batch: two sentences padded to length 5
BATCH = (("a", "b", "c", "<pad>", "<pad>"), ("x", "y", "<pad>", "<pad>", "<pad>"))
#: seed 003's causal example
CAUSAL_TOKENS = ("I", "am", "very", "happy")


@dataclass
class MaskDemo:
    key_padding_mask: Tensor  # (B, Lk) bool, True at padding
    causal: Tensor  # (Lq, Lk) bool, True above the diagonal
    causal_float: Tensor  # (Lq, Lk) float, 0 or -inf
    small_causal: Tensor  # (4, 4) bool, for "I am very happy"
    merged: Tensor  # (B, Lq, Lk) bool, from check_masks(...).blocked()
    scores: Tensor  # (B, Lq, Lk) random scores
    weights: Tensor  # (B, Lq, Lk) attention weights under the merged mask


def compute(seed: int = 0) -> MaskDemo:
    """The masks of seed 003's batch and the weights they leave, through qkv.functional."""
    B, L = len(BATCH), len(BATCH[0])
    kpm = torch.tensor([[t == "<pad>" for t in s] for s in BATCH])  # (B, Lk)
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)  # (Lq, Lk): key j > query i
    causal_float = torch.zeros(L, L).masked_fill(causal, float("-inf"))
    spec = check_masks(
        B=B,
        H=1,
        Lq=L,
        Lk=L,
        device=torch.device("cpu"),
        batched_heads=False,
        key_padding_mask=kpm,
        attn_mask=causal,
    )
    merged = spec.blocked()
    assert merged is not None
    merged = merged.expand(B, 1, L, L)[:, 0]  # (B, Lq, Lk)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, L, 8, generator=g)
    k = torch.randn(B, L, 8, generator=g)
    scores = q @ k.transpose(1, 2) / 8**0.5
    _, weights = qf.attention(q, k, k, key_padding_mask=kpm, attn_mask=causal, need_weights=True)
    return MaskDemo(
        kpm,
        causal,
        causal_float,
        torch.ones(4, 4, dtype=torch.bool).triu(1),
        merged,
        scores,
        weights,
    )


def _grid(ax, m: Tensor, xt, yt, *, text=None, title="", colour="#9e9e9e") -> None:
    """Draw a bool mask: blocked cells grey, allowed cells white, a label in each cell."""
    from matplotlib.colors import ListedColormap

    rows, cols = m.shape
    ax.imshow(m.float().numpy(), cmap=ListedColormap(["#ffffff", colour]), vmin=0, vmax=1)
    for i in range(rows):
        for j in range(cols):
            label = text(i, j) if text else ("True" if bool(m[i, j]) else "False")
            ax.text(
                j,
                i,
                label,
                ha="center",
                va="center",
                fontsize=8,
                color="white" if bool(m[i, j]) else "#333",
            )
    ax.set_xticks(range(cols), xt)
    ax.set_yticks(range(rows), yt)
    ax.set_xticks([x - 0.5 for x in range(1, cols)], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, rows)], minor=True)
    ax.grid(which="minor", color="#666", linewidth=0.6)
    ax.tick_params(which="minor", length=0)
    ax.set_title(title, fontsize=10)


def _figures(r: MaskDemo, out: Path) -> list[Path]:
    from qkv.viz import new_figure, save_figure

    drawn = [
        ("masks-key-padding.png", (13, 3.6), _draw_key_padding),
        ("masks-attn-mask.png", (8, 3.8), _draw_attn_mask),
        ("masks-merged.png", (12, 7.2), _draw_merged),
        ("masks-weights.png", (10, 4.4), _draw_weights),
    ]
    paths = []
    for name, size, draw in drawn:
        fig = new_figure(size, layout="constrained")
        draw(fig, r)
        paths.append(save_figure(fig, out / name))
    return paths


def _draw_key_padding(fig: Any, r: MaskDemo) -> None:
    """Figure 1: ``key_padding_mask`` ``(B, Lk)`` and what it hides in each sentence's
    ``(Lq, Lk)`` scores."""
    B, L = r.key_padding_mask.shape
    keys = [f"key {j}" for j in range(L)]
    axes = fig.subplots(1, 3, width_ratios=[1.1, 1, 1])
    _grid(
        axes[0],
        r.key_padding_mask,
        keys,
        ["sentence 0", "sentence 1"],
        title="key_padding_mask (B, Lk): True at <pad>",
    )
    for b in range(B):
        cols = r.key_padding_mask[b].expand(L, L)
        _grid(
            axes[b + 1],
            cols,
            BATCH[b],
            BATCH[b],
            text=lambda i, j, c=cols: "-inf" if c[i, j] else "",
            title=f"sentence {b}: hides key columns of QKᵀ",
        )
        axes[b + 1].set_xlabel("keys")
        axes[b + 1].set_ylabel("queries")


def _draw_attn_mask(fig: Any, r: MaskDemo) -> None:
    """Figure 2: the causal ``attn_mask``, bool and float, on "I am very happy"."""
    axes = fig.subplots(1, 2)
    t = list(CAUSAL_TOKENS)
    _grid(axes[0], r.small_causal, t, t, title="attn_mask, bool: True = not allowed")
    _grid(
        axes[1],
        r.small_causal,
        t,
        t,
        text=lambda i, j: "-inf" if r.small_causal[i, j] else "0",
        title="attn_mask, float: added to QKᵀ",
    )
    for ax in axes:
        ax.set_xlabel("keys")
        ax.set_ylabel("queries")


def _draw_merged(fig: Any, r: MaskDemo) -> None:
    """Figure 3: the merge, per sentence: padding | causal = merged."""
    B, L = r.key_padding_mask.shape
    axes = fig.subplots(B, 3)
    for b in range(B):
        toks = BATCH[b]
        pad = r.key_padding_mask[b].expand(L, L)
        _grid(
            axes[b, 0],
            pad,
            toks,
            toks,
            text=lambda i, j, m=pad: "T" if m[i, j] else "",
            title=f"sentence {b}: key_padding_mask",
        )
        _grid(
            axes[b, 1],
            r.causal,
            toks,
            toks,
            text=lambda i, j: "T" if r.causal[i, j] else "",
            title="causal attn_mask",
        )
        _grid(
            axes[b, 2],
            r.merged[b],
            toks,
            toks,
            colour="#555555",
            text=lambda i, j, m=r.merged[b]: "T" if m[i, j] else "",
            title="merged: check_masks(...).blocked()",
        )
        axes[b, 0].set_ylabel("queries")
    for ax in axes[-1]:
        ax.set_xlabel("keys")
    fig.suptitle("merging the two masks: a position is hidden if either mask hides it (OR)")


def _draw_weights(fig: Any, r: MaskDemo) -> None:
    """Figure 4: what is left, the attention weights, zero wherever the merged mask is True."""
    B, L = r.key_padding_mask.shape
    axes = fig.subplots(1, B)
    image = None
    for b, ax in enumerate(axes):
        image = ax.imshow(r.weights[b].numpy(), cmap="Reds", vmin=0.0, vmax=1.0)
        for i in range(L):
            for j in range(L):
                v = float(r.weights[b, i, j])
                ax.text(
                    j,
                    i,
                    f"{v:.2f}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if v > 0.6 else "black",
                )
        ax.set_xticks(range(L), BATCH[b])
        ax.set_yticks(range(L), BATCH[b])
        ax.set_title(f"sentence {b}")
        ax.set_xlabel("keys")
    axes[0].set_ylabel("queries")
    fig.colorbar(image, ax=axes, shrink=0.7)
    fig.suptitle("attention weights under the merged mask (random scores): rows sum to 1")


def _bools(m: Tensor) -> None:
    for row in m:
        print("    " + " ".join(f"{bool(x)!s:>5}" for x in row))


@register(
    "masks",
    "seed 003's key_padding_mask, causal attn_mask and their merge, drawn",
    needs=("matplotlib",),
)
def run(out: Path, quick: bool) -> None:
    r = compute()
    B = r.key_padding_mask.shape[0]
    print("seed 003: the two masks of multi-head attention (bool: True = NOT allowed)")
    print(f"  batch: {[list(s) for s in BATCH]}\n")
    print(f"  key_padding_mask (B, Lk) = {tuple(r.key_padding_mask.shape)}, True at <pad>:")
    _bools(r.key_padding_mask)
    print(f"  causal attn_mask (Lq, Lk) = {tuple(r.causal.shape)}, True above the diagonal:")
    _bools(r.causal)
    print("  as a float mask it is added to the scores:")
    for row in r.causal_float:
        print("    " + " ".join(f"{float(x):>5}" for x in row))
    print("\n  merged with check_masks(..., key_padding_mask=kpm, attn_mask=causal).blocked():")
    for b in range(B):
        print(f"  sentence {b} {list(BATCH[b])}:")
        _bools(r.merged[b])
    by_hand = r.key_padding_mask[:, None, :] | r.causal[None]
    print(f"  equal to key_padding_mask[:, None, :] | attn_mask: {torch.equal(r.merged, by_hand)}")
    print("\n  attention weights under the merged mask (random scores):")
    for b in range(B):
        print(f"  sentence {b}:")
        for row in r.weights[b]:
            print("    " + " ".join(f"{float(x):5.3f}" for x in row))
    sums = r.weights.sum(-1)
    zero = bool((r.weights[r.merged] == 0).all())
    print(f"  row sums: {[round(float(x), 6) for x in sums.flatten()]}")
    print(f"  every masked position has weight exactly 0: {zero}")
    print("  (the <pad> rows are queries from padding: they still see the real tokens before")
    print("   them; the seed ignores their outputs in the loss with ignore_index=padding_idx)")
    out.mkdir(parents=True, exist_ok=True)
    print()
    for p in _figures(r, out):
        print(f"  wrote {p}")
