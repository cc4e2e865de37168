"""EncoderDecoder, its config (a saved model rebuilds itself) and attention capture."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _seq2seq_models import V, batch, tiny

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
        dict(activation="swish", scale_embedding=False, tie_embeddings=True),
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


@pytest.mark.parametrize("kind", ["transformer", "bahdanau"])
def test_viz_contract_accepts_the_maps(kind, tmp_path):
    """The maps are what qkv.viz expects: per layer ``(B, H, Lq, Lk)`` weights whose rows sum to 1
    over the sentence's real (and, decoder self-attention, earlier) keys and are 0 elsewhere;
    ``sentence()`` crops them to ``(H, Lq, Lk)`` kinds the viewer and the figures draw."""
    viz = pytest.importorskip("qkv.viz")
    model = tiny(kind)
    B, Ls, T = 3, 7, 5
    src, vl = batch(B=B, L=Ls, seed=1)
    i = int(vl.argmin())
    S = int(vl[i])
    assert Ls > S  # the sentence is padded, so the padding's zeros are checked
    _, maps = model(src, torch.randint(3, V, (B, T)), vl, return_attention=True)
    cfg = model.config
    H = cfg.num_heads if kind == "transformer" else 1
    one = maps.sentence(i, src_len=S, tgt_len=T)
    # name: (full per-layer maps, layers, keys each query may see (Lq, Lk), sentence's (Lq, Lk))
    real = torch.arange(Ls) < S
    expected = {"cross": (maps.cross, cfg.num_dec_layers, real.expand(T, Ls), (T, S))}
    if kind == "transformer":
        expected["encoder_self"] = (
            maps.encoder_self,
            cfg.num_enc_layers,
            real.expand(Ls, Ls),
            (S, S),
        )
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        expected["decoder_self"] = (maps.decoder_self, cfg.num_dec_layers, causal, (T, T))
    else:  # the Bahdanau model: a GRU encoder, one additive attention with one head
        assert maps.encoder_self is None and maps.decoder_self is None
        expected["cross"] = (maps.cross, 1, real.expand(T, Ls), (T, S))
    assert set(one) == set(expected)
    for name, (ws, n_layers, seen, (Sq, Sk)) in expected.items():
        assert [w.shape for w in ws] == [(B, H, *seen.shape)] * n_layers, name
        for w, c in zip(ws, one[name], strict=True):
            w = w[i].float()
            torch.testing.assert_close(w.sum(-1), torch.ones(H, seen.shape[0]))  # rows sum to 1 ...
            assert (w.masked_select(~seen) == 0).all(), name  # ... over the keys seen, 0 elsewhere
            # sentence(): its own rows and columns, as float32 on the CPU
            assert c.dtype == torch.float32 and c.device.type == "cpu"
            torch.testing.assert_close(c, w[:, :Sq, :Sk])
    src_tokens, tgt_tokens = [f"s{j}" for j in range(S)], [f"t{j}" for j in range(T)]
    if kind == "transformer":
        kinds = viz.translation_attention(
            src_tokens,
            tgt_tokens,
            encoder=one["encoder_self"],
            decoder=one["decoder_self"],
            cross=one["cross"],
        )
        want = {
            "encoder self-attention": (one["encoder_self"], (S, S)),
            "decoder self-attention": (one["decoder_self"], (T, T)),
            "cross-attention": (one["cross"], (T, S)),
        }
    else:
        kinds = viz.translation_attention(src_tokens, tgt_tokens, bahdanau=one["cross"][0][0])
        want = {"Bahdanau attention": (one["cross"], (T, S))}
    assert [k.name for k in kinds] == list(want)
    for k in kinds:
        layers, shape = want[k.name]
        assert k.num_layers == len(layers) and k.shape == shape
        for layer, w in enumerate(layers):
            assert k.heads(layer) == H and w.shape == (H, *shape)
            for h in range(H):  # the viz draws the model's numbers, unchanged
                np.testing.assert_allclose(k.matrix(layer, h), w[h].numpy(), rtol=1e-6)

    html = viz.save_attention(tmp_path / "maps.html", kinds, title="contract")
    assert "contract" in html.read_text(encoding="utf-8")
    pytest.importorskip("matplotlib")
    png = viz.save_attention(tmp_path / "maps.png", kinds)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
