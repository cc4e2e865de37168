"""Why several heads? Seed 001's claim, trained and measured on a task made to show it.

Each position of a sequence holds a random vector; the target at position ``i`` is the pair
(left neighbour, right neighbour) ``(x[i-1], x[i+1])`` (the sequence wraps around). One
attention layer, :class:`qkv.nn.MultiheadAttention` (the drop-in for torch's), reads content plus
a one-hot position. A head's output is one weighted average of the values: one head cannot
fetch two different positions at once. Attending to both gives ``(x[i-1] + x[i+1]) / 2``, from
which neither neighbour can be told apart; attending to one gets it exactly and leaves the
other unknown. Either way, with weights set by the positions, one head's best mean squared
error is 0.5 per target entry (entries of variance 1); weights that also follow the content
gain a little, not much. Two heads of the same total width can each fetch one neighbour: the
error goes to about 0, and the weights show head 0 looking left and head 1 right (or the
reverse: which head takes which side is chance).

The same total width and the same training in every case: only the number of heads changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from qkv.nn import MultiheadAttention

from . import register
from ._threads import one_thread

__all__ = ["HeadsModel", "HeadsRun", "batch", "compute", "draw_heads", "draw_losses", "run"]

L = 8  # positions
CONTENT = 8  # entries of each position's vector
WIDTH = 16  # model width: content + one-hot position; H heads of WIDTH / H each
STEPS = 200  # Adam updates of batches of 128 sequences


def batch(n: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """``(inputs (n, L, CONTENT + L), targets (n, L, 2 * CONTENT))``: random content with the
    one-hot position appended; the target of position ``i`` is ``[x[i-1], x[i+1]]``."""
    x = torch.randn(n, L, CONTENT, generator=g)
    pos = torch.eye(L).expand(n, L, L)
    target = torch.cat((x.roll(1, dims=1), x.roll(-1, dims=1)), dim=-1)
    return torch.cat((x, pos), dim=-1), target


class HeadsModel(nn.Module):
    """One self-attention layer of ``heads`` heads over ``WIDTH`` channels, then a linear read-out
    to the ``2 * CONTENT`` target entries."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.attention = MultiheadAttention(WIDTH, heads, batch_first=True)
        self.out = nn.Linear(WIDTH, 2 * CONTENT)

    def forward(self, x: Tensor, *, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        y, w = self.attention(
            x, x, x, need_weights=need_weights, average_attn_weights=False
        )  # w: (B, H, L, L)
        return self.out(y), w


@dataclass
class HeadsRun:
    """One model trained on the task: its losses and its weights on a fresh batch."""

    heads: int
    losses: list[float]  # training loss, every `every` updates
    test_loss: float  # on a fresh batch
    weights: Tensor  # (H, L, L): mean over the fresh batch
    offsets: list[int]  # per head, where it looks most: key - query (mod L, in -L/2..L/2)
    share: list[float]  # per head, the mean weight at that offset


def _train(heads: int, steps: int, seed: int) -> HeadsRun:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = HeadsModel(heads)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        x, t = batch(128, g)
        loss = ((model(x)[0] - t) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == steps - 1:
            losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        x, t = batch(1024, g)
        y, w = model(x, need_weights=True)
    assert w is not None
    mean = w.mean(0)  # (H, L, L)
    offsets, share = [], []
    for h in range(heads):
        # the mean weight at each offset key - query (mod L), over the queries
        rows = torch.arange(L)
        by_offset = torch.stack([mean[h][rows, (rows + o) % L].mean() for o in range(L)])
        o = int(by_offset.argmax())
        offsets.append(o if o <= L // 2 else o - L)
        share.append(float(by_offset[o]))
    return HeadsRun(heads, losses, float(((y - t) ** 2).mean()), mean, offsets, share)


def compute(
    *, steps: int = STEPS, seed: int = 0, heads: tuple[int, ...] = (1, 2)
) -> list[HeadsRun]:
    """Train one model per number of heads in ``heads`` (same width, data and updates)."""
    with one_thread():
        return [_train(h, steps, seed) for h in heads]


def draw_heads(runs: list[HeadsRun]) -> Any:
    """Each model's heads: the mean weights (queries down, keys across) on a fresh batch."""
    from qkv.viz import new_figure

    cols = sum(r.heads for r in runs)
    fig = new_figure((2.6 * cols + 0.8, 3.0), layout="constrained")
    axes = fig.subplots(1, cols, squeeze=False)[0]
    i = 0
    image = None
    for r in runs:
        for h in range(r.heads):
            ax = axes[i]
            image = ax.imshow(r.weights[h].numpy(), cmap="Reds", vmin=0, vmax=1)
            side = {-1: "left", 1: "right", 0: "itself"}.get(r.offsets[h], f"{r.offsets[h]:+d}")
            where = f"{side} ({r.share[h]:.2f})"
            ax.set_title(
                f"{r.heads} head{'s' if r.heads > 1 else ''}: head {h}\nlooks {where}", fontsize=9
            )
            ax.set_xlabel("key position")
            if i == 0:
                ax.set_ylabel("query position")
            i += 1
    fig.colorbar(image, ax=list(axes), shrink=0.8, label="mean weight")
    return fig


def draw_losses(runs: list[HeadsRun], every: int = 10) -> Any:
    """The training loss of each model, with one head's best possible loss (0.5) dotted."""
    from qkv.viz import new_figure

    fig = new_figure((6.0, 3.8), layout="constrained")
    ax = fig.subplots()
    for r in runs:
        steps = [min(i * every, every * (len(r.losses) - 1)) for i in range(len(r.losses))]
        ax.plot(steps, r.losses, label=f"{r.heads} head{'s' if r.heads > 1 else ''}")
    ax.axhline(0.5, color="grey", ls=":", label="one head, weights set by position: 0.5")
    ax.set_yscale("log")
    ax.set_xlabel("update")
    ax.set_ylabel("mean squared error")
    ax.legend()
    return fig


@register("heads", "seed 001: why several heads? one head cannot fetch two neighbours, two can")
def run(out: Path, quick: bool) -> None:
    runs = compute()
    print(
        f"task: at each of {L} positions, output (left neighbour, right neighbour), vectors of "
        f"{CONTENT} N(0, 1) entries; one attention layer of width {WIDTH}; the same data and "
        f"{STEPS} Adam updates for every model\n"
    )
    for r in runs:
        print(
            f"{r.heads} head{'s' if r.heads > 1 else ' '}: loss on fresh data {r.test_loss:.4f} "
            f"(start {r.losses[0]:.3f})"
        )
        for h in range(r.heads):
            print(
                f"   head {h} looks most at offset {r.offsets[h]:+d} "
                f"(mean weight there {r.share[h]:.3f})"
            )
    one, two = runs[0], runs[1]
    print(
        f"\none head stays near 0.5 ({one.test_loss:.3f}), the best an average of the values "
        f"can do when it must hold two neighbours; two heads of the same width reach {two.test_loss:.4f}, "
        f"{one.test_loss / max(two.test_loss, 1e-12):.0f}x lower, each fetching one side."
    )
    from qkv.viz import save_figure

    print()
    for name, fig in (
        ("heads-weights.png", draw_heads(runs)),
        ("heads-loss.png", draw_losses(runs)),
    ):
        print(f"  wrote {save_figure(fig, out / name)}")
