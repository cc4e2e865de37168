"""``attention()``: the one entry point.  It validates, picks a backend in one place, and runs it.

Backends:

* ``"fused"``: ``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-efficient
  kernels), used when the weights are not needed and the score's kind says the kernel runs it;
* ``"reference"``: materialises the ``(B, H, Lq, Lk)`` scores and weights; every score and mask;
* ``"chunked"``: exact attention in O(L) memory, forward and backward (:mod:`.chunked`), taken
  when the materialised weights would exceed the memory budget or when the fused kernel would
  need a large materialised mask;
* ``"export"``: tensor operations only, for graphs (``torch.export``, the ONNX exporter,
  ``torch.compile``): no value is read back to the host (no ``.item()``, ``bool()``,
  ``.tolist()``, ``nonzero``), so no Python branch depends on data.  Taken whenever
  :func:`torch.compiler.is_compiling` is true (whatever ``backend=`` asks), and on request.  The masks are built with tensor
  ops, rows with no key zeroed and NaN rows poisoned by tensor ops; the fused kernel runs what
  it can (no weights, a dot-product kind, a float scale), the materialised scores the rest.
  Nothing is trimmed and no memory budget applies.

:func:`explain` says which backend a call takes and why the others were passed over: it runs
the planner :func:`attention` runs (validation, masks, scale, backend), then stops.  The memory
budget is per call (``memory_budget=`` bytes) or global (:func:`set_memory_budget`);
:func:`additive_attention` goes through the same planner.  Everything a backend needs to know
about a score comes from its :class:`~qkv.functional.scores.ScoreKind`.
"""

from __future__ import annotations

import contextlib
import html
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from ._memory import available_memory
from .chunked import run_chunked
from .masks import MaskSpec, check_masks
from .scores import (
    ADDITIVE,
    SCORE_MOD,
    Score,
    ScoreKind,
    grouped_wv,
    nonfinite_rows,
    score_kind,
    sync_free_scores,
)
from .softmax import apply_masks, softmax_and_dead

__all__ = [
    "BACKENDS",
    "AttentionMemoryError",
    "BackendChoice",
    "additive_attention",
    "attention",
    "explain",
    "get_memory_budget",
    "set_memory_budget",
]

Backend = Literal["auto", "fused", "reference", "chunked", "export"]
BACKENDS: tuple[str, ...] = ("fused", "reference", "chunked", "export")

_MEMORY_BUDGET = 1 << 30  # bytes the reference path may spend on materialised scores/weights
# a mask the fused kernel would need built, above this many (B*Lq*Lk) elements, sends the call to
# the chunked backend, which computes such masks from indices block by block
_MASK_ELEMENTS_LIMIT = 1 << 22
# the export backend's reason for running the reference computation instead of the fused kernel
_MATERIALISES = "materialises the scores"


class AttentionMemoryError(MemoryError):
    """Raised when a call would need more memory than its budget and no backend can avoid it."""


def set_memory_budget(nbytes: int) -> int:
    """Set the global memory budget (bytes) for materialised attention weights; returns the old.

    Calls whose weights would exceed it (or the memory available: the least of the free
    memory, the cgroup limits and ``ulimit -v``) run on the chunked backend; weights asked for
    (``need_weights=True``) over it, or over the memory available, raise
    :class:`AttentionMemoryError`, and so does a forced ``backend="reference"`` (or ``"fused"``
    with a mask to build, or an eager ``"export"`` that materialises the scores), before
    anything is allocated.
    """
    global _MEMORY_BUDGET
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"nbytes: expected a positive int (bytes), got {nbytes!r}")
    old, _MEMORY_BUDGET = _MEMORY_BUDGET, nbytes
    return old


def get_memory_budget() -> int:
    """The global memory budget in bytes (default 1 GiB)."""
    return _MEMORY_BUDGET


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


@dataclass(frozen=True)
class BackendChoice:
    """Which backend a call takes, and why each faster one was passed over."""

    backend: str
    reasons: tuple[str, ...] = ()

    def __str__(self) -> str:
        why = "; ".join(self.reasons) if self.reasons else "fastest backend available"
        return f"{self.backend} ({why})"

    def _repr_html_(self) -> str:
        """The choice as a table: the backend taken, then why each faster one was not."""
        cell = 'style="border:1px solid #ccc;padding:2px 6px;text-align:left"'
        why = self.reasons or ("fastest backend available",)
        rows = "".join(f"<tr><td {cell}>{html.escape(r)}</td></tr>" for r in why)
        return (
            f"<div>backend <b><code>{html.escape(self.backend)}</code></b>"
            f'<table style="border-collapse:collapse;margin:4px 0">'
            f"<tr><th {cell}>why (the faster backends passed over)</th></tr>{rows}</table></div>"
        )


