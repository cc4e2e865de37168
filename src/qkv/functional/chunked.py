"""The chunked backend: exact attention in O(L) memory, forward and backward.

Queries are processed in blocks of ``block_q``; for each block the keys it may see are cut into
*segments*.  The plan (:func:`plan_blocks`) asks the masks' spec which keys the block's queries
may see (:meth:`~qkv.functional.masks.MaskSpec.key_bounds`, from the position-based masks such
as ``is_causal``, ``window``, ``valid_lens``): keys no query of the block can see are skipped (so
causal attention does about half the work), keys every query sees need no index mask, and only
the thin band in between gets a small materialised mask.  Segments are combined with the online
softmax (running log-sum-exp), and the backward pass recomputes each segment from the saved
output and log-sum-exp (the FlashAttention recipe), so nothing of size ``(Lq, Lk)`` is ever held.

Two engines run the segments, chosen from the score's :class:`~qkv.functional.scores.ScoreKind`:

* a kind whose scores are the scaled dot product of its prepared query and key (``scaled_dot``,
  ``dot``, ``cosine``, ``length_scaled``, and ``normalized`` once its row factor is folded into
  the query) calls torch's CPU flash-attention kernel on each segment when it is available (it
  returns the log-sum-exp the merge needs);
* anything else (a kind with its own block scores: a ``score_mod`` callable, additive
  attention; or a tensor ``scale``), and dropout, runs a blockwise PyTorch engine that calls the
  kind's block function and whose backward differentiates it with ``torch.autograd.grad``, so
  any differentiable score works.

Dropout on the weights (``dropout_p``): each block's keep-mask is drawn from its own generator,
seeded from one number taken from torch's default generator per call (so ``torch.manual_seed``
reproduces a run) and the block's position; the backward draws the same masks again instead of
storing them.  The softmax's normaliser uses the weights before dropout, as a materialised
``dropout(softmax(s))`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import MaskSpec
from .scores import (
    ADDITIVE,
    Score,
    ScoreKind,
    acc_dtype,
    block_scratch,
    nonfinite_rows,
    score_kind,
)

__all__ = ["Segment", "chunked_additive", "chunked_attention", "plan_blocks", "run_chunked"]

_flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_flash_bwd = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_NEG_INF = float("-inf")


@dataclass(frozen=True)
class Segment:
    """Keys ``k0:k1`` of one query block; ``index`` says whether index masks must be applied."""

    k0: int
    k1: int
    index: bool


def _split(lo: int, hi: int, size: int, index: bool) -> list[Segment]:
    return [Segment(a, min(hi, a + size), index) for a in range(lo, hi, size)]


def plan_blocks(
    spec: MaskSpec, block_q: int, block_k: int, full_block_k: int | None = None
) -> list[tuple[int, int, list[Segment]]]:
    """Cut the problem into query blocks and, per block, the key segments worth computing.

    Returns ``[(q0, q1, [Segment, ...]), ...]``.  A block whose queries see no key gets no
    segment (its rows are "dead": zero output).  ``full_block_k`` bounds segments that need no
    index mask (None: one segment).  The key ranges come from the masks themselves
    (:meth:`MaskSpec.key_bounds`): a mask kind that gives none is applied to every segment.
    """
    Lq, Lk = spec.Lq, spec.Lk
    full_size = full_block_k or max(Lk, 1)
    plan = []
    for q0 in range(0, Lq, block_q):
        q1 = min(Lq, q0 + block_q)
        # keys some query of the block may see (lo:hi), keys every query sees (flo:fhi)
        lo, hi, flo, fhi = spec.key_bounds(q0, q1)
        segs: list[Segment] = []
        if hi > lo:
            flo = min(max(flo, lo), hi)
            fhi = max(min(fhi, hi), flo)
            segs += _split(lo, flo, block_k, True)
            segs += _split(flo, fhi, full_size, False)
            segs += _split(fhi, hi, block_k, True)
        plan.append((q0, q1, segs))
    return plan


def _merge(acc_o: Tensor | None, acc_l: Tensor | None, o: Tensor, lse: Tensor):
    """Combine two normalised partial results by their log-sum-exp ``(B, H, lq)``."""
    if acc_o is None:
        return o, lse
    m = torch.maximum(acc_l, lse)
    m = m.masked_fill(torch.isneginf(m), 0.0)
    a, b = torch.exp(acc_l - m), torch.exp(lse - m)
    tot = a + b
    norm = torch.where(tot > 0, tot, torch.ones_like(tot))
    out = (acc_o * (a / norm).unsqueeze(-1).to(o.dtype)) + o * (b / norm).unsqueeze(-1).to(o.dtype)
    return out, m + torch.log(tot)


def _expand_heads(t: Tensor, G: int) -> Tensor:
    return t if G == 1 else t.repeat_interleave(G, dim=1)


def _reduce_heads(t: Tensor, G: int) -> Tensor:
    if G == 1:
        return t
    B, H = t.shape[:2]
    return t.view(B, H // G, G, *t.shape[2:]).sum(dim=2)


# ---------------------------------------------------------------------------- flash engine
def _segment_bias(spec: MaskSpec, dtype, q0, q1, seg: Segment) -> Tensor | None:
    return spec.bias(dtype, q0, q1, seg.k0, seg.k1, index=seg.index)


def _kernel_layout(t: Tensor) -> Tensor:
    """``t`` as torch's CPU flash kernel reads it: that kernel assumes the last axis is
    contiguous (stride 1) and silently reads garbage otherwise (a transposed ``(B, d, L)``
    feature map, a sliced or expanded last axis).  Any other stride (expanded batch or heads,
    sliced positions, heads-first views) it handles; a tensor already fine is not copied."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _flash_forward(q, k, v, spec: MaskSpec, scale: float, plan):
    """``k``/``v`` already carry ``H`` heads.  Returns the output and the log-sum-exp."""
    B, H, Lq, _ = q.shape
    acc = acc_dtype(q.dtype)  # partial results are merged in float32 at least
    out = q.new_zeros(B, H, Lq, v.shape[-1])
    lse = torch.full((B, H, Lq), _NEG_INF, dtype=acc, device=q.device)
    for q0, q1, segs in plan:
        qb = q[:, :, q0:q1]
        acc_o = acc_l = None
        for seg in segs:
            bias = _segment_bias(spec, q.dtype, q0, q1, seg)
            o, lb = _flash(
                qb, k[:, :, seg.k0 : seg.k1], v[:, :, seg.k0 : seg.k1], attn_mask=bias, scale=scale
            )
            if bias is not None:  # the kernel reports lse 0 for a row that saw nothing
                dead = torch.isneginf(bias).all(dim=-1)
                if bool(dead.any()):
                    lb = lb.masked_fill(dead.expand_as(lb), _NEG_INF)
            acc_o, acc_l = _merge(acc_o, acc_l, o.to(acc), lb.to(acc))
        if acc_o is not None:
            out[:, :, q0:q1] = acc_o
            lse[:, :, q0:q1] = acc_l
    return out, lse


