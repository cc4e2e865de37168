"""Beams that reorder without copying their cache (``expand_beams``, :class:`BeamKVCache`):
every step's logits equal the general path's (float64, to rounding) through beam reorders within
sentences, whole sentences leaving, a reorder of any other kind, weights asked for, and keys
that are not finite; the stored keys read back as each beam's own, exactly; beam search's
hypotheses and scores are the general path's."""

from __future__ import annotations

import pytest
import torch
from _seq2seq_models import BOS, EOS, batch, tiny

from qkv.decoding import generate
from qkv.functional import attention
from qkv.functional.decode import grouped_attention
from qkv.nn.kv_cache import BeamKVCache, BeamRows, KVCache
from qkv.nn.transformer import TransformerDecoder

TOL = dict(atol=1e-10, rtol=1e-10)


def _model(seed=0, dtype=torch.float64, **kw):
    torch.manual_seed(seed)
    cfg = dict(num_hiddens=30, num_heads=3, ffn_num_hiddens=44, tgt_vocab_size=37)
    cfg.update(kw)
    return tiny(dtype=dtype, **cfg)


def _within(G: int, K: int, g: torch.Generator) -> torch.Tensor:
    """A random beam reorder: each row continues a row of its own sentence."""
    return torch.arange(G).repeat_interleave(K) * K + torch.randint(0, K, (G * K,), generator=g)


def _drive(model, src, lens, K, fast: bool, plan, steps=7):
    """Logits of ``steps`` cached steps of ``G * K`` beams (one narrow step, expand_beams, then
    the reorders ``plan[t]`` of each step: 'within', 'leave', 'any', 'weights' or None)."""
    model.decoder.fast_decode = fast
    g = torch.Generator().manual_seed(3)
    out, kinds = [], []
    try:
        with torch.inference_mode():
            state = model.init_state(model.encode(src, lens), lens, use_cache=True, capacity=2)
            tok = torch.full((src.shape[0], 1), BOS)
            logits, state = model.decode(tok, state)
            out.append(logits)
            state = model.expand_beams(state, K)
            kinds.append(type(state.self_caches[0]).__name__)
            G = src.shape[0]
            tok = torch.randint(3, 37, (G * K, 1), generator=g)
            for t in range(1, steps):
                need = plan.get(t) == "weights"
                logits, state = model.decode(tok, state, need_weights=need)
                out.append(logits)
                kinds.append(type(state.self_caches[0]).__name__)
                rows = tok.shape[0]
                what = plan.get(t)
                if what == "within":
                    index = _within(rows // K, K, g)
                    state = model.reorder_state(state, index, include_encoder=False)
                elif what == "leave":  # whole sentences leave: the first and the last
                    keep = torch.arange(K, rows - K)
                    state = model.reorder_state(state, keep)
                elif what == "any":  # rows of other sentences: not a beam reorder
                    index = torch.randint(0, rows, (rows,), generator=g)
                    state = model.reorder_state(state, index)
                else:
                    index = torch.arange(rows)
                rows = index.numel() if what != "leave" else keep.numel()
                tok = torch.randint(3, 37, (rows, 1), generator=g)
            return out, kinds
    finally:
        model.decoder.fast_decode = True


@pytest.mark.parametrize("kw", [{}, {"norm_first": True, "use_bias": True}, {"num_heads": 5}])
@pytest.mark.parametrize("K", [2, 3])
def test_beams_equal_the_general_path_through_reorders(kw, K):
    model = _model(**kw)
    src, lens = batch(B=5, L=7, seed=1)
    lens[2], src[2] = 0, 0  # a source with no token
    plan = {1: "within", 2: "within", 3: "leave", 4: "within", 5: "within"}
    fast, kinds = _drive(model, src, lens, K, True, plan)
    slow, slow_kinds = _drive(model, src, lens, K, False, plan)
    assert kinds[0] == "BeamKVCache" and kinds[-1] == "BeamKVCache"  # the beam cache ran
    assert set(slow_kinds) == {"KVCache"}
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("what", ["any", "weights"])
def test_other_uses_end_the_beams_and_stay_equal(what):
    model = _model(seed=2)
    src, lens = batch(B=4, L=6, seed=2)
    plan = {1: "within", 2: what, 3: "within"}
    fast, kinds = _drive(model, src, lens, 3, True, plan, steps=6)
    slow, _ = _drive(model, src, lens, 3, False, plan, steps=6)
    assert kinds[1] == "BeamKVCache" and kinds[-1] == "KVCache"  # rows of their own after it
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, **TOL)


