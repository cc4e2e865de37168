"""EncoderDecoder, its config (a saved model rebuilds itself) and attention capture."""

from __future__ import annotations

import json

import pytest
import torch
from _models_helpers import V, batch, tiny

from qkv.nn.seq2seq import AttentionMaps, EncoderDecoder, Seq2SeqConfig, build_model
from qkv.nn.transformer import TransformerDecoder, TransformerEncoder


def test_book_encoder_decoder_forward():
    enc = TransformerEncoder(30, 16, 32, 4, 2, 0.1)
    dec = TransformerDecoder(40, 16, 32, 4, 2, 0.1)
    model = EncoderDecoder(enc, dec)
    src, vl = torch.randint(0, 30, (3, 7)), torch.tensor([7, 2, 5])
    assert model(src, torch.randint(0, 40, (3, 5)), vl).shape == (3, 5, 40)
    assert model.config is None


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(kind="bahdanau"),
        dict(pos_encoding="rotary", norm_first=True, tie_embeddings=True, activation="gelu"),
        dict(pos_encoding="learned", share_embeddings=True, use_bias=True),
        dict(kind="bahdanau", embed_size=32, tie_embeddings=True, share_embeddings=True),
    ],
)
def test_config_round_trip_rebuilds_the_model(overrides, tmp_path):
    model = tiny(**overrides)
    src, vl = batch()
    tgt = torch.randint(3, V, (src.shape[0], 5))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(model.config.to_dict()))
    again = build_model(json.loads(path.read_text())).eval()
    again.load_state_dict(model.state_dict())
    torch.testing.assert_close(again(src, tgt, vl), model(src, tgt, vl))
    assert again.config == model.config
    if overrides.get("tie_embeddings"):
        assert again.decoder.dense.weight is again.decoder.embedding.weight
    if overrides.get("share_embeddings"):
        assert again.encoder.embedding.weight is again.decoder.embedding.weight


@pytest.mark.parametrize(
    ("kw", "arg"),
    [
        (dict(kind="lstm"), "kind"),
        (dict(num_hiddens=30, num_heads=4), "num_hiddens"),
        (dict(num_enc_layers=0), "num_enc_layers"),
        (dict(dropout=1.0), "dropout"),
        (dict(pos_encoding="alibi"), "pos_encoding"),
        (dict(activation="tanh"), "activation"),
        (dict(kind="bahdanau", num_dec_layers=2, num_enc_layers=3), "num_dec_layers"),
        (dict(kind="bahdanau", tie_embeddings=True, embed_size=8), "tie_embeddings"),
        (dict(tgt_vocab_size=11, share_embeddings=True), "share_embeddings"),
        (dict(norm_first="yes"), "norm_first"),
        (dict(pos_encoding="rotary", num_hiddens=12, num_heads=4), "rotary"),
    ],
)
def test_config_errors_name_the_argument(kw, arg):
    base = dict(src_vocab_size=10, tgt_vocab_size=10) | kw
    with pytest.raises(ValueError, match=arg):
        Seq2SeqConfig(**base)


def test_from_dict_rejects_unknown_and_missing_keys():
    with pytest.raises(ValueError, match="unknown Seq2SeqConfig keys \\['layers'\\]"):
        Seq2SeqConfig.from_dict(dict(src_vocab_size=5, tgt_vocab_size=5, layers=3))
    with pytest.raises(ValueError, match="tgt_vocab_size"):
        Seq2SeqConfig.from_dict(dict(src_vocab_size=5))
    with pytest.raises(TypeError, match="config"):
        build_model("transformer")


def test_encoder_decoder_checks_its_parts():
    with pytest.raises(TypeError, match="decoder"):
        EncoderDecoder(TransformerEncoder(10, 8, 16, 2, 1, 0.0), torch.nn.Linear(2, 2))


def test_transformer_attention_maps():
    model = tiny(num_enc_layers=2, num_dec_layers=3)
    src, vl = batch(B=3, L=7)
    tgt = torch.randint(3, V, (3, 5))
    plain = model(src, tgt, vl)
    logits, maps = model(src, tgt, vl, return_attention=True)
    torch.testing.assert_close(logits, plain)
    assert isinstance(maps, AttentionMaps)
    assert [w.shape for w in maps.encoder_self] == [(3, 4, 7, 7)] * 2
    assert [w.shape for w in maps.decoder_self] == [(3, 4, 5, 5)] * 3
    assert [w.shape for w in maps.cross] == [(3, 4, 5, 7)] * 3
    S = int(vl[1])
    one = maps.sentence(1, src_len=S, tgt_len=4)
    assert set(one) == {"encoder_self", "decoder_self", "cross"}
    assert [w.shape for w in one["encoder_self"]] == [(4, S, S)] * 2
    assert [w.shape for w in one["decoder_self"]] == [(4, 4, 4)] * 3
    assert [w.shape for w in one["cross"]] == [(4, 4, S)] * 3
    for ws in one.values():
        for w in ws:  # rows of weights over the sentence's own keys sum to 1
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:2]))
    with pytest.raises(ValueError, match="i: expected"):
        maps.sentence(3)


def test_bahdanau_attention_maps():
    model = tiny("bahdanau")
    src, vl = batch(B=2, L=6)
    _, maps = model(src, torch.randint(3, V, (2, 4)), vl, return_attention=True)
    assert maps.encoder_self is None and maps.decoder_self is None
    assert [w.shape for w in maps.cross] == [(2, 1, 4, 6)]
    one = maps.sentence(0)
    assert set(one) == {"cross"} and one["cross"][0].shape == (1, 4, 6)


def test_attention_maps_need_a_capturing_pass():
    model = tiny()
    src, vl = batch(B=2)
    model(src, torch.randint(3, V, (2, 4)), vl)
    with pytest.raises(RuntimeError, match="return_attention"):
        model.attention_maps()


def test_viz_contract_accepts_the_maps():
    viz = pytest.importorskip("qkv.viz")
    model = tiny()
    src, vl = batch(B=2, L=5)
    _, maps = model(src, torch.randint(3, V, (2, 3)), vl, return_attention=True)
    one = maps.sentence(0, src_len=int(vl[0]), tgt_len=3)
    kinds = viz.translation_attention(
        [f"s{i}" for i in range(int(vl[0]))],
        ["a", "b", "c"],
        encoder=one["encoder_self"],
        decoder=one["decoder_self"],
        cross=one["cross"],
    )
    assert len(kinds) == 3
