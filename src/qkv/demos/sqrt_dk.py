"""Why divide by sqrt(d_k)? Seed 001's answer, measured.

With ``q`` and ``k`` of ``d`` independent entries of mean 0 and variance 1, ``q . k`` is a sum of
``d`` products of variance 1: its variance is ``d``. Dividing by ``sqrt(d)`` brings it back to 1
whatever ``d``; dividing by ``d`` shrinks it to ``1/d`` (the softmax goes flat), by ``d^(1/3)``
leaves ``d^(1/3)`` (it still grows). Unscaled scores of variance ``d`` saturate the softmax: one
weight near 1, the others near 0, and the softmax's gradient, ``p_i (delta_ij - p_j)``, near 0.

Everything is measured on random draws (seeded), in float64, and set beside the theory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from qkv import functional as qf

from . import register

__all__ = ["DIMS", "SCALINGS", "SqrtDk", "compute", "draw_saturation", "draw_variance", "run"]

#: the key widths measured
DIMS = (4, 16, 64, 256, 1024)
#: each scaling: the divisor of q . k as a function of d, and its theoretical variance
SCALINGS: dict[str, tuple[Any, Any]] = {
    "none": (lambda d: 1.0, lambda d: float(d)),
    "sqrt(d)": (lambda d: math.sqrt(d), lambda d: 1.0),
    "d": (lambda d: float(d), lambda d: 1.0 / d),
    "d^(1/3)": (lambda d: d ** (1 / 3), lambda d: d ** (1 / 3)),
}


@dataclass
class SqrtDk:
    """The measurements, per scaling name and per ``d`` of :data:`DIMS`."""

    dims: tuple[int, ...]
    n_pairs: int
    n_keys: int
    variance: dict[str, list[float]] = field(default_factory=dict)  # var(q.k / divisor)
    max_weight: dict[str, list[float]] = field(default_factory=dict)  # mean largest weight
    saturated: dict[str, list[float]] = field(default_factory=dict)  # rows with a weight > 0.99
    grad: dict[str, list[float]] = field(default_factory=dict)  # mean |d loss / d score|


def compute(*, seed: int = 0, n_pairs: int = 4000, n_keys: int = 16) -> SqrtDk:
    """Measure, for every ``d`` in :data:`DIMS` and every scaling of :data:`SCALINGS`:

    * the variance of ``q . k / divisor`` over ``n_pairs`` random pairs (entries ``N(0, 1)``);
    * for ``n_pairs / n_keys`` queries over ``n_keys`` keys each: the mean largest softmax weight,
      the share of rows whose largest weight exceeds 0.99 (saturated), and the mean absolute
      gradient of ``sum(weights * g)`` (``g`` random, ``N(0, 1)``) with respect to the scores,
      the signal that training sends back through the softmax.

    The weights are :func:`qkv.functional.attention`'s (``score="dot"``, ``scale=1/divisor``).
    """
    g = torch.Generator().manual_seed(seed)
    r = SqrtDk(dims=DIMS, n_pairs=n_pairs, n_keys=n_keys)
    rows = n_pairs // n_keys
    for name in SCALINGS:
        for key in ("variance", "max_weight", "saturated", "grad"):
            getattr(r, key)[name] = []
    for d in DIMS:
        q = torch.randn(n_pairs, d, generator=g, dtype=torch.float64)
        k = torch.randn(n_pairs, d, generator=g, dtype=torch.float64)
        dots = (q * k).sum(-1)  # (n_pairs,)
        Q = q[:rows].reshape(1, rows, d)  # (B=1, Lq, d)
        K = k[: rows * n_keys].reshape(rows, n_keys, d)  # one set of keys per query
        up = torch.randn(rows, n_keys, generator=g, dtype=torch.float64)
        for name, (divisor, _) in SCALINGS.items():
            r.variance[name].append(float((dots / divisor(d)).var()))
            # each query with its own n_keys keys: batch of rows, one query each
            s = (Q.transpose(0, 1) @ K.transpose(1, 2) / divisor(d)).requires_grad_(True)
            w = torch.softmax(s, dim=-1)  # (rows, 1, n_keys)
            _, w_qkv = qf.attention(
                Q.transpose(0, 1),
                K,
                K,
                score="dot",
                scale=1.0 / divisor(d),
                need_weights=True,
            )
            torch.testing.assert_close(w_qkv, w.detach(), rtol=1e-12, atol=1e-12)
            (grad,) = torch.autograd.grad((w[:, 0] * up).sum(), s)
            top = w.detach().amax(-1).flatten()
            r.max_weight[name].append(float(top.mean()))
            r.saturated[name].append(float((top > 0.99).double().mean()))
            r.grad[name].append(float(grad.abs().mean()))
    return r


def draw_variance(r: SqrtDk) -> Any:
    """The measured variance of ``q . k / divisor`` against ``d`` (log-log), theory dashed."""
    from qkv.viz import new_figure

    fig = new_figure((6.0, 4.2), layout="constrained")
    ax = fig.subplots()
    for name, (_, theory) in SCALINGS.items():
        (line,) = ax.plot(r.dims, r.variance[name], "o-", label=f"q\u00b7k / {name}")
        ax.plot(r.dims, [theory(d) for d in r.dims], "--", color=line.get_color(), alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("d (width of q and k)")
    ax.set_ylabel("variance of the score")
    ax.set_title("measured (dots) and theory (dashed): only / sqrt(d) stays at 1")
    ax.legend()
    return fig


def draw_saturation(r: SqrtDk) -> Any:
    """The softmax's largest weight and its gradient against ``d``, per scaling."""
    from qkv.viz import new_figure

    fig = new_figure((10.0, 4.0), layout="constrained")
    left, right = fig.subplots(1, 2)
    for name in SCALINGS:
        left.plot(r.dims, r.max_weight[name], "o-", label=name)
        right.plot(r.dims, r.grad[name], "o-", label=name)
    left.axhline(1.0 / r.n_keys, color="grey", lw=0.8, ls=":")
    left.set_title(f"mean largest weight of {r.n_keys} (1/{r.n_keys}: flat)")
    right.set_title("mean |gradient| through the softmax")
    right.set_yscale("log")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("d")
        ax.legend(title="divided by")
    return fig