def test_keys_that_are_not_finite_take_the_general_rule(monkeypatch):
    model = _model(seed=3)
    src, lens = batch(B=3, L=5, seed=3)
    with torch.no_grad():  # a huge embedding row: its projections overflow to inf in float64
        model.decoder.embedding.weight[9] = 1e308
    gathered = []  # the general rule: every beam's own keys, gathered from the beam cache
    rows = BeamKVCache.rows

    def spy(cache, beams):
        gathered.append(cache.finite)
        return rows(cache, beams)

    monkeypatch.setattr(BeamKVCache, "rows", spy)
    plan = {1: "within", 2: "within"}
    outs, finite, kinds = [], [], set()
    for fast in (True, False):
        model.decoder.fast_decode = fast
        g = torch.Generator().manual_seed(0)  # the same reorders on both paths
        with torch.inference_mode():
            state = model.init_state(model.encode(src, lens), lens, use_cache=True)
            logits, state = model.decode(torch.full((3, 1), BOS), state)
            state = model.expand_beams(state, 2)
            seq = [logits]
            for t in range(1, 4):
                tok = torch.full((6, 1), 5)
                if t == 1:
                    tok[0] = 9  # the first sentence's first beam only: its keys overflow
                logits, state = model.decode(tok, state)
                seq.append(logits)
                if plan.get(t):
                    state = model.reorder_state(state, _within(3, 2, g), include_encoder=False)
            if fast:
                finite = [c.finite for c in state.self_caches]
                kinds = {type(c).__name__ for c in state.self_caches}
        outs.append(seq)
    model.decoder.fast_decode = True
    assert kinds == {"BeamKVCache"} and finite == [False, False]  # not finite, beams kept
    # steps 1..3 of both layers took the general rule, and only with keys not finite
    assert len(gathered) == 3 * 2 and not any(gathered)
    # the other beams stay finite (the overflowing beam's neighbours included), so the
    # comparison below reads numbers, not NaN against NaN
    assert bool(outs[1][-1][1:].isfinite().all())
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, equal_nan=True, **TOL)


def test_beam_cache_reads_back_each_beams_own_keys_exactly():
    G, K, H, d = 3, 4, 2, 5
    g = torch.Generator().manual_seed(0)
    first = KVCache(capacity=2)
    first.append(torch.randn(G, H, 1, d, generator=g), torch.randn(G, H, 1, d, generator=g))
    beam = BeamKVCache.from_cache(first, K)
    rows = BeamRows(G, K, 1, 2, torch.device("cpu"))
    plain = KVCache(capacity=2)  # the classic way: every row its own, gathered at every step
    plain.append(*(t.repeat_interleave(K, 0) for t in (first.keys, first.values)))
    for _ in range(6):  # appends beyond the capacity, reorders between them
        k, v = torch.randn(G * K, H, 1, d, generator=g), torch.randn(G * K, H, 1, d, generator=g)
        rows.advance(torch.float32)
        beam.append(k, v)
        plain.append(k, v)
        keys, values = beam.rows(rows)
        assert torch.equal(keys, plain.keys) and torch.equal(values, plain.values)
        index = _within(G, K, g)
        rows.reorder(index)
        plain.reorder(index)
    assert rows.within_groups(_within(G, K, g))
    assert not rows.within_groups(torch.arange(G * K).flip(0))
    assert torch.equal(rows.whole_groups(torch.arange(K, 3 * K)), torch.tensor([1, 2]))
    assert rows.whole_groups(torch.arange(1, K + 1)) is None


def test_grouped_attention_equals_attention_with_the_mask():
    g = torch.Generator().manual_seed(1)
    G, H, Lq, Lk, d = 3, 2, 4, 11, 7
    q, k, v = (torch.randn(G, H, n, d, generator=g, dtype=torch.float64) for n in (Lq, Lk, Lk))
    sees = torch.rand(G, 1, Lq, Lk, generator=g) < 0.5
    sees[..., 0] = True  # every query sees a key
    bias = torch.zeros(sees.shape, dtype=torch.float64).masked_fill(~sees, float("-inf"))
    got = grouped_attention(q, k, v, bias, known_finite=True)
    torch.testing.assert_close(got, attention(q, k, v, attn_mask=~sees)[0], **TOL)  # True: hidden
    torch.testing.assert_close(got, attention(q, k, v, attn_mask=bias)[0], **TOL)  # added
    assert grouped_attention(q, k, v, bias, known_finite=False) is None
    q[0, 0, 0, 0] = float("nan")
    assert grouped_attention(q, k, v, bias, known_finite=True) is None


@pytest.mark.parametrize("K", [2, 4])
def test_beam_search_hypotheses_equal_the_general_path(K):
    model = _model(seed=4, dtype=torch.float32)
    with torch.no_grad():
        model.decoder.dense.bias[EOS] += 2.0  # sentences end at different steps: early exits
    src, lens = batch(B=9, L=8, seed=5)
    kw = dict(bos_id=BOS, eos_id=EOS, beam_size=K, n_best=K)
    limits = [4, 9, 7, 9, 3, 8, 9, 6, 9]  # each sentence its own max_len
    fast = generate(model, src, lens, max_output_len=limits, **kw)
    TransformerDecoder.fast_decode = False
    try:
        slow = generate(model, src, lens, max_output_len=limits, **kw)
    finally:
        TransformerDecoder.fast_decode = True
    for f, s in zip(fast, slow):
        assert [h for h, _ in f] == [h for h, _ in s]
        torch.testing.assert_close(torch.tensor([x for _, x in f]), torch.tensor([x for _, x in s]))
