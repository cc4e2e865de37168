"""The Transformer's fast path in inference: the same results as its modules, less Python.

Two calls of :mod:`qkv.nn.transformer`'s model take it, each where :func:`why_not_fast_path`
finds nothing against it (inference: no grad, eval mode, the CPU, no weights asked for, outside
``torch.compile``/``torch.export`` and TorchScript; and what each path reads is of a kind it
knows):

* the encoder's ``forward(..., skip_padding=True)`` (:func:`encode_packed`): the linear layers,
  feed-forward networks and norms run on the valid positions only, attention on the padded
  batch with the padded positions zero and masked (decoding asks for it; its attention masks
  the padding);
* the decoder's cached step of one new token per row (:func:`decoder_step`): the
  self-attention's three projections are one product, the linear layers read transposed or
  packed copies of their weights (:mod:`qkv.nn._inference`), taken once per decoder state
  (:class:`StepPlan`, of one :class:`BlockPlan` per block, remade when a weight changes in
  place), and attention runs through :func:`qkv.functional.decode.cached_attention` and, over
  the encoder, :func:`qkv.functional.decode.planned_attention` with the plan made once per batch
  (``TransformerDecoderState.cross_plans``).  Without beams, once the first step has planned the
  cross-attention, the whole step (every block and the output layer) runs as one TorchScript
  function (:mod:`qkv.nn._scripted`): the same operators in the same order, called without
  Python in between; a step it cannot run (a cache to grow, a projection that is not finite, a
  layer of another kind) runs in Python (:func:`block_step`).

Beam search's beams (:func:`expand_beams`) keep their self-attention keys where they were
written (:class:`~qkv.nn.kv_cache.BeamKVCache`): reordering beams within their sentences moves
no keys (:func:`reorder_beams`), and a sentence's beams attend over the encoder as several
queries of one row.  Anything else gives every beam its own rows back first (:func:`end_beams`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.decode import (
    _SCALED_DOT,
    PlannedKeys,
    cached_attention,
    grouped_attention,
    plan_keys,
    planned_attention,
)
from ._inference import (
    Linear,
    Product,
    forget,
    fused_product,
    fused_projection,
    linear,
    packed_of,
    product,
    versions,
    weights_of,
)
from ._scripted import CrossKeys, Layout, Norms, Products, scripted_step
from .kv_cache import BeamKVCache, BeamRows, KVCache
from .sublayers import PositionWiseFFN

__all__ = [
    "BlockPlan",
    "NormPlan",
    "StepPlan",
    "block_step",
    "decoder_step",
    "encode_packed",
    "end_beams",
    "expand_beams",
    "forget",
    "reorder_beams",
    "why_not_fast_path",
]


# ---------------------------------------------------------------------------- may it run
def why_not_fast_path(
    stack: nn.Module,
    X: Tensor | None = None,
    *,
    valid_lens: object = None,
    state: object = None,
    need_weights: bool = False,
) -> str | None:
    """Why a call of ``stack`` does not take the fast path, in a few words; None when it does.

    ``stack`` is a :class:`~qkv.nn.TransformerEncoder` called with token ids ``X`` ``(B, L)``
    and ``valid_lens`` (its packed path, ``forward(..., skip_padding=True)``), or a
    :class:`~qkv.nn.TransformerDecoder` given its ``state`` (a decoding step of ``X``
    ``(B, n)``; ``X`` None asks about the steps to come, as :func:`expand_beams` does).  Every
    caller of the fast path asks here, so each reason is given by one rule.
    """
    decoder = state is not None
    if decoder and not stack.fast_decode:
        return "fast_decode is False"
    if need_weights:
        return "need_weights=True: attention weights exist on the general path only"
    reason = _inference_reason(stack, X.device if X is not None else state.enc_outputs.device)
    if reason is None:
        reason = _step_reason(X, state) if decoder else _lengths_reason(X, valid_lens)
    if reason is not None:
        return reason
    block_reason = _decoder_block_reason if decoder else _encoder_block_reason
    for i, blk in enumerate(stack.blks):
        reason = block_reason(blk)
        if reason is not None:
            return f"block {i}: {reason}"
    return None


def _inference_reason(module: nn.Module, device: torch.device) -> str | None:
    if module.training:
        return "training mode (call .eval())"
    if torch.is_grad_enabled():
        return "autograd is on (run under torch.no_grad() or torch.inference_mode())"
    if device.type != "cpu":
        return f"on {device}, not the CPU"
    if torch.compiler.is_compiling():
        return "inside torch.compile or torch.export"
    if torch.jit.is_tracing() or torch.jit.is_scripting():
        return "inside TorchScript (tracing or scripting)"
    return None


def _step_reason(X: Tensor | None, state: object) -> str | None:
    if X is not None and X.shape[1] != 1:
        return f"{X.shape[1]} new tokens per row, not 1"
    caches = state.self_caches
    if caches is None:
        return "no cache (init_state(..., use_cache=True) makes one)"
    if type(caches[0]) not in (KVCache, BeamKVCache):
        return f"caches of type {type(caches[0]).__name__} (a step graph's), not KVCache"
    return None


def _lengths_reason(X: Tensor, valid_lens: object) -> str | None:
    if valid_lens is None:
        return None
    if not isinstance(valid_lens, Tensor):
        return f"valid_lens is a {type(valid_lens).__name__}, not a tensor"
    if valid_lens.shape != (X.shape[0],):
        return f"valid_lens of shape {tuple(valid_lens.shape)}, not (B,) = ({X.shape[0]},)"
    if valid_lens.is_floating_point():
        return f"valid_lens of dtype {valid_lens.dtype}, not an integer one"
    if valid_lens.device != X.device:
        return f"valid_lens on {valid_lens.device}, X on {X.device}"
    return None


def _ffn_reason(ffn: nn.Module) -> str | None:
    if type(ffn) is not PositionWiseFFN:
        return f"a feed-forward network of type {type(ffn).__name__}, not PositionWiseFFN"
    return None


def _encoder_block_reason(blk: nn.Module) -> str | None:
    """A dynamically quantized layer scales its input by the range of all its rows, padding
    included: such a block runs on the padded batch."""
    reason = _ffn_reason(blk.ffn)
    if reason is not None:
        return reason
    a, ffn = blk.attention, blk.ffn
    for name, m in (
        ("attention.W_q", a.W_q),
        ("attention.W_k", a.W_k),
        ("attention.W_v", a.W_v),
        ("attention.W_o", a.W_o),
        ("ffn.dense1", ffn.dense1),
        ("ffn.dense2", ffn.dense2),
    ):
        if type(m) is not nn.Linear:
            return f"{name} is a {type(m).__name__}, not a plain nn.Linear"
    return None


def _decoder_block_reason(blk: nn.Module) -> str | None:
    """What :func:`block_step` computes as the block's ``forward`` does: no rotary positions,
    the scaled dot product with its default scale, a :class:`PositionWiseFFN`.  Asked at every
    step: the attentions are checked in one condition, named only when one fails."""
    a1, a2 = blk.attention1, blk.attention2
    if a1.rotary is not None:
        return "rotary positions"
    if (
        a1.score != "scaled_dot"
        or a2.score != "scaled_dot"
        or a1.scale is not None
        or a2.scale is not None
    ):
        return _attention_reason(blk)
    return _ffn_reason(blk.ffn)


def _attention_reason(blk: nn.Module) -> str | None:
    for name in ("attention1", "attention2"):
        a = getattr(blk, name)
        if a.score != "scaled_dot":
            return f"{name}.score is {a.score!r}, not 'scaled_dot'"
        if a.scale is not None:
            return f"{name}.scale is {a.scale!r}, not the default"
    return None


# ---------------------------------------------------------------------------- the encoder
def encode_packed(encoder: nn.Module, X: Tensor, valid_lens: Tensor | None) -> Tensor:
    """The encoder's ``forward`` of ``X`` ``(B, L)`` in inference, the padding skipped: the
    linear layers, the feed-forward networks and the norms run on the valid positions only
    (each product through :func:`qkv.nn._inference.linear`), attention on the whole batch with
    the padded positions zero and masked.  The valid positions get what ``forward`` gives (to
    float rounding); the padded ones are 0.  Returns ``(B, L, D)``."""
    B, L = X.shape
    D = encoder.num_hiddens
    flat = encoder._embed(X).reshape(B * L, D)
    keep = None
    if valid_lens is not None:
        seen = torch.arange(L, device=X.device) < valid_lens.unsqueeze(1)  # (B, L)
        keep = seen.view(-1).nonzero().squeeze(1)  # (N,) the valid rows of (B * L)
        flat = flat.index_select(0, keep)
    for blk in encoder.blks:
        flat = _packed_block(blk, flat, keep, B, L, valid_lens)
    if encoder.norm is not None:
        flat = encoder.norm(flat)
    encoder.attention_weights = None
    if keep is None:
        return flat.view(B, L, D)
    return flat.new_zeros(B * L, D).index_copy_(0, keep, flat).view(B, L, D)


def _packed_block(
    blk: nn.Module, x: Tensor, keep: Tensor | None, B: int, L: int, lens: Tensor | None
) -> Tensor:
    """An encoder block's ``forward`` in inference on the valid positions only: ``x``
    ``(N, D)`` holds rows ``keep`` ``(N,)`` of the flattened ``(B * L, D)`` batch (None: every
    row); the linear layers and norms read those rows, attention the ``(B, H, L, d)`` batch with
    the padded positions zero (masked by ``lens``, as in ``forward``)."""
    a = blk.attention
    H, d = a.num_heads, a.head_dim
    D = H * d
    Q = blk.addnorm1.pre(x)
    qkv = fused_projection(a, (a.W_q, a.W_k, a.W_v), Q)  # (N, 3D)
    if qkv is None:  # a weight without a version (an inference tensor): one by one
        qkv = torch.cat([linear(a.W_q, Q), linear(a.W_k, Q), linear(a.W_v, Q)], dim=1)
    if keep is not None:
        qkv = qkv.new_zeros(B * L, 3 * D).index_copy_(0, keep, qkv)
    q, k, v = qkv.view(B, L, 3, H, d).permute(2, 0, 3, 1, 4)  # each (B, H, L, d)
    if a.rotary is not None:
        q, k = a.rotary(q, 0), a.rotary(k, 0)
    out, a.attention_weights = a._attend(q, k, v, 0.0, valid_lens=lens)
    out = out.transpose(1, 2).reshape(B * L, D)  # (B, H, L, d) -> (B * L, D)
    if keep is not None:
        out = out.index_select(0, keep)
    Y = blk.addnorm1(x, linear(a.W_o, out))
    ffn = blk.ffn
    hidden = ffn.activation(linear(ffn.dense1, blk.addnorm2.pre(Y)))
    return blk.addnorm2(Y, linear(ffn.dense2, hidden))


# ---------------------------------------------------------------------------- the decoder's step
class NormPlan(NamedTuple):
    """A layer norm as ``F.layer_norm`` takes it after its input."""

    shape: tuple[int, ...]
    weight: Tensor | None
    bias: Tensor | None
    eps: float

    @classmethod
    def of(cls, ln: nn.LayerNorm) -> NormPlan:
        return cls(tuple(ln.normalized_shape), ln.weight, ln.bias, ln.eps)


def _layer_norm(x: Tensor, n: NormPlan) -> Tensor:
    return F.layer_norm(x, n.shape, n.weight, n.bias, n.eps)


def _add_norm(X: Tensor, Y: Tensor, norm: NormPlan, pre: bool) -> Tensor:
    """``AddNorm.forward`` in evaluation (:class:`~qkv.nn.AddNorm`)."""
    return X + Y if pre else _layer_norm(Y + X, norm)


@dataclass(frozen=True, slots=True)
class BlockPlan:
    """What :func:`block_step` reads of one decoder block, for inputs like ``x`` ``(B, D)``: the
    products of its linear layers (:func:`qkv.nn._inference.product`) and its norms.

    Attributes:
        qkv: the self-attention's query, key and value projections as one product ``(B, 3D)``;
            None when they cannot be fused (then ``query``, ``key`` and ``value`` run).
        query, key, value, self_out: the self-attention's ``W_q``, ``W_k``, ``W_v``, ``W_o``.
        cross_query, cross_out: the cross-attention's ``W_q`` and ``W_o`` (its keys and values
            are projected once per batch, :func:`_cross_kv`).
        ffn_in, activation, ffn_out: the feed-forward network's ``dense1``, activation module
            and ``dense2``.
        self_norm, cross_norm, ffn_norm: the norms of ``addnorm1``, ``addnorm2``, ``addnorm3``.
        norm_first: pre-norm (True) or post-norm.
    """

    qkv: Product | None
    query: Product
    key: Product
    value: Product
    self_out: Product
    cross_query: Product
    cross_out: Product
    ffn_in: Product
    activation: nn.Module
    ffn_out: Product
    self_norm: NormPlan
    cross_norm: NormPlan
    ffn_norm: NormPlan
    norm_first: bool

    @classmethod
    def of(cls, blk: nn.Module, x: Tensor) -> BlockPlan:
        a1, a2, ffn = blk.attention1, blk.attention2, blk.ffn
        return cls(
            qkv=fused_product(a1, (a1.W_q, a1.W_k, a1.W_v), x),
            query=product(a1.W_q, x),
            key=product(a1.W_k, x),
            value=product(a1.W_v, x),
            self_out=product(a1.W_o, x),
            cross_query=product(a2.W_q, x),
            cross_out=product(a2.W_o, x),
            ffn_in=product(ffn.dense1, x),
            activation=ffn.activation,
            ffn_out=product(ffn.dense2, x),
            self_norm=NormPlan.of(blk.addnorm1.ln),
            cross_norm=NormPlan.of(blk.addnorm2.ln),
            ffn_norm=NormPlan.of(blk.addnorm3.ln),
            norm_first=blk.addnorm1.norm_first,
        )


def _linears(blk: nn.Module) -> tuple[nn.Module, ...]:
    """The linear layers of a decoder block that a step reads (the cross-attention's keys and
    values excepted: projected once per batch)."""
    a1, a2, ffn = blk.attention1, blk.attention2, blk.ffn
    return (a1.W_q, a1.W_k, a1.W_v, a1.W_o, a2.W_q, a2.W_o, ffn.dense1, ffn.dense2)


def _cross_kv(blk: nn.Module, enc: Tensor) -> tuple[Tensor, Tensor]:
    """A decoder block's cross-attention keys and values of ``enc`` ``(B, Ls, D)``,
    ``(B, H, Ls, d)`` each, in one product (:func:`qkv.nn._inference.fused_projection`) where
    it can."""
    a2 = blk.attention2
    B, Ls, _ = enc.shape
    H, d = a2.num_heads, a2.head_dim
    kv = fused_projection(a2, (a2.W_k, a2.W_v), enc.reshape(B * Ls, -1))  # (B*Ls, 2D)
    if kv is None:  # e.g. quantized layers: one by one
        return (
            a2.W_k(enc).unflatten(-1, (H, d)).transpose(1, 2),
            a2.W_v(enc).unflatten(-1, (H, d)).transpose(1, 2),
        )
    k, v = kv.view(B, Ls, 2, H, d).permute(2, 0, 3, 1, 4)  # (B, H, Ls, d) each
    return k, v


def block_step(blk: nn.Module, X: Tensor, state: object) -> Tensor:
    """A decoder block's ``forward`` of one new position per row, with a cache, in inference:
    ``X`` ``(B, D)`` -> ``(B, D)``, reading the block's products and norms from the state's
    plan (``state.step_plan``, a :class:`StepPlan`).

    The block's ``forward`` is the general path (any module, weights, autograd) and
    :func:`qkv.nn._scripted.decode_step` the scripted one; this Python spelling of the same
    arithmetic stays because only it reads what the other two cannot: a cache that grows,
    beams through their histories (:func:`~qkv.functional.decode.grouped_attention`), and
    :func:`qkv.functional.attention`'s rule for NaN where a projection is not finite.
    """
    B, D = X.shape
    i = blk.i
    p = state.step_plan.blocks[i]
    pre = p.norm_first
    H = blk.attention1.num_heads
    d = D // H
    # self-attention: the three projections in one product, the new key and value appended
    Q = _layer_norm(X, p.self_norm) if pre else X
    if p.qkv is None:  # e.g. quantized layers: one by one
        q, k, v = p.query(Q), p.key(Q), p.value(Q)
    else:
        q, k, v = p.qkv(Q).split(D, dim=1)
    # (B, D) -> (B, H, 1, d)
    q, k, v = q.view(B, H, 1, d), k.view(B, H, 1, d), v.view(B, H, 1, d)
    cache, beams = state.self_caches[i], state.beams
    keys, values = cache.append(k, v)
    out = None
    if beams is not None:  # a sentence's K beams over all its slots, each its own history
        G, K = beams.groups, beams.beams
        grouped = q.view(G, K, H, d).transpose(1, 2)  # (G, H, K, d)
        out = grouped_attention(grouped, keys, values, beams.bias, known_finite=cache.finite)
        if out is None:  # not known finite: every beam's own keys, by the general rule
            keys, values = cache.rows(beams)
    if out is None:
        out = cached_attention(q, keys, values)  # (B, H, 1, d)
    # (B, H, 1, d) or (G, H, K, d) -> (B, D)
    Y = _add_norm(X, p.self_out(out.transpose(1, 2).reshape(B, D)), p.self_norm, pre)
    # cross-attention over the encoder, planned once per batch
    plan = state.cross_plans[i]
    if plan is None:
        cache = state.cross_caches[i]
        if cache.empty:  # the first step: the encoder's keys and values, projected once
            cache.set(*_cross_kv(blk, state.enc_outputs))
        plan = plan_keys(cache.keys, cache.values, valid_lens=state.enc_valid_lens, heads=H)
        state.cross_plans[i] = plan
    q = p.cross_query(_layer_norm(Y, p.cross_norm) if pre else Y)
    if beams is None:
        q = q.view(B, H, 1, d)
    else:  # the encoder's part is one row per sentence: its K beams are K queries of it
        q = q.view(beams.groups, beams.beams, H, d).transpose(1, 2)  # (G, H, K, d)
    out = planned_attention(q, plan)  # (B, H, 1, d) or (G, H, K, d)
    Z = _add_norm(Y, p.cross_out(out.transpose(1, 2).reshape(B, D)), p.cross_norm, pre)
    hidden = p.activation(p.ffn_in(_layer_norm(Z, p.ffn_norm) if pre else Z))
    return _add_norm(Z, p.ffn_out(hidden), p.ffn_norm, pre)


def decoder_step(decoder: nn.Module, X: Tensor, state: object) -> Tensor:
    """The decoder's ``forward`` of one new token per row ``X`` ``(B, 1)`` with a cache, in
    inference (where :func:`why_not_fast_path` gives None): the logits ``(B, 1, V)``, the
    state's caches advanced.  The whole step runs scripted where it can
    (:meth:`StepPlan.scripted`), else block by block (:func:`block_step`)."""
    B = X.shape[0]
    Y = decoder._embed(X, state.offset).reshape(B, decoder.num_hiddens)
    if state.cross_plans is None:
        state.cross_plans = [None] * decoder.num_blks
    if state.step_plan is None or not state.step_plan.current():
        state.step_plan = StepPlan(decoder, Y)
    if state.beams is not None:  # this step's position in every beam's history
        state.beams.advance(Y.dtype)
    elif decoder.scripted_decode:  # the whole step scripted, where it runs
        logits = state.step_plan.scripted(Y, state)
        if logits is not None:
            return logits.view(B, 1, -1)
    for blk in decoder.blks:
        Y = block_step(blk, Y, state)
    if decoder.norm is not None:
        Y = decoder.norm(Y)
    return state.step_plan.dense(Y).view(B, 1, -1)


def _act_code(act: nn.Module) -> int | None:
    """The feed-forward activation's code in the scripted step (``qkv.nn._scripted.ACTIVATIONS``:
    ReLU, GELU, GELU's tanh approximation, swish), or None for any other module."""
    if type(act) is nn.ReLU:
        return 0
    if type(act) is nn.SiLU:
        return 3
    if type(act) is nn.GELU:
        return {"none": 1, "tanh": 2}.get(act.approximate)
    return None


