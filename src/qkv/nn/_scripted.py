# ruff: noqa: UP006, UP035, UP045 - TorchScript reads typing.List and Optional, not list and X | None
"""A Transformer decoder's decoding step as one TorchScript function.

For a small model on the CPU, a decoding step spends about as long calling its hundred-odd
operators from Python as running them: at one sentence per batch the Python step
(:meth:`qkv.nn.TransformerDecoderBlock._step_fast` over the blocks, then the output layer)
takes several times the operators' own time.  :func:`decode_step` is the same step, every
block and the output layer, written for TorchScript: the same operators with the same
arguments in the same order (the same numbers, bit for bit), called from TorchScript's
interpreter instead of Python.

It runs a step that needs nothing else (:meth:`_StepPlan.scripted
<qkv.nn.transformer._StepPlan.scripted>` decides): one new token per row and no beams; every
linear layer's product of a kind it knows (:class:`qkv.nn._inference.Linear`: oneDNN-packed
or transposed float weights, a dynamically quantized int8 layer); a ReLU or GELU feed-forward
network; each cross-attention planned for the three small products
(:func:`qkv.functional.decode.plan_keys`); room in every self-attention cache, whose keys and
values are all finite.  The step checks what the Python step checks: when a self-attention's
new query, key or value, or a cross-attention's query, holds a NaN or an infinity, it returns
None, having counted nothing (a cache's length is the caller's to advance), and the caller runs
the Python step, whose rule for non-finite numbers applies.

torch marks TorchScript deprecated; the step is scripted on first use, with its warning
silenced, and where scripting fails (a torch without it, sources not shipped) the Python step
runs as before (:func:`scripted_step` returns None).
"""

import math
import warnings
from typing import Callable, List, Optional

import torch
from torch import Tensor

__all__ = ["ACTIVATIONS", "decode_step", "scripted_step"]

#: the feed-forward activations the step runs, by code: ReLU, GELU, GELU's tanh approximation
ACTIVATIONS = ("relu", "gelu", "gelu_tanh")


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
    """Product ``j`` of ``x`` ``(N, in)``, as :class:`qkv.nn._inference.Linear` runs it."""
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


def decode_step(
    x: Tensor,
    t: int,
    keys: List[Tensor],
    values: List[Tensor],
    kinds: List[int],
    weights: List[Tensor],
    biases: List[Optional[Tensor]],
    packs: List[torch.classes.quantized.LinearPackedParamsBase],
    where: List[int],
    reduce_range: List[bool],
    norm_w: List[Optional[Tensor]],
    norm_b: List[Optional[Tensor]],
    eps: List[float],
    cross_keys_t: List[Tensor],
    cross_values: List[Tensor],
    cross_bias: List[Optional[Tensor]],
    cross_dead: List[Optional[Tensor]],
    cross_mult: List[float],
    self_mult: float,
    heads: int,
    pre: bool,
    act: int,
    final_norm: bool,
) -> Optional[Tensor]:
    """One decoding step: the logits ``(B, V)`` of the embedded tokens ``x`` ``(B, D)`` at
    position ``t``, their keys and values written at ``t`` of every block's cache storage
    ``keys[i]``/``values[i]`` ``(B, H, capacity, d)``; None when a projection is not finite.

    Products ``6 * i + (0..5)`` of block ``i``: the fused query/key/value projection, the
    self-attention's output, the cross-attention's query and output, the two feed-forward
    layers; product ``6 * blocks`` is the output layer.  Norms ``3 * i + (0..2)`` of block
    ``i``, then the final one (pre-norm).  Block ``i``'s cross-attention reads its planned keys
    transposed ``(B, H, d, Ls)``, values ``(B, H, Ls, d)``, additive mask, dead rows and
    multiplier (:class:`qkv.functional.decode.PlannedKeys`).
    """
    B, D = x.shape[0], x.shape[1]
    H = heads
    d = D // H
    shape = [D]
    n = len(keys)
    for i in range(n):
        j = 6 * i
        # self-attention over the cache, the new position written first
        Q = _norm(x, 3 * i, shape, norm_w, norm_b, eps) if pre else x
        qkv = _linear(j, Q, kinds, weights, biases, packs, where, reduce_range)
        if not _finite(qkv):
            return None
        q, k, v = qkv.split(D, dim=1)
        q, k, v = q.view(B, H, 1, d), k.view(B, H, 1, d), v.view(B, H, 1, d)
        keys[i][:, :, t : t + 1] = k
        values[i][:, :, t : t + 1] = v
        scores = torch.matmul(q, keys[i][:, :, : t + 1].transpose(-2, -1)).mul_(self_mult)
        out = torch.matmul(torch.softmax(scores, dim=-1), values[i][:, :, : t + 1])
        y = _linear(j + 1, out.transpose(1, 2).reshape(B, D), kinds, weights, biases, packs,
                    where, reduce_range)  # fmt: skip
        Y = x + y if pre else _norm(y + x, 3 * i, shape, norm_w, norm_b, eps)
        # cross-attention over the encoder's planned keys
        Q = _norm(Y, 3 * i + 1, shape, norm_w, norm_b, eps) if pre else Y
        q = _linear(j + 2, Q, kinds, weights, biases, packs, where, reduce_range)
        if not _finite(q):
            return None
        scores = torch.matmul(q.view(B, H, 1, d), cross_keys_t[i]).mul_(cross_mult[i])
        bias = cross_bias[i]
        if bias is not None:
            scores.add_(bias)
        out = torch.matmul(torch.softmax(scores, dim=-1), cross_values[i])
        dead = cross_dead[i]
        if dead is not None:
            out = out.masked_fill(dead, 0.0)
        z = _linear(j + 3, out.transpose(1, 2).reshape(B, D), kinds, weights, biases, packs,
                    where, reduce_range)  # fmt: skip
        Z = Y + z if pre else _norm(z + Y, 3 * i + 1, shape, norm_w, norm_b, eps)
        # feed-forward network
        Q = _norm(Z, 3 * i + 2, shape, norm_w, norm_b, eps) if pre else Z
        hidden = _linear(j + 4, Q, kinds, weights, biases, packs, where, reduce_range)
        if act == 0:
            hidden = torch.relu(hidden)
        elif act == 1:
            hidden = torch.nn.functional.gelu(hidden)
        else:
            hidden = torch.nn.functional.gelu(hidden, approximate="tanh")
        f = _linear(j + 5, hidden, kinds, weights, biases, packs, where, reduce_range)
        x = Z + f if pre else _norm(f + Z, 3 * i + 2, shape, norm_w, norm_b, eps)
    if final_norm:
        x = _norm(x, 3 * n, shape, norm_w, norm_b, eps)
    return _linear(6 * n, x, kinds, weights, biases, packs, where, reduce_range)


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
