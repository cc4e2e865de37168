"""The registries: every score kind on every backend that claims it, every position-based mask kind
on the chunked planner, both against the float64 formulas of tests/_reference.py.

A new entry in qkv.functional.scores.SCORE_KINDS or qkv.functional.masks.INDEX_MASKS is picked up
here by itself; the tests fail until its formula (SCORE_FORMULAS) or example (MASK_EXAMPLES)
is written.
"""

from __future__ import annotations

import importlib
import inspect
from types import MappingProxyType
from typing import get_args

import pytest
import torch
from _reference import SCORE_FORMULAS, reference_additive, reference_attention

from qkv import functional as qf
from qkv.functional import scores
from qkv.functional.chunked import plan_blocks, run_chunked
from qkv.functional.masks import INDEX_MASKS, IndexMask, check_masks

attention_module = importlib.import_module("qkv.functional.attention")


def alibi(s, b, h, i, j):
    return s - 0.3 * (h + 1) * (i - j).abs()


def _draw(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _problem(seed, B=2, H=4, Hk=2, Lq=13, Lk=17, d=5, dv=3):
    """Odd sizes, grouped-query heads, d != dv; float64 leaves."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = _draw(g, B, H, Lq, d), _draw(g, B, Hk, Lk, d), _draw(g, B, Hk, Lk, dv)
    masks = {
        "valid_lens": torch.randint(1, Lk + 1, (B, Lq), generator=g),
        "key_padding_mask": torch.rand(B, Lk, generator=g) < 0.2,
        "is_causal": True,
    }
    masks["valid_lens"][0, 3] = 0  # a query that sees nothing
    return q, k, v, masks


def _spec(q, k, **masks):
    B, H, Lq = q.shape[:3]
    return check_masks(B=B, H=H, Lq=Lq, Lk=k.shape[2], device=q.device, batched_heads=True, **masks)


def _backends(kind):
    """The backends a kind claims: the fused kernel only where its kind says so."""
    return [b for b in qf.BACKENDS if b != "fused" or kind.not_fused is None]


def _grads(out, inputs, go):
    return torch.autograd.grad(out, inputs, go)


# ------------------------------------------------------------------ score kinds
@pytest.mark.parametrize("score", [*qf.SCORES, alibi], ids=[*qf.SCORES, "score_mod"])
@pytest.mark.parametrize("scale", [None, 0.7])
def test_every_score_kind_on_every_backend_it_claims_matches_the_formula(score, scale):
    kind, _ = scores.score_kind(score)
    q, k, v, masks = _problem(seed=len(kind.name))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    ref, ref_w = reference_attention(q, k, v, score=score, scale=scale, **masks)
    go = torch.randn_like(ref)
    ref_g = _grads(ref, (q, k, v), go)
    backends = _backends(kind)
    assert "reference" in backends and "chunked" in backends
    for backend in backends:
        weights = backend == "reference"
        out, w = qf.attention(
            q, k, v, score=score, scale=scale, backend=backend, need_weights=weights, **masks
        )
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12, msg=backend)
        if w is not None:
            torch.testing.assert_close(w, ref_w, rtol=1e-10, atol=1e-12)
        for a, b in zip(_grads(out, (q, k, v), go), ref_g):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=backend)
    if "fused" not in backends:  # a kind that says the fused kernel cannot run it is refused there
        with pytest.raises(ValueError, match=r"backend: 'fused' cannot run .*" + kind.not_fused):
            qf.attention(q, k, v, score=score, scale=scale, backend="fused")
    # the chunked backend with small blocks: many blocks, skipped and unmasked segments
    spec = _spec(q, k, **masks)
    mult = kind.multiplier(scale, q.shape[-1], k.shape[2])
    arg = score if callable(score) else None
    out = run_chunked(q, k, v, spec, kind, arg, mult, block_q=3, block_k=4)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for a, b in zip(_grads(out, (q, k, v), go), ref_g):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("backend", ["reference", "chunked"])
def test_additive_kind_on_every_backend_matches_the_formula(backend):
    g = torch.Generator().manual_seed(5)
    B, Lq, Lk, h, dv = 3, 7, 11, 5, 2
    q, k, v, w_v = _draw(g, B, Lq, h), _draw(g, B, Lk, h), _draw(g, B, Lk, dv), _draw(g, h)
    masks = {"valid_lens": torch.tensor([[i % (Lk + 1) for i in range(Lq)], [Lk] * Lq, [4] * Lq])}
    masks["attn_mask"] = torch.rand(Lq, Lk, generator=g) < 0.2
    ref, ref_w = reference_additive(q, k, v, w_v, **masks)
    out, w = qf.additive_attention(
        q, k, v, w_v, backend=backend, need_weights=backend == "reference", **masks
    )
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    if w is not None:
        torch.testing.assert_close(w, ref_w, rtol=1e-10, atol=1e-12)
    spec = check_masks(B=B, H=1, Lq=Lq, Lk=Lk, device=q.device, batched_heads=False, **masks)
    small = run_chunked(*(t.unsqueeze(1) for t in (q, k, v)), spec, scores.ADDITIVE, w_v, 1.0, 2, 3)
    torch.testing.assert_close(small.squeeze(1), ref, rtol=1e-10, atol=1e-12)


def test_additive_attention_uses_the_memory_budget(monkeypatch):
    q = k = v = torch.randn(2, 64, 8)
    w_v = torch.randn(8)
    ran = []
    real = attention_module.run_chunked
    monkeypatch.setattr(
        attention_module, "run_chunked", lambda *a, **kw: ran.append(a[4]) or real(*a, **kw)
    )
    # the scores and the weights (2*64*64 float32 each) and tanh(q + k) twice (2*64*64*8 each)
    need = 2 * 64 * 64 * 4 * (2 + 2 * 8)
    within, _ = qf.additive_attention(q, k, v, w_v, memory_budget=need)
    assert ran == []
    over, _ = qf.additive_attention(q, k, v, w_v, memory_budget=need - 1)
    assert ran == [scores.ADDITIVE]
    torch.testing.assert_close(over, within)
    budget = qf.set_memory_budget(need - 1)  # the global budget too
    try:
        qf.additive_attention(q, k, v, w_v)
    finally:
        qf.set_memory_budget(budget)
    assert ran == [scores.ADDITIVE] * 2
    # weights asked for keep the budget, as attention()'s do
    with pytest.raises(qf.AttentionMemoryError, match=r"need_weights=True .* over the memory"):
        qf.additive_attention(q, k, v, w_v, memory_budget=need - 1, need_weights=True)
    _, w = qf.additive_attention(q, k, v, w_v, memory_budget=need, need_weights=True)
    assert w is not None and len(ran) == 2
    with pytest.raises(ValueError, match="backend: 'chunked' cannot run this call: need_weights"):
        qf.additive_attention(q, k, v, w_v, need_weights=True, backend="chunked")


def test_score_names_are_the_registry():
    assert tuple(scores.SCORE_KINDS) == qf.SCORES == scores.SCORES
    assert set(get_args(scores.ScoreName)) == set(qf.SCORES)  # the type hint keeps up
    assert all(kind.name == name for name, kind in scores.SCORE_KINDS.items())
    assert set(SCORE_FORMULAS) >= set(qf.SCORES)  # tests/_reference.py has every formula


def test_unknown_score_lists_the_known_names():
    q = torch.randn(1, 2, 3)
    with pytest.raises(ValueError, match="score: expected one of") as e:
        qf.attention(q, q, q, score="max")
    assert all(repr(name) in str(e.value) for name in qf.SCORES) and "'max'" in str(e.value)
    with pytest.raises(ValueError, match="score: expected one of"):
        qf.explain(q, q, q, score=3)


def test_a_kind_with_its_own_block_says_why_the_fused_kernel_cannot_run_it():
    with pytest.raises(ValueError, match="not_fused: expected the reason"):
        scores.ScoreKind("mine", "f(q, k)", lambda d: 1.0, block=lambda *a: a[0])


def test_a_new_kind_is_one_registry_entry(monkeypatch):
    """A kind registered in scores.py alone runs on every backend, with no other change."""
    negated = scores.ScoreKind(
        "negated", "-scale * q_i . k_j", lambda d: 0.5, prepare=lambda q, k: (q, -k)
    )
    monkeypatch.setattr(scores, "SCORE_KINDS", MappingProxyType({"negated": negated}))
    q, k, v, masks = _problem(seed=3)
    ref, _ = reference_attention(q, -k, v, score="dot", scale=0.5, **masks)
    for backend in qf.BACKENDS:
        out, _ = qf.attention(q, k, v, score="negated", backend=backend, **masks)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


def test_explain_takes_exactly_the_arguments_of_attention():
    params = inspect.signature(qf.attention).parameters
    assert inspect.signature(qf.explain).parameters == params
    assert list(inspect.signature(attention_module.plan_call).parameters) == list(params)
    q = torch.randn(1, 2, 3)
    with pytest.raises(TypeError, match="scal"):
        qf.explain(q, q, q, scal=2.0)


# ------------------------------------------------------------------ position-based mask kinds
# an example of the attention() arguments that make each kind, at B=2, Lq=13, Lk=17; lengths stay
# below Lk so that the planner has keys to skip
MASK_EXAMPLES = {
    "is_causal": [lambda g: {"is_causal": True}],
    "window": [lambda g: {"window": 4}, lambda g: {"window": 2, "is_causal": True}],
    "valid_lens": [
        lambda g: {"valid_lens": torch.randint(0, 13, (2,), generator=g)},
        lambda g: {"valid_lens": torch.randint(0, 13, (2, 13), generator=g)},
    ],
}


def test_every_mask_kind_has_an_example():
    assert set(MASK_EXAMPLES) == set(INDEX_MASKS)


def _plan_agrees_with_the_mask(spec, plan):
    """Pairs left out of the plan are masked for every batch element; pairs in unmasked
    segments are allowed by every position-based mask."""
    full = (spec.B, 1, spec.Lq, spec.Lk)
    qi, kj = torch.arange(spec.Lq).view(-1, 1), torch.arange(spec.Lk).view(1, -1)
    index_only = torch.zeros(spec.Lq, spec.Lk, dtype=torch.bool)  # for some batch element
    for m in spec.index_masks:
        index_only |= torch.broadcast_to(m.blocked(qi, kj, 0, spec.Lq), full).any(0)[0]
    covered = torch.zeros(spec.Lq, spec.Lk, dtype=torch.bool)
    for q0, q1, segs in plan:
        for s in segs:
            covered[q0:q1, s.k0 : s.k1] = True
            if not s.index:
                assert not index_only[q0:q1, s.k0 : s.k1].any(), (q0, q1, s)
    skipped = ~covered
    always_blocked = torch.broadcast_to(spec.blocked(), full).all(0)[0]
    assert always_blocked[skipped].all()
    return int(skipped.sum()), sum(not s.index for _, _, segs in plan for s in segs)


@pytest.mark.parametrize("name", list(INDEX_MASKS))
@pytest.mark.parametrize("score", ["scaled_dot", alibi], ids=["flash engine", "generic engine"])
def test_every_mask_kind_with_block_bounds_chunked_matches_reference(name, score):
    kind_cls = INDEX_MASKS[name]
    for i, example in enumerate(MASK_EXAMPLES[name]):
        g = torch.Generator().manual_seed(i)
        masks = example(g)
        q, k, v, _ = _problem(seed=i, Lq=13, Lk=17)
        spec = _spec(q, k, **masks)
        assert any(isinstance(m, kind_cls) for m in spec.index_masks), masks
        plan = plan_blocks(spec, 3, 4, 4)
        skipped, unmasked = _plan_agrees_with_the_mask(spec, plan)
        if kind_cls.key_bounds is not IndexMask.key_bounds:  # the kind gives block bounds
            assert skipped > 0 and unmasked > 0, (masks, skipped, unmasked)
        kind, arg = scores.score_kind(score)
        mult = kind.multiplier(None, q.shape[-1], k.shape[2])
        out = run_chunked(q, k, v, spec, kind, arg, mult, block_q=3, block_k=4)
        ref, _ = qf.attention(q, k, v, score=score, backend="reference", **masks)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
        formula, _ = reference_attention(q, k, v, score=score, **masks)
        torch.testing.assert_close(out, formula, rtol=1e-10, atol=1e-12)


class _EveryThirdKey(IndexMask):
    """A mask kind that gives no block bounds: query i may not see keys j with (i + j) % 3 == 0."""

    __slots__ = ()

    def blocked(self, qi, kj, q0, q1):
        return (qi + kj) % 3 == 0


@pytest.mark.parametrize("score", ["scaled_dot", alibi], ids=["flash engine", "generic engine"])
def test_a_mask_kind_without_block_bounds_is_applied_everywhere(score):
    q, k, v, _ = _problem(seed=9)
    spec = _spec(q, k, is_causal=True)
    object.__setattr__(spec, "index_masks", (*spec.index_masks, _EveryThirdKey()))
    plan = plan_blocks(spec, 3, 4, 4)
    assert all(s.index for _, _, segs in plan for s in segs)  # never assumed unmasked
    kind, arg = scores.score_kind(score)
    out = run_chunked(q, k, v, spec, kind, arg, kind.multiplier(None, 5, 17), block_q=3, block_k=4)
    qi, kj = torch.arange(13).view(-1, 1), torch.arange(17).view(1, -1)
    same = (qi + kj) % 3 == 0
    ref, _ = reference_attention(q, k, v, score=score, attn_mask=same, is_causal=True)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