# ---------------------------------------------------------------------------- validation
def _describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"{type(x).__name__}"


def _check_qkv(query: Tensor, key: Tensor, value: Tensor) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a tensor, got {_describe(t)}")
        if not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")
    if query.dim() not in (3, 4):
        raise ValueError(
            f"query: expected shape (B, H, Lq, d) or (B, Lq, d), got {tuple(query.shape)}"
        )
    layout = "(B, H, L, d)" if query.dim() == 4 else "(B, L, d)"
    for name, t in (("key", key), ("value", value)):
        if t.dim() != query.dim():
            raise ValueError(
                f"{name}: expected {query.dim()} dimensions {layout} like query, "
                f"got shape {tuple(t.shape)}"
            )
        if t.dtype != query.dtype:
            raise TypeError(f"{name}: expected dtype {query.dtype} like query, got {t.dtype}")
        if t.device != query.device:
            raise ValueError(f"{name}: expected device {query.device} like query, got {t.device}")
        if t.shape[0] != query.shape[0]:
            raise ValueError(
                f"{name}: expected batch size {query.shape[0]} like query, got shape "
                f"{tuple(t.shape)}"
            )
    if query.shape[-1] == 0:  # q . k would be 0 for every pair, and its scale 1/sqrt(0)
        raise ValueError(
            f"query: expected a width d >= 1 (last axis), got shape {tuple(query.shape)}"
        )
    if key.shape[-1] != query.shape[-1]:
        raise ValueError(
            f"key: expected width d={query.shape[-1]} like query (last axis), got shape "
            f"{tuple(key.shape)}"
        )
    if value.shape[-2] != key.shape[-2]:
        raise ValueError(
            f"value: expected {key.shape[-2]} positions like key (axis -2), got shape "
            f"{tuple(value.shape)}"
        )
    if query.dim() == 4:
        H, Hk, Hv = query.shape[1], key.shape[1], value.shape[1]
        if Hk != Hv:
            raise ValueError(f"value: expected {Hk} heads like key, got shape {tuple(value.shape)}")
        if Hk == 0 or H % Hk:
            raise ValueError(
                f"key: expected a number of heads dividing query's {H} (grouped-query "
                f"attention), got shape {tuple(key.shape)}"
            )


def _check_dropout(dropout_p: object) -> float:
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p: expected a float in [0, 1), got {_describe(dropout_p)}")
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"dropout_p: expected a float in [0, 1), got {dropout_p}")
    return float(dropout_p)


def _check_budget(budget: object) -> None:
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0
    ):
        raise ValueError(f"memory_budget: expected a positive int (bytes) or None, got {budget!r}")


def _check_scale(scale: object, sync_free: bool = False) -> None:
    if scale is None:
        return
    if isinstance(scale, Tensor):
        if scale.numel() != 1 or not scale.is_floating_point():
            raise ValueError(
                f"scale: expected a float or a one-element float tensor, got {_describe(scale)}"
            )
        if sync_free:  # its value is not read back: graphs take it as it is
            return
        value = float(scale.detach())
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"scale: expected a positive finite value, got {value}")
        return
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale: expected a positive float, got {_describe(scale)}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale: expected a positive finite float, got {scale}")


# ---------------------------------------------------------------------------- dispatch
def _why_not_fused(
    query: Tensor,
    key: Tensor,
    kind: ScoreKind,
    scale: object,
    need_weights: bool,
) -> list[str]:
    reasons = []
    if need_weights:
        reasons.append("need_weights=True: the fused kernel does not return weights")
    if kind.not_fused is not None:
        reasons.append(kind.not_fused)
    if isinstance(scale, Tensor):
        reasons.append("a tensor scale is not supported by the fused kernel")
    if key.shape[-2] == 0 or query.shape[-2] == 0:
        reasons.append("empty query or key sequence")
    return reasons


def _export_choice(
    query: Tensor, key: Tensor, kind: ScoreKind, scale, need_weights: bool, backend: str
) -> BackendChoice:
    """The export backend's plan: the fused kernel where it can run the call (decided from the
    arguments and shapes alone), else the materialised scores.  ``backend`` is the one asked."""
    if backend == "export":
        why = "requested by the caller"
    else:  # under torch.compile / torch.export, whatever was asked
        why = "torch.compiler.is_compiling(): tensor operations only, no host sync"
        if backend != "auto":
            why += f" (backend={backend!r} would read values back to the host)"
    not_fused = _why_not_fused(query, key, kind, scale, need_weights)
    if not not_fused:
        return BackendChoice("export", (why, "runs scaled_dot_product_attention"))
    return BackendChoice("export", (why, _MATERIALISES, *not_fused))


