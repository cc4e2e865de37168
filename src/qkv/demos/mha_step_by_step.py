"""Seed 000: the Transformer's attention step by step, ``torch.nn.MultiheadAttention`` and qkv's
drop-in side by side.

The seed's encoder walk (token ids ``(B, L)``, embedding, positions, ``Q = X W^Q``,
``view(B, L, n, d/n)``, ``permute(0, 2, 1, 3)``, scores ``(B, n, L, L)``, softmax, ``A V``, back to
``(B, L, d)``, ``W^O``) is computed by hand in float64 from the weights of a
``torch.nn.MultiheadAttention``, every shape printed as measured, and set beside torch's module
and :class:`qkv.nn.MultiheadAttention` holding the same ``state_dict``. Then the decoder's two
attentions (causal ``attn_mask`` ``(L, L)`` and padding; cross-attention ``(B, L, S)``), the
``(B*n, L, S)`` form of ``attn_mask``, ``kdim``/``vdim`` (the seed asks why ``kdim`` exists), a
query whose every key is masked (torch: NaN; qkv: zeros), and DETR's image as a sequence:
``(B, C, Hi, Wi)`` features, a 1x1 convolution, ``view(B, d, Hi*Wi).permute(0, 2, 1)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from qkv.nn import ImageEncoder, ImageToSequence, MultiheadAttention, PositionalEncoding

from . import register

__all__ = [
    "SOURCE",
    "TARGET",
    "StepByStep",
    "by_hand",
    "compute",
    "draw_detr",
    "draw_weights",
    "run",
]

#: the seed's convention: index 0 is <pad>; two source sentences of S = 5 and targets of L = 4
SOURCE = [[5, 8, 3, 0, 0], [7, 2, 9, 4, 1]]
TARGET = [[6, 2, 9, 0], [3, 3, 1, 8]]
V, D, HEADS = 10, 8, 2  # vocabulary (ids 1..V, 0 = <pad>), model width d, heads n


@dataclass
class StepByStep:
    """Every number the demo prints, computed."""

    steps: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    diffs: dict[str, float] = field(default_factory=dict)  # max |difference| of each comparison
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    encoder_weights: Tensor | None = None  # (B, n, S, S) per head, padding masked
    key_padding_mask: Tensor | None = None  # (B, S)
    nan_rows: tuple[bool, bool] = (False, False)  # (torch has NaN, qkv has NaN) for a dead row
    dead_row_output: Tensor | None = None  # qkv's output of the query that sees no key
    out_proj_bias: Tensor | None = None
    pixel_attention: Tensor | None = None  # (B, Hi, Wi): one pixel's mean weights over the image
    pixel_mask: Tensor | None = None  # (B, Hi, Wi)


def by_hand(
    mha: nn.MultiheadAttention, X: Tensor, key_padding_mask: Tensor, steps: list
) -> tuple[Tensor, Tensor]:
    """The seed's steps, in float64, from ``mha``'s ``in_proj_weight``/``out_proj``: ``X (B, L,
    d)`` self-attention with padding; appends ``(step, shape)`` to ``steps``; returns ``(output
    (B, L, d), weights (B, n, L, L))``."""
    B, L, d = X.shape
    n = mha.num_heads
    W = mha.in_proj_weight.detach().double()
    b = mha.in_proj_bias.detach().double()
    X = X.double()
    Q, K, Vv = (X @ W[i * d : (i + 1) * d].T + b[i * d : (i + 1) * d] for i in range(3))
    steps.append(("Q = X W^Q (and K, V alike)", tuple(Q.shape)))
    Q1 = Q.view(B, L, n, d // n)
    steps.append(("Q.view(B, L, n, d/n)", tuple(Q1.shape)))
    Q1, K1, V1 = (t.view(B, L, n, d // n).permute(0, 2, 1, 3) for t in (Q, K, Vv))
    steps.append(("permute(0, 2, 1, 3)", tuple(Q1.shape)))
    A = Q1 @ K1.transpose(-1, -2) / math.sqrt(d // n)
    steps.append(("A = Q K^T / sqrt(d/n)", tuple(A.shape)))
    A = A.masked_fill(key_padding_mask[:, None, None, :], float("-inf")).softmax(-1)
    steps.append(("softmax, padding keys masked", tuple(A.shape)))
    heads = A @ V1
    steps.append(("O = A V", tuple(heads.shape)))
    joined = heads.permute(0, 2, 1, 3).contiguous().view(B, L, d)
    steps.append(("O.permute(0, 2, 1, 3).contiguous().view(B, L, d)", tuple(joined.shape)))
    out = joined @ mha.out_proj.weight.detach().double().T + mha.out_proj.bias.detach().double()
    steps.append(("O W^O", tuple(out.shape)))
    return out, A


def _pair(n_heads: int = HEADS, **kw: Any) -> tuple[nn.MultiheadAttention, MultiheadAttention]:
    """torch's module and qkv's, the same weights (copied with ``load_state_dict``)."""
    ref = nn.MultiheadAttention(D, n_heads, **kw).eval()
    ours = MultiheadAttention(D, n_heads, **kw).eval()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _max_diff(a: Tensor, b: Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def _encoder(r: StepByStep) -> None:
    src = torch.tensor(SOURCE)  # (B, S)
    kpm = src == 0  # (B, S): True at <pad>
    emb = nn.Embedding(V + 1, D, padding_idx=0)
    X = PositionalEncoding(D)(emb(src) * math.sqrt(D))  # (B, S, d)
    r.shapes.update(ids=tuple(src.shape), embedding=tuple(emb.weight.shape), X=tuple(X.shape))
    ref, ours = _pair()
    x = X.transpose(0, 1)  # the seed's (S, B, d): batch_first=False, torch's default
    with torch.no_grad():
        out_t, w_t = ref(x, x, x, key_padding_mask=kpm, average_attn_weights=False)
        out_q, w_q = ours(x, x, x, key_padding_mask=kpm, average_attn_weights=False)
        out_h, w_h = by_hand(ref, X.detach(), kpm, r.steps)
        _, w_mean = ours(x, x, x, key_padding_mask=kpm)  # averaged over the heads
    r.diffs["torch vs by hand (output)"] = _max_diff(out_t.transpose(0, 1), out_h)
    r.diffs["qkv vs torch (output)"] = _max_diff(out_q, out_t)
    r.diffs["qkv vs torch (weights per head)"] = _max_diff(w_q, w_t)
    r.diffs["qkv's averaged weights vs the mean of the heads by hand"] = _max_diff(
        w_mean, w_h.mean(1)
    )
    r.shapes["weights, averaged (the default)"] = tuple(w_mean.shape)
    r.shapes["weights, average_attn_weights=False"] = tuple(w_q.shape)
    r.encoder_weights, r.key_padding_mask = w_q, kpm


def _decoder(r: StepByStep) -> None:
    B, S, L = len(SOURCE), len(SOURCE[0]), len(TARGET[0])
    g = torch.Generator().manual_seed(1)
    y = torch.randn(L, B, D, generator=g)  # decoder inputs (L, B, d)
    memory = torch.randn(S, B, D, generator=g)  # the encoder's output (S, B, d)
    src_kpm = torch.tensor(SOURCE) == 0
    tgt_kpm = torch.tensor(TARGET) == 0
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)  # (L, L): True above the diagonal
    ref, ours = _pair()
    with torch.no_grad():
        a_t, _ = ref(y, y, y, attn_mask=causal, key_padding_mask=tgt_kpm)
        a_q, w_q = ours(y, y, y, attn_mask=causal, key_padding_mask=tgt_kpm)
        r.diffs["decoder self-attention, causal + padding: qkv vs torch"] = _max_diff(a_q, a_t)
        r.shapes["attn_mask (causal)"] = tuple(causal.shape)
        r.diffs["weights above the diagonal (must be 0)"] = float(
            w_q.masked_select(causal).abs().max()
        )
        ref2, ours2 = _pair()
        c_t, _ = ref2(y, memory, memory, key_padding_mask=src_kpm, average_attn_weights=False)
        c_q, cw_q = ours2(y, memory, memory, key_padding_mask=src_kpm, average_attn_weights=False)
        r.diffs["cross-attention: qkv vs torch"] = _max_diff(c_q, c_t)
        r.shapes["cross-attention query (L, B, d)"] = tuple(y.shape)
        r.shapes["cross-attention key = value (S, B, d)"] = tuple(memory.shape)
        r.shapes["cross-attention output"] = tuple(c_q.shape)
        r.shapes["cross-attention weights per head"] = tuple(cw_q.shape)
        # attn_mask as (B * n, L, S): one mask per sequence and head, as the seed says
        per_head = torch.zeros(B * HEADS, L, S, dtype=torch.bool)
        per_head[1::HEADS, :, -1] = True  # head 1 of every sequence may not see the last key
        m_t, _ = ref2(y, memory, memory, attn_mask=per_head)
        m_q, mw_q = ours2(y, memory, memory, attn_mask=per_head, average_attn_weights=False)
        r.diffs["attn_mask (B*n, L, S): qkv vs torch"] = _max_diff(m_q, m_t)
        r.diffs["head 1's weight on the last key (must be 0)"] = float(
            mw_q[:, 1, :, -1].abs().max()
        )
        r.shapes["attn_mask per sequence and head"] = tuple(per_head.shape)


def _kdim_and_dead_rows(r: StepByStep) -> None:
    B, S, L = 2, 5, 3
    g = torch.Generator().manual_seed(2)
    ref, ours = _pair(kdim=6, vdim=5)
    q = torch.randn(L, B, D, generator=g)
    k, v = torch.randn(S, B, 6, generator=g), torch.randn(S, B, 5, generator=g)
    with torch.no_grad():
        r.diffs["kdim=6, vdim=5: qkv vs torch"] = _max_diff(ours(q, k, v)[0], ref(q, k, v)[0])
    r.shapes["k_proj_weight (kdim -> d)"] = tuple(ours.k_proj_weight.shape)
    r.shapes["v_proj_weight (vdim -> d)"] = tuple(ours.v_proj_weight.shape)
    ref, ours = _pair()
    with torch.no_grad():  # a bias that is not 0, so that "the output is the bias" means something
        ref.out_proj.bias.copy_(torch.randn(D, generator=g))
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(L, B, D, generator=g)
    dead = torch.zeros(L, L, dtype=torch.bool)
    dead[0] = True  # query 0 may look at no key
    with torch.no_grad():
        out_t, _ = ref(x, x, x, attn_mask=dead)
        out_q, _ = ours(x, x, x, attn_mask=dead)
    r.nan_rows = (bool(out_t[0].isnan().any()), bool(out_q[0].isnan().any()))
    r.dead_row_output = out_q[0, 0]
    r.out_proj_bias = ours.out_proj.bias.detach()
    r.diffs["the other queries: qkv vs torch"] = _max_diff(out_q[1:], out_t[1:])


def _detr(r: StepByStep) -> None:
    B, C, Hi, Wi = 2, 16, 3, 4
    g = torch.Generator().manual_seed(3)
    features = torch.randn(B, C, Hi, Wi, generator=g)  # a backbone's (B, C, Hi, Wi)
    mask = torch.zeros(B, Hi, Wi, dtype=torch.bool)
    mask[1, :, 3:] = True  # the second image is narrower: its last column is padding
    seq = ImageToSequence(C, D)
    with torch.no_grad():
        tokens, pos, kpm = seq(features, mask)
        conv = seq.input_proj(features)  # the 1x1 convolution: (B, d, Hi, Wi)
        seed = conv.view(B, D, Hi * Wi).permute(0, 2, 1)  # the seed's formula
    r.shapes["features (B, C, Hi, Wi)"] = tuple(features.shape)
    r.shapes["1x1 conv (B, d, Hi, Wi)"] = tuple(conv.shape)
    r.shapes["view(B, d, Hi*Wi).permute(0, 2, 1)"] = tuple(seed.shape)
    r.shapes["2-D sine positions"] = tuple(pos.shape)
    assert kpm is not None
    r.shapes["key_padding_mask from the pixel mask"] = tuple(kpm.shape)
    r.diffs["ImageToSequence vs the seed's view/permute"] = _max_diff(tokens, seed)
    enc = ImageEncoder(C, D, 16, HEADS, 1, 0.0).eval()
    with torch.no_grad():
        out = enc(features, mask, need_weights=True)
    assert enc.attention_weights is not None
    w = enc.attention_weights[0]  # (B, n, Hi*Wi, Hi*Wi)
    r.shapes["ImageEncoder output"] = tuple(out.shape)
    r.shapes["its attention weights"] = tuple(w.shape)
    r.diffs["weight on padded pixels (must be 0)"] = float(w[1][..., kpm[1]].abs().max())
    r.pixel_attention = w.mean(1)[:, 0].reshape(B, Hi, Wi)  # pixel (0, 0) over the image
    r.pixel_mask = mask


def compute(seed: int = 0) -> StepByStep:
    """Every part of the demo (see the module's notes), with ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    r = StepByStep()
    _encoder(r)
    _decoder(r)
    _kdim_and_dead_rows(r)
    _detr(r)
    return r


def draw_weights(r: StepByStep) -> Any:
    """The encoder's self-attention per sequence (rows) and head (columns): padding columns 0."""
    from qkv.viz import show_heatmaps

    assert r.encoder_weights is not None
    names = [["<pad>" if i == 0 else f"w{i}" for i in s] for s in SOURCE]
    return show_heatmaps(
        r.encoder_weights,
        xlabel="keys (sequence 2's labels)",
        ylabel="queries",
        titles=[f"head {h}" for h in range(HEADS)],
        figsize=(6.0, 5.2),
        xticklabels=names[1],
        yticklabels=names[1],
    )


def draw_detr(r: StepByStep) -> Any:
    """The image as a sequence: each pixel's position ``y * Wi + x``, and pixel 0's attention
    over the image (heads averaged), padded pixels hatched."""
    from matplotlib.patches import Rectangle

    from qkv.viz import new_figure

    assert r.pixel_attention is not None and r.pixel_mask is not None
    B, Hi, Wi = r.pixel_attention.shape
    fig = new_figure((3.2 * (B + 1), 3.0), layout="constrained")
    axes = fig.subplots(1, B + 1)
    axes[0].imshow(torch.arange(Hi * Wi).reshape(Hi, Wi).numpy(), cmap="Blues")
    for y in range(Hi):
        for x in range(Wi):
            i = y * Wi + x
            axes[0].text(x, y, str(i), ha="center", va="center", color="w" if i > 5 else "k")
    axes[0].set_title("sequence position y * Wi + x", fontsize=9)
    for b in range(B):
        ax = axes[b + 1]
        ax.imshow(r.pixel_attention[b].numpy(), cmap="Reds", vmin=0)
        for y, x in r.pixel_mask[b].nonzero().tolist():
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, hatch="//", color="grey"))
        ax.set_title(f"image {b}: pixel 0's attention\n(hatched: padding)", fontsize=9)
    for ax in axes:
        ax.set_xticks(range(Wi))
        ax.set_yticks(range(Hi))
    return fig


