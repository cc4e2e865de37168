"""``why_not_fast_path``: one rule says whether the Transformer's fast path in inference runs, and
why not.  Each reason comes from a minimal case; None is what lets the fast path run, and the
encoder's packed path, the decoder's step and ``expand_beams`` each follow what it says."""

from __future__ import annotations

import pytest
import torch
from _seq2seq_models import BOS, batch, tiny
from torch import nn

from qkv.inference import quantize_model
from qkv.nn import _fast_decode, _scripted
from qkv.nn.kv_cache import BeamKVCache, KVCache, TensorKVCache


def _model(**kw):
    torch.manual_seed(0)
    return tiny(**kw)


def _encoder_reason(enc, X, lens, **kw):
    with torch.no_grad():
        return enc.why_not_fast_path(X, lens, **kw)


def _decoder_state(model, **kw):
    src, lens = batch(B=3, L=5)
    with torch.no_grad():
        return model.init_state(model.encode(src, lens), lens, **kw)


def _decoder_reason(model, X=None, state=None, **kw):
    state = _decoder_state(model, use_cache=True) if state is None else state
    X = torch.full((3, 1), BOS) if X is None else X
    with torch.no_grad():
        return model.decoder.why_not_fast_path(X, state, **kw)


# ---------------------------------------------------------------------------- None: it runs
def test_none_in_inference_on_the_cpu():
    model = _model()
    X, lens = batch(B=3, L=5)
    assert _encoder_reason(model.encoder, X, lens) is None
    assert _encoder_reason(model.encoder, X, None) is None
    assert _decoder_reason(model) is None
    state = _decoder_state(model, use_cache=True)
    with torch.no_grad():
        assert model.decoder.why_not_fast_path(None, state) is None  # the steps to come


# ---------------------------------------------------------------------------- the call
def test_weights_asked_for():
    model = _model()
    X, lens = batch(B=3, L=5)
    assert "need_weights" in _encoder_reason(model.encoder, X, lens, need_weights=True)
    assert "need_weights" in _decoder_reason(model, need_weights=True)


def test_training_mode():
    model = _model()
    X, lens = batch(B=3, L=5)
    state = _decoder_state(model, use_cache=True)
    model.train()
    assert "training mode" in _encoder_reason(model.encoder, X, lens)
    assert "training mode" in _decoder_reason(model, state=state)


def test_autograd_on():
    model = _model()
    X, lens = batch(B=3, L=5)
    assert "autograd" in model.encoder.why_not_fast_path(X, lens)
    state = _decoder_state(model, use_cache=True)
    assert "autograd" in model.decoder.why_not_fast_path(torch.full((3, 1), BOS), state)


def test_a_device_other_than_the_cpu():
    model = _model()
    X = torch.zeros(3, 5, dtype=torch.long, device="meta")
    assert _encoder_reason(model.encoder, X, None) == "on meta, not the CPU"


@pytest.mark.parametrize(
    "where, name, words",
    [
        (torch.compiler, "is_compiling", "inside torch.compile or torch.export"),
        (torch.jit, "is_tracing", "inside TorchScript (tracing or scripting)"),
        (torch.jit, "is_scripting", "inside TorchScript (tracing or scripting)"),
    ],
)
def test_inside_torch_compile_or_torchscript(monkeypatch, where, name, words):
    model = _model()
    X, lens = batch(B=3, L=5)
    state = _decoder_state(model, use_cache=True)
    monkeypatch.setattr(where, name, lambda: True)
    assert _encoder_reason(model.encoder, X, lens) == words
    assert _decoder_reason(model, state=state) == words


# ---------------------------------------------------------------------------- the encoder
@pytest.mark.parametrize(
    "lens, words",
    [
        ([5, 3, 2], "a list, not a tensor"),
        (torch.tensor([[5], [3], [2]]), "of shape (3, 1), not (B,) = (3,)"),
        (torch.tensor([5.0, 3.0, 2.0]), "torch.float32, not an integer one"),
        (torch.tensor([5, 3, 2], device="meta"), "on meta, X on cpu"),
    ],
)
def test_valid_lens_not_a_b_integer_tensor_on_x_device(lens, words):
    model = _model()
    X, _ = batch(B=3, L=5)
    assert words in _encoder_reason(model.encoder, X, lens)


