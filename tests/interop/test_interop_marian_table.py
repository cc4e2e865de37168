"""The Marian table (qkv.interop.marian) against transformers' own MarianMTModel: a model made
by transformers, read through the table, computes transformers' logits in qkv; written back
through it, it is transformers' model again, tensor for tensor."""

from __future__ import annotations

import pytest
import torch

from qkv._errors import SettingError
from qkv.interop import _table, marian
from qkv.nn import build_model

transformers = pytest.importorskip("transformers")


def _marian(seed: int, **overrides):
    """A MarianMTModel of random weights (every parameter and final_logits_bias drawn, so
    that each permutation is exercised), in evaluation mode."""
    torch.manual_seed(seed)
    kw = dict(
        vocab_size=53,
        d_model=16,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=24,
        decoder_ffn_dim=24,
        max_position_embeddings=64,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=52,
        eos_token_id=0,
        decoder_start_token_id=52,
        dropout=0.0,
    )
    kw.update(overrides)
    model = transformers.MarianMTModel(transformers.MarianConfig(**kw)).eval()
    with torch.no_grad():
        for name, t in model.named_parameters():
            if "embed_positions" not in name:
                t.copy_(torch.randn_like(t) * 0.3)
        model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
    return model


def _tensors(model):
    sd = model.state_dict()
    return lambda name: sd.get(name)


def _batch(model, seed: int):
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    V, Vt = cfg.vocab_size, cfg.decoder_vocab_size
    src = torch.randint(1, V - 1, (3, 9), generator=g)
    src[:, -1] = cfg.eos_token_id
    lens = torch.tensor([9, 6, 3])
    for r, n in enumerate(lens.tolist()):
        src[r, n - 1] = cfg.eos_token_id
        src[r, n:] = cfg.pad_token_id
    tgt = torch.randint(1, Vt - 1, (3, 7), generator=g)
    tgt[:, 0] = cfg.decoder_start_token_id
    return src, lens, tgt


def _hf_logits(model, src, lens, tgt):
    mask = (torch.arange(src.shape[1]) < lens.unsqueeze(1)).long()
    with torch.no_grad():
        return model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits


