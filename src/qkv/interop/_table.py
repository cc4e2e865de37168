"""What every architecture's table shares: one parameter's two names and how its tensor moves.

A table (:mod:`qkv.interop.marian`, :mod:`qkv.interop.m2m100`) lists, for one
``transformers`` architecture, every parameter of its state dict beside the parameter of
qkv's :class:`~qkv.nn.EncoderDecoder` that holds the same numbers, and what must be done to the
tensor on the way: nothing, or a permutation of the residual stream's ``D`` features along the
axis that reads or writes it. The same rows read both ways: :func:`to_qkv` (import) applies
the permutation ``p``, :func:`to_transformers` (export) its inverse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "AS_IS",
    "COLUMNS",
    "KINDS",
    "ROWS",
    "Param",
    "inverse_permutation",
    "permuted",
    "to_qkv",
    "to_transformers",
]

#: the tensor as it is (a tensor that neither reads nor writes the residual stream, or an
#: architecture without a permutation)
AS_IS = "as_is"
#: a weight ``(out, D)`` that reads the residual stream: its columns permuted, ``W[:, p]``
#: (the query, key, value and first feed-forward layers, the embeddings, the output layer)
COLUMNS = "columns"
#: a weight ``(D, in)`` or a vector ``(D,)`` that writes (or is) the residual stream: its rows
#: permuted, ``W[p]`` (an attention's output layer and its bias, the second feed-forward layer
#: and its bias, every layer norm)
ROWS = "rows"
KINDS = (AS_IS, COLUMNS, ROWS)


@dataclass(frozen=True)
class Param:
    """One parameter in both state dicts.

    Attributes:
        hf: its name in the ``transformers`` model's state dict
            (``model.encoder.layers.0.fc1.weight``).
        qkv: its name in qkv's (``encoder.blks.block0.ffn.dense1.weight``).
        kind: :data:`AS_IS`, :data:`COLUMNS` or :data:`ROWS`: where the residual stream's
            permutation applies.
    """

    hf: str
    qkv: str
    kind: str = AS_IS

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {self.kind!r}")


def inverse_permutation(p: Tensor) -> Tensor:
    """``q`` with ``q[p[i]] = i``: undoes ``p`` (``x[p][q] == x``). Shapes: ``(D,)`` both."""
    q = torch.empty_like(p)
    q[p] = torch.arange(p.numel(), dtype=p.dtype, device=p.device)
    return q


def permuted(t: Tensor, kind: str, p: Tensor | None) -> Tensor:
    """``t`` with the permutation ``p`` ``(D,)`` applied as ``kind`` says (None: as it is).

    Shapes: a :data:`COLUMNS` weight ``(out, D)``; a :data:`ROWS` weight ``(D, in)`` or
    vector ``(D,)``. Returns a new contiguous tensor (or ``t`` itself when nothing moves)."""
    if p is None or kind == AS_IS:
        return t
    dim = 1 if kind == COLUMNS else 0
    if t.shape[dim] != p.numel():
        raise ValueError(
            f"t: expected {p.numel()} features along dimension {dim} for a {kind} permutation, "
            f"got shape {tuple(t.shape)}"
        )
    return t.index_select(dim, p.to(t.device)).contiguous()


def _move(
    params: Sequence[Param],
    source: Mapping[str, Tensor] | Callable[[str], Tensor],
    p: Tensor | None,
    *,
    frm: str,
    to: str,
) -> dict[str, Tensor]:
    get = source if callable(source) else source.__getitem__
    out: dict[str, Tensor] = {}
    for param in params:
        out[getattr(param, to)] = permuted(get(getattr(param, frm)), param.kind, p)
    return out


def to_qkv(
    params: Sequence[Param],
    tensors: Mapping[str, Tensor] | Callable[[str], Tensor],
    p: Tensor | None,
) -> dict[str, Tensor]:
    """qkv's tensors of ``params`` read from ``transformers``' (a mapping, or a function of a
    name that reads one), the permutation ``p`` ``(D,)`` applied (qkv feature ``i`` is the
    source's feature ``p[i]``; None: none)."""
    return _move(params, tensors, p, frm="hf", to="qkv")


def to_transformers(
    params: Sequence[Param],
    state_dict: Mapping[str, Tensor] | Callable[[str], Tensor],
    p: Tensor | None,
) -> dict[str, Tensor]:
    """``transformers``' tensors of ``params`` from qkv's: :func:`to_qkv` undone (the inverse
    of ``p`` applied)."""
    q = None if p is None else inverse_permutation(p)
    return _move(params, state_dict, q, frm="qkv", to="hf")
