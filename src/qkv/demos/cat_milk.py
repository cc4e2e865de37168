"""Seed 001's worked example: does "it" mean the cat or the milk?

Five words with 4-dimensional vectors whose first and last entries (the seed's "...") are 0:
``sweet (0, 4)``, ``milk (1, 3)``, ``it (2, 2)``, ``cat (2, 2)``, ``hungry (4, 0)`` in the two
visible columns (column 1: how "hungry"-like, column 2: how "sweet"-like).  For the sentences
"The cat drank the milk because it was sweet." and "... because it was hungry." self-attention
with ``Q = K = V`` gives new embeddings in which "it" moves toward "milk", respectively "cat".

Everything is computed exactly in float64 with ``d = 4`` (so ``sqrt(d) = 2``) through
:func:`qkv.functional.attention`.  The seed's printed numbers are kept here verbatim; where they
differ from the seed's own formula both are printed, with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from qkv import functional as qf

from . import register

__all__ = ["SEED", "SENTENCES", "VECTORS", "CatMilk", "compute", "embedding", "run"]

#: the two visible columns of each word's vector (the seed's "..." are 0)
VECTORS: dict[str, tuple[float, float]] = {
    "sweet": (0.0, 4.0),
    "milk": (1.0, 3.0),
    "it": (2.0, 2.0),
    "cat": (2.0, 2.0),
    "hungry": (4.0, 0.0),
}
D = 4  # the seed: "dim = 4", the "..." entries taken as 0

SENTENCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "sweet": ("The cat drank the milk because it was sweet.", ("cat", "milk", "it", "sweet")),
    "hungry": ("The cat drank the milk because it was hungry.", ("cat", "milk", "it", "hungry")),
}

#: what seed 001 prints, verbatim: Q K^T, the new embeddings' visible columns, and the
#: similarities with the products exactly as the seed writes them
SEED: dict[str, dict] = {
    "sweet": {
        "scores": [[8, 8, 8, 8], [8, 10, 8, 12], [8, 8, 8, 8], [8, 12, 8, 16]],
        "new": [[0.625, 1.375], [0.089, 1.911], [0.625, 1.375], [0.010, 1.990]],
        "sim": {
            "it·milk": (2.68, ((0.0625, 0.089), (1.375, 1.911))),
            "it·cat": (2.28, ((0.0625, 0.0625), (1.375, 1.375))),
        },
    },
    "hungry": {
        "scores": [[8, 8, 8, 8], [8, 10, 8, 4], [8, 8, 8, 8], [8, 4, 8, 16]],
        "new": [[1.125, 0.875], [0.609, 1.391], [1.125, 0.875], [1.999, 0.001]],
        "sim": {
            "it·milk": (1.90, ((1.125, 0.609), (0.875, 1.391))),
            "it·cat": (2.03, ((1.125, 1.125), (0.875, 0.875))),
        },
    },
}
SEED_BEFORE = {"it·milk": 8.0, "it·cat": 8.0}  # "1 x 2 + 3 x 2 = 8", "2 x 2 + 2 x 2 = 8"


def embedding(word: str) -> Tensor:
    """The word's ``(4,)`` float64 vector ``(0, a, b, 0)``."""
    if word not in VECTORS:
        raise ValueError(f"word: expected one of {sorted(VECTORS)}, got {word!r}")
    a, b = VECTORS[word]
    return torch.tensor([0.0, a, b, 0.0], dtype=torch.float64)


@dataclass
class CatMilk:
    """One sentence of the example, every number in float64."""

    key: str
    sentence: str
    tokens: tuple[str, ...]
    X: Tensor  # (4, D): Q = K = V, one row per token
    scores: Tensor  # (4, 4): Q K^T
    weights: Tensor  # (4, 4): softmax(Q K^T / sqrt(D)), the formula
    new: Tensor  # (4, D): weights @ V, the formula's new embeddings
    sim: dict[str, float]  # "it·milk", "it·cat" on the new embeddings
    sim_before: dict[str, float]  # the same on the original embeddings
    seed_weights: Tensor  # (4, 4): softmax(Q K^T), no scaling inside the softmax
    seed_new: Tensor  # (4, D): softmax(Q K^T) V / sqrt(D), what the seed's numbers are


