"""Linear layers at inference, as a decoding step runs them.

A decoding step multiplies a few rows (the batch) by every weight of the decoder.  The weights
are kept here transposed, ``(in, out)`` contiguous, which the CPU's GEMM reads faster for so
few rows than ``nn.Linear``'s ``(out, in)``; the self-attention's three projections are one
``(in, 3 * out)`` matrix (one product instead of three).  The copies are made on first use and
remade whenever a weight changes (a new tensor, or an in-place update: an optimizer step,
``load_state_dict``), and are held by weak reference to their module: a module freed frees them.
Autograd never flows through them: callers use them only without grad.

Anything but a plain ``nn.Linear`` (e.g. a dynamically quantized one) is called as it is.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn

__all__ = ["fused_projection", "linear"]

# module -> (the weights' identity and versions, transposed weight, bias)
_CACHE: weakref.WeakKeyDictionary[nn.Module, tuple[tuple | None, Tensor, Tensor | None]] = (
    weakref.WeakKeyDictionary()
)
_FUSED: weakref.WeakKeyDictionary[nn.Module, tuple[tuple | None, Tensor, Tensor | None]] = (
    weakref.WeakKeyDictionary()
)


def _version(t: Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # an inference tensor (made under inference_mode) has no version
        return None


def _key(*tensors: Tensor | None) -> tuple | None:
    """What identifies the tensors' contents; None when a change could go unseen (an inference
    tensor has no version counter): then nothing is cached."""
    key = []
    for t in tensors:
        if t is None:
            key.append(None)
            continue
        version = _version(t)
        if version is None:
            return None
        key.append((t.data_ptr(), version, t.shape, t.dtype, t.device))
    return tuple(key)


def linear(module: nn.Module, x: Tensor) -> Tensor:
    """``module(x)`` for ``x`` ``(N, in)``; a plain ``nn.Linear`` through its transposed weight."""
    if type(module) is not nn.Linear:
        return module(x)
    w, b = module.weight, module.bias
    key = _key(w, b)
    if key is None:
        return module(x)
    hit = _CACHE.get(module)
    if hit is None or hit[0] != key:
        hit = (key, w.detach().t().contiguous(), None if b is None else b.detach())
        _CACHE[module] = hit
    _, wt, bias = hit
    if x.dtype != wt.dtype or x.device != wt.device:
        return module(x)
    return torch.mm(x, wt) if bias is None else torch.addmm(bias, x, wt)


def fused_projection(owner: nn.Module, layers: tuple[nn.Module, ...], x: Tensor) -> Tensor | None:
    """``cat([layer(x) for layer in layers], -1)`` for ``x`` ``(N, in)`` as one product, the
    fused weight kept on ``owner``; None when a layer is not a plain ``nn.Linear`` (call them
    one by one then)."""
    if any(type(m) is not nn.Linear for m in layers):
        return None
    weights = [m.weight for m in layers]
    biases = [m.bias for m in layers]
    key = _key(*weights, *biases)
    if key is None:
        return None
    hit = _FUSED.get(owner)
    if hit is None or hit[0] != key:
        wt = torch.cat([w.detach() for w in weights]).t().contiguous()  # (in, sum of outs)
        if all(b is None for b in biases):
            bias = None
        else:
            bias = torch.cat(
                [
                    b.detach() if b is not None else w.new_zeros(w.shape[0])
                    for w, b in zip(weights, biases)
                ]
            )
        hit = (key, wt, bias)
        _FUSED[owner] = hit
    _, wt, bias = hit
    if x.dtype != wt.dtype or x.device != wt.device:
        return None
    return torch.mm(x, wt) if bias is None else torch.addmm(bias, x, wt)
