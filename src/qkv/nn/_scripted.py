# ruff: noqa: UP006, UP035, UP045 - TorchScript reads typing.List and Optional, not list and X | None
"""A Transformer decoder's decoding step as one TorchScript function.

For a small model on the CPU, a decoding step spends about as long calling its hundred-odd
operators from Python as running them: at one sentence per batch the Python step
(:func:`qkv.nn._fast_decode.block_step` over the blocks, then the output layer)
takes several times the operators' own time.  :func:`decode_step` is the same step, every
block and the output layer, written for TorchScript: the same operators with the same
arguments in the same order (the same numbers, bit for bit), called from TorchScript's
interpreter instead of Python.  Its arguments are grouped in named tuples (TorchScript takes
them as they are): the products (:class:`Products`), the norms (:class:`Norms`), the planned
cross-attention keys (:class:`CrossKeys`) and what every block shares (:class:`Layout`).

It runs a step that needs nothing else (:meth:`qkv.nn._fast_decode.StepPlan.scripted`
decides): one new token per row and no beams; every
linear layer's product of a kind it knows (:class:`qkv.nn._inference.Linear`: oneDNN-packed
or transposed float weights, a dynamically quantized int8 layer); a ReLU, GELU or swish
feed-forward network; each cross-attention planned for the three small products
(:func:`qkv.functional.decode.plan_keys`); room in every self-attention cache, whose keys and
values are all finite.  The step checks what the Python step checks: when a self-attention's
new query, key or value, or a cross-attention's query, holds a NaN or an infinity, it returns
None, having counted nothing (a cache's length is the caller's to advance), and the caller runs
the Python step, whose rule for non-finite numbers applies.

torch marks TorchScript deprecated; the step is scripted on first use, with its warning
silenced, and where scripting fails (a torch without it, sources not shipped) the Python step
runs (:func:`scripted_step` returns None).
"""

import math
import warnings
from typing import Callable, List, NamedTuple, Optional

import torch
from torch import Tensor

from ..functional.decode import matmul_attention

__all__ = [
    "ACTIVATIONS",
    "CrossKeys",
    "Layout",
    "Norms",
    "Products",
    "decode_step",
    "scripted_step",
]

#: the feed-forward activations the step runs, by code: ReLU, GELU, GELU's tanh approximation,
#: swish (SiLU)
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swish")


class Products(NamedTuple):
    """Every linear layer's product of the step, by index ``j`` (see :func:`decode_step`), as
    :class:`qkv.nn._inference.Linear` keeps it: ``kinds[j]`` (``Linear.ONEDNN``, ``MM`` or
    ``INT8``), the float weight and bias (an empty weight for an int8 product), and for an int8
    product its packed weight ``packs[where[j]]`` and ``reduce_range[j]``."""

    kinds: List[int]
    weights: List[Tensor]
    biases: List[Optional[Tensor]]
    packs: List[torch.classes.quantized.LinearPackedParamsBase]
    where: List[int]
    reduce_range: List[bool]


class Norms(NamedTuple):
    """Every layer norm of the step, by index (see :func:`decode_step`): ``F.layer_norm``'s
    weight, bias and eps; each normalises the width ``D``."""

    weights: List[Optional[Tensor]]
    biases: List[Optional[Tensor]]
    eps: List[float]


class CrossKeys(NamedTuple):
    """Each block's cross-attention keys as :func:`qkv.functional.decode.plan_keys` planned them
    (:class:`~qkv.functional.decode.PlannedKeys`): the keys transposed ``(B, H, d, Ls)``, the
    values ``(B, H, Ls, d)``, the additive mask ``(B, 1, 1, Ls)`` or None, the rows that see no
    key ``(B, 1, 1, 1)`` or None, and the multiplier of ``q . k``."""

    keys_t: List[Tensor]
    values: List[Tensor]
    bias: List[Optional[Tensor]]
    dead: List[Optional[Tensor]]
    mult: List[float]


class Layout(NamedTuple):
    """What every block of the decoder shares: the heads ``H``, the self-attention's multiplier
    of ``q . k``, pre-norm or post-norm, the activation's code (:data:`ACTIVATIONS`), and
    whether a final norm (pre-norm's) comes before the output layer."""

    heads: int
    self_mult: float
    norm_first: bool
    activation: int
    final_norm: bool


def _linear(
    j: int,
    x: Tensor,
    kinds: List[int],
    weights: List[Tensor],
    biases: List[Optional[Tensor]],
    packs: List[torch.classes.quantized.LinearPackedParamsBase],
    where: List[int],
    reduce_range: List[bool],
) -> Tensor:
    """Product ``j`` of ``x`` ``(N, in)``, as :class:`qkv.nn._inference.Linear` runs it (the
    fields of :class:`Products`, which :func:`decode_step` reads once: each field read is an
    instruction of TorchScript's interpreter, at every product of every step)."""
    kind = kinds[j]
    if kind == 2:  # Linear.INT8
        return torch.ops.quantized.linear_dynamic(x, packs[where[j]], reduce_range[j])
    if kind == 0:  # Linear.ONEDNN
        scalars = torch.jit.annotate(List[Optional[number]], [])  # noqa: F821
        return torch.ops.mkldnn._linear_pointwise(x, weights[j], biases[j], "none", scalars, "")
    bias = biases[j]  # Linear.MM
    if bias is None:
        return torch.mm(x, weights[j])
    return torch.addmm(bias, x, weights[j])


def _norm(x: Tensor, i: int, shape: List[int], w: List[Optional[Tensor]],
          b: List[Optional[Tensor]], eps: List[float]) -> Tensor:  # fmt: skip
    return torch.layer_norm(x, shape, w[i], b[i], eps[i])


