"""The sinusoidal positional encoding (d2l "self-attention and positional encoding", seed 004).

``P[i, 2j] = sin(i / 10000^(2j/d))`` and ``P[i, 2j+1] = cos(i / 10000^(2j/d))``: each pair of
columns is a point turning on a circle, the higher pairs more slowly — the continuous cousin of
counting in binary, where the higher bits flip more slowly.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from ..nn.position import sinusoidal_encoding
from . import register

__all__ = ["encoding_table", "run", "sinusoidal_table"]


def sinusoidal_table(max_len: int, d: int, base: float = 10000.0) -> Tensor:
    """The ``(max_len, d)`` float64 table of sinusoidal encodings (``d`` even).

    The formula written out, the paper's and the book's: what the demo checks the library's
    table (:func:`encoding_table`) against.
    """
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len: expected a positive int, got {max_len!r}")
    if isinstance(d, bool) or not isinstance(d, int) or d < 2 or d % 2:
        raise ValueError(f"d: expected a positive even int, got {d!r}")
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
    freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angles = pos * freq  # (max_len, d/2)
    table = torch.empty(max_len, d, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table


def encoding_table(max_len: int, d: int) -> tuple[Tensor, str]:
    """The ``(max_len, d)`` float64 table of the library's sinusoidal encoding, and its name."""
    P = sinusoidal_encoding(torch.arange(max_len), d, dtype=torch.float64)
    return P, "qkv.nn.position.sinusoidal_encoding"


def _rotation_error(P: Tensor, k: int, base: float = 10000.0) -> float:
    """max |P[i+k] - R_k P[i]|: the encoding of position i+k is a fixed rotation of position i's."""
    d = P.shape[1]
    freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    c, s = torch.cos(k * freq), torch.sin(k * freq)
    sin_i, cos_i = P[:-k, 0::2], P[:-k, 1::2]
    sin_ik = sin_i * c + cos_i * s
    cos_ik = cos_i * c - sin_i * s
    return float(
        torch.maximum((sin_ik - P[k:, 0::2]).abs().max(), (cos_ik - P[k:, 1::2]).abs().max())
    )


@register(
    "positional-encoding",
    "the sinusoidal positional encoding: heatmap and columns",
    needs=("matplotlib",),
)
def run(out: Path, quick: bool) -> None:
    from qkv.viz import new_figure, save_figure, show_heatmaps

    d, steps = 32, 60  # the book's picture
    P, source = encoding_table(steps, d)
    check = float((P - sinusoidal_table(steps, d)).abs().max())
    print(f"sinusoidal positional encoding, {steps} positions x {d} dimensions (seed 004)")
    print("  P[i, 2j] = sin(i / 10000^(2j/d)),  P[i, 2j+1] = cos(i / 10000^(2j/d))")
    print(f"  table from {source}; max |difference| from the formula: {check:.1e}\n")
    print("  the first 4 positions, columns 0..7:")
    for i in range(4):
        print(f"    position {i}: {[round(float(x), 4) for x in P[i, :8]]}")
    print("\n  counting in binary: the higher bits flip more slowly, as the higher columns turn")
    for i in range(8):
        print(f"    {i} = {i:03b}")
    for k in (1, 5):
        print(
            f"  P[i + {k}] is a fixed rotation of P[i] (per column pair): max error "
            f"{_rotation_error(P, k):.2e}"
        )
    print(f"  every value lies in [-1, 1]: min {float(P.min()):.4f}, max {float(P.max()):.4f}")

    out.mkdir(parents=True, exist_ok=True)
    show_heatmaps(
        P.unsqueeze(0).unsqueeze(0),
        xlabel="column (encoding dimension)",
        ylabel="row (position)",
        figsize=(3.5, 4),
        cmap="Blues",
        path=out / "positional-encoding-heatmap.png",
    )
    fig = new_figure((6.5, 2.8), layout="constrained")
    ax = fig.subplots()
    for col in range(6, 10):
        ax.plot(range(steps), P[:, col].numpy(), label=f"column {col}")
    ax.set_xlabel("row (position)")
    ax.set_ylabel("encoding value")
    ax.set_title("columns 6-9: sin/cos pairs, the higher the pair the lower the frequency")
    ax.legend(fontsize=8, ncols=4, loc="lower left")
    save_figure(fig, out / "positional-encoding-columns.png")
    print(f"\n  wrote {out / 'positional-encoding-heatmap.png'}")
    print(f"  wrote {out / 'positional-encoding-columns.png'}")