def _available_memory(device: torch.device) -> int | None:
    """Bytes the device can still allocate for this process (None when unknown): on the CPU
    the least of the free memory, the cgroup limits (v1 and v2) and ``ulimit -v``."""
    return available_memory(device)


# a materialisation smaller than this is not checked against the available memory (reading
# it costs ~0.2 ms; a process that cannot spare this much has other problems)
_CHECK_AVAILABLE_ABOVE = 1 << 24


def _available_for(nbytes: int, device: torch.device) -> int | None:
    """The available memory when ``nbytes`` is worth checking against it, else None."""
    return _available_memory(device) if nbytes > _CHECK_AVAILABLE_ABOVE else None


def _needs_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(
        t is not None and isinstance(t, Tensor) and t.requires_grad for t in tensors
    )


def _reference_bytes(query: Tensor, spec: MaskSpec, kind: ScoreKind, grad: bool) -> int:
    """Bytes the materialised computation holds: the scores and the weights, a float32 softmax
    temporary for half precision, and in training the weights' gradient; a kind whose pairs
    hold several values (additive attention's tanh(q + k)) holds them twice (the sum and its
    tanh)."""
    elem = query.element_size()
    n = spec.B * spec.H * spec.Lq * spec.Lk
    nbytes = n * (2 * elem + (4 if elem < 4 else 0) + (elem if grad else 0))
    pair_values = kind.pair_values(query.shape[-1])
    if pair_values > 1:
        nbytes += 2 * n * pair_values * elem
    return nbytes


def _choose(
    query,
    key,
    value,
    spec: MaskSpec,
    kind: ScoreKind,
    arg,
    scale,
    need_weights,
    dropout_p,
    backend,
    budget,
    pad_bytes: int = 0,
) -> BackendChoice:
    """The backend for a planned call; ``pad_bytes``: the weights returned with the trimmed
    keys' zero columns put back (counted with the materialised computation)."""
    budget = _MEMORY_BUDGET if budget is None else budget
    params = [t for t in (scale, arg) if isinstance(t, Tensor)]
    grad = _needs_grad(query, key, value, *params)
    reference_bytes = _reference_bytes(query, spec, kind, grad) + pad_bytes
    not_fused = _why_not_fused(query, key, kind, scale, need_weights)
    not_chunked = _why_not_chunked(spec, need_weights)
    if backend != "auto":
        blockers = {"fused": not_fused, "chunked": not_chunked, "reference": []}[backend]
        if blockers:
            raise ValueError(f"backend: {backend!r} cannot run this call: {'; '.join(blockers)}")
        _check_forced_memory(backend, query, spec, need_weights, reference_bytes, budget)
        return BackendChoice(backend, ("requested by the caller",))
    if need_weights:
        _check_weights_memory(query, spec, reference_bytes, budget)
        return BackendChoice("reference", tuple(not_fused))
    if not not_fused:
        return _fused_or_chunked(query, spec, grad, budget, not_chunked)
    return _reference_or_chunked(query, reference_bytes, budget, not_fused, not_chunked)


_WAY_OUT = "raise the budget (memory_budget= bytes, or qkv.functional.set_memory_budget()) or "


def _why_not_chunked(spec: MaskSpec, need_weights: bool) -> list[str]:
    reasons = []
    if need_weights:
        reasons.append("need_weights=True: the chunked backend never holds the weights")
    if spec.Lq == 0 or spec.Lk == 0:
        reasons.append("empty query or key sequence")
    float_masks = (spec.key_padding_mask, spec.attn_mask)
    if any(m is not None and m.requires_grad for m in float_masks) and torch.is_grad_enabled():
        reasons.append("a float mask requires grad (the chunked backend treats masks as constant)")
    return reasons


def _check_forced_memory(
    backend: str,
    query: Tensor,
    spec: MaskSpec,
    need_weights: bool,
    reference_bytes: int,
    budget: int,
) -> None:
    """A forced backend keeps the budget and the available memory: refused
    (:class:`AttentionMemoryError`) before anything is allocated."""
    B, H, Lq, Lk = spec.B, spec.H, spec.Lq, spec.Lk
    held = {
        "reference": (reference_bytes, f"the {B}x{H}x{Lq}x{Lk} scores and weights"),
        "fused": (
            spec.built_mask_elements() * (1 + query.element_size()),
            "the mask it needs built",
        ),
    }.get(backend)
    if held is None:
        return
    chunked_too = "" if need_weights else " (the chunked backend runs in O(L) memory)"
    if held[0] > budget:
        raise AttentionMemoryError(
            f"backend: {backend!r} would materialise {held[1]}, about "
            f"{_fmt_bytes(held[0])}, over the memory budget of {_fmt_bytes(budget)}; "
            f"{_WAY_OUT}pass backend='auto'{chunked_too}"
        )
    avail = _available_for(held[0], query.device)
    if avail is not None and held[0] > avail:
        raise AttentionMemoryError(
            f"backend: {backend!r} would materialise {held[1]}, about "
            f"{_fmt_bytes(held[0])}, more than the {_fmt_bytes(avail)} available on "
            f"{query.device} (free memory, cgroup and ulimit -v limits); pass "
            f"backend='auto'{chunked_too}"
        )


