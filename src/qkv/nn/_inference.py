"""Linear layers at inference, as a decoding step runs them.

A decoding step multiplies a few rows (the batch) by every weight of the decoder.  For so few
rows the weight's layout decides the speed, so the weights are kept here in the layout the
CPU's GEMM reads fastest: packed for oneDNN (the library CTranslate2 runs on CPUs) where
PyTorch was built with it, for float32; otherwise transposed, ``(in, out)`` contiguous, which
MKL reads faster than ``nn.Linear``'s ``(out, in)``.  The self-attention's three projections
are one ``(in, 3 * out)`` matrix (one product instead of three).  The same numbers come out up
to float rounding (the tests compare with ``nn.Linear``).

The copies are made on first use and remade whenever a weight changes (a new tensor, or an
in-place update: an optimizer step, ``load_state_dict``), and are held by weak reference to
their module: a module freed frees them.  Autograd never flows through them: callers use them
only without grad.

A dynamically quantized int8 linear layer (:func:`qkv.inference.quantize_model`) is called
through its kernel (``quantized::linear_dynamic`` on its packed weight, as its ``forward``
does, without the module call around it), and several of them fed the same input (the
self-attention's three projections, the cross-attention's keys and values) are one int8 product:
their int8 weights stacked, each output row keeping its own layer's scale (per-channel), so the
numbers are those of the layers one by one (the input is quantized once, with the same range).
Their packed weights are kept while every layer keeps its own (``set_weight_bias`` and
``load_state_dict`` pack a new one).  Anything else is called as it is.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

__all__ = [
    "Linear",
    "forget",
    "fused_product",
    "fused_projection",
    "linear",
    "packed_of",
    "product",
    "versions",
    "weights_of",
]

Product = Callable[[Tensor], Tensor]  # x (N, in) -> (N, out)
# module -> (the weights' identity and versions, the product with the kept weights)
_CACHE: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, Product]] = weakref.WeakKeyDictionary()
_FUSED: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, Product]] = weakref.WeakKeyDictionary()


def forget(module: nn.Module) -> None:
    """Drop the weights kept for ``module`` and every module inside it. A kept weight is
    recognised by its tensor's version counter, which an in-place update bumps, except one
    that bypasses autograd's counters (torch's fused AdamW, ``p.data.add_()``): such
    updates are made in training mode, so a module that changes mode forgets what it kept
    (``_Stack.train`` calls this)."""
    for m in module.modules():
        _CACHE.pop(m, None)
        _FUSED.pop(m, None)


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


def _has_onednn() -> bool:
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


_ONEDNN = _has_onednn()


class Linear:
    """A linear layer's product ``x -> x @ W.T + b`` for ``x`` ``(N, in)``, with the weight kept
    in one of three layouts, named by :attr:`kind` (what a scripted decoding step reads to run
    the same kernel itself, :mod:`qkv.nn._scripted`):

    * ``ONEDNN``: ``weight`` packed for oneDNN (float32 on the CPU, where torch has it);
    * ``MM``: ``weight`` transposed, ``(in, out)`` contiguous;
    * ``INT8``: a dynamically quantized layer's packed int8 weight ``packed`` (bias inside),
      called with ``reduce_range``.
    """

    ONEDNN, MM, INT8 = 0, 1, 2
    __slots__ = ("bias", "kind", "packed", "reduce_range", "run", "weight")

    def __init__(
        self,
        kind: int,
        run: Product,
        *,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        packed: object = None,
        reduce_range: bool = False,
    ) -> None:
        self.kind, self.run = kind, run
        self.weight, self.bias = weight, bias
        self.packed, self.reduce_range = packed, reduce_range

    def __call__(self, x: Tensor) -> Tensor:
        return self.run(x)


def _product(weight: Tensor, bias: Tensor | None) -> Linear:
    """``x -> x @ weight.T + bias`` with the weight ``(out, in)`` kept in the fastest layout."""
    weight = weight.detach()
    bias = None if bias is None else bias.detach()
    if _ONEDNN and weight.dtype == torch.float32 and weight.device.type == "cpu":
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        except RuntimeError:  # not for this build or this CPU: the transposed weight then
            pass
        else:
            run = torch.ops.mkldnn._linear_pointwise
            return Linear(
                Linear.ONEDNN,
                lambda x: run(x, packed, bias, "none", [], ""),
                weight=packed,
                bias=bias,
            )
    wt = weight.t().contiguous()  # (in, out)
    if bias is None:
        return Linear(Linear.MM, lambda x: torch.mm(x, wt), weight=wt)
    return Linear(Linear.MM, lambda x: torch.addmm(bias, x, wt), weight=wt, bias=bias)


def _fits(x: Tensor, weight: Tensor) -> bool:
    return x.dtype == weight.dtype and x.device == weight.device and x.dim() == 2


def _int8(module: nn.Module, x: Tensor) -> bool:
    """Whether ``module`` is a dynamically quantized int8 linear layer that :func:`product` may
    call through its kernel for a float32 ``x`` ``(N, in)`` on the CPU."""
    return (
        type(module) is DynamicInt8Linear
        and module._packed_params.dtype == torch.qint8
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and x.dim() == 2
    )


def _reduce_range(module: nn.Module) -> bool:
    """What the layer's ``forward`` passes as ``reduce_range`` (True from its version 4)."""
    version = getattr(module, "version", None)
    return version is not None and version >= 4


_LINEAR_DYNAMIC = torch.ops.quantized.linear_dynamic.default
# the operator itself: its Python wrapper looks for traced (fake) script objects at every call,
# and the packed weights here are real ones
_LINEAR_DYNAMIC_OP = getattr(_LINEAR_DYNAMIC, "_op", _LINEAR_DYNAMIC)


