"""The decoding step scripted as one TorchScript function (``qkv.nn._scripted``) computes what
the Python fast step computes, bit for bit: logits and caches at every step (float32, float64,
int8; post-norm, pre-norm with its final norm, biases and GELU, odd sizes), tokens of greedy
search with rows leaving the batch; it hands a step to Python when a projection is not finite,
when a cache must grow, with beams, and where TorchScript is missing."""

from __future__ import annotations

import pytest
import torch
from _seq2seq_models import BOS, EOS, batch, tiny

from qkv.decoding import generate
from qkv.inference import quantize_model
from qkv.nn import _fast_decode, _scripted


def _model(dtype=torch.float32, seed=0, int8=False, **kw):
    torch.manual_seed(seed)
    cfg = dict(num_hiddens=35, num_heads=5, ffn_num_hiddens=47, tgt_vocab_size=41)
    cfg.update(kw)
    model = tiny(dtype=dtype, **cfg)
    with torch.no_grad():
        model.decoder.dense.bias[EOS] += 1.0  # greedy sentences end at different steps
    return quantize_model(model, "int8") if int8 else model


@pytest.fixture
def ran(monkeypatch):
    """Each step's answer of the scripted step: True (it ran), False (it handed the step to
    Python)."""
    out: list[bool] = []
    real = _fast_decode.StepPlan.scripted

    def scripted(self, x, state):
        logits = real(self, x, state)
        out.append(logits is not None)
        return logits

    monkeypatch.setattr(_fast_decode.StepPlan, "scripted", scripted)
    return out


def _steps(model, src, lens, scripted: bool, n: int = 7, tokens=None):
    """Logits and self-attention caches of ``n`` cached steps, teacher-forced on fixed random
    tokens (or ``tokens`` ``(B, n)``); capacity 3: the caches grow at the fourth step."""
    model.decoder.scripted_decode = scripted
    g = torch.Generator().manual_seed(4)
    B = src.shape[0]
    logits_seen = []
    try:
        with torch.inference_mode():
            state = model.init_state(model.encode(src, lens), lens, use_cache=True, capacity=3)
            tok = torch.full((B, 1), BOS)
            for t in range(n):
                logits, state = model.decode(tok, state)
                logits_seen.append(logits)
                if tokens is not None:
                    tok = tokens[:, t : t + 1]
                else:
                    tok = torch.randint(3, logits.shape[-1], (B, 1), generator=g)
        caches = [(c.keys.clone(), c.values.clone()) for c in state.self_caches]
        return logits_seen, caches
    finally:
        model.decoder.scripted_decode = True


CONFIGS = [
    {},
    {"norm_first": True},
    {"use_bias": True, "activation": "gelu"},
    {"use_bias": True, "activation": "swish", "scale_embedding": False},
    {"num_heads": 7, "num_dec_layers": 3, "ffn_num_hiddens": 29},
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kw", CONFIGS)
def test_scripted_step_equals_the_python_step_bit_for_bit(dtype, kw, ran):
    model = _model(dtype, **kw)
    src, lens = batch(B=5, L=8, seed=1)
    lens[2] = 0  # a source with no token: its cross-attention row is zero
    src[2] = 0
    script, caches_s = _steps(model, src, lens, True)
    # step 0 plans the cross-attention in Python; steps 3 and 6 grow the caches
    assert ran == [False, True, True, False, True, True, False]
    python, caches_p = _steps(model, src, lens, False)
    for a, b in zip(script, python):
        assert a.shape == (5, 1, 41) and torch.equal(a, b)
    for (ka, va), (kb, vb) in zip(caches_s, caches_p):
        assert torch.equal(ka, kb) and torch.equal(va, vb)


@pytest.mark.parametrize("kw", [{}, {"norm_first": True, "use_bias": True}])
def test_scripted_int8_step_equals_the_python_step_bit_for_bit(kw, ran):
    model = _model(int8=True, **kw)
    src, lens = batch(B=6, L=9, seed=2)
    script, caches_s = _steps(model, src, lens, True)
    assert ran == [False, True, True, False, True, True, False]
    python, caches_p = _steps(model, src, lens, False)
    for a, b in zip(script, python):
        assert torch.equal(a, b)
    for (ka, va), (kb, vb) in zip(caches_s, caches_p):
        assert torch.equal(ka, kb) and torch.equal(va, vb)


@pytest.mark.parametrize("int8", [False, True])
def test_greedy_tokens_are_the_same_with_rows_leaving_the_batch(int8, ran):
    model = _model(int8=int8, seed=3)
    src, lens = batch(B=9, L=7, seed=3)
    kw = dict(max_output_len=12, bos_id=BOS, eos_id=EOS)
    model.decoder.scripted_decode = False
    python = generate(model, src, lens, **kw)
    model.decoder.scripted_decode = True
    ran.clear()
    script = generate(model, src, lens, **kw)
    assert script == python
    assert len({len(s) for s in script}) > 2  # sentences ended at different steps
    # Python plans the cross-attention: at the first step, and after rows left the batch
    assert not ran[0] and sum(ran) >= len(ran) - 3


def test_a_non_finite_projection_hands_the_step_to_python(ran):
    model = _model(seed=5)
    src, lens = batch(B=4, L=6, seed=5)
    g = torch.Generator().manual_seed(6)
    tokens = torch.randint(3, 41, (4, 7), generator=g)
    tokens[1, 3] = 40
    with torch.no_grad():
        model.decoder.embedding.weight[40, 0] = float("nan")  # row 1's input at step 4
    script, _ = _steps(model, src, lens, True, tokens=tokens)
    # steps 1-2 scripted; 3 grows the caches; 4 meets the NaN; afterwards the caches hold one
    assert ran == [False, True, True, False, False, False, False]
    python, _ = _steps(model, src, lens, False, tokens=tokens)
    for a, b in zip(script, python):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    assert script[4][1].isnan().all() and not script[4][[0, 2, 3]].isnan().any()


def test_beams_keep_the_python_step(ran):
    model = _model(seed=6)
    src, lens = batch(B=3, L=5, seed=6)
    generate(model, src, lens, max_output_len=6, bos_id=BOS, eos_id=EOS, beam_size=3)
    assert not any(ran)


def test_without_torchscript_the_python_step_runs(monkeypatch, ran):
    model = _model(seed=7)
    src, lens = batch(B=5, L=6, seed=7)
    kw = dict(max_output_len=9, bos_id=BOS, eos_id=EOS)
    expected = generate(model, src, lens, **kw)
    monkeypatch.setattr(_scripted, "_SCRIPTED", [None])  # scripting failed in this process
    ran.clear()
    assert generate(model, src, lens, **kw) == expected
    assert ran and not any(ran)


def test_layers_of_another_kind_keep_the_python_step(ran):
    """A feed-forward activation the scripted step does not run (any module)."""
    model = _model(seed=8)
    for blk in model.decoder.blks:
        blk.ffn.activation = torch.nn.Mish()
    src, lens = batch(B=3, L=5, seed=8)
    python, _ = _steps(model, src, lens, False)
    script, _ = _steps(model, src, lens, True)
    assert not any(ran)
    for a, b in zip(script, python):
        assert torch.equal(a, b)