def _finite(t: Tensor) -> bool:
    """Whether every number of ``t`` is finite (one sum, as the Python step's check)."""
    return math.isfinite(float(t.sum()))


def _activate(hidden: Tensor, code: int) -> Tensor:
    if code == 0:
        return torch.relu(hidden)
    if code == 1:
        return torch.nn.functional.gelu(hidden)
    if code == 3:
        return torch.nn.functional.silu(hidden)
    return torch.nn.functional.gelu(hidden, approximate="tanh")


def decode_step(
    x: Tensor,
    t: int,
    keys: List[Tensor],
    values: List[Tensor],
    products: Products,
    norms: Norms,
    cross: CrossKeys,
    layout: Layout,
) -> Optional[Tensor]:
    """One decoding step: the logits ``(B, V)`` of the embedded tokens ``x`` ``(B, D)`` at
    position ``t``, their keys and values written at ``t`` of every block's cache storage
    ``keys[i]``/``values[i]`` ``(B, H, capacity, d)``; None when a projection is not finite.

    Products ``6 * i + (0..5)`` of block ``i``: the fused query/key/value projection, the
    self-attention's output, the cross-attention's query and output, the two feed-forward
    layers; product ``6 * blocks`` is the output layer.  Norms ``3 * i + (0..2)`` of block
    ``i``, then the final one (pre-norm).  Both attentions' arithmetic is
    :func:`qkv.functional.decode.matmul_attention`'s.

    This is the third spelling of a decoder block, beside
    :meth:`qkv.nn.TransformerDecoderBlock.forward` (the general path: any module, weights,
    autograd) and :func:`qkv.nn._fast_decode.block_step` (the Python step: growing caches,
    beams, the NaN rule of :func:`qkv.functional.attention`).  It stays a spelling of its own
    because TorchScript runs neither: they call modules and Python objects (caches, plans) that
    it cannot compile.  The tests hold the three to one another (bit for bit against the Python
    step).
    """
    B, D = x.shape[0], x.shape[1]
    H = layout.heads
    d = D // H
    shape = [D]
    pre, act, self_mult = layout.norm_first, layout.activation, layout.self_mult
    kinds, weights, biases = products.kinds, products.weights, products.biases
    packs, where, rr = products.packs, products.where, products.reduce_range
    nw, nb, eps = norms.weights, norms.biases, norms.eps
    for i in range(len(keys)):
        j = 6 * i
        # self-attention over the cache, the new position written first
        Q = _norm(x, 3 * i, shape, nw, nb, eps) if pre else x
        qkv = _linear(j, Q, kinds, weights, biases, packs, where, rr)
        if not _finite(qkv):
            return None
        q, k, v = qkv.split(D, dim=1)
        q, k, v = q.view(B, H, 1, d), k.view(B, H, 1, d), v.view(B, H, 1, d)
        keys[i][:, :, t : t + 1] = k
        values[i][:, :, t : t + 1] = v
        past_t = keys[i][:, :, : t + 1].transpose(-2, -1)
        out = matmul_attention(q, past_t, values[i][:, :, : t + 1], self_mult, None)
        out = out.transpose(1, 2).reshape(B, D)
        y = _linear(j + 1, out, kinds, weights, biases, packs, where, rr)
        Y = x + y if pre else _norm(y + x, 3 * i, shape, nw, nb, eps)
        # cross-attention over the encoder's planned keys
        Q = _norm(Y, 3 * i + 1, shape, nw, nb, eps) if pre else Y
        q = _linear(j + 2, Q, kinds, weights, biases, packs, where, rr)
        if not _finite(q):
            return None
        q = q.view(B, H, 1, d)
        out = matmul_attention(q, cross.keys_t[i], cross.values[i], cross.mult[i], cross.bias[i])
        dead = cross.dead[i]
        if dead is not None:
            out = out.masked_fill(dead, 0.0)
        out = out.transpose(1, 2).reshape(B, D)
        z = _linear(j + 3, out, kinds, weights, biases, packs, where, rr)
        Z = Y + z if pre else _norm(z + Y, 3 * i + 1, shape, nw, nb, eps)
        # feed-forward network
        Q = _norm(Z, 3 * i + 2, shape, nw, nb, eps) if pre else Z
        hidden = _activate(_linear(j + 4, Q, kinds, weights, biases, packs, where, rr), act)
        f = _linear(j + 5, hidden, kinds, weights, biases, packs, where, rr)
        x = Z + f if pre else _norm(f + Z, 3 * i + 2, shape, nw, nb, eps)
    if layout.final_norm:
        x = _norm(x, 3 * len(keys), shape, nw, nb, eps)
    return _linear(6 * len(keys), x, kinds, weights, biases, packs, where, rr)


_SCRIPTED: list = []  # [the scripted step] once scripted, [None] where scripting failed


def _unoptimized(step: Callable[..., Optional[Tensor]]) -> Callable[..., Optional[Tensor]]:
    """``step`` run as written: TorchScript's graph optimizations off for the call (they
    rewrite operators, e.g. ``addmm`` into ``mm`` then ``add``, which rounds differently)."""

    def run(*args: object) -> Optional[Tensor]:
        with torch.jit.optimized_execution(False):
            return step(*args)

    return run


def scripted_step() -> Callable[..., Optional[Tensor]] | None:
    """:func:`decode_step` scripted (once per process), or None where TorchScript cannot
    script it."""
    if not _SCRIPTED:
        try:
            with warnings.catch_warnings():  # torch's deprecation notice for TorchScript
                warnings.simplefilter("ignore")
                _SCRIPTED.append(_unoptimized(torch.jit.script(decode_step)))
        except Exception:  # any failure to script: the Python step runs
            _SCRIPTED.append(None)
    return _SCRIPTED[0]
