"""The query and key vectors behind attention weights, for the viewer's neuron view.

Seed 001 computes one attention weight by hand: the query vector of one token, the key vector of
another, their elementwise product, its sum (the dot product), the scale ``1/√d`` and the
softmax over the row. :func:`record_queries_keys` records those vectors while a model runs, so
that the viewer can show the same computation on a trained model: every module of qkv that
attends through ``_attend`` (``MultiHeadAttention``, ``MultiheadAttention``,
``MultiHeadSelfAttention``, ``DotProductAttention``) hands it its projected queries and keys
``(B, H, L, d)`` (after rotary embeddings, as the scores see them). Nothing in the model changes:
each module's ``_attend`` is wrapped on the instance for the duration of the ``with`` block.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

__all__ = ["Recorded", "record_queries_keys", "scaled_dot_scale"]


@dataclass
class Recorded:
    """What :func:`record_queries_keys` saw: per module (in the model's module order), one
    ``(queries, keys, scale)`` per call: ``(B, H, Lq, d)``, ``(B, H, Lk, d)`` float CPU
    tensors, and the scale the scores were multiplied by; ``scale`` is None for a module whose
    score is not the scaled dot product (the neuron view shows that score only)."""

    calls: dict[str, list[tuple[Tensor, Tensor, float | None]]] = field(default_factory=dict)

    names: dict[int, str] = field(default_factory=dict)

    def last(self, module: str | nn.Module) -> tuple[Tensor, Tensor, float | None] | None:
        """The last call of ``module`` (the module, or its name in ``model.named_modules()``),
        or None if it was not called."""
        name = module if isinstance(module, str) else self.names.get(id(module), "")
        seen = self.calls.get(name)
        return seen[-1] if seen else None

    def layers(
        self, modules: list[nn.Module], i: int = 0
    ) -> tuple[list[Tensor], list[Tensor], float] | None:
        """Sentence ``i``'s per-layer ``(queries (H, Lq, d), keys (H, Lk, d), scale)`` of the last
        call of each of ``modules`` (one per layer), ready for
        :class:`~qkv.viz.AttentionKind`; None when one was not called or its score is not a
        dot product."""
        got = [self.last(m) for m in modules]
        if not got or any(g is None or g[2] is None for g in got):
            return None
        return [g[0][i] for g in got], [g[1][i] for g in got], got[-1][2]


def scaled_dot_scale(module: Any, head_dim: int) -> float | None:
    """The factor a module's scores are multiplied by: ``scale`` when it sets one, ``1/√d`` for
    the scaled dot product, 1 for the plain dot product; None for other scores."""
    score = getattr(module, "score", "scaled_dot")
    scale = getattr(module, "scale", None)
    if score == "scaled_dot":
        return float(scale) if scale is not None else 1.0 / math.sqrt(head_dim)
    if score == "dot":
        return float(scale) if scale is not None else 1.0
    return None


@contextlib.contextmanager
def record_queries_keys(model: nn.Module) -> Iterator[Recorded]:
    """Record the queries and keys every attention module of ``model`` scores, while the block
    runs.

    >>> with record_queries_keys(model) as seen:           # doctest: +SKIP
    ...     model(src, tgt, valid_lens, return_attention=True)
    >>> q, k, scale = seen.last("decoder.blks.block0.attention2")

    Raises:
        TypeError: ``model`` is not a torch module.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    seen = Recorded()
    wrapped = []
    for name, module in model.named_modules():
        attend = getattr(type(module), "_attend", None)
        if attend is None or "_attend" in vars(module):
            continue

        def spy(q: Tensor, k: Tensor, *args: Any, _m: Any = module, _n: str = name, **kw: Any):
            scale = scaled_dot_scale(_m, q.shape[-1])
            keep = (q.detach().to("cpu").float(), k.detach().to("cpu").float(), scale)
            seen.calls.setdefault(_n, []).append(keep)
            return type(_m)._attend(_m, q, k, *args, **kw)

        module._attend = spy
        seen.names[id(module)] = name
        wrapped.append(module)
    try:
        yield seen
    finally:
        for module in wrapped:
            del module._attend
