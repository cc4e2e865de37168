"""The book's Nadaraya-Watson demo (d2l "attention pooling", seed 004).

Fifty noisy samples of ``f(x) = 2 sin(x) + x^0.8`` on ``[0, 5)``; three estimators of ``f`` on the
test inputs ``0, 0.1, ..., 4.9``: average pooling (no attention), the Gaussian-kernel estimator
(attention with a fixed kernel) and the parametric one whose ``w`` is trained by SGD, leave-one-out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from qkv.nn.kernel_regression import NWKernelRegression, average_pooling, nadaraya_watson

from . import register

__all__ = ["NWResult", "compute", "run", "target"]


def target(x: Tensor) -> Tensor:
    """The function the estimators recover: ``2 sin(x) + x^0.8``."""
    return 2 * torch.sin(x) + x**0.8


@dataclass
class NWResult:
    x_train: Tensor  # (n,) sorted
    y_train: Tensor  # (n,)
    x_test: Tensor  # (m,)
    y_truth: Tensor  # (m,)
    predictions: dict[str, Tensor]  # estimator -> (m,)
    weights: dict[str, Tensor]  # estimator -> (m, n), queries x keys
    losses: list[float]  # training loss (sum of squared errors) per epoch, before each step
    w_initial: float
    w_learned: float


def compute(*, seed: int = 0, n_train: int = 50, epochs: int = 5, lr: float = 0.5) -> NWResult:
    """Run the three estimators as the book does; everything returned, nothing printed."""
    g = torch.Generator().manual_seed(seed)
    x_train, _ = torch.sort(torch.rand(n_train, generator=g) * 5)
    y_train = target(x_train) + 0.5 * torch.randn(n_train, generator=g)
    x_test = torch.arange(0, 5, 0.1)
    y_truth = target(x_test)

    preds, weights = {}, {}
    preds["average pooling"], weights["average pooling"] = average_pooling(x_test, y_train)
    preds["Gaussian kernel"], weights["Gaussian kernel"] = nadaraya_watson(x_test, x_train, y_train)

    torch.manual_seed(seed)  # the book draws the initial w from U(0, 1)
    net = NWKernelRegression()
    w0 = float(net.w.detach())
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    leave_one_out = torch.eye(n_train, dtype=torch.bool)  # a sample never predicts itself
    losses = []
    for _ in range(epochs):
        opt.zero_grad()
        loss = ((net(x_train, x_train, y_train, attn_mask=leave_one_out) - y_train) ** 2).sum()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        p, w = nadaraya_watson(x_test, x_train, y_train, net.w)
    preds["learned w"], weights["learned w"] = p, w
    return NWResult(
        x_train, y_train, x_test, y_truth, preds, weights, losses, w0, float(net.w.detach())
    )


def _figures(r: NWResult, out: Path) -> list[Path]:
    from qkv.viz import new_figure, save_figure, show_heatmaps

    paths = []
    fig = new_figure((12, 3.4), layout="constrained")
    axes = fig.subplots(1, 3, sharey=True)
    x_test, y_truth = r.x_test.numpy(), r.y_truth.numpy()
    for ax, (name, p) in zip(axes, r.predictions.items()):
        ax.plot(x_test, y_truth, label="truth", color="tab:blue")
        ax.plot(x_test, p.numpy(), "--", label="prediction", color="tab:purple")
        ax.plot(
            r.x_train.numpy(),
            r.y_train.numpy(),
            "o",
            alpha=0.5,
            label="training samples",
            color="tab:orange",
        )
        mse = float(((p - r.y_truth) ** 2).mean())
        ax.set_title(f"{name} (test MSE {mse:.3f})")
        ax.set_xlabel("x")
    axes[0].set_ylabel("y")
    axes[0].legend(loc="lower left", fontsize=8)
    paths.append(save_figure(fig, out / "nw-fits.png"))

    # one picture per estimator, each with its own colour bar (as in the book): on one shared
    # scale the learned w's sharp weights would wash the other two out
    slug = {"average pooling": "average", "Gaussian kernel": "gaussian", "learned w": "learned"}
    for name, w in r.weights.items():
        path = out / f"nw-weights-{slug[name]}.png"
        show_heatmaps(
            w.unsqueeze(0).unsqueeze(0),
            xlabel="sorted training inputs (keys)",
            ylabel="testing inputs (queries)",
            titles=[f"{name}: attention weights"],
            figsize=(4.2, 3.6),
            path=path,
        )
        paths.append(path)

    fig = new_figure((4.5, 3), layout="constrained")
    ax = fig.subplots()
    ax.plot(range(1, len(r.losses) + 1), r.losses, "o-")
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss (sum of squared errors)")
    ax.set_yscale("log")
    ax.set_title(f"learning w: {r.w_initial:.3f} -> {r.w_learned:.3f}")
    paths.append(save_figure(fig, out / "nw-loss.png"))
    return paths


@register(
    "nadaraya-watson",
    "the book's Nadaraya-Watson regression: average pooling, Gaussian kernel, learned w",
    needs=("matplotlib",),
)
def run(out: Path, quick: bool) -> None:
    r = compute()
    print("Nadaraya-Watson kernel regression (d2l 'attention pooling', seed 004)")
    print(f"  {len(r.x_train)} training samples of 2 sin(x) + x^0.8 + N(0, 0.5^2) on [0, 5)")
    print(f"  {len(r.x_test)} test inputs 0, 0.1, ..., 4.9\n")
    print(f"  {'estimator':<18}{'test MSE':>10}{'weights: row sums':>22}{'max weight':>12}")
    for name, p in r.predictions.items():
        w = r.weights[name]
        mse = float(((p - r.y_truth) ** 2).mean())
        sums = w.sum(-1)
        print(
            f"  {name:<18}{mse:>10.4f}{float(sums.min()):>13.6f}..{float(sums.max()):.6f}"
            f"{float(w.max()):>12.4f}"
        )
    print("\n  training w by SGD (lr 0.5, leave-one-out keys, loss = sum of squared errors):")
    for i, loss in enumerate(r.losses, 1):
        print(f"    epoch {i}: loss {loss:.6f}")
    print(f"  w: {r.w_initial:.4f} (drawn from U(0, 1)) -> {r.w_learned:.4f}")
    print("  a large w narrows the kernel: the learned estimator follows the noise more closely")
    out.mkdir(parents=True, exist_ok=True)
    for p in _figures(r, out):
        print(f"  wrote {p}")