def _sims(E: Tensor, tokens: tuple[str, ...]) -> dict[str, float]:
    i = {t: n for n, t in enumerate(tokens)}
    return {
        "it·milk": float(E[i["it"]] @ E[i["milk"]]),
        "it·cat": float(E[i["it"]] @ E[i["cat"]]),
    }


def compute() -> dict[str, CatMilk]:
    """Both sentences of the example, through :func:`qkv.functional.attention` in float64."""
    out = {}
    for key, (sentence, tokens) in SENTENCES.items():
        X = torch.stack([embedding(t) for t in tokens])  # (4, D)
        new, weights = qf.attention(X[None], X[None], X[None], need_weights=True)  # scale 1/√D
        new, weights = new[0], weights[0]
        scores = X @ X.T
        seed_weights = torch.softmax(scores, dim=-1)
        out[key] = CatMilk(
            key=key,
            sentence=sentence,
            tokens=tokens,
            X=X,
            scores=scores,
            weights=weights,
            new=new,
            sim=_sims(new, tokens),
            sim_before=_sims(X, tokens),
            seed_weights=seed_weights,
            seed_new=seed_weights @ X / math.sqrt(D),
        )
    return out


def _row(label: str, values, fmt: str = "{:8.4f}") -> str:
    return f"    {label:<8}" + "".join(fmt.format(float(v)) for v in values)


def _print_sentence(r: CatMilk) -> None:
    seed = SEED[r.key]
    toks = r.tokens
    print(f"\n{r.sentence}")
    print(f"  Q = K = V ({len(toks)} tokens x d = {D}; the seed's '...' are 0):")
    for t, x in zip(toks, r.X):
        print(_row(t, x, "{:6.0f}"))
    ok = torch.equal(r.scores, torch.tensor(seed["scores"], dtype=torch.float64))
    print(f"  Q K^T  ({'matches the seed' if ok else 'DIFFERS from the seed'}):")
    print("    " + " " * 8 + "".join(f"{t:>8}" for t in toks))
    for t, s in zip(toks, r.scores):
        print(_row(t, s, "{:8.0f}"))
    print(f"  weights softmax(Q K^T / sqrt({D})) = softmax(Q K^T / 2), rows sum to 1:")
    print("    " + " " * 8 + "".join(f"{t:>8}" for t in toks))
    for t, w in zip(toks, r.weights):
        print(_row(t, w))
    seed_new = torch.tensor(seed["new"], dtype=torch.float64)
    diff = float((r.new[:, 1:3] - seed_new).abs().max())
    implied = float((r.seed_new[:, 1:3] - seed_new).abs().max())
    print("  new embeddings (visible columns):   formula            the seed prints")
    for t, a, b in zip(toks, r.new[:, 1:3], seed_new):
        print(f"    {t:<8} ({float(a[0]):6.3f}, {float(a[1]):6.3f})      ({b[0]:.3f}, {b[1]:.3f})")
    if diff > 5e-4:
        print(
            f"  -> the seed's new embeddings differ from softmax(Q K^T / sqrt(d)) V by up to "
            f"{diff:.3f}.\n     They are softmax(Q K^T) V / sqrt(d): the scaling applied after "
            f"the softmax instead of inside it\n     (that reproduces every printed value to "
            f"{implied:.4f}).\n     A check without any arithmetic: every word's entries sum to 4 and "
            f"the weights sum to 1,\n     so each new embedding's entries must sum to 4; the "
            f"seed's sum to 2 = 4 / sqrt(d)."
        )
    print("  similarities (dot products):    before   after (formula)   seed prints")
    for name in ("it·milk", "it·cat"):
        printed, products = seed["sim"][name]
        written = sum(a * b for a, b in products)
        print(
            f"    sim({name.replace('·', ', ')}){'':<7}{r.sim_before[name]:6.2f}"
            f"{r.sim[name]:>14.4f}{printed:>16.2f}"
        )
        from_seed_vectors = _sims(torch.cat([torch.zeros(4, 1), seed_new], 1), toks)[name]
        terms = " + ".join(f"{a:g} x {b:g}" for a, b in products)
        if abs(written - printed) > 5e-3:
            print(
                f"      the seed writes {terms} = {printed:.2f}, but those products give "
                f"{written:.4f};\n      with its own embeddings the result is "
                f"{from_seed_vectors:.4f} (so {printed:.2f} is right and 0.0625 is a typo for "
                f"0.625)"
            )
        elif abs(from_seed_vectors - printed) > 5e-3:
            print(f"      the seed's own embeddings give {from_seed_vectors:.4f}")
    closer = "milk" if r.sim["it·milk"] > r.sim["it·cat"] else "cat"
    seed_closer = "milk" if seed["sim"]["it·milk"][0] > seed["sim"]["it·cat"][0] else "cat"
    print(
        f"  -> after attention 'it' is closer to '{closer}' (formula) and to '{seed_closer}' "
        f"(the seed's numbers): the seed's conclusion {'holds' if closer == seed_closer else 'FAILS'}"
    )