class _FlashChunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec, scale, plan, G, poison):
        # the one place tensors enter the kernel (forward here, backward from what is saved)
        q, k, v = _kernel_layout(q), _kernel_layout(k), _kernel_layout(v)
        # grouped-query heads: expanded once per call, not once per block
        ke, ve = _expand_heads(k, G), _expand_heads(v, G)
        out, lse = _flash_forward(q, ke, ve, spec, scale, plan)
        # rows with NaN or inf inputs NaN (the kernel gives 0 for some), rows with no key 0
        if poison is not None:
            out = (out + poison).masked_fill_(torch.isneginf(lse).unsqueeze(-1), 0.0)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.spec, ctx.scale, ctx.plan, ctx.G = spec, scale, plan, G
        return out

    @staticmethod
    def backward(ctx, gout):
        q, k, v, out, lse = ctx.saved_tensors
        spec, scale, G = ctx.spec, ctx.scale, ctx.G
        ke, ve = _expand_heads(k, G), _expand_heads(v, G)
        acc = acc_dtype(q.dtype)  # gradients summed over blocks in float32 at least
        gout = gout.contiguous()
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dk = torch.zeros(ke.shape, dtype=acc, device=q.device)
        dv = torch.zeros(ve.shape, dtype=acc, device=q.device)
        # a dead row (lse = -inf) has zero output; +inf makes its recomputed weights exactly 0
        lse_b = lse.masked_fill(torch.isneginf(lse), float("inf"))
        for q0, q1, segs in ctx.plan:
            qb = q[:, :, q0:q1]
            gb = gout[:, :, q0:q1].contiguous()
            ob = out[:, :, q0:q1].contiguous()
            lb = lse_b[:, :, q0:q1].contiguous().to(acc_dtype(q.dtype))
            for seg in segs:
                kb, vb = ke[:, :, seg.k0 : seg.k1], ve[:, :, seg.k0 : seg.k1]
                bias = _segment_bias(spec, q.dtype, q0, q1, seg)
                gq, gk, gv = _flash_bwd(
                    gb, qb, kb, vb, ob, lb, 0.0, False, attn_mask=bias, scale=scale
                )
                dq[:, :, q0:q1] += gq
                dk[:, :, seg.k0 : seg.k1] += gk
                dv[:, :, seg.k0 : seg.k1] += gv
        dk, dv = _reduce_heads(dk, G), _reduce_heads(dv, G)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None


