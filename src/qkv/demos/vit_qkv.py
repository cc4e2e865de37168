"""Seed 002: ViT's attention with one fused ``qkv`` projection, step by step.

The seed's data flow (``x`` of ``B x N x C = 32 x 196 x 768``, 8 heads of 96) is replayed on
:class:`qkv.nn.MultiHeadSelfAttention` (batch 2 instead of 32, to stay quick) and every shape is
printed as measured. The module's weights are named as the seed's and timm's (``qkv``, ``proj``),
so their state dicts load; its output is checked against the seed's forward written out in
float64 from the same weights, and against timm's ``Attention`` when timm can be imported.

Then attention maps of patches: a tiny ViT (one block, 2 heads) learns in a few seconds to tell
which of 16 patches holds the centre of a bright square on a noisy image, and its class token's
attention over the patches shows where it looks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from qkv import functional as qf
from qkv.nn import MultiHeadSelfAttention

from . import register
from ._threads import one_thread

__all__ = [
    "TinyViT",
    "VitResult",
    "attention_weights",
    "compare_with_timm",
    "compute_maps",
    "data_flow",
    "draw_maps",
    "run",
    "seed_forward",
    "squares",
]


# ---------------------------------------------------------------------------- the seed's shapes
def seed_forward(state: dict[str, Tensor], x: Tensor, num_heads: int) -> Tensor:
    """Seed 002's ``Attention.forward`` written out from a state dict, in float64:
    ``qkv -> reshape(B, N, 3, H, C/H) -> permute(2, 0, 3, 1, 4) -> q k^T * d^-0.5 -> softmax ->
    @ v -> transpose(1, 2) -> reshape(B, N, C) -> proj``."""
    x = x.double()
    B, N, C = x.shape
    w = {k: v.double() for k, v in state.items()}
    qkv = x @ w["qkv.weight"].T + w.get("qkv.bias", 0)
    q, k, v = qkv.reshape(B, N, 3, num_heads, C // num_heads).permute(2, 0, 3, 1, 4).unbind(0)
    attn = ((q @ k.transpose(-2, -1)) * (C // num_heads) ** -0.5).softmax(dim=-1)
    out = (attn @ v).transpose(1, 2).reshape(B, N, C)
    return out @ w["proj.weight"].T + w["proj.bias"]


def attention_weights(m: MultiHeadSelfAttention, x: Tensor) -> tuple[Tensor, Tensor]:
    """``(output (B, N, C), weights (B, H, N, N))`` of ``m`` on ``x``: the module's own steps
    (fused ``qkv``, the per-head norms, :func:`qkv.functional.attention`, ``proj``) with the
    weights kept (the module itself does not return them)."""
    B, N, C = x.shape
    q, k, v = m.qkv(x).view(B, N, 3, m.num_heads, m.head_dim).permute(2, 0, 3, 1, 4)
    out, w = qf.attention(m.q_norm(q), m.k_norm(k), v, scale=m.scale, need_weights=True)
    assert w is not None
    return m.proj(out.transpose(1, 2).reshape(B, N, C)), w


def data_flow(batch: int = 2, N: int = 196, C: int = 768, H: int = 8) -> list[tuple[str, tuple]]:
    """The seed's steps on a random ``x (batch, N, C)`` through a :class:`MultiHeadSelfAttention`
    of ``H`` heads, each step's shape as measured."""
    torch.manual_seed(0)
    m = MultiHeadSelfAttention(C, num_heads=H).eval()
    x = torch.rand(batch, N, C)
    steps: list[tuple[str, tuple]] = [("x", tuple(x.shape))]
    with torch.no_grad():
        qkv = m.qkv(x)
        steps.append(("qkv(x)", tuple(qkv.shape)))
        r = qkv.reshape(batch, N, 3, H, C // H)
        steps.append(("reshape(B, N, 3, H, C // H)", tuple(r.shape)))
        p = r.permute(2, 0, 3, 1, 4)
        steps.append(("permute(2, 0, 3, 1, 4)", tuple(p.shape)))
        q, _, v = p.unbind(0)
        steps.append(("q, k, v = unbind(0): each", tuple(q.shape)))
        out, w = attention_weights(m, x)
        steps.append(("softmax(q k^T / sqrt(d))", tuple(w.shape)))
        steps.append(("attn @ v", tuple((w @ v).shape)))
        steps.append(("transpose(1, 2).reshape(B, N, C), proj", tuple(out.shape)))
        torch.testing.assert_close(out, m(x), rtol=1e-5, atol=1e-5)
    return steps


def compare_with_timm(dim: int = 64, heads: int = 4) -> str:
    """Load the same random weights into timm's ``Attention`` and qkv's module and compare, or
    say why timm could not be imported here."""
    try:
        from timm.layers import Attention
    except Exception as e:  # timm absent, or its torchvision import failing beside this torch
        return f"timm not importable here ({type(e).__name__}: {str(e)[:80]}): skipped"
    g = torch.Generator().manual_seed(0)
    ref = Attention(dim, num_heads=heads, qkv_bias=True).eval()
    ours = MultiHeadSelfAttention(dim, num_heads=heads, qkv_bias=True).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 11, dim, generator=g)
    with torch.no_grad():
        diff = float((ours(x) - ref(x)).abs().max())
    return f"timm.layers.Attention, same weights: max |qkv - timm| = {diff:.1e}"