def _figures(results: dict[str, CatMilk], out: Path) -> list[Path]:
    from qkv.viz import new_figure, save_figure, show_heatmaps

    paths = []
    for key, r in results.items():
        m = torch.stack([r.weights, r.seed_weights]).unsqueeze(0)  # (1, 2, 4, 4)
        fig = show_heatmaps(
            m,
            xlabel="keys",
            ylabel="queries",
            titles=["the formula:\nsoftmax(QKᵀ/√d)", "what the seed's numbers use:\nsoftmax(QKᵀ)"],
            figsize=(8, 3.6),
            xticklabels=list(r.tokens),
            yticklabels=list(r.tokens),
        )
        for ax, w in zip(fig.axes[:2], (r.weights, r.seed_weights)):
            for i in range(4):
                for j in range(4):
                    v = float(w[i, j])
                    ax.text(
                        j,
                        i,
                        f"{v:.3f}",
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white" if v > 0.55 else "black",
                    )
        fig.suptitle(f"“{r.sentence}” — attention weights")
        paths.append(save_figure(fig, out / f"cat-milk-{key}-weights.png"))

    fig = new_figure((10, 4.6), layout="constrained")
    axes = fig.subplots(1, 2, sharex=True, sharey=True)
    for ax, r in zip(axes, results.values()):
        seed_new = torch.tensor(SEED[r.key]["new"], dtype=torch.float64)
        colours = dict(zip(r.tokens, ("tab:orange", "tab:blue", "tab:red", "tab:green")))
        done: dict[tuple[float, float, float], list[str]] = {}
        for t, x, y, s in zip(r.tokens, r.X[:, 1:3], r.new[:, 1:3], seed_new):
            x0, x1, y0, y1 = float(x[0]), float(x[1]), float(y[0]), float(y[1])
            ax.annotate(
                "",
                xy=(y0, y1),
                xytext=(x0, x1),
                arrowprops={"arrowstyle": "->", "color": colours[t], "lw": 1.5},
            )
            ax.plot([y0], [y1], "o", color=colours[t])
            ax.plot([float(s[0])], [float(s[1])], "x", color=colours[t], ms=8)
            done.setdefault((x0, x1, 0.1), []).append(t)  # originals labelled above
            done.setdefault((round(y0, 6), round(y1, 6), -0.25), []).append(t + "′")  # below
        for (px, py, dy), names in done.items():
            ax.text(px + 0.08, py + dy, " = ".join(names), fontsize=9)
        ax.set_title(f"“{r.sentence}”", fontsize=10)
        ax.set_xlabel("column 1 (hungry-like)")
        ax.grid(alpha=0.3)
        ax.set_aspect("equal")
        ax.set_xlim(-0.4, 4.9)
        ax.set_ylim(-0.4, 4.6)
    axes[0].set_ylabel("column 2 (sweet-like)")
    axes[0].plot([], [], "o", color="gray", label="new embedding (formula), t′")
    axes[0].plot([], [], "x", color="gray", label="new embedding as the seed prints it")
    axes[0].legend(loc="upper right", fontsize=8)
    fig.suptitle("self-attention moves each word toward the words it attends to")
    paths.append(save_figure(fig, out / "cat-milk-embeddings.png"))
    return paths


@register(
    "cat-milk",
    "seed 001's worked example: does 'it' mean the cat or the milk?",
    needs=("matplotlib",),
)
def run(out: Path, quick: bool) -> None:
    print("seed 001: self-attention with Q = K = V, d = 4, computed exactly in float64")
    print(
        "  word vectors (visible columns; first and last are 0): "
        + ", ".join(f"{w} {v}" for w, v in VECTORS.items())
    )
    results = compute()
    for r in results.values():
        _print_sentence(r)
    out.mkdir(parents=True, exist_ok=True)
    print()
    for p in _figures(results, out):
        print(f"  wrote {p}")
