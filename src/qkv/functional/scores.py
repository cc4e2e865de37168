"""Score kinds: how a query and a key become one number before the softmax.

Every scaling seed 001 lists, plus FlexAttention-style user modifications:

===================  =========================================================  ================
``score``            score ``s_ij``                                             default ``scale``
===================  =========================================================  ================
``"scaled_dot"``     ``scale * q_i . k_j``                                      ``1/sqrt(d)``
``"dot"``            ``scale * q_i . k_j`` (temperature tau: ``scale=1/tau``)   ``1``
``"cosine"``         ``scale * (q_i/|q_i|) . (k_j/|k_j|)`` (pre-normalisation)  ``1``
``"normalized"``     ``scale * (q_i . k_j) / |q_i . K|`` (L2 norm of the row    ``1``
                     over the keys the query may see)
``"length_scaled"``  ``scale * q_i . k_j / sqrt(Lk)``                           ``1/sqrt(d)``
callable             ``score_mod(scale * q_i . k_j, b, h, i, j)``               ``1/sqrt(d)``
===================  =========================================================  ================

A ``score_mod`` is called once on a whole block of scores ``(B, H, lq, lk)`` with broadcastable
integer index tensors ``b (B,1,1,1)``, ``h (1,H,1,1)``, ``q_idx (1,1,lq,1)``, ``k_idx (1,1,1,lk)``
(absolute positions), and must return a tensor of the same shape, for example
``lambda s, b, h, q, k: s - 0.1 * (q - k).abs()`` (an ALiBi-like bias).  It may return ``-inf``
to forbid a position.

Each kind is one :class:`ScoreKind` object, and every backend (fused, reference, chunked) and
:func:`~qkv.functional.explain` read what they need from it: its default scale, the transform
of ``q``/``k`` before the product, whether torch's fused kernel can run it, and how a block of
its scores is computed.  A new kind is one more entry in :data:`SCORE_KINDS` (and a row in the
table above); the tests pick it up from there.
"""

from __future__ import annotations

import contextlib
import math
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, Union

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "ADDITIVE",
    "SCORES",
    "SCORE_KINDS",
    "SCORE_MOD",
    "RowScale",
    "Score",
    "ScoreKind",
    "ScoreMod",
    "check_score",
    "grouped_qk",
    "grouped_wv",
    "normalize_rows",
    "prepare_qk",
    "qk_multiplier",
    "run_score_mod",
    "score_kind",
]

ScoreName = Literal["scaled_dot", "dot", "cosine", "normalized", "length_scaled"]
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
Score = Union[ScoreName, ScoreMod]  # noqa: UP007 - a runtime alias, kept py3.10-friendly
# (q_blk (B, H, lq, d), k_blk (B, Hkv, lk, d), q0, k0, multiplier, the kind's argument)
#   -> scores (B, H, lq, lk); q0/k0 are the block's absolute first query and key positions
BlockScores = Callable[[Tensor, Tensor, int, int, Any, Any], Tensor]