# ---------------------------------------------------------------------------- attention maps
SIDE, PATCH, SQUARE = 24, 6, 6  # a 24x24 image, 6x6 patches (a 4x4 grid), a 6x6 square
GRID = SIDE // PATCH
STEPS = 200  # Adam updates of 32 images


def squares(n: int, g: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """``(images (n, SIDE, SIDE), labels (n,), footprints (n, SIDE, SIDE))``: noise
    ``N(0, 0.3)`` plus a bright square of value 1 placed anywhere (its footprint: 1 on it, 0
    elsewhere); the label is the patch holding the square's centre (0..15, row-major)."""
    img = 0.3 * torch.randn(n, SIDE, SIDE, generator=g)
    top = torch.randint(0, SIDE - SQUARE + 1, (n,), generator=g)
    left = torch.randint(0, SIDE - SQUARE + 1, (n,), generator=g)
    pix = torch.arange(SIDE)
    rows = (pix >= top[:, None]) & (pix < top[:, None] + SQUARE)  # (n, SIDE)
    cols = (pix >= left[:, None]) & (pix < left[:, None] + SQUARE)
    footprint = (rows[:, :, None] & cols[:, None, :]).float()
    centre_y, centre_x = top + SQUARE // 2, left + SQUARE // 2
    return img + footprint, (centre_y // PATCH) * GRID + centre_x // PATCH, footprint


class TinyViT(nn.Module):
    """Patches -> linear embedding, a class token and learned positions, one pre-norm block
    (:class:`MultiHeadSelfAttention`, 2 heads, and an MLP), a linear head on the class token."""

    def __init__(self, dim: int = 32, heads: int = 2, classes: int = GRID * GRID) -> None:
        super().__init__()
        self.embed = nn.Linear(PATCH * PATCH, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(0.02 * torch.randn(1, GRID * GRID + 1, dim))
        self.norm1, self.norm2, self.norm = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = MultiHeadSelfAttention(dim, num_heads=heads, qkv_bias=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, classes)

    def tokens(self, images: Tensor) -> Tensor:
        """``(B, SIDE, SIDE) -> (B, 1 + 16, dim)``: the class token, then the patches row-major."""
        B = images.shape[0]
        patches = images.unfold(1, PATCH, PATCH).unfold(2, PATCH, PATCH)  # (B, 4, 4, 6, 6)
        x = self.embed(patches.reshape(B, GRID * GRID, PATCH * PATCH))
        return torch.cat((self.cls.expand(B, -1, -1), x), dim=1) + self.pos

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """``(logits (B, 16), attention weights (B, H, 17, 17))``."""
        x = self.tokens(images)
        a, w = attention_weights(self.attn, self.norm1(x))
        x = x + a
        x = x + self.mlp(self.norm2(x))
        return self.head(self.norm(x[:, 0])), w


@dataclass
class VitResult:
    accuracy: float  # on fresh images
    chance: float
    images: Tensor  # (4, SIDE, SIDE) examples
    labels: Tensor  # (4,)
    predicted: Tensor  # (4,)
    maps: Tensor  # (4, H, GRID, GRID): the class token's attention over the patches
    weights: Tensor  # (4, H, 17, 17): every token's weights ([CLS], then the patches row-major)
    on_square: list[float]  # per head, its class token's mean weight on the square's patches
    touched: float  # mean share of the patches the square touches (what uniform weights give)


def _touched(squares: Tensor) -> Tensor:
    """``(B, 16)`` bool: the patches that hold part of the square, from its footprint
    ``squares (B, SIDE, SIDE)`` (1 on the square, 0 elsewhere)."""
    return (
        squares.unfold(1, PATCH, PATCH)
        .unfold(2, PATCH, PATCH)
        .amax((-1, -2))
        .reshape(squares.shape[0], -1)
        > 0
    )


def compute_maps(
    *, steps: int = STEPS, seed: int = 0, lr: float = 5e-3, batch: int = 32
) -> VitResult:
    """Train :class:`TinyViT` on :func:`squares` (``steps`` Adam updates of ``batch`` images)
    and read its class
    token's attention on four fresh images."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = TinyViT()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    with one_thread():
        for _ in range(steps):
            img, lab, _ = squares(batch, g)
            loss = nn.functional.cross_entropy(model(img)[0], lab)
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            img, lab, foot = squares(512, g)
            logits, w = model(img)
    pred = logits.argmax(-1)
    cls = w[:, :, 0, 1:]  # (B, H, 16): the class token's weights over the patches
    touched = _touched(foot)
    on_square = (cls * touched[:, None]).sum(-1).mean(0).tolist()  # (H,)
    return VitResult(
        accuracy=float((pred == lab).double().mean()),
        chance=1 / (GRID * GRID),
        images=img[:4],
        labels=lab[:4],
        predicted=pred[:4],
        maps=cls[:4].reshape(4, -1, GRID, GRID),
        weights=w[:4],
        on_square=on_square,
        touched=float(touched.double().mean()),
    )


def draw_maps(r: VitResult) -> Any:
    """Four images (top) and, under each, its class token's attention per head over the 4x4
    patches."""
    from qkv.viz import new_figure

    H = r.maps.shape[1]
    fig = new_figure((2.2 * 4, 2.2 * (H + 1)), layout="constrained")
    axes = fig.subplots(H + 1, 4, squeeze=False)
    for i in range(4):
        ax = axes[0, i]
        ax.imshow(r.images[i].numpy(), cmap="gray")
        ax.set_title(f"label {int(r.labels[i])}, says {int(r.predicted[i])}", fontsize=9)
        for h in range(H):
            a = axes[h + 1, i]
            a.imshow(r.maps[i, h].numpy(), cmap="Reds", vmin=0)
            a.set_title(f"[CLS] -> patches, head {h}", fontsize=8)
        for a in axes[:, i]:
            a.set_xticks([])
            a.set_yticks([])
    return fig


@register(
    "vit-qkv", "seed 002: ViT's fused qkv step by step, timm's names, attention maps of patches"
)
def run(out: Path, quick: bool) -> None:
    print("seed 002's data flow on qkv.nn.MultiHeadSelfAttention(768, num_heads=8):")
    for name, shape in data_flow():
        print(f"  {name:<42} {shape}")
    print("  (batch 2 instead of the seed's 32; every other size the seed's)")

    torch.manual_seed(0)
    m = MultiHeadSelfAttention(48, num_heads=6, qkv_bias=True).double().eval()
    print(f"\nparameter names, as seed 002's and timm's Attention: {sorted(m.state_dict())}")
    x = torch.randn(3, 13, 48, dtype=torch.float64)
    with torch.no_grad():
        diff = float((m(x) - seed_forward(m.state_dict(), x, 6)).abs().max())
    print(
        f"the seed's forward, written out in float64 from the same weights: max |diff| = {diff:.1e}"
    )
    print(compare_with_timm())

    r = compute_maps()
    print(
        f"\na tiny ViT ({GRID}x{GRID} patches of {PATCH}x{PATCH} pixels, one block, 2 heads) "
        f"trained {STEPS} updates to find the patch of a bright square's centre: accuracy "
        f"{r.accuracy:.0%} on fresh images (chance {r.chance:.0%})."
    )
    shares = ", ".join(f"head {h} {v:.0%}" for h, v in enumerate(r.on_square))
    print(
        f"the class token's weight on the patches the square touches: {shares} (on average the "
        f"square touches {r.touched:.0%} of the patches: what evenly spread weights would give)"
    )
    from qkv.viz import save_figure

    print(f"\n  wrote {save_figure(draw_maps(r), out / 'vit-attention-maps.png')}")