CONFIGS = {
    "swish-tied": dict(),
    "gelu-noscale": dict(activation_function="gelu", scale_embedding=False),
    "relu-untied-head": dict(activation_function="relu", tie_word_embeddings=False),
    "separate-vocabs": dict(
        share_encoder_decoder_embeddings=False,
        decoder_vocab_size=41,
        pad_token_id=40,
        decoder_start_token_id=40,
    ),
    "separate-untied": dict(share_encoder_decoder_embeddings=False, tie_word_embeddings=False),
    "odd-width": dict(d_model=15, encoder_attention_heads=3, decoder_attention_heads=3),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_marian_model_read_through_the_table_gives_transformers_logits(name):
    hf = _marian(len(name), **CONFIGS[name])
    config, sd = marian.to_qkv(hf.config.to_dict(), _tensors(hf))
    model = build_model(config).eval()
    missing, unexpected = model.load_state_dict(sd, strict=True), None
    assert unexpected is None and not missing.missing_keys
    src, lens, tgt = _batch(hf, 7)
    with torch.no_grad():
        got = model(src, tgt, lens)
    want = _hf_logits(hf, src, lens, tgt)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_table_read_back_gives_transformers_model_tensor_for_tensor(name):
    hf = _marian(100 + len(name), **CONFIGS[name])
    config, sd = marian.to_qkv(hf.config.to_dict(), _tensors(hf))
    model = build_model(config)
    model.load_state_dict(sd)
    back = marian.to_transformers(config, model.state_dict())
    fresh = transformers.MarianMTModel(
        transformers.MarianConfig(**marian_config(config, hf.config))
    ).eval()
    result = fresh.load_state_dict(back, strict=False)
    assert set(result.missing_keys) <= set(marian.POSITIONS), result.missing_keys
    assert not result.unexpected_keys
    want = hf.state_dict()
    for key, t in fresh.state_dict().items():
        assert torch.equal(t, want[key]), key
    src, lens, tgt = _batch(hf, 8)
    assert torch.equal(_hf_logits(fresh, src, lens, tgt), _hf_logits(hf, src, lens, tgt))


def marian_config(config, original):
    """transformers_config of the table, with the original's special ids."""
    return marian.transformers_config(
        config,
        pad_id=original.pad_token_id,
        eos_id=original.eos_token_id,
        decoder_start_id=original.decoder_start_token_id,
    )


def test_the_tensors_decide_sharing_and_tying():
    hf = _marian(3, tie_word_embeddings=False)  # share, but four tensors trained apart
    cfg, _ = marian.to_qkv(hf.config.to_dict(), _tensors(hf))
    assert not cfg.share_embeddings and not cfg.tie_embeddings
    hf = _marian(4)
    cfg, sd = marian.to_qkv(hf.config.to_dict(), _tensors(hf))
    assert cfg.share_embeddings and cfg.tie_embeddings
    assert sd["encoder.embedding.weight"] is sd["decoder.dense.weight"]


def test_the_permutation_turns_marian_positions_into_qkv_positions():
    from qkv.nn.position import sinusoidal_encoding

    for D in (8, 15, 64):
        p = marian.residual_permutation(D)
        assert sorted(p.tolist()) == list(range(D))
        table = marian.sinusoid_table(50, D)
        assert torch.equal(table[:, p], sinusoidal_encoding(torch.arange(50), D))
        q = _table.inverse_permutation(p)
        assert torch.equal(table[:, p][:, q], table)


def test_a_checkpoint_with_another_position_table_is_refused():
    hf = _marian(5)
    sd = hf.state_dict()
    sd["model.encoder.embed_positions.weight"] = sd["model.encoder.embed_positions.weight"][
        :, marian.residual_permutation(16)
    ]  # qkv's interleaved layout: not Marian's
    with pytest.raises(SettingError, match="not Marian's sinusoid table") as e:
        marian.to_qkv(hf.config.to_dict(), sd.get)
    assert e.value.key == "model.encoder.embed_positions.weight"


@pytest.mark.parametrize(
    "change, key",
    [
        (dict(activation_function="gelu_new"), "activation_function"),
        (dict(decoder_attention_heads=2), "decoder_attention_heads"),
        (dict(decoder_ffn_dim=12), "decoder_ffn_dim"),
        (dict(model_type="bart"), "model_type"),
    ],
)
def test_a_config_qkv_cannot_express_is_refused_by_its_field(change, key):
    hf = _marian(6)
    cfg = {**hf.config.to_dict(), **change}
    with pytest.raises(SettingError) as e:
        marian.to_qkv(cfg, _tensors(hf))
    assert e.value.key == key


def test_a_missing_or_misshapen_tensor_is_named():
    hf = _marian(7)
    sd = dict(hf.state_dict())
    del sd["model.decoder.layers.1.fc1.weight"]
    with pytest.raises(SettingError) as e:
        marian.to_qkv(hf.config.to_dict(), sd.get)
    assert e.value.key == "model.decoder.layers.1.fc1.weight"
    sd = dict(hf.state_dict())
    sd["model.encoder.layers.0.fc2.bias"] = torch.zeros(3)
    with pytest.raises(SettingError, match=r"expected shape \(16,\)"):
        marian.to_qkv(hf.config.to_dict(), sd.get)


def test_a_model_marian_cannot_express_is_refused_on_export():
    from qkv.nn import Seq2SeqConfig

    for change, why in (
        (dict(norm_first=True), "pre-norm"),
        (dict(pos_encoding="rotary"), "'rotary' positions"),
        (dict(kind="bahdanau"), "not a Transformer"),
    ):
        c = Seq2SeqConfig(src_vocab_size=10, tgt_vocab_size=10, **change)
        with pytest.raises(ValueError, match=why):
            marian.transformers_config(c, pad_id=0, eos_id=2)


def test_a_qkv_model_without_attention_biases_exports_zero_biases():
    from qkv.nn import Seq2SeqConfig

    c = Seq2SeqConfig(src_vocab_size=30, tgt_vocab_size=30, num_hiddens=16, ffn_num_hiddens=24,
                      num_heads=2, num_enc_layers=1, num_dec_layers=1, dropout=0.0,
                      use_bias=False, tie_embeddings=True, share_embeddings=True)  # fmt: skip
    model = build_model(c).eval()
    sd = marian.to_transformers(c, model.state_dict())
    hf = transformers.MarianMTModel(
        transformers.MarianConfig(**marian.transformers_config(c, pad_id=1, eos_id=2))
    ).eval()
    hf.load_state_dict(sd, strict=False)
    assert torch.equal(sd["model.encoder.layers.0.self_attn.q_proj.bias"], torch.zeros(16))
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    lens = torch.tensor([4, 3])
    tgt = torch.tensor([[1, 5, 6], [1, 7, 8]])
    with torch.no_grad():
        got = model(src, tgt, lens)
    assert (got - _hf_logits(hf, src, lens, tgt)).abs().max().item() < 1e-4