# ---------------------------------------------------------------------------- generic engine
BlockScore = Callable[..., Tensor]  # (q_blk, k_blk, q0, k0, *params) -> (B, H, lq, lk)


Dropout = tuple[float, int]  # (dropout_p, the call's seed)


def _keep_scale(drop: Dropout, shape, q0: int, k0: int, dtype, device) -> Tensor:
    """Block ``(q0, k0)``'s dropout multiplier: 0 where a weight is dropped, ``1 / (1 - p)``
    elsewhere, the same every time it is drawn (forward and backward)."""
    p, seed = drop
    g = torch.Generator(device=device)
    g.manual_seed(hash((seed, q0, k0)) & ((1 << 63) - 1))
    keep = torch.rand(shape, generator=g, device=device, dtype=torch.float32) >= p
    return keep.to(dtype) * (1.0 / (1.0 - p))


def _masked_block(score_fn, spec, qb, kb, q0, q1, seg, params, strict):
    s = score_fn(qb, kb, q0, seg.k0, *params)
    bias = spec.bias(s.dtype, q0, q1, seg.k0, seg.k1, index=seg.index)
    if bias is None:
        return s
    # strict (some input not finite): -inf forbids whatever the score (NaN + -inf is NaN)
    return (s + bias).masked_fill_(torch.isneginf(bias), _NEG_INF) if strict else s + bias