_HALF = (torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------- shared pieces
def grouped_qk(q: Tensor, k: Tensor) -> Tensor:
    """``q @ k^T`` with grouped-query heads, without copying keys.

    Args:
        q: ``(B, H, Lq, d)``.
        k: ``(B, Hkv, Lk, d)`` with ``H % Hkv == 0``; query head ``h`` uses key head ``h // (H/Hkv)``.

    Returns:
        ``(B, H, Lq, Lk)``.
    """
    B, H, Lq, d = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    if Hkv == H:
        return q @ k.transpose(-2, -1)
    G = H // Hkv
    # (B, Hkv, G*Lq, d) @ (B, Hkv, d, Lk) -> (B, Hkv, G*Lq, Lk): keys are shared, not repeated
    return (q.reshape(B, Hkv, G * Lq, d) @ k.transpose(-2, -1)).view(B, H, Lq, Lk)


def grouped_wv(w: Tensor, v: Tensor) -> Tensor:
    """``w @ v`` with grouped-query heads: ``w (B, H, Lq, Lk)``, ``v (B, Hkv, Lk, dv)``."""
    B, H, Lq, Lk = w.shape
    Hkv, dv = v.shape[1], v.shape[-1]
    if Hkv == H:
        return w @ v
    G = H // Hkv
    return (w.reshape(B, Hkv, G * Lq, Lk) @ v).view(B, H, Lq, dv)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums are taken in: float32 at least (half precision overflows and underflows)."""
    return torch.float32 if dtype in _HALF else dtype


#: devices where reading a value back costs no sync: nonfinite_rows answers None there
SYNC_FREE = frozenset({"cpu"})


#: tensors known to hold only finite numbers: id -> weak reference (see mark_finite)
_KNOWN_FINITE: dict[int, weakref.ref] = {}


def mark_finite(*tensors: Tensor) -> None:
    """Record that ``tensors`` hold only finite numbers, checked by their owner (a key/value
    cache checks what it stores once, when it stores it), so :func:`nonfinite_rows` does not sum
    them again at every call.  Held by weak reference: a tensor freed is forgotten.  The owner
    promises not to change them in place afterwards."""
    for t in tensors:
        key = id(t)
        _KNOWN_FINITE[key] = weakref.ref(t, lambda _, key=key: _KNOWN_FINITE.pop(key, None))


def known_finite(t: Tensor) -> bool:
    ref = _KNOWN_FINITE.get(id(t))
    return ref is not None and ref() is t


def all_finite(*tensors: Tensor) -> bool | None:
    """Whether every number of ``tensors`` is finite, by one sum per tensor read back; None
    (unknown) off the devices where reading back costs no sync (the CPU)."""
    if any(t.device.type not in SYNC_FREE for t in tensors):
        return None
    total = 0.0
    for t in tensors:
        acc = acc_dtype(t.dtype)
        total += (t.sum() if acc == t.dtype else t.sum(dtype=acc)).item()
    return math.isfinite(total)


def nonfinite_rows(q: Tensor, k: Tensor, v: Tensor, *, sync_free: bool = False) -> Tensor | None:
    """``(B, H, Lq, 1)`` in ``q``'s dtype: NaN for the rows whose inputs hold a NaN or an
    infinity, 0 for the others; or None when no input holds one (answered only on the CPU,
    where it costs no device sync).  Every backend adds it to its output (the reference and
    generic chunked engines to the query first), then zeroes the rows that see no key.

    A row's inputs are its own query ``q[b, h, i]`` and all the keys and values of its sequence
    ``k[b, h // (H // Hkv)]``, ``v[...]`` (masked positions included: torch's math multiplies
    a masked value by a zero weight, which is NaN, and a float mask's ``-inf`` added to a NaN
    score is NaN).  Shapes: q ``(B, H, Lq, d)``, k ``(B, Hkv, Lk, d)``, v ``(B, Hkv, Lk, dv)``.

    Found by sums: on the CPU one per tensor, read back (a few microseconds), then one per
    query row and per sequence only when some input is not finite; elsewhere the per-row sums
    alone, never read back (no device sync).  A sum is finite exactly when its terms are,
    unless finite terms overflow it (values above about 1e30 in float32 or bfloat16), which
    then count as infinite too.  With ``sync_free=True`` (the export backend) the per-row sums
    are always returned, never read back, on every device.
    """
    B, H, Lq, _ = q.shape
    Hkv = k.shape[1]
    acc = acc_dtype(q.dtype)
    kw = {} if acc == q.dtype else {"dtype": acc}
    # where a sync costs nothing, one sum per tensor first: finite is the usual answer
    if not sync_free and q.device.type in SYNC_FREE:
        # keys and values a cache checked when it stored them are not summed again
        unchecked = [t for t in (k, v) if not known_finite(t)]
        total = q.sum(**kw)
        for t in unchecked:
            total = total + t.sum(**kw)
        if math.isfinite(total.item()):
            return None
    with torch.no_grad():
        rows = q.sum(-1, keepdim=True, **kw)  # (B, H, Lq, 1)
        seq = k.sum((-2, -1), keepdim=True, **kw).add_(v.sum((-2, -1), keepdim=True, **kw))
        if Hkv == H:
            rows += seq  # (B, H, 1, 1)
        else:  # query heads h * G .. h * G + G - 1 read key/value head h
            rows.view(B, Hkv, (H // Hkv) * Lq, 1).add_(seq)
        rows.mul_(0.0)  # finite * 0 = 0, inf * 0 = NaN * 0 = NaN
    return rows if acc == q.dtype else rows.to(q.dtype)


def run_score_mod(fn: ScoreMod, scores: Tensor, q0: int = 0, k0: int = 0) -> Tensor:
    """Apply a user ``score_mod`` to a block ``(B, H, lq, lk)`` starting at query q0, key k0."""
    B, H, lq, lk = scores.shape
    dev = scores.device
    b = torch.arange(B, device=dev).view(B, 1, 1, 1)
    h = torch.arange(H, device=dev).view(1, H, 1, 1)
    qi = torch.arange(q0, q0 + lq, device=dev).view(1, 1, lq, 1)
    ki = torch.arange(k0, k0 + lk, device=dev).view(1, 1, 1, lk)
    out = fn(scores, b, h, qi, ki)
    if not isinstance(out, Tensor):
        raise TypeError(
            f"score: the score_mod callable returned {type(out).__name__}, not a tensor"
        )
    if out.shape != scores.shape:
        try:
            out = out.expand(scores.shape)
        except RuntimeError as e:
            raise ValueError(
                f"score: the score_mod callable must return scores of shape "
                f"{tuple(scores.shape)}, got {tuple(out.shape)}"
            ) from e
    return out.to(scores.dtype)


# ---------------------------------------------------------------------------- the kind object
@dataclass(frozen=True, eq=False)
class RowScale:
    """A factor per query computed from its whole row of scores (the kind's block scores with
    multiplier 1) over the keys it may see (``"normalized"``: ``scale / |q_i . K|``).

    ``partial(scores, blocked)`` reduces a block of keys to ``(B, H, lq, 1)`` (the reference
    backend calls it once on the whole row, the chunked backend once per key block and sums);
    ``finish(total, multiplier)`` turns the sum into the factor.  The reference backend multiplies
    the scores by the factor, the chunked backend folds it into the query.
    """

    partial: Callable[[Tensor, Tensor | None], Tensor]
    finish: Callable[[Tensor, Any], Tensor]

    def apply(self, scores: Tensor, blocked: Tensor | None, mult: float | Tensor) -> Tensor:
        """``scores (B, H, Lq, Lk)`` (the whole rows) times their rows' factors."""
        out = scores * self.finish(self.partial(scores, blocked), mult)
        # the product in float32 at least (factors may exceed float16), the result in its dtype
        return out if out.dtype == scores.dtype else out.to(scores.dtype)


def _as_is(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    return q, k


def _one(d: int) -> float:
    return 1.0


def _inv_sqrt(d: int) -> float:
    return 1.0 / math.sqrt(d)


def _one_value(d: int) -> int:
    return 1


@dataclass(frozen=True, eq=False)
class ScoreKind:
    """One kind of score: everything a backend needs to know to compute it.

    Attributes:
        name: the ``score=`` string that selects it.
        formula: ``s_ij`` in words, for messages.
        default_scale: ``d -> scale`` used when the caller passes ``scale=None``.
        length_divisor: ``Lk -> divisor`` the scale is divided by (``"length_scaled"``), or None.
        prepare: ``(q, k) -> (q, k)`` applied before the product, on every backend (``"cosine"``
            normalises the rows).
        row_scale: a per-query factor taken from the whole row of scores, or None.
        block: ``(q_blk, k_blk, q0, k0, multiplier, arg) -> (B, H, lq, lk)`` scores of a block, or
            None for the scaled dot product ``multiplier * q . k`` of the prepared ``q`` and
            ``k`` (the only form torch's kernels compute: the fused backend and the chunked
            backend's flash engine).  The reference backend calls it on the whole problem, the
            chunked backend's generic engine on each block, and differentiates it.
        not_fused: why the fused kernel cannot run this kind (None: it can).
        in_place: whether backends may modify the block's scores in place (False when the block
            runs a user's function, whose backward may need its output).
        pair_values: ``d -> n``, the values one query-key pair of the block holds at once (1 for
            a dot product, ``h`` for additive attention's ``tanh(q + k)``): the reference
            backend's memory estimate and the chunked backend's block sizes scale with it.
        block_setup: ``(q, k, arg) -> block`` or None: called once per call by the chunked
            backend's forward (no autograd) on the whole prepared ``q`` and ``k``; the block
            function it returns (same signature and result as ``block``) replaces ``block``
            for that forward's blocks, e.g. with per-query and per-key factors computed once
            (additive attention's exp-ratio form).  None: ``block`` everywhere.
    """

    name: str
    formula: str
    default_scale: Callable[[int], float]
    length_divisor: Callable[[int], float] | None = None
    prepare: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] = _as_is
    row_scale: RowScale | None = None
    block: BlockScores | None = None
    not_fused: str | None = None
    in_place: bool = True
    pair_values: Callable[[int], int] = _one_value
    block_setup: Callable[[Tensor, Tensor, Any], BlockScores | None] | None = None

    def __post_init__(self) -> None:
        if self.block is not None and self.not_fused is None:
            raise ValueError(
                f"not_fused: expected the reason the fused kernel cannot run score kind "
                f"{self.name!r} (it has its own block scores), got None"
            )

    def __repr__(self) -> str:
        return f"ScoreKind({self.name!r}: {self.formula})"

    def multiplier(self, scale: float | Tensor | None, d: int, Lk: int) -> float | Tensor:
        """The factor applied to ``q . k`` (for a row-scaled kind: together with the row's factor)."""
        base = self.default_scale(d) if scale is None else scale
        if self.length_divisor is not None:
            return base / self.length_divisor(Lk)
        return base

    def block_scores(
        self, q: Tensor, k: Tensor, q0: int, k0: int, mult: float | Tensor, arg: Any = None
    ) -> Tensor:
        """Scores ``(B, H, lq, lk)`` of the prepared query block ``q`` against key block ``k``."""
        if self.block is None:
            if isinstance(mult, float) and mult == 1.0:
                return grouped_qk(q, k)
            return grouped_qk(q * mult, k)  # scale the (lq, d) query, not the (lq, lk) scores
        return self.block(q, k, q0, k0, mult, arg)

    def scores(
        self,
        q: Tensor,
        k: Tensor,
        mult: float | Tensor,
        arg: Any = None,
        blocked: Tensor | None = None,
    ) -> Tensor:
        """All scores ``(B, H, Lq, Lk)`` of prepared ``q``/``k``, before the masks.

        ``blocked`` (True = may not attend) is read by a row-scaled kind only.
        """
        if self.row_scale is None:
            return self.block_scores(q, k, 0, 0, mult, arg)
        return self.row_scale.apply(self.block_scores(q, k, 0, 0, 1.0, arg), blocked, mult)


# ---------------------------------------------------------------------------- the kinds
def _unit(x: Tensor) -> Tensor:
    if x.dtype in _HALF:  # in float32: eps=1e-12 underflows in float16
        return F.normalize(x.float(), dim=-1).to(x.dtype)
    return F.normalize(x, dim=-1)


def _unit_qk(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    return _unit(q), _unit(k)


_EPS = 1e-12  # below this a row's norm counts as zero


def _visible_sumsq(scores: Tensor, blocked: Tensor | None) -> Tensor:
    # the squares in float32 at least: they overflow float16
    s = (scores.float() if scores.dtype in _HALF else scores).square()
    if blocked is not None:
        s = s.masked_fill(blocked, 0.0)
    return s.sum(dim=-1, keepdim=True)


def _inverse_norm(total: Tensor, mult: float | Tensor) -> Tensor:
    # 0 for a row whose visible scores are all 0 (or that sees no key): its scores stay 0; the
    # clamp keeps the gradient of the inverse square root finite there
    inv = torch.where(total > _EPS * _EPS, total.clamp_min(_EPS * _EPS).rsqrt(), 0.0)
    return inv if isinstance(mult, float) and mult == 1.0 else inv * mult


def _dot_then_mod(q: Tensor, k: Tensor, q0: int, k0: int, mult: Any, fn: ScoreMod) -> Tensor:
    return run_score_mod(fn, grouped_qk(q * mult, k), q0, k0)


def _tanh_features(q: Tensor, k: Tensor, q0: int, k0: int, mult: Any, w_v: Tensor) -> Tensor:
    # (B, 1, lq, 1, h) + (B, 1, 1, lk, h) -> (B, 1, lq, lk, h) -> (B, 1, lq, lk); the
    # elementwise function in place on the sum, a temporary of its own: one (lq, lk, h) tensor
    # written, not two (autograd's backward reads the output it keeps)
    if q.dtype in _SIGMOID_DTYPES:
        if not torch.is_grad_enabled() and (f := _exp_ratio_factors(q, k)) is not None:
            return _exp_ratio_scores(f[0].unsqueeze(-1), f[1].unsqueeze(-2), w_v)
        # w . tanh(x) = 2 w . sigmoid(2x) - sum(w), exactly: torch's CPU sigmoid runs about 7x
        # faster than its tanh, and the (lq, lk, h) elementwise pass is this score's whole cost
        a, b = (2.0 * q).unsqueeze(-2), (2.0 * k).unsqueeze(-3)
        buf = None
        if q.shape[:-2] == k.shape[:-2]:  # (not torch.broadcast_shapes: it imports sympy)
            shape = (*q.shape[:-1], k.shape[-2], q.shape[-1])
            buf = _scratch(torch.Size(shape), q.dtype, q.device)
        x = a + b if buf is None else torch.add(a, b, out=buf)
        return x.sigmoid_() @ (2.0 * w_v) - w_v.sum()
    # half precision: the difference above would cancel in 8-11 bits; tanh directly
    return (q.unsqueeze(-2) + k.unsqueeze(-3)).tanh_() @ w_v


def _additive_setup(q: Tensor, k: Tensor, w_v: Tensor) -> BlockScores | None:
    """The chunked engine's forward blocks for one call: the exp-ratio form with its factors
    computed once for all queries and keys (see :func:`_exp_ratio_factors`), or None (the
    blocks then run :func:`_tanh_features`)."""
    if q.dtype not in _SIGMOID_DTYPES or (f := _exp_ratio_factors(q, k)) is None:
        return None
    p_all, e_all = f  # (.., h, Lq), (.., h, Lk)

    def block(qb: Tensor, kb: Tensor, q0: int, k0: int, mult: Any, w: Tensor) -> Tensor:
        p = p_all[..., q0 : q0 + qb.shape[-2]].unsqueeze(-1)  # (.., h, lq, 1)
        e = e_all[..., k0 : k0 + kb.shape[-2]].unsqueeze(-2)  # (.., h, 1, lk)
        return _exp_ratio_scores(p, e, w)

    return block


# the dtypes whose additive scores go through the sigmoid identity or the exp-ratio form
_SIGMOID_DTYPES = (torch.float32, torch.float64)
# |x| from which tanh(x) rounds to +-1 in the dtype, with a margin: 1 - tanh(x) < 2 e^(-2x) is
# below half a unit in the last place of 1 (float32: 2^-25 from x = 9.01; float64: 2^-54 from
# x = 19.1)
_SATURATED = {torch.float32: 10.0, torch.float64: 20.0}
# the largest |a| whose e^(2a) and e^(-2a) are normal numbers, and whose sum with another such
# is finite (float32: 2 e^87 < 3.4e38 and e^-87 > 1.18e-38; float64: e^+-700 against 1e+-308)
_EXP_HALF_RANGE = {torch.float32: 43.5, torch.float64: 350.0}


def _exp_ratio_factors(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor] | None:
    """The factors of the exp-ratio form of ``tanh(q_i + k_j)``: ``P = e^(-2a)`` per query and
    ``Q = e^(2b)`` per key, hidden unit first, or None where the range does not allow it (and
    off the CPU, where the check below would cost a device sync; while torch.export or
    torch.compile trace, and inside :func:`sync_free_scores`, where it is a data-dependent
    branch).

    ``tanh(a + b) = 1 - 2 r`` with ``r = 1 / (1 + e^(2a) e^(2b)) = P / (P + Q)``: the
    exponentials are taken once per query and once per key, and each query-key pair costs an add
    and a divide (:func:`_exp_ratio_scores`), about half the time of a sigmoid.

    Exact as long as every ``P`` and ``Q`` is a normal number: ``P + Q`` is then finite, and
    ``r`` rounds to 0 or 1 only where the pair's tanh rounds to +-1 anyway (no inf, no NaN).
    To keep large inputs in range, each hidden unit's query values are first clamped to
    ``[-S - max_j b_j, S - min_j b_j]`` (a query above that bound has ``a + b >= S`` with every
    key, and so with the bound too: its tanh rounds to 1 either way; likewise below), then the
    key values against the clamped queries' range; pairs with ``|a + b| < S`` are untouched.
    Where the clamped values still leave that range, or an input holds a NaN, the answer is None.

    Shapes: q ``(B, H, Lq, h)``, k ``(B, H, Lk, h)`` (the same leading shape, else None).
    Returns ``P (B, H, h, Lq)`` and ``Q (B, H, h, Lk)``, each contiguous.
    """
    if q.device.type not in SYNC_FREE or q.shape[:-2] != k.shape[:-2]:
        return None
    if torch.compiler.is_compiling() or getattr(_SYNC_FREE_SCORES, "on", False):
        return None  # torch.export, torch.compile, the export backend: no data-dependent branch
    if 0 in (q.shape[-2], k.shape[-2], q.shape[-1]) or 0 in q.shape[:-2]:
        return None  # nothing to compute (and no range to take)
    S, R = _SATURATED[q.dtype], _EXP_HALF_RANGE[q.dtype]
    # each hidden unit's range over the keys and the queries: (B, H, 1, h)
    k_lo, k_hi = k.amin(dim=-2, keepdim=True), k.amax(dim=-2, keepdim=True)
    q_lo, q_hi = q.amin(dim=-2, keepdim=True), q.amax(dim=-2, keepdim=True)
    a_lo, a_hi = -S - k_hi, S - k_lo  # the queries' clamp (a_lo < a_hi as S > 0)
    a_min, a_max = q_lo.clamp(a_lo, a_hi), q_hi.clamp(a_lo, a_hi)  # the clamped queries' range
    b_lo, b_hi = -S - a_max, S - a_min
    b_min, b_max = k_lo.clamp(b_lo, b_hi), k_hi.clamp(b_lo, b_hi)
    # one read-back: the largest clamped magnitude (a NaN input makes it NaN: None)
    top = torch.stack((a_min, a_max, b_min, b_max)).abs().max()
    if not float(top) <= R:
        return None
    p = q.clamp(a_lo, a_hi).mul_(-2.0).exp_().transpose(-1, -2).contiguous()
    e = k.clamp(b_lo, b_hi).mul_(2.0).exp_().transpose(-1, -2).contiguous()
    return p, e


def _exp_ratio_scores(p: Tensor, e: Tensor, w_v: Tensor) -> Tensor:
    """``w . tanh(a_i + b_j) = sum(w) - 2 w . P / (P + Q)`` of a block, from the factors
    ``p = P (.., h, lq, 1)`` and ``e = Q (.., h, 1, lk)`` (:func:`_exp_ratio_factors`), laid out
    hidden unit first: one number of ``P`` against a contiguous row of ``Q`` (torch's broadcast
    add and divide run vectorised on it, as they do not on ``(lq, lk, h)``), then one product
    ``(1, h) @ (h, lq lk)``.  Returns ``(.., lq, lk)``."""
    lead, h, lq, lk = p.shape[:-3], p.shape[-3], p.shape[-2], e.shape[-1]
    shape = torch.Size((*lead, h, lq, lk))
    buf = _scratch(shape, p.dtype, p.device)
    x = torch.add(p, e) if buf is None else torch.add(p, e, out=buf)
    r = torch.div(p, x, out=x)  # 1 / (1 + e^(2a) e^(2b)), in [0, 1]
    # one (1, h) @ (h, lq lk) product per leading index (a plain matrix product where there is
    # one: about 1.4x faster than torch's batched one)
    n, w2 = math.prod(lead), (-2.0 * w_v).unsqueeze(0)
    rows = r.view(n, h, lq * lk)
    s = torch.mm(w2, rows[0]) if n == 1 else torch.matmul(w2, rows)
    return s.view(*lead, lq, lk).add_(w_v.sum())


_SYNC_FREE_SCORES = threading.local()


@contextlib.contextmanager
def sync_free_scores() -> Iterator[None]:
    """Within it, block scores read nothing back to the host (the export backend's promise):
    additive scores skip the exp-ratio form, whose range check is a read-back."""
    prev = getattr(_SYNC_FREE_SCORES, "on", False)
    _SYNC_FREE_SCORES.on = True
    try:
        yield
    finally:
        _SYNC_FREE_SCORES.on = prev


_SCRATCH = threading.local()


@contextlib.contextmanager
def block_scratch() -> Iterator[None]:
    """Within it, a block's no-grad temporary reuses one buffer (per thread, freed on exit)
    instead of fresh memory: the chunked engine's forward, whose ``(lq, lk, h)`` block would
    otherwise cost the OS's page faults on every block (measured: 7 ms against 0.9 ms for a
    16 MiB sum).  The block's returned scores never alias the buffer."""
    prev = getattr(_SCRATCH, "holder", None)
    _SCRATCH.holder = [None]
    try:
        yield
    finally:
        _SCRATCH.holder = prev


def _scratch(shape: torch.Size, dtype: torch.dtype, device: torch.device) -> Tensor | None:
    """A buffer of ``shape`` inside :func:`block_scratch` without autograd, else None."""
    holder = getattr(_SCRATCH, "holder", None)
    if holder is None or torch.is_grad_enabled():
        return None
    n = math.prod(shape)
    buf = holder[0]
    if buf is None or buf.numel() < n or buf.dtype != dtype or buf.device != device:
        buf = holder[0] = torch.empty(n, dtype=dtype, device=device)
    return buf[:n].view(shape)


SCALED_DOT = ScoreKind("scaled_dot", "scale * q_i . k_j", _inv_sqrt)
DOT = ScoreKind("dot", "scale * q_i . k_j", _one)
COSINE = ScoreKind("cosine", "scale * (q_i/|q_i|) . (k_j/|k_j|)", _one, prepare=_unit_qk)
_ROW_NORM = RowScale(_visible_sumsq, _inverse_norm)
NORMALIZED = ScoreKind(
    "normalized",
    "scale * (q_i . k_j) / |q_i . K|",
    _one,
    row_scale=_ROW_NORM,
    not_fused="score='normalized' needs each query's whole row of scores",
)
LENGTH_SCALED = ScoreKind(
    "length_scaled",
    "scale * q_i . k_j / sqrt(Lk)",
    _inv_sqrt,
    length_divisor=lambda Lk: math.sqrt(max(Lk, 1)),
)

#: The kinds ``score=`` selects by name, in the order they are documented.
SCORE_KINDS: MappingProxyType[str, ScoreKind] = MappingProxyType(
    {kind.name: kind for kind in (SCALED_DOT, DOT, COSINE, NORMALIZED, LENGTH_SCALED)}
)
SCORES: tuple[str, ...] = tuple(SCORE_KINDS)

#: A ``score_mod`` callable passed as ``score=`` (the callable is the kind's argument).
SCORE_MOD = ScoreKind(
    "score_mod",
    "score_mod(scale * q_i . k_j, b, h, i, j)",
    _inv_sqrt,
    block=_dot_then_mod,
    not_fused="a score_mod callable needs materialised scores",
    in_place=False,
)
#: :func:`~qkv.functional.additive_attention` (``w_v`` is the kind's argument; not a ``score=``).
ADDITIVE = ScoreKind(
    "additive",
    "w_v . tanh(q_i + k_j)",
    _one,
    block=_tanh_features,
    not_fused="additive scores are not a dot product",
    pair_values=lambda h: h,
    block_setup=_additive_setup,
)


def score_kind(score: object) -> tuple[ScoreKind, ScoreMod | None]:
    """The kind of a ``score=`` value and its argument (the callable for a ``score_mod``).

    Raises:
        ValueError: ``score`` is neither a known name nor a callable.
    """
    kind = SCORE_KINDS.get(score) if isinstance(score, str) else None
    if kind is not None:
        return kind, None
    if callable(score):
        return SCORE_MOD, score
    raise ValueError(
        f"score: expected one of {', '.join(repr(s) for s in SCORES)} or a callable "
        f"score_mod(scores, b, h, q_idx, k_idx), got {score!r}"
    )


# ---------------------------------------------------------------------------- by score value
def check_score(score: object) -> None:
    """Raise a clear error unless ``score`` is a known name or a callable."""
    score_kind(score)


def qk_multiplier(score: Score, scale: float | Tensor | None, d: int, Lk: int) -> float | Tensor:
    """The factor applied to ``q . k`` (for ``"normalized"``: applied after normalising)."""
    return score_kind(score)[0].multiplier(scale, d, Lk)


def prepare_qk(q: Tensor, k: Tensor, score: Score) -> tuple[Tensor, Tensor]:
    """L2-normalise q and k per row for ``"cosine"``; pass them through otherwise."""
    return score_kind(score)[0].prepare(q, k)


def normalize_rows(
    scores: Tensor, blocked: Tensor | None, multiplier: float | Tensor, eps: float = _EPS
) -> Tensor:
    """Divide each query's row of scores by its L2 norm over the keys it may see (``"normalized"``).

    ``eps`` is kept for compatibility: rows whose norm is below ``1e-12`` get zero scores.
    """
    return _ROW_NORM.apply(scores, blocked, multiplier)