def _table(title: str, dims: tuple[int, ...], cells: dict[str, list[str]]) -> None:
    print(title)
    print(f"  {'d':>6}" + "".join(f"{n:>20}" for n in cells))
    for i, d in enumerate(dims):
        print(f"  {d:>6}" + "".join(f"{c[i]:>20}" for c in cells.values()))


def _print(r: SqrtDk) -> None:
    var = {
        n: [f"{r.variance[n][i]:.4g} ({theory(d):.3g})" for i, d in enumerate(r.dims)]
        for n, (_, theory) in SCALINGS.items()
    }
    _table(
        f"variance of q\u00b7k / divisor over {r.n_pairs} random pairs, entries N(0, 1) "
        "(in brackets: the theory, d / divisor^2):",
        r.dims,
        {f"/ {n}": v for n, v in var.items()},
    )
    heads = f"softmax over {r.n_keys} keys, {r.n_pairs // r.n_keys} queries"
    for title, values, fmt in (
        ("mean largest weight", r.max_weight, "{:.3f}"),
        ("share of rows with a weight > 0.99 (saturated)", r.saturated, "{:.0%}"),
        ("mean |gradient| through the softmax", r.grad, "{:.1e}"),
    ):
        print()
        _table(
            f"{heads}: {title}",
            r.dims,
            {f"/ {n}": [fmt.format(v) for v in values[n]] for n in SCALINGS},
        )
    i = len(r.dims) - 1
    print(
        f"\nat d = {r.dims[i]}: unscaled, {r.saturated['none'][i]:.0%} of the rows are saturated "
        f"and the gradient is {r.grad['sqrt(d)'][i] / max(r.grad['none'][i], 1e-300):.0f}x "
        f"smaller than with / sqrt(d); divided by d the largest weight is "
        f"{r.max_weight['d'][i]:.3f}, barely above the flat 1/{r.n_keys} = {1 / r.n_keys:.3f}."
    )


@register("sqrt-dk", "seed 001: why divide q.k by sqrt(d_k)? variance and softmax saturation")
def run(out: Path, quick: bool) -> None:
    r = compute()
    _print(r)
    from qkv.viz import save_figure

    print()
    for name, draw in (
        ("sqrt-dk-variance.png", draw_variance),
        ("sqrt-dk-saturation.png", draw_saturation),
    ):
        print(f"  wrote {save_figure(draw(r), out / name)}")