def _generic_forward(score_fn, spec, plan, q, k, v, params, poison, drop=None):
    B, H, Lq = q.shape[0], q.shape[1], q.shape[2]
    dt = acc_dtype(q.dtype)  # accumulated in float32 at least
    out = torch.zeros(B, H, Lq, v.shape[-1], dtype=dt, device=q.device)
    lse = torch.full((B, H, Lq), _NEG_INF, dtype=dt, device=q.device)
    for q0, q1, segs in plan:
        qb = q[:, :, q0:q1]
        m = torch.full((B, H, q1 - q0, 1), _NEG_INF, dtype=dt, device=q.device)
        den = torch.zeros_like(m)
        acc = torch.zeros(B, H, q1 - q0, v.shape[-1], dtype=dt, device=q.device)
        for seg in segs:
            kb = k[:, :, seg.k0 : seg.k1]
            s = _masked_block(score_fn, spec, qb, kb, q0, q1, seg, params, poison is not None)
            s = s.to(dt)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            m_safe = m_new.masked_fill(torch.isneginf(m_new), 0.0)
            p = torch.exp(s - m_safe)
            alpha = torch.exp(m - m_safe)
            den = den * alpha + p.sum(dim=-1, keepdim=True)  # the normaliser: before dropout
            vb = _expand_heads(v[:, :, seg.k0 : seg.k1].to(dt), H // v.shape[1])
            if drop is not None:
                p = p * _keep_scale(drop, p.shape, q0, seg.k0, dt, q.device)
            acc = acc * alpha + p @ vb
            m = m_new
        live = den != 0  # a row with NaN scores has a NaN sum: not a row with no key
        o = acc / torch.where(live, den, torch.ones_like(den))
        if poison is not None:
            o = (o + poison[:, :, q0:q1]).masked_fill_(~live, 0.0)  # 0 weights * NaN value: 0
        out[:, :, q0:q1] = o
        m_safe = m.masked_fill(torch.isneginf(m), 0.0)
        lse[:, :, q0:q1] = torch.where(live, m_safe + torch.log(den), _NEG_INF).squeeze(-1)
    return out.to(q.dtype), lse


class _GenericChunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, score_fn, setup, spec, plan, poison, drop, q, k, v, *params):
        # no autograd here: the blocks' temporaries reuse one buffer, and the kind may set up
        # its forward blocks once for the call (the backward differentiates score_fn)
        with block_scratch():
            fwd_fn = (setup(q, k, *params) if setup is not None else None) or score_fn
            out, lse = _generic_forward(fwd_fn, spec, plan, q, k, v, params, poison, drop)
        ctx.save_for_backward(q, k, v, out, lse, *params)
        ctx.score_fn, ctx.spec, ctx.plan, ctx.strict = score_fn, spec, plan, poison is not None
        ctx.drop = drop
        return out

    @staticmethod
    def backward(ctx, gout):
        q, k, v, out, lse, *params = ctx.saved_tensors
        score_fn, spec = ctx.score_fn, ctx.spec
        acc = lse.dtype
        H = q.shape[1]
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        dparams = [torch.zeros(p.shape, dtype=acc, device=p.device) for p in params]
        gout = gout.to(acc)
        D = (gout * out.to(acc)).sum(dim=-1, keepdim=True)  # (B, H, Lq, 1)
        lse_b = lse.masked_fill(torch.isneginf(lse), float("inf")).unsqueeze(-1)
        for q0, q1, segs in ctx.plan:
            gb, Db, lb = gout[:, :, q0:q1], D[:, :, q0:q1], lse_b[:, :, q0:q1]
            for seg in segs:
                with torch.enable_grad():
                    qb = q[:, :, q0:q1].detach().requires_grad_()
                    kb = k[:, :, seg.k0 : seg.k1].detach().requires_grad_()
                    ps = [p.detach().requires_grad_() for p in params]
                    s = _masked_block(score_fn, spec, qb, kb, q0, q1, seg, ps, ctx.strict)
                p = torch.exp(s.detach().to(acc) - lb)  # (B, H, lq, lk)
                G = H // v.shape[1]
                vb = _expand_heads(v[:, :, seg.k0 : seg.k1].to(acc), G)
                dp = gb @ vb.transpose(-2, -1)  # d loss / d (weights after dropout)
                if ctx.drop is not None:  # the forward's masks, drawn again
                    keep = _keep_scale(ctx.drop, p.shape, q0, seg.k0, acc, q.device)
                    dv[:, :, seg.k0 : seg.k1] += _reduce_heads((p * keep).transpose(-2, -1) @ gb, G)
                    dp = dp * keep
                else:
                    dv[:, :, seg.k0 : seg.k1] += _reduce_heads(p.transpose(-2, -1) @ gb, G)
                # D = rowsum(gout * out) = rowsum(p * dp), dropout or not
                ds = p * (dp - Db)
                grads = torch.autograd.grad(s, [qb, kb, *ps], ds.to(s.dtype), allow_unused=True)
                if grads[0] is not None:
                    dq[:, :, q0:q1] += grads[0]
                if grads[1] is not None:
                    dk[:, :, seg.k0 : seg.k1] += grads[1]
                for acc_p, g in zip(dparams, grads[2:]):
                    if g is not None:
                        acc_p += g
        cast = [dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)]
        grads = (g.to(p.dtype) for g, p in zip(dparams, params))
        return (None, None, None, None, None, None, *cast, *grads)


# ---------------------------------------------------------------------------- entry points
def _row_partial(kind: ScoreKind, arg, q: Tensor, kb: Tensor, k0: int, blocked) -> Tensor:
    return kind.row_scale.partial(kind.block_scores(q, kb, 0, k0, 1.0, arg), blocked)


