"""The Transformer decoder's fast decoding step gives what its general path gives: logits at
every step (float64: to rounding), tokens of greedy and beam search, with padding, a source of
length 0, pre-norm, biases, quantized layers, and weights changed between calls."""

from __future__ import annotations

import copy

import pytest
import torch
from _seq2seq_models import BOS, EOS, batch, tiny

from qkv.decoding import generate
from qkv.decoding.search import _argmax, _top_candidates
from qkv.inference import quantize_model
from qkv.nn import _fast_decode
from qkv.nn.transformer import TransformerDecoder

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def _model(dtype=torch.float64, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(num_hiddens=30, num_heads=3, ffn_num_hiddens=44, tgt_vocab_size=37)
    cfg.update(kw)
    return tiny(dtype=dtype, **cfg)


def _steps(model, src, lens, fast: bool, n: int = 6, reorder=None):
    """Logits of ``n`` cached steps (teacher-forced on fixed tokens), fast path on or off."""
    model.decoder.fast_decode = fast
    g = torch.Generator().manual_seed(5)
    out = []
    try:
        with torch.inference_mode():
            state = model.init_state(model.encode(src, lens), lens, use_cache=True, capacity=3)
            tok = torch.full((src.shape[0], 1), BOS)
            for t in range(n):
                logits, state = model.decode(tok, state)
                out.append(logits)
                if reorder is not None and t == 2:
                    state = model.reorder_state(state, reorder)
                    tok = tok[reorder]
                tok = torch.randint(3, logits.shape[-1], (tok.shape[0], 1), generator=g)
            return out, state
    finally:
        model.decoder.fast_decode = True


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"norm_first": True},
        {"use_bias": True, "activation": "gelu"},
        {"use_bias": True, "activation": "swish", "scale_embedding": False},
        {"num_heads": 5, "num_dec_layers": 3},
    ],
)
def test_fast_step_equals_the_general_path(dtype, kw):
    model = _model(dtype, **kw)
    for seed in range(2):
        src, lens = batch(B=5, L=7, seed=seed)
        lens[3] = 0  # a source with no token: its cross-attention row sees nothing
        src[3] = 0
        fast, state = _steps(model, src, lens, True)
        slow, _ = _steps(model, src, lens, False)
        assert state.cross_plans is not None and all(p is not None for p in state.cross_plans)
        for a, b in zip(fast, slow):
            assert a.shape == b.shape == (5, 1, 37)
            torch.testing.assert_close(a, b, **TOL[dtype])


def test_fast_step_after_reordering_rows():
    model = _model()
    src, lens = batch(B=4, L=6, seed=2)
    order = torch.tensor([2, 0, 0, 3, 1])  # rows dropped and repeated (early exit, beams)
    fast, _ = _steps(model, src, lens, True, reorder=order)
    slow, _ = _steps(model, src, lens, False, reorder=order)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, **TOL[torch.float64])


def test_fast_path_is_taken_only_in_inference(monkeypatch):
    model = _model()
    src, lens = batch(B=3, L=5)
    calls = []
    first = model.decoder.blks[0]
    step = _fast_decode.block_step
    monkeypatch.setattr(
        _fast_decode,
        "block_step",
        lambda blk, *a: (blk is first and calls.append(1)) or step(blk, *a),
    )
    state = model.init_state(model.encode(src, lens), lens, use_cache=True)
    tok = torch.full((3, 1), BOS)
    model.decode(tok, state)  # autograd on: the general path (gradients reach the weights)
    with torch.no_grad():
        model.decode(tok, state, need_weights=True)  # weights asked for
        model.decode(torch.full((3, 2), BOS), state)  # two new tokens
        model.train()
        model.decode(tok, state)  # training mode
        model.eval()
        assert calls == []
        model.decode(tok, state)
    assert calls == [1]


def test_changed_weights_are_seen():
    """The kept (transposed, packed, fused) weights follow in-place updates and new tensors."""
    model = _model(torch.float32)
    src, lens = batch(B=3, L=5, seed=1)
    _steps(model, src, lens, True, n=2)
    with torch.no_grad():
        for p in model.decoder.parameters():
            p.add_(0.1 * torch.randn_like(p))  # in place: an optimizer step
        model.decoder.dense.weight = torch.nn.Parameter(model.decoder.dense.weight * 1.5)
    fast, _ = _steps(model, src, lens, True, n=3)
    slow, _ = _steps(model, src, lens, False, n=3)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