def _check_weights_memory(query: Tensor, spec: MaskSpec, reference_bytes: int, budget: int) -> None:
    """The weights asked for are materialised within the budget and the memory available,
    else refused (:class:`AttentionMemoryError`)."""
    B, H, Lq, Lk = spec.B, spec.H, spec.Lq, spec.Lk
    if reference_bytes > budget:
        raise AttentionMemoryError(
            f"need_weights=True on {B}x{H}x{Lq}x{Lk} attention needs about "
            f"{_fmt_bytes(reference_bytes)} for the weights and scores, over the memory "
            f"budget of {_fmt_bytes(budget)}; {_WAY_OUT}pass need_weights=False (the "
            "chunked backend then runs in O(L) memory)"
        )
    avail = _available_for(reference_bytes, query.device)
    if avail is not None and reference_bytes > avail:
        raise AttentionMemoryError(
            f"need_weights=True on {B}x{H}x{Lq}x{Lk} attention needs about "
            f"{_fmt_bytes(reference_bytes)} for the weights and scores, more than the "
            f"{_fmt_bytes(avail)} available on {query.device} (free memory, cgroup and "
            "ulimit -v limits); pass need_weights=False (the chunked backend then runs in "
            "O(L) memory)"
        )


def _fused_or_chunked(
    query: Tensor, spec: MaskSpec, grad: bool, budget: int, not_chunked: list[str]
) -> BackendChoice:
    """A call the fused kernel can run: fused, unless the mask it would need built is large
    and the chunked backend can compute it from indices instead."""
    build = spec.built_mask_elements()
    # on the CPU, inference: the chunked backend computes index masks faster than the fused
    # kernel reads a large materialised one; elsewhere only memory decides
    cpu_inference = query.device.type == "cpu" and not grad
    too_large = build > _MASK_ELEMENTS_LIMIT if cpu_inference else build * 4 > budget
    if build and too_large and not not_chunked:
        return BackendChoice(
            "chunked",
            (
                f"the fused kernel would need a materialised mask of {build} elements; "
                "the chunked backend computes it from indices",
            ),
        )
    return BackendChoice("fused")


def _reference_or_chunked(
    query: Tensor,
    reference_bytes: int,
    budget: int,
    not_fused: list[str],
    not_chunked: list[str],
) -> BackendChoice:
    """A call the fused kernel cannot run: the materialised scores within the budget and the
    memory available, else the chunked backend (or, where it cannot run the call, the
    materialised scores if the memory is there at all)."""
    avail = _available_for(reference_bytes, query.device)
    over_avail = avail is not None and reference_bytes > avail
    if reference_bytes <= budget and not over_avail:
        return BackendChoice("reference", tuple(not_fused))
    too_big = (
        f"materialised weights would take about {_fmt_bytes(reference_bytes)} "
        f"(memory budget {_fmt_bytes(budget)})"
    )
    if not_chunked:
        if avail is None:  # dropout: the reference only, if the memory is there
            avail = _available_memory(query.device)
        if avail is None or reference_bytes > avail:
            raise AttentionMemoryError(
                f"{too_big}, more than is available, and the chunked backend cannot run "
                f"this call: {'; '.join(not_chunked)}"
            )
        return BackendChoice("reference", (*not_fused, *not_chunked))
    if over_avail and reference_bytes <= budget:
        why = (
            f"materialised weights would take about {_fmt_bytes(reference_bytes)}, more "
            f"than the {_fmt_bytes(avail)} available on {query.device}"
        )
        return BackendChoice("chunked", (*not_fused, why))
    return BackendChoice("chunked", (*not_fused, too_big))


# ---------------------------------------------------------------------------- backends
def _fused(
    q,
    k,
    v,
    spec: MaskSpec,
    kind: ScoreKind,
    mult: float,
    dropout_p: float,
    poison: Tensor | None,
    sync_free: bool = False,
) -> Tensor:
    q, k = kind.prepare(q, k)
    # dead rows attend to every key in the kernel, then are zeroed below
    mask, causal, dead = spec.sdpa_mask_and_dead(q.dtype, sync_free)
    # enable_gqa only when needed: the ONNX exporter's SDPA takes no such argument
    gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal, scale=float(mult), **gqa
    )
    if poison is not None:  # NaN rows stay NaN whatever the kernel makes of them (it may give 0)
        out = out + poison
    if dead is not None:
        out = out.masked_fill(dead, 0.0)
    return out


