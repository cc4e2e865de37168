"""Dynamic int8 quantization of a model's linear layers, for faster decoding on the CPU.

>>> from qkv.inference import quantize_model
>>> model = quantize_model(saved.model, "int8")   # a quantized copy; saved.model is unchanged

Every :class:`torch.nn.Linear` (attention projections, feed-forward layers, the output
projection) gets int8 weights (one scale per weight matrix, as torch's dynamic quantization
does), and its input is quantized on the fly at each call; the matrix
products run in int8 with an fp32 result (the fbgemm/oneDNN kernels). Embeddings, layer norms and
the attention itself stay fp32. It changes the numbers slightly: a translation may differ from
the fp32 one (``qkv evaluate --quantize int8`` measures the BLEU cost).

A decoding step calls the quantized layers' kernel directly, and runs the layers that read one
input as one int8 product (the self-attention's query, key and value projections; the
cross-attention's keys and values): their int8 weights stacked, each row with its own layer's
scale, so the numbers are those of the layers one by one (:mod:`qkv.nn._inference`).

torch implements it on the CPU only: a model on CUDA is refused. torch marks
``torch.ao.quantization`` as deprecated in favour of the separate ``torchao`` package; it still
ships (and is what this uses) in the torch versions qkv supports, and its warnings are silenced
here.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

__all__ = ["QUANTIZATIONS", "check_quantize", "quantize_model"]

#: the accepted ``quantize`` values (None: no quantization)
QUANTIZATIONS = ("int8",)


def check_quantize(quantize: object, device: torch.device | str = "cpu") -> str | None:
    """``quantize`` as a valid choice, or a one-line ValueError: one of :data:`QUANTIZATIONS`
    or None, and a CPU ``device`` (torch's dynamic int8 kernels are the CPU's)."""
    if quantize is None:
        return None
    if quantize not in QUANTIZATIONS:
        raise ValueError(
            f"quantize: expected one of {', '.join(QUANTIZATIONS)} or None, got {quantize!r}"
        )
    if torch.device(device).type != "cpu":
        raise ValueError(
            f"quantize: {quantize} runs on the CPU only (torch's dynamic quantization), "
            f"got device {str(device)!r}; use --device cpu"
        )
    return str(quantize)


def quantize_model(model: nn.Module, quantize: str = "int8") -> nn.Module:
    """A copy of ``model`` (in eval mode, on the CPU) with every ``nn.Linear`` replaced by a
    dynamically quantized int8 one; ``model`` itself is left as it was.

    Raises:
        ValueError: ``quantize`` is not one of :data:`QUANTIZATIONS`, or ``model`` is not on the
            CPU.
    """
    devices = {p.device for p in model.parameters()}
    device = next(iter(devices)) if len(devices) == 1 else torch.device("cpu")
    check_quantize(quantize, device if devices else "cpu")
    if quantize is None:  # pragma: no cover - check_quantize refuses it for quantize_model
        raise ValueError("quantize: expected 'int8', got None")
    q = copy.deepcopy(model).eval()
    with warnings.catch_warnings():  # torch.ao.quantization's deprecation notices
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(q, {nn.Linear}, dtype=torch.qint8, inplace=True)
