"""The int8 decoding step (``quantize_model``): its quantized layers called through their kernel,
the self-attention's three projections and the cross-attention's keys and values each one int8
product (stacked weights, per-row scales), give what the layers one by one give: the same
logits to float rounding and the same tokens, at odd sizes; weights replaced between steps are
seen; a quantized model that decoded still saves, loads and pickles."""

from __future__ import annotations

import copy
import io
import pickle
import warnings

import pytest
import torch
from _seq2seq_models import BOS, EOS, batch, tiny
from torch import nn

from qkv.decoding import generate
from qkv.inference import quantize_model
from qkv.nn import _inference

TOL = dict(atol=1e-5, rtol=1e-5)


def _int8(seed: int = 0, **kw) -> nn.Module:
    torch.manual_seed(seed)
    cfg = dict(num_hiddens=35, num_heads=5, ffn_num_hiddens=51, tgt_vocab_size=41)
    cfg.update(kw)
    model = tiny(**cfg)
    with torch.no_grad():
        model.decoder.dense.bias[EOS] += 1.5  # sentences end at different steps
    return quantize_model(model, "int8")


class _Unfused:
    """Every quantized layer called as a module, one by one (what decoding did before)."""

    def __enter__(self) -> None:
        self.int8 = _inference._int8
        _inference._int8 = lambda module, x: False

    def __exit__(self, *exc: object) -> None:
        _inference._int8 = self.int8


def _logits(model, src, lens, n: int = 7) -> list[torch.Tensor]:
    """Logits of ``n`` cached steps on fixed random tokens (the fast step)."""
    g = torch.Generator().manual_seed(9)
    out = []
    with torch.inference_mode():
        state = model.init_state(model.encode(src, lens), lens, use_cache=True, capacity=2)
        tok = torch.full((src.shape[0], 1), BOS)
        for _ in range(n):
            logits, state = model.decode(tok, state)
            out.append(logits)
            tok = torch.randint(3, logits.shape[-1], (src.shape[0], 1), generator=g)
    return out


@pytest.mark.parametrize("kw", [{}, {"use_bias": True}, {"norm_first": True, "num_dec_layers": 3}])
def test_fused_int8_step_equals_the_layers_one_by_one(kw):
    model = _int8(seed=1, **kw)
    for seed in range(3):
        src, lens = batch(B=7, L=9, seed=seed)
        fused = _logits(model, src, lens)
        with _Unfused():
            single = _logits(model, src, lens)
        for a, b in zip(fused, single):
            torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("beam", [1, 3])
def test_fused_int8_tokens_equal_the_unfused_ones(beam):
    model = _int8(seed=2)
    for seed in range(3):
        src, lens = batch(B=5 + 2 * seed, L=11, seed=10 + seed)
        kw = dict(max_output_len=13, bos_id=BOS, eos_id=EOS, beam_size=beam)
        fused = generate(model, src, lens, **kw)
        with _Unfused():
            single = generate(model, src, lens, **kw)
        assert fused == single


def test_stacked_int8_product_keeps_each_layer_scale():
    """Three layers of very different ranges (one per-channel, one without bias): the stacked
    product is their outputs side by side."""
    torch.manual_seed(3)
    layers = [nn.Linear(19, 7), nn.Linear(19, 5, bias=False), nn.Linear(19, 6)]
    with torch.no_grad():
        layers[0].weight.mul_(40.0)
        layers[2].weight.mul_(0.01)
    qs = [quantize_model(nn.Sequential(m), "int8")[0] for m in layers[:2]]
    with warnings.catch_warnings():  # a per-channel one, as the per-channel qconfig makes
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        qs.append(
            quantize_dynamic(
                nn.Sequential(layers[2]), {nn.Linear: per_channel_dynamic_qconfig}, torch.qint8
            )[0]
        )
    owner = nn.Module()
    for x in (torch.randn(3, 19), torch.randn(1, 19) * 50):
        with torch.inference_mode():
            fused = _inference.fused_projection(owner, tuple(qs), x)
            single = torch.cat([m(x) for m in qs], dim=1)
        assert fused is not None and fused.shape == (x.shape[0], 18)
        torch.testing.assert_close(fused, single, **TOL)


def test_replaced_int8_weights_are_seen_between_steps():
    """load_state_dict packs new weights: the next step reads them (its plan is remade)."""
    model, other = _int8(seed=4), _int8(seed=5)
    src, lens = batch(B=4, L=6, seed=4)
    with torch.inference_mode():
        state = model.init_state(model.encode(src, lens), lens, use_cache=True)
        tok = torch.full((4, 1), BOS)
        model.decode(tok, state)
        model.decoder.load_state_dict(other.decoder.state_dict())
        after, _ = model.decode(tok, state)
    with _Unfused(), torch.inference_mode():
        state = model.init_state(model.encode(src, lens), lens, use_cache=True)
        model.decoder.load_state_dict(_int8(seed=4).decoder.state_dict())
        model.decode(tok, state)
        model.decoder.load_state_dict(other.decoder.state_dict())
        expected, _ = model.decode(tok, state)
    torch.testing.assert_close(after, expected, **TOL)


def test_a_decoded_int8_model_saves_loads_and_pickles():
    model = _int8(seed=6)
    src, lens = batch(B=6, L=8, seed=6)
    kw = dict(max_output_len=10, bos_id=BOS, eos_id=EOS)
    first = generate(model, src, lens, **kw)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    fresh = _int8(seed=7)
    fresh.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=False))
    assert generate(fresh, src, lens, **kw) == first
    assert generate(pickle.loads(pickle.dumps(model)), src, lens, **kw) == first
    assert generate(copy.deepcopy(model), src, lens, **kw) == first