def _reference(
    q,
    k,
    v,
    spec: MaskSpec,
    kind: ScoreKind,
    arg,
    mult,
    dropout_p: float,
    poison: Tensor | None,
    sync_free: bool = False,
) -> tuple[Tensor, Tensor]:
    if poison is not None:
        # a NaN row of scores is never taken for a row with no key (as -inf scores from an
        # infinite input would be), and its weights come out NaN
        q = q + poison
    q, k = kind.prepare(q, k)
    blocked = spec.blocked() if kind.row_scale is not None else None
    # an eager export backend reads nothing back (a trace needs no flag: it is_compiling)
    eager_sync_free = sync_free and not torch.compiler.is_compiling()
    with sync_free_scores() if eager_sync_free else contextlib.nullcontext():
        scores = kind.scores(q, k, mult, arg, blocked)
    # in place on our own temporary, unless the kind's backward may need its output
    scores = apply_masks(scores, spec, inplace=kind.in_place, strict=poison is not None)
    # rows left with no key, from the masked scores
    weights, dead = softmax_and_dead(scores, sync_free=sync_free)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    out = grouped_wv(weights, v)
    if poison is not None:  # (dropout or a score_mod may have dropped the NaN)
        out = out + poison
    if dead is not None:  # zero weights times a NaN value is NaN: a row with no key stays 0
        out = out.masked_fill(dead, 0.0)
    return out, weights


# heads of a sequence the reference path runs at once when it runs the problem in slices: the
# slice's scores stay under about this many values (~4 MiB in float32), in the CPU's cache;
# larger slices are fewer parallel regions (each a barrier of the threads)
_SLICE_ELEMENTS = 1 << 20
# problems with fewer scores than this run in one piece (the slices' Python costs more)
_SLICED_ABOVE = 1 << 21