@pytest.mark.parametrize("optimizer", ["fused", "data"])
def test_weights_changed_unseen_by_version_counters_are_seen_after_train(optimizer):
    """torch's fused AdamW and ``p.data`` updates leave the version counters as they were: the
    weights the fast path kept are dropped when the model changes mode, as every training loop
    does around its updates (the weights a run validated with were once its first
    evaluation's)."""
    model = _model(torch.float32, seed=6)
    src, lens = batch(B=4, L=7, seed=6)
    _steps(model, src, lens, True, n=2)  # keeps the encoder's and the decoder's weights
    model.train()
    if optimizer == "fused":
        opt = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
        tgt = torch.randint(3, 37, (4, 5))
        model(src, tgt, lens).logsumexp(-1).mean().backward()
        opt.step()
    else:
        for p in model.parameters():
            p.data.add_(0.05 * torch.randn_like(p))
    model.eval()
    fresh = copy.deepcopy(model)  # new modules: nothing kept for them
    kept, _ = _steps(model, src, lens, True, n=3)
    new, _ = _steps(fresh, src, lens, True, n=3)
    for a, b in zip(kept, new):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


def test_the_kept_weights_stay_while_the_mode_does_not_change():
    """Every ``train(False)`` dropped them, also on a model in evaluation mode already: each
    attention map of ``Translator.attention`` (an ``eval()`` and a ``train(False)``) made the
    next translation build them again."""
    from qkv.nn import _inference

    model = _model(torch.float32, seed=7)
    src, lens = batch(B=3, L=6, seed=7)
    _steps(model, src, lens, True, n=2)
    kept = {m: v for m in model.modules() if (v := _inference._CACHE.get(m)) is not None}
    assert kept
    model.eval()
    model.train(False)
    assert all(_inference._CACHE.get(m) is v for m, v in kept.items())
    model.train()
    assert not any(m in _inference._CACHE for m in kept)


def test_quantized_model_fast_and_general_agree():
    model = quantize_model(_model(torch.float32, seed=3), "int8")
    src, lens = batch(B=4, L=6, seed=3)
    fast, _ = _steps(model, src, lens, True)
    slow, _ = _steps(model, src, lens, False)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


@pytest.mark.parametrize("beam", [1, 3])
def test_generate_tokens_equal_with_the_fast_path(beam):
    model = _model(torch.float32, seed=4)
    with torch.no_grad():
        model.decoder.dense.bias[EOS] += 2.0  # sentences end at different steps
    src, lens = batch(B=7, L=8, seed=4)
    kw = dict(max_output_len=9, bos_id=BOS, eos_id=EOS, beam_size=beam, n_best=beam)
    fast = generate(model, src, lens, **kw)
    TransformerDecoder.fast_decode = False
    try:
        slow = generate(model, src, lens, **kw)
    finally:
        TransformerDecoder.fast_decode = True
    if beam == 1:
        assert fast == slow
    else:  # the same hypotheses, scores equal to rounding
        for f, s in zip(fast, slow):
            assert [h for h, _ in f] == [h for h, _ in s]
            torch.testing.assert_close(
                torch.tensor([x for _, x in f]), torch.tensor([x for _, x in s])
            )


def test_argmax_equals_torch_argmax_with_ties_nan_and_inf():
    g = torch.Generator().manual_seed(0)
    for trial in range(400):
        rows = int(torch.randint(1, 6, (1,), generator=g))
        V = int(torch.randint(1, 400, (1,), generator=g))
        x = torch.randint(-2, 3, (rows, V), generator=g).float()  # many exact ties
        r = torch.rand(rows, V, generator=g)
        x[r < 0.01] = float("nan")
        x[r > 0.99] = float("inf")
        x[(r > 0.3) & (r < 0.4)] = -float("inf")
        if trial % 9 == 0:
            x[:] = -float("inf")
        assert torch.equal(_argmax(x), x.argmax(dim=-1)), (rows, V)


def test_top_candidates_equal_topk_of_every_sum():
    g = torch.Generator().manual_seed(1)
    for trial in range(300):
        B, K = (int(torch.randint(1, 5, (1,), generator=g)) for _ in range(2))
        V = int(torch.randint(1, 700, (1,), generator=g))
        logp = torch.randn(B, K, V, generator=g).log_softmax(-1)
        scores = torch.randn(B, K, generator=g) * 3
        if trial % 4 == 0:
            scores[:, 1:] = -float("inf")  # the first step: one live beam
        n = min(2 * K, K * V)
        want_v, want_i = (scores.unsqueeze(-1) + logp).view(B, K * V).topk(n, dim=1)
        got_v, got_i = _top_candidates(scores, logp, n)
        assert torch.equal(got_v, want_v)
        finite = torch.isfinite(want_v)  # the order of equal -inf candidates is unspecified
        assert torch.equal(got_i[finite], want_i[finite])