def _int8_product(packed: object, reduce_range: bool) -> Linear:
    run = _LINEAR_DYNAMIC_OP
    return Linear(
        Linear.INT8,
        lambda x: run(x, packed, reduce_range),
        packed=packed,
        reduce_range=reduce_range,
    )


def packed_of(module: nn.Module) -> object | None:
    """The packed weight of a dynamically quantized linear layer (replaced whenever its weights
    are), or None for any other module."""
    params = getattr(module, "_packed_params", None)
    return getattr(params, "_packed_params", None) if type(module) is DynamicInt8Linear else None


def _stacked_int8(layers: tuple[nn.Module, ...]) -> Linear:
    """One int8 product for the dynamically quantized ``layers`` (one input): their int8 weights
    stacked, every output row with its own layer's scale and zero point (per-channel)."""
    weights, scales, zeros, biases = [], [], [], []
    for m in layers:
        w, b = torch.ops.quantized.linear_unpack(packed_of(m))
        out = w.shape[0]
        if w.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            scales.append(w.q_per_channel_scales().double())
            zeros.append(w.q_per_channel_zero_points().long())
        else:
            scales.append(torch.full((out,), w.q_scale(), dtype=torch.double))
            zeros.append(torch.full((out,), w.q_zero_point(), dtype=torch.long))
        weights.append(w.int_repr())
        biases.append(torch.zeros(out) if b is None else b.detach().float())
    scale, zero = torch.cat(scales), torch.cat(zeros)
    with warnings.catch_warnings():  # torch's deprecation notice for quantized tensors
        warnings.simplefilter("ignore")
        stacked = torch._make_per_channel_quantized_tensor(torch.cat(weights), scale, zero, 0)
        packed = torch.ops.quantized.linear_prepack(stacked, torch.cat(biases))
    return _int8_product(packed, _reduce_range(layers[0]))


def product(module: nn.Module, x: Tensor) -> Product:
    """What :func:`linear` runs for ``module`` on inputs like ``x`` ``(N, in)``: the product with
    the kept weight for a plain ``nn.Linear`` whose weights have versions, else the module
    itself (which reads its weights at every call).  Valid while the weights are unchanged
    (:func:`weights_key`); a decoding step takes its products once per decoder state."""
    if _int8(module, x):
        return _int8_product(packed_of(module), _reduce_range(module))
    if type(module) is not nn.Linear or not _fits(x, module.weight):
        return module
    key = _key(module.weight, module.bias)
    if key is None:
        return module
    hit = _CACHE.get(module)
    if hit is None or hit[0] != key:
        hit = (key, _product(module.weight, module.bias))
        _CACHE[module] = hit
    return hit[1]


def linear(module: nn.Module, x: Tensor) -> Tensor:
    """``module(x)`` for ``x`` ``(N, in)``; a plain ``nn.Linear`` through its kept weight."""
    return product(module, x)(x)


def fused_product(owner: nn.Module, layers: tuple[nn.Module, ...], x: Tensor) -> Product | None:
    """``x -> cat([layer(x) for layer in layers], -1)`` for inputs like ``x`` ``(N, in)`` as one
    product, the fused weight kept on ``owner``; None when a layer is not a plain ``nn.Linear``
    (or all dynamically quantized int8 ones, see the module's notes) or a weight has no version
    (call them one by one then)."""
    if all(_int8(m, x) for m in layers) and len({_reduce_range(m) for m in layers}) == 1:
        packed = tuple(packed_of(m) for m in layers)
        hit = _FUSED.get(owner)
        # the packed weights themselves are kept in the key: their ids stay theirs while kept
        if (
            hit is None
            or len(hit[0]) != len(packed)
            or any(a is not b for a, b in zip(hit[0], packed))
        ):
            hit = (packed, _stacked_int8(layers))
            _FUSED[owner] = hit
        return hit[1]
    if any(type(m) is not nn.Linear for m in layers) or not _fits(x, layers[0].weight):
        return None
    weights = [m.weight for m in layers]
    biases = [m.bias for m in layers]
    key = _key(*weights, *biases)
    if key is None:
        return None
    hit = _FUSED.get(owner)
    if hit is None or hit[0] != key:
        weight = torch.cat([w.detach() for w in weights])  # (sum of outs, in)
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat(
                [
                    b.detach() if b is not None else w.new_zeros(w.shape[0])
                    for w, b in zip(weights, biases)
                ]
            )
        hit = (key, _product(weight, bias))
        _FUSED[owner] = hit
    return hit[1]


def fused_projection(owner: nn.Module, layers: tuple[nn.Module, ...], x: Tensor) -> Tensor | None:
    """``cat([layer(x) for layer in layers], -1)`` for ``x`` ``(N, in)`` as one product
    (:func:`fused_product`); None when a layer is not a plain ``nn.Linear`` (call them one by
    one then)."""
    run = fused_product(owner, layers, x)
    return None if run is None else run(x)


def weights_of(modules: tuple[nn.Module, ...]) -> list[Tensor]:
    """Every weight and bias tensor of ``modules`` (those of a quantized layer are not tensors:
    it reads its own at every call)."""
    tensors = [t for m in modules for t in (getattr(m, "weight", None), getattr(m, "bias", None))]
    return [t for t in tensors if isinstance(t, Tensor)]


def versions(tensors: list[Tensor]) -> tuple | None:
    """The version counters of ``tensors`` (an in-place update changes one), or None when one
    has none (an inference tensor)."""
    out = tuple(_version(t) for t in tensors)
    return None if None in out else out