def test_an_encoder_block_with_a_quantized_layer():
    model = quantize_model(_model(), "int8")
    X, lens = batch(B=3, L=5)
    reason = _encoder_reason(model.encoder, X, lens)
    assert reason.startswith("block 0: attention.W_q is a ") and "not a plain nn.Linear" in reason


def test_a_feed_forward_network_of_another_kind():
    model = _model()
    model.encoder.blks[1].ffn = nn.Identity()
    model.decoder.blks[1].ffn = nn.Identity()
    X, lens = batch(B=3, L=5)
    words = "block 1: a feed-forward network of type Identity, not PositionWiseFFN"
    assert _encoder_reason(model.encoder, X, lens) == words
    assert _decoder_reason(model) == words


# ---------------------------------------------------------------------------- the decoder
def test_fast_decode_off():
    model = _model()
    model.decoder.fast_decode = False
    assert _decoder_reason(model) == "fast_decode is False"


def test_more_than_one_new_token():
    model = _model()
    assert _decoder_reason(model, X=torch.full((3, 2), BOS)) == "2 new tokens per row, not 1"


def test_no_cache():
    model = _model()
    state = _decoder_state(model, use_cache=False)
    assert "no cache" in _decoder_reason(model, state=state)


def test_a_step_graphs_tensor_caches():
    model = _model()
    state = _decoder_state(model, use_cache=True)
    state.self_caches = [TensorKVCache(torch.zeros(3, 4, 0, 8), torch.zeros(3, 4, 0, 8))] * 2
    assert "TensorKVCache" in _decoder_reason(model, state=state)


def test_rotary_positions():
    assert _decoder_reason(_model(pos_encoding="rotary")) == "block 0: rotary positions"


def test_a_score_other_than_the_scaled_dot_product():
    model = _model()
    model.decoder.blks[1].attention2.score = "dot"
    assert _decoder_reason(model) == "block 1: attention2.score is 'dot', not 'scaled_dot'"


def test_a_scale_given():
    model = _model()
    model.decoder.blks[0].attention1.scale = 0.5
    assert _decoder_reason(model) == "block 0: attention1.scale is 0.5, not the default"


# ---------------------------------------------------------------------------- every caller follows it
def test_forward_takes_the_fast_step_exactly_when_there_is_no_reason(monkeypatch):
    model = _model()
    calls = []
    step = _fast_decode.decoder_step
    monkeypatch.setattr(_fast_decode, "decoder_step", lambda *a: calls.append(1) or step(*a))
    tok = torch.full((3, 1), BOS)
    for fast in (False, True):
        model.decoder.fast_decode = fast
        state = _decoder_state(model, use_cache=True)
        with torch.no_grad():
            model.decode(tok, state)
    assert calls == [1]


def test_expand_beams_groups_the_caches_only_without_a_reason():
    model = _model()
    tok = torch.full((3, 1), BOS)
    kinds = []
    for fast in (True, False):
        model.decoder.fast_decode = fast
        state = _decoder_state(model, use_cache=True)
        with torch.no_grad():
            _, state = model.decode(tok, state)
            state = model.expand_beams(state, 2)
        kinds.append(type(state.self_caches[0]))
    assert kinds == [BeamKVCache, KVCache]


def test_the_scripted_step_says_why_it_does_not_run():
    model = _model()
    tok = torch.full((3, 1), BOS)
    plans = []
    for activation in (None, nn.Mish()):
        if activation is not None:
            for blk in model.decoder.blks:
                blk.ffn.activation = activation
        state = _decoder_state(model, use_cache=True)
        with torch.no_grad():
            model.decode(tok, state)
        plans.append(state.step_plan)
    if _scripted.scripted_step() is None:
        pytest.skip("TorchScript cannot script the step here")
    assert plans[0].unscripted is None and plans[0].script_args is not None
    assert plans[1].unscripted == "a feed-forward activation other than ReLU, GELU or swish"
    assert plans[1].script_args is None