def _row_factor(kind: ScoreKind, arg, q: Tensor, k: Tensor, spec: MaskSpec, block_k: int, mult):
    """A row-scaled kind's factor per query ``(B, H, Lq, 1)``, from its scores over the keys
    each query may see, in O(Lq * block_k) memory (each key block checkpointed)."""
    from torch.utils.checkpoint import checkpoint

    total = None
    for k0 in range(0, k.shape[2], block_k):
        k1 = min(k.shape[2], k0 + block_k)
        blocked = spec.blocked(0, spec.Lq, k0, k1)
        kb = k[:, :, k0:k1]
        part = checkpoint(_row_partial, kind, arg, q, kb, k0, blocked, use_reentrant=False)
        total = part if total is None else total + part
    if total is None:
        total = torch.zeros(*q.shape[:-1], 1, dtype=acc_dtype(q.dtype), device=q.device)
    return kind.row_scale.finish(total, mult).to(q.dtype)


def _block_sizes(Lq: int, Lk: int, per_pair: int, budget_elems: int = 1 << 22) -> tuple[int, int]:
    """Query/key block sizes whose ``(lq, lk)`` tile holds at most ``budget_elems`` values
    (``per_pair`` values per query-key pair, e.g. ``B * H`` or ``B * hidden``); at least 1."""
    per_pair = max(1, per_pair)
    bk = max(1, min(Lk, 1024, budget_elems // per_pair))
    bq = max(1, min(Lq, budget_elems // (per_pair * bk)))
    return bq, bk


def _flash_usable(q: Tensor) -> bool:
    """Whether torch's CPU flash kernel (a private op) is there and answers as expected."""
    global _FLASH_CHECKED, _flash, _flash_bwd
    if _flash is None or _flash_bwd is None or q.device.type != "cpu":
        return False
    if q.dtype not in _FLASH_DTYPES:
        return False
    if not _FLASH_CHECKED:
        _FLASH_CHECKED = True
        try:  # a signature change in a future torch falls back to the generic engine
            t = torch.zeros(1, 1, 2, 8)
            o, lse = _flash(t, t, t, attn_mask=None, scale=1.0)
            _flash_bwd(o, t, t, t, o, lse, 0.0, False, attn_mask=None, scale=1.0)
        except (RuntimeError, TypeError):  # pragma: no cover - depends on the torch build
            _flash = _flash_bwd = None
            return False
    return True


_FLASH_CHECKED = False


def run_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    spec: MaskSpec,
    kind: ScoreKind,
    arg: object,
    mult: float | Tensor,
    block_q: int | None = None,
    block_k: int | None = None,
    *,
    poison: Tensor | Literal["check"] | None = "check",
    dropout_p: float = 0.0,
) -> Tensor:
    """Exact attention with scores of ``kind`` in O(L) memory (what the backend runs).

    Shapes: q ``(B, H, Lq, d)``, k ``(B, Hkv, Lk, d)``, v ``(B, Hkv, Lk, dv)``; ``mult`` is the
    kind's resolved multiplier (:meth:`ScoreKind.multiplier`), ``arg`` its argument (a
    ``score_mod`` callable, additive attention's ``w_v``, or None); ``poison`` is
    :func:`~qkv.functional.scores.nonfinite_rows` of the call's inputs (``"check"``: computed
    here); ``dropout_p`` drops weights (see the module's notes; always applied when > 0).
    Returns the output ``(B, H, Lq, dv)``; differentiable with an O(L)-memory backward.
    """
    B, H, Lq, d = q.shape
    Hk, Lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    if isinstance(poison, str):
        poison = nonfinite_rows(q, k, v)
    if kind.row_scale is not None and acc_dtype(q.dtype) != q.dtype:
        # the row factor is folded into q, which can overflow half precision: run in float32
        q32, k32, v32 = q.float(), k.float(), v.float()
        p32 = None if poison is None else poison.float()
        out = run_chunked(
            q32, k32, v32, spec, kind, arg, mult, block_q, block_k, poison=p32, dropout_p=dropout_p
        )
        return out.to(q.dtype)
    drop: Dropout | None = None
    if dropout_p > 0:  # one number from the default generator: torch.manual_seed reproduces it
        drop = (float(dropout_p), int(torch.randint(0, 1 << 62, (1,)).item()))
    flash = (
        drop is None and kind.block is None and not isinstance(mult, Tensor) and _flash_usable(q)
    )
    if not flash and poison is not None:  # NaN rows of scores are never taken for rows with no key
        q = q + poison
    q, k = kind.prepare(q, k)
    if flash:
        # large query blocks: fewer kernel calls (the diagonal band wastes ~block/L of the work)
        bq = block_q or 1024
        bk = block_k or 1024
        if kind.row_scale is not None:
            q = q * _row_factor(kind, arg, q, k, spec, bk, float(mult))
            mult = 1.0
        width = max(d, dv)  # the kernel wants one head width: zero-pad (dot products unchanged)
        if d < width:
            q, k = F.pad(q, (0, width - d)), F.pad(k, (0, width - d))
        vp = F.pad(v, (0, width - dv)) if dv < width else v
        plan = plan_blocks(spec, bq, bk)
        out = _FlashChunked.apply(q, k, vp, spec, float(mult), plan, H // Hk, poison)
        return out[..., :dv] if dv < width else out

    bq, bk = _block_sizes(Lq, Lk, B * H * kind.pair_values(d))
    bq, bk = block_q or bq, block_k or bk
    if kind.row_scale is not None:
        q = q * _row_factor(kind, arg, q, k, spec, bk, mult)
        mult = 1.0
    # tensors among the multiplier and the kind's argument are differentiated by the engine
    m_t, a_t = isinstance(mult, Tensor), isinstance(arg, Tensor)
    params = tuple(t for t, is_t in ((mult, m_t), (arg, a_t)) if is_t)

    def score_fn(qb, kb, q0, k0, *ps):
        m = ps[0] if m_t else mult
        a = ps[-1] if a_t else arg
        return kind.block_scores(qb, kb, q0, k0, m, a)

    setup = None
    if kind.block_setup is not None:

        def setup(qf, kf, *ps):  # the kind's blocks for this call's forward, or None
            m = ps[0] if m_t else mult
            a = ps[-1] if a_t else arg
            blk = kind.block_setup(qf, kf, a)
            if blk is None:
                return None
            return lambda qb, kb, q0, k0, *_: blk(qb, kb, q0, k0, m, a)

    plan = plan_blocks(spec, bq, bk, bk)
    return _GenericChunked.apply(score_fn, setup, spec, plan, poison, drop, q, k, v, *params)


def chunked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    spec: MaskSpec,
    score: Score,
    mult: float | Tensor,
    block_q: int | None = None,
    block_k: int | None = None,
) -> Tensor:
    """Exact attention in O(L) memory.

    Shapes: q ``(B, H, Lq, d)``, k ``(B, Hkv, Lk, d)``, v ``(B, Hkv, Lk, dv)``; ``mult`` is the
    score's resolved multiplier (:func:`qkv.functional.scores.qk_multiplier`).  Returns the
    output ``(B, H, Lq, dv)``; differentiable with an O(L)-memory backward.
    """
    kind, arg = score_kind(score)
    return run_chunked(q, k, v, spec, kind, arg, mult, block_q, block_k)


def chunked_additive(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w_v: Tensor,
    spec: MaskSpec,
    block_q: int | None = None,
    block_k: int | None = None,
) -> Tensor:
    """Additive attention ``s_ij = w_v . tanh(q_i + k_j)`` in O(L) memory.

    Shapes: q ``(B, 1, Lq, h)``, k ``(B, 1, Lk, h)``, v ``(B, 1, Lk, dv)``, w_v ``(h,)``;
    returns ``(B, 1, Lq, dv)``.  Each block holds at most ~4M values of ``tanh(q + k)`` (or one
    query-key pair for every batch element when ``B * h`` alone exceeds that).
    """
    return run_chunked(q, k, v, spec, ADDITIVE, w_v, 1.0, block_q, block_k)