class ScriptArgs(NamedTuple):
    """What :func:`qkv.nn._scripted.decode_step` takes of the decoder, laid out once per plan."""

    products: Products
    norms: Norms
    layout: Layout


class StepPlan:
    """What the fast decoding step reads, taken once per decoder state: every block's
    :class:`BlockPlan` (``blocks``) and the output layer's product (``dense``); remade when a
    weight changes in place (its version counter; a weight replaced by a new tensor is seen by
    the next state).

    :meth:`scripted` runs a step as one TorchScript function (:mod:`qkv.nn._scripted`) where
    it can: the products and norms laid out for it once (``script_args``; ``unscripted`` says
    why not when it cannot), the cross-attention's plans per batch."""

    def __init__(self, decoder: nn.Module, x: Tensor) -> None:
        linears = [m for blk in decoder.blks for m in _linears(blk)] + [decoder.dense]
        self.tensors = weights_of(tuple(linears))
        self.versions = versions(self.tensors)
        # quantized layers' packed weights (replaced, never changed in place, when weights are:
        # set_weight_bias, load_state_dict), with what holds them
        self.packed = [
            (m._packed_params, packed_of(m)) for m in linears if packed_of(m) is not None
        ]
        self.blocks = [BlockPlan.of(blk, x) for blk in decoder.blks]
        self.dense = product(decoder.dense, x)
        self.heads = decoder.blks[0].attention1.num_heads
        self.self_mult = float(_SCALED_DOT.multiplier(None, decoder.num_hiddens // self.heads, 1))
        self.script = scripted_step()
        args = self._script_args(decoder) if self.script is not None else "TorchScript failed"
        self.script_args = args if isinstance(args, ScriptArgs) else None
        self.unscripted = args if isinstance(args, str) else None
        # the cross-attention's plans the scripted step last read, and their lists
        self._cross_plans: list[PlannedKeys] = []
        self._cross_keys: CrossKeys | None = None

    def current(self) -> bool:
        """Whether no weight changed since the plan was made."""
        return (
            self.versions is not None
            and versions(self.tensors) == self.versions
            and all(held._packed_params is p for held, p in self.packed)
        )

    def _script_args(self, decoder: nn.Module) -> ScriptArgs | str:
        """The products and norms as :func:`qkv.nn._scripted.decode_step` takes them, or why
        it does not run this decoder (a layer of a kind it does not know)."""
        products, norms, pre, acts = [], [], set(), set()
        for p in self.blocks:
            products += [p.qkv, p.self_out, p.cross_query, p.cross_out, p.ffn_in, p.ffn_out]
            norms += [p.self_norm, p.cross_norm, p.ffn_norm]
            pre.add(p.norm_first)
            acts.add(_act_code(p.activation))
        products.append(self.dense)
        final = decoder.norm
        if final is not None:
            if type(final) is not nn.LayerNorm:
                return f"a final norm of type {type(final).__name__}, not nn.LayerNorm"
            norms.append(NormPlan.of(final))
        heads = {b.attention1.num_heads for b in decoder.blks}
        heads |= {b.attention2.num_heads for b in decoder.blks}
        if heads != {self.heads}:
            return f"blocks of different numbers of heads {sorted(heads)}"
        if len(pre) != 1:
            return "pre-norm and post-norm blocks mixed"
        if len(acts) != 1 or None in acts:
            return "a feed-forward activation other than ReLU, GELU or swish"
        if any(type(p) is not Linear for p in products):
            return "a linear layer that is not a plain nn.Linear or a dynamically quantized one"
        if any(n.shape != (decoder.num_hiddens,) for n in norms):
            return "a norm over another shape than the width"
        return ScriptArgs(_products(products), _norms(norms), self._layout(pre, acts, final))

    def _layout(self, pre: set[bool], acts: set[int | None], final: nn.Module | None) -> Layout:
        return Layout(
            heads=self.heads,
            self_mult=self.self_mult,
            norm_first=pre.pop(),
            activation=acts.pop(),
            final_norm=final is not None,
        )

    def scripted(self, x: Tensor, state: object) -> Tensor | None:
        """The logits ``(B, V)`` of the embedded new tokens ``x`` ``(B, D)`` by the scripted
        step, the caches advanced; None where it does not run (the Python step then does)."""
        caches, plans = state.self_caches, state.cross_plans
        args = self.script_args
        if args is None or state.beams is not None or plans is None:
            return None
        t = caches[0].length
        for c in caches:
            k = c._k
            if (
                type(c) is not KVCache
                or k is None
                or c.length != t
                or not c._finite
                or k.shape[2] <= t
                or k.shape[0] != x.shape[0]
                or k.dtype != x.dtype
            ):
                return None
        cross = self._cross_keys
        if (
            cross is None
            or len(self._cross_plans) != len(plans)
            or any(a is not b for a, b in zip(self._cross_plans, plans))
        ):
            cross = _cross_keys(plans, x)
            if cross is None:
                return None
            self._cross_plans, self._cross_keys = list(plans), cross
        keys, values = [c._k for c in caches], [c._v for c in caches]
        out = self.script(x, t, keys, values, args.products, args.norms, cross, args.layout)
        if out is not None:
            for c in caches:
                c.length = t + 1
        return out


def _products(products: list[Linear]) -> Products:
    where, k = [], 0
    for p in products:
        where.append(k if p.kind == Linear.INT8 else -1)
        k += p.kind == Linear.INT8
    empty = torch.empty(0)
    return Products(
        kinds=[p.kind for p in products],
        weights=[empty if p.weight is None else p.weight for p in products],
        biases=[p.bias for p in products],
        packs=[p.packed for p in products if p.kind == Linear.INT8],
        where=where,
        reduce_range=[bool(p.reduce_range) for p in products],
    )


def _norms(norms: list[NormPlan]) -> Norms:
    return Norms(
        weights=[n.weight for n in norms],
        biases=[n.bias for n in norms],
        eps=[float(n.eps) for n in norms],
    )


def _cross_keys(plans: list[PlannedKeys | None], x: Tensor) -> CrossKeys | None:
    """Every block's planned cross-attention keys as the scripted step reads them, or None
    when one is not planned for three small products on rows and a dtype like ``x``'s."""
    if any(
        p is None or p.key_t is None or p.key.shape[0] != x.shape[0] or p.key_t.dtype != x.dtype
        for p in plans
    ):
        return None
    return CrossKeys(
        keys_t=[p.key_t for p in plans],
        values=[p.kernel_value for p in plans],
        bias=[p.bias for p in plans],
        dead=[p.dead for p in plans],
        mult=[p.mult for p in plans],
    )


# ---------------------------------------------------------------------------- beams
def expand_beams(decoder: nn.Module, state: object, beams: int) -> object:
    """Every row of the decoder's ``state`` repeated ``beams`` times (rows ``b * beams + r``), as
    ``reorder_state(state, arange(B).repeat_interleave(beams))``.  Where the fast step will run
    (:func:`why_not_fast_path`), the self-attention caches become
    :class:`~qkv.nn.kv_cache.BeamKVCache` and the encoder's part stays one row per sentence."""
    B, device = state.enc_outputs.shape[0], state.enc_outputs.device
    caches = state.self_caches
    grouped = (
        beams > 1
        and state.beams is None
        and caches is not None
        and all(type(c) is KVCache and not c.empty and c.keys.shape[0] == B for c in caches)
        and why_not_fast_path(decoder, state=state) is None
    )
    if not grouped:
        return decoder.reorder_state(state, torch.arange(B, device=device).repeat_interleave(beams))
    state.beams = BeamRows(B, beams, caches[0].length, caches[0].capacity or 1, device)
    state.self_caches = [BeamKVCache.from_cache(c, beams) for c in caches]
    return state


def end_beams(state: object) -> None:
    """Every beam's own rows again: its self-attention cache (:class:`KVCache`) and its
    sentence's encoder part, for anything but the fast step."""
    beams = state.beams
    if beams is None:
        return
    if state.self_caches is not None:
        state.self_caches = [c.to_cache(beams) for c in state.self_caches]
    state.beams = None
    G, device = beams.groups, state.enc_outputs.device
    state._reorder_encoder(torch.arange(G, device=device).repeat_interleave(beams.beams))


def reorder_beams(state: object, index: Tensor, include_encoder: bool) -> bool:
    """Rows ``index`` ``(B',)`` of a state with beams, kept on the beams' tables where they can
    be: True when done (beams reordered within their sentences move no keys; whole sentences
    leave), False when the caller reorders every row's own cache (the beams ended here, or
    there were none)."""
    beams = state.beams
    if beams is None:
        return False
    if not include_encoder and beams.within_groups(index):
        beams.reorder(index)  # no key moves: the beams read their new histories
        return True
    groups = beams.whole_groups(index) if include_encoder else None
    if groups is None:
        end_beams(state)
        return False
    for c in state.self_caches:  # whole sentences leave (early exit)
        c.keep_groups(groups)
    beams.keep_groups(groups)
    state._reorder_encoder(groups)
    return True