@register(
    "mha-step-by-step",
    "seed 000: the Transformer's attention step by step, torch's MHA and qkv's side by side, DETR",
)
def run(out: Path, quick: bool) -> None:
    r = compute()
    B, S = len(SOURCE), len(SOURCE[0])
    print(f"token ids (B, S) = {r.shapes['ids']}, index 0 = <pad>: {SOURCE}")
    print(
        f"embedding table (V+1, d) = {r.shapes['embedding']}; X = embedding * sqrt(d) + P: {r.shapes['X']}"
    )
    print(f"encoder self-attention, n = {HEADS} heads of d/n = {D // HEADS}, by hand in float64:")
    for name, shape in r.steps:
        print(f"  {name:<52} {shape}")
    print("\nside by side (max |difference|; torch's module and qkv's hold one state_dict):")
    for name, diff in r.diffs.items():
        print(f"  {name:<58} {diff:.1e}")
    print("\nshapes:")
    for name, shape in r.shapes.items():
        if name not in ("ids", "embedding", "X"):
            print(f"  {name:<42} {shape}")
    torch_nan, qkv_nan = r.nan_rows
    assert r.dead_row_output is not None and r.out_proj_bias is not None
    print(
        f"\na query whose every key is masked: torch's output has NaN: {torch_nan}; qkv's has "
        f"NaN: {qkv_nan}; qkv's is out_proj.bias (max |diff| "
        f"{_max_diff(r.dead_row_output, r.out_proj_bias):.1e}), the attention value being 0"
    )
    print(
        f"(kdim and vdim: key and value may come with other widths; k_proj and v_proj map them "
        f"to d, so Q K^T is still a product in d)\n"
        f"({B} sequences of {S}: attention weights are averaged over the heads unless "
        f"average_attn_weights=False)"
    )
    from qkv.viz import save_figure

    print()
    for name, draw in (
        ("mha-step-by-step-weights.png", draw_weights),
        ("mha-step-by-step-detr.png", draw_detr),
    ):
        print(f"  wrote {save_figure(draw(r), out / name)}")