def _reference_sliced(
    q, k, v, spec: MaskSpec, kind: ScoreKind, arg, mult, poison: Tensor | None
) -> tuple[Tensor, Tensor]:
    """:func:`_reference` (inference, no dropout) one sequence and a few heads at a time.

    Each slice's scores, weights and softmax stay in the cache instead of going to memory and
    back between passes (measured at B 8, H 8, 512 x 384 scores: about half the time of one
    piece); the results are the same computation on the same numbers.  Shapes as
    :func:`_reference`; returns ``(out (B, H, Lq, dv), weights (B, H, Lq, Lk))``."""
    B, H, Lq, _ = q.shape
    Hkv, Lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    G = H // Hkv
    per_group = G * Lq * max(Lk, 1)  # query heads that share one key/value head go together
    n = -(-Hkv * per_group // _SLICE_ELEMENTS)  # slices per sequence, of equal size
    hc = G * -(-Hkv // max(1, min(Hkv, n)))
    out = q.new_empty(B, H, Lq, dv)
    weights = q.new_empty(B, H, Lq, Lk)
    for b in range(B):
        for h0 in range(0, H, hc):
            h1 = min(H, h0 + hc)
            p = None
            if poison is not None:
                p = poison[b : b + 1, h0:h1] if poison.shape[1] != 1 else poison[b : b + 1]
            o, w = _reference(
                q[b : b + 1, h0:h1],
                k[b : b + 1, h0 // G : h1 // G],
                v[b : b + 1, h0 // G : h1 // G],
                spec.select(b, b + 1, h0, h1),
                kind,
                arg,
                mult,
                0.0,
                p,
            )
            out[b : b + 1, h0:h1] = o
            weights[b : b + 1, h0:h1] = w
    return out, weights


def _slices_pay(q: Tensor, k: Tensor, v: Tensor, spec: MaskSpec, kind: ScoreKind, arg, mult, p):
    """Whether the reference path runs in slices: a large problem on the CPU, no autograd (the
    slices are written into one result), no dropout (its random draws stay those of one
    piece), several slices to make, and not a ``score_mod`` (it reads absolute batch and head
    indices)."""
    return (
        q.device.type == "cpu"
        and kind is not SCORE_MOD
        and p == 0.0
        and spec.B * spec.H * spec.Lq * spec.Lk > _SLICED_ABOVE
        and spec.B * spec.H > 1
        and not _needs_grad(q, k, v, *(t for t in (mult, arg) if isinstance(t, Tensor)))
        and not any(
            m is not None and m.requires_grad for m in (spec.key_padding_mask, spec.attn_mask)
        )
    )


# ---------------------------------------------------------------------------- the planner
class _CheckedCall(NamedTuple):
    """One validated call: its tensors (trailing keys every query masks dropped), its masks, its
    score kind and the backend chosen."""

    query: Tensor
    key: Tensor
    value: Tensor
    inputs: tuple[Tensor, Tensor]  # key and value before trimming: checked for NaN and inf
    spec: MaskSpec
    kind: ScoreKind
    arg: Any  # the kind's argument: a score_mod callable, additive attention's w_v, or None
    mult: float | Tensor
    dropout_p: float
    need_weights: bool
    choice: BackendChoice
    pad_keys: int = 0  # trailing keys trimmed from a call returning weights: zero columns


def _check_export_budget(query, key, value, spec, kind, arg, scale, choice, budget) -> None:
    """A forced ``backend="export"`` called eagerly (shapes known) that materialises the scores
    keeps the memory budget, as the other forced backends do."""
    if _MATERIALISES not in choice.reasons:
        return
    budget = _MEMORY_BUDGET if budget is None else budget
    params = [t for t in (scale, arg) if isinstance(t, Tensor)]
    nbytes = _reference_bytes(query, spec, kind, _needs_grad(query, key, value, *params))
    if nbytes > budget:
        raise AttentionMemoryError(
            f"backend: 'export' would materialise the {spec.B}x{spec.H}x{spec.Lq}x{spec.Lk} "
            f"scores and weights, about {_fmt_bytes(nbytes)}, over the memory budget of "
            f"{_fmt_bytes(budget)}; raise the budget (memory_budget= bytes, or "
            "qkv.functional.set_memory_budget())"
        )


def _plan_kind(
    query, key, value, masks, kind: ScoreKind, arg, scale, dropout_p, need_weights, backend, budget
) -> _CheckedCall:
    """Validate what every kind shares, canonicalise the masks, resolve the multiplier on the
    full key length, drop trailing keys every query has masked (when the weights are not
    returned), and choose the backend."""
    p = _check_dropout(dropout_p)
    _check_budget(budget)
    if backend not in ("auto", *BACKENDS):
        raise ValueError(f"backend: expected 'auto' or one of {BACKENDS}, got {backend!r}")
    sync_free = backend == "export" or torch.compiler.is_compiling()
    spec = _spec(query, key, *masks, sync_free=sync_free)
    mult = kind.multiplier(scale, query.shape[-1], key.shape[-2])
    if isinstance(mult, Tensor):
        mult = mult.to(query.dtype).reshape(())
    inputs = (key, value)
    if sync_free:
        choice = _export_choice(query, key, kind, scale, need_weights, backend)
        if backend == "export" and not torch.compiler.is_compiling():
            _check_export_budget(query, key, value, spec, kind, arg, scale, choice, budget)
        return _CheckedCall(
            query, key, value, inputs, spec, kind, arg, mult, p, need_weights, choice
        )
    end = spec.key_extent()
    pad = 0
    if 0 < end < spec.Lk:
        # weights asked for get these keys back as zero columns (exactly what softmax gives
        # keys every query has masked); nothing else about them is computed
        pad = spec.Lk - end if need_weights else 0
        spec = spec.trim_keys(end)
        key, value = key[..., :end, :], value[..., :end, :]
    pad_bytes = spec.B * spec.H * spec.Lq * (spec.Lk + pad) * query.element_size() if pad else 0
    choice = _choose(
        query, key, value, spec, kind, arg, scale, need_weights, p, backend, budget, pad_bytes
    )
    return _CheckedCall(
        query, key, value, inputs, spec, kind, arg, mult, p, need_weights, choice, pad
    )


def plan_call(
    query,
    key,
    value,
    valid_lens,
    key_padding_mask,
    attn_mask,
    is_causal,
    window,
    scale,
    score,
    dropout_p,
    need_weights,
    backend,
    memory_budget,
) -> _CheckedCall:
    """What :func:`attention` and :func:`explain` share: the arguments of :func:`attention`
    (same names, same order), validated and planned."""
    _check_qkv(query, key, value)
    kind, arg = score_kind(score)
    _check_scale(scale, sync_free=backend == "export" or torch.compiler.is_compiling())
    masks = (valid_lens, key_padding_mask, attn_mask, is_causal, window)
    return _plan_kind(
        query, key, value, masks, kind, arg, scale, dropout_p, need_weights, backend, memory_budget
    )


def _run(plan: _CheckedCall) -> tuple[Tensor, Tensor | None]:
    query, key, value, (key_in, value_in) = plan.query, plan.key, plan.value, plan.inputs
    spec, kind, arg, mult, p, choice = (
        plan.spec,
        plan.kind,
        plan.arg,
        plan.mult,
        plan.dropout_p,
        plan.choice,
    )
    squeeze = query.dim() == 3
    if squeeze:  # (B, L, d) -> (B, 1, L, d)
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        key_in, value_in = key_in.unsqueeze(1), value_in.unsqueeze(1)
    export = choice.backend == "export"
    poison = nonfinite_rows(query, key_in, value_in, sync_free=export)
    weights = None
    if export and _MATERIALISES not in choice.reasons:
        out = _fused(query, key, value, spec, kind, mult, p, poison, sync_free=True)
    elif export:
        out, weights = _reference(query, key, value, spec, kind, arg, mult, p, poison, True)
    elif choice.backend == "fused":
        out = _fused(query, key, value, spec, kind, mult, p, poison)
    elif choice.backend == "chunked":
        out = run_chunked(query, key, value, spec, kind, arg, mult, poison=poison, dropout_p=p)
    elif _slices_pay(query, key, value, spec, kind, arg, mult, p):
        out, weights = _reference_sliced(query, key, value, spec, kind, arg, mult, poison)
    else:
        out, weights = _reference(query, key, value, spec, kind, arg, mult, p, poison)
    if weights is not None and plan.pad_keys:
        weights = F.pad(weights, (0, plan.pad_keys))
    if squeeze:
        out = out.squeeze(1)
        weights = weights.squeeze(1) if weights is not None else None
    return out, (weights if plan.need_weights else None)


def _spec(
    query, key, valid_lens, key_padding_mask, attn_mask, is_causal, window, sync_free=False
) -> MaskSpec:
    four = query.dim() == 4
    return check_masks(
        B=query.shape[0],
        H=query.shape[1] if four else 1,
        Lq=query.shape[-2],
        Lk=key.shape[-2],
        device=query.device,
        batched_heads=four,
        valid_lens=valid_lens,
        key_padding_mask=key_padding_mask,
        attn_mask=attn_mask,
        is_causal=is_causal,
        window=window,
        sync_free=sync_free,
    )


# ---------------------------------------------------------------------------- entry points
def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    valid_lens: Tensor | Sequence[int] | None = None,
    key_padding_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    window: int | None = None,
    scale: float | Tensor | None = None,
    score: Score = "scaled_dot",
    dropout_p: float = 0.0,
    need_weights: bool = False,
    backend: Backend = "auto",
    memory_budget: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Attention of ``query`` over ``key``/``value`` with any combination of masks.

    Shapes:
        query ``(B, H, Lq, d)`` or ``(B, Lq, d)``; key ``(B, Hkv, Lk, d)`` / ``(B, Lk, d)``;
        value ``(B, Hkv, Lk, dv)`` / ``(B, Lk, dv)``.  ``Hkv`` may divide ``H`` (grouped-query
        attention: query head ``h`` reads key/value head ``h // (H // Hkv)``, nothing is copied).

    Masks (all combinable, broadcast over heads; bool True = NOT allowed, float = added):
        valid_lens: ``(B,)`` or ``(B, Lq)`` integer lengths in ``[0, Lk]`` (d2l).
        key_padding_mask: ``(B, Lk)``, True at padding (torch.nn.MultiheadAttention).
        attn_mask: ``(Lq, Lk)``, ``(B, Lq, Lk)`` or, for 4-D inputs, ``(B|1, H|1, Lq, Lk)``.
            A 3-D mask is always per batch element, broadcast over heads (torch's SDPA would
            read a 3-D mask on 4-D inputs as ``(H, Lq, Lk)``: use the 4-D form for per-head).
        is_causal: query ``i`` sees keys ``j <= i`` (top-left aligned, as torch SDPA).
        window: query ``i`` sees keys ``i - window < j <= i``.

    Args:
        scale: multiplier of ``q . k``; its default depends on ``score`` (see
            :mod:`qkv.functional.scores`).  A one-element tensor (a learned temperature) is allowed.
        score: a name in :data:`~qkv.functional.SCORES` (``"scaled_dot"``, ``"dot"``, ...: the
            table in :mod:`qkv.functional.scores`) or a callable
            ``score_mod(scores, b, h, q_idx, k_idx)``.
        dropout_p: dropout on the attention weights (always applied when > 0: modules pass 0
            in eval mode).
        need_weights: also return the weights ``(B, H, Lq, Lk)`` / ``(B, Lq, Lk)``; they are the
            weights actually applied to ``value`` (after dropout).
        backend: ``"auto"`` (see :func:`explain`), ``"fused"``, ``"reference"``,
            ``"chunked"`` or ``"export"`` (tensor operations only, no host sync: what
            ``torch.export``, the ONNX exporter and ``torch.compile`` need, taken by itself
            whenever :func:`torch.compiler.is_compiling`; see the module's notes).
        memory_budget: bytes the materialised weights may take before ``"auto"`` turns to the
            chunked backend (default: :func:`get_memory_budget`, 1 GiB).  Weights asked for
            and a forced backend stay within it: ``need_weights=True``, ``"reference"`` (its
            scores and weights), ``"fused"`` (a mask it would build) or an eager ``"export"``
            over the budget raises instead of allocating.

    Raises:
        AttentionMemoryError: ``need_weights=True`` over the budget or the memory available
            (the least of the free memory, the cgroup limits and ``ulimit -v``), dropout on a
            problem whose weights exceed the memory available, or a forced backend over the
            budget or the memory available, with the memory it would need.

    NaN and infinities, the same on every backend: a row whose own query holds a NaN or an
    infinity, or whose sequence's keys or values do (batch element ``b``, key/value head
    ``h // (H // Hkv)``, masked positions included), comes out NaN, its weights too; the other
    rows are what they are with finite inputs.  Never a zero for such a row, and no error (a
    NaN reaches the loss, where ``GradScaler`` or a NaN check sees it).

    Returns:
        ``(output, weights or None)``; output ``(B, H, Lq, dv)`` or ``(B, Lq, dv)``.  A query that
        may attend to nothing gets zero weights and a zero output, with finite gradients, whatever
        its inputs hold.
    """
    # positional, in this signature's order (checked by the tests): the cheapest call
    return _run(
        plan_call(query, key, value, valid_lens, key_padding_mask, attn_mask, is_causal, window,
              scale, score, dropout_p, need_weights, backend, memory_budget)
    )  # fmt: skip


_ATTENTION = inspect.signature(attention)
_R = TypeVar("_R")


def _takes_the_arguments_of_attention(f: Callable[..., _R]) -> Callable[..., _R]:
    """Show :func:`attention`'s parameters as ``f``'s (``help()``, ``inspect``)."""
    f.__signature__ = _ATTENTION.replace(  # type: ignore[attr-defined]
        return_annotation=inspect.signature(f).return_annotation
    )
    return f


@_takes_the_arguments_of_attention
def explain(query: Tensor, key: Tensor, value: Tensor, **options: Any) -> BackendChoice:
    """Which backend :func:`attention` takes for these arguments, and why.

    Takes exactly the arguments of :func:`attention` (its signature is shown here), validates
    and plans them with the same code, and computes nothing.  ``str(explain(...))`` reads e.g.
    ``"reference (need_weights=True: ...)"``.
    """
    try:
        bound = _ATTENTION.bind(query, key, value, **options)
    except TypeError as e:  # an unknown or repeated argument, named as attention() would
        raise TypeError(f"explain() {e}") from None
    bound.apply_defaults()
    return plan_call(**bound.arguments).choice


def additive_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    w_v: Tensor,
    *,
    valid_lens: Tensor | Sequence[int] | None = None,
    key_padding_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    window: int | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    backend: Literal["auto", "reference", "chunked", "export"] = "auto",
    memory_budget: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Additive (Bahdanau) attention on already-projected queries and keys.

    ``s_ij = w_v . tanh(q_i + k_j)``, then the same masks, softmax and dropout as
    :func:`attention`, through the same planner and memory budget.  The book's form broadcasts a
    ``(B, Lq, Lk, h)`` tensor; the chunked backend (taken when that tensor and the weights would
    exceed the memory budget) computes the same scores block by block in O(L) memory, forward
    and backward.

    Shapes:
        query ``(B, Lq, h)`` (``W_q q``), key ``(B, Lk, h)`` (``W_k k``), value ``(B, Lk, dv)``,
        w_v ``(h,)``.  Returns ``(output (B, Lq, dv), weights (B, Lq, Lk) or None)``.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor) or t.dim() != 3:
            raise ValueError(f"{name}: expected a 3-D tensor (B, L, h), got {_describe(t)}")
    if not isinstance(w_v, Tensor) or w_v.dim() != 1 or w_v.shape[0] != query.shape[-1]:
        raise ValueError(
            f"w_v: expected a vector of shape ({query.shape[-1]},) matching query's width, "
            f"got {_describe(w_v)}"
        )
    _check_qkv(query, key, value)
    if backend not in ("auto", "reference", "chunked", "export"):
        raise ValueError(
            f"backend: expected 'auto', 'reference', 'chunked' or 'export', got {backend!r}"
        )
    masks = (valid_lens, key_padding_mask, attn_mask, is_causal, window)
    return _run(
        _plan_kind(
            query,
            key,
            value,
            masks,
            ADDITIVE,
            w_v,
            None,
            dropout_p,
            need_weights,
            backend,
            memory_budget,
        )
    )
