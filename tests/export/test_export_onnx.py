"""qkv's modules in graphs: torch.export, torch.compile, and the ONNX translator.

* ``torch.export.export`` of ``qkv.nn.MultiheadAttention``, of ViT's attention and of a
  Transformer encoder succeeds with dynamic sizes and equals eager;
* ``torch.compile(fullgraph=True)`` of a decoder step (the tensor step and the ordinary cached
  decode) traces without a graph break;
* the tensor KV cache (:meth:`TransformerDecoder.step`) equals the preallocated one;
* :func:`qkv.export.onnx.export_onnx`: encoder outputs and step logits equal eager within 1e-5 in
  onnxruntime, and :class:`OnnxTranslator` gives qkv's greedy ids on random sources, post-norm
  and pre-norm.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch.export import Dim

import qkv.export.onnx as onnx_export
from qkv.data import WordTokenizer
from qkv.export.onnx import ONNX_FILES, OnnxTranslator, export_onnx
from qkv.inference import CheckpointError, Decoding, SavedModel, decode_texts, generate_ids
from qkv.nn import MultiheadAttention, MultiHeadSelfAttention, Seq2SeqConfig, build_model
from qkv.nn.kv_cache import TensorKVCache
from qkv.nn.position import PositionalEncoding, _offset
from qkv.nn.transformer import TransformerEncoder

V = 40  # vocabulary of the small translators


def _model(seed: int = 0, **over) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = dict(
        src_vocab_size=V,
        tgt_vocab_size=V,
        num_hiddens=32,
        ffn_num_hiddens=48,
        num_heads=4,
        num_enc_layers=2,
        num_dec_layers=2,
        max_len=64,
    )
    model = build_model(Seq2SeqConfig(**{**cfg, **over})).eval()
    with torch.no_grad():  # perturb the norms and biases a fresh model leaves at 1 and 0
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln." in name or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
        model.decoder.dense.bias[2] += 1.5  # EOS likely: lengths vary
    return model


def _sources(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 16, (n,), generator=g)
    return [[*torch.randint(4, V, (int(L),), generator=g).tolist(), 2] for L in lens]


def _padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    for i, r in enumerate(rows):
        src[i, : len(r)] = torch.tensor(r)
    return src, torch.tensor([len(r) for r in rows])


# ---------------------------------------------------------------------------- torch.export
class _MHA(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.m = MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x, kpm):
        return self.m(x, x, x, key_padding_mask=kpm, need_weights=False)[0]


def test_torch_export_of_multihead_attention_equals_eager():
    torch.manual_seed(1)
    mod = _MHA().eval()
    x, kpm = torch.randn(3, 7, 16), torch.zeros(3, 7, dtype=torch.bool)
    kpm[1, 4:] = True
    b, n = Dim("b", min=1, max=64), Dim("n", min=2, max=256)
    ep = torch.export.export(mod, (x, kpm), dynamic_shapes={"x": {0: b, 1: n}, "kpm": {0: b, 1: n}})
    x2, kpm2 = torch.randn(5, 9, 16), torch.rand(5, 9) < 0.4
    kpm2[0] = True  # a sequence with no key: the module's bias, as eager
    torch.testing.assert_close(ep.module()(x2, kpm2), mod(x2, kpm2))
    # torch's default call (weights averaged over heads) exports too
    ep = torch.export.export(mod.m, (x, x, x))
    out, w = ep.module()(x, x, x)
    want, want_w = mod.m(x, x, x)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(w, want_w)


@pytest.mark.slow
def test_onnx_export_of_multihead_attention_runs_in_onnxruntime(tmp_path):
    torch.manual_seed(5)
    mod = _MHA().eval()
    x, kpm = torch.randn(3, 7, 16), torch.zeros(3, 7, dtype=torch.bool)
    kpm[1, 4:] = True
    b, n = Dim("b", min=1, max=64), Dim("n", min=2, max=256)
    with onnx_export._quiet_exporter():
        program = torch.onnx.export(
            mod,
            (x, kpm),
            dynamo=True,
            input_names=["x", "kpm"],
            dynamic_shapes={"x": {0: b, 1: n}, "kpm": {0: b, 1: n}},
            verbose=False,
        )
    program.save(str(tmp_path / "mha.onnx"))
    x2, kpm2 = torch.randn(5, 11, 16), torch.rand(5, 11) < 0.3
    kpm2[0] = True
    (got,) = _session(tmp_path / "mha.onnx").run(None, {"x": x2.numpy(), "kpm": kpm2.numpy()})
    np.testing.assert_allclose(got, mod(x2, kpm2).detach().numpy(), atol=1e-5, rtol=0)


def test_torch_export_of_vit_attention_equals_eager():
    torch.manual_seed(2)
    m = MultiHeadSelfAttention(24, num_heads=3, qkv_bias=True, qk_norm=True).eval()
    x = torch.randn(2, 10, 24)
    ep = torch.export.export(m, (x,), dynamic_shapes={"x": {0: Dim("b"), 1: Dim("n", min=2)}})
    x2 = torch.randn(4, 17, 24)
    torch.testing.assert_close(ep.module()(x2), m(x2))


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_torch_export_of_a_transformer_encoder_equals_eager(norm_first):
    torch.manual_seed(3)
    enc = TransformerEncoder(V, 32, 48, 4, 2, 0.0, norm_first=norm_first, max_len=64).eval()
    X, lens = torch.randint(0, V, (2, 9)), torch.tensor([9, 4])
    b, n = Dim("b", min=1, max=64), Dim("n", min=2, max=64)
    ep = torch.export.export(enc, (X, lens), dynamic_shapes=({0: b, 1: n}, {0: b}))
    X2, lens2 = torch.randint(0, V, (5, 13)), torch.tensor([13, 1, 7, 0, 12])
    torch.testing.assert_close(ep.module()(X2, lens2), enc(X2, lens2))


# ---------------------------------------------------------------------------- the step
@pytest.mark.parametrize(
    "over",
    [{}, {"norm_first": True, "pos_encoding": "rotary"}, {"pos_encoding": "learned"}],
    ids=["post-norm", "pre-norm-rotary", "learned"],
)
def test_the_tensor_step_equals_decoding_with_the_preallocated_cache(over):
    model = _model(4, **over)
    src, lens = _padded(_sources(4, seed=5))
    with torch.no_grad():
        enc = model.encode(src, lens)
        state = model.init_state(enc, lens, use_cache=True)
        ck, cv = model.decoder.cross_kv(enc)
        pk = pv = torch.zeros(2, 4, 4, 0, 8)
        tok = torch.ones(4, 1, dtype=torch.long)
        for _ in range(5):
            want, state = model.decode(tok, state)
            got, pk, pv = model.decoder.step(tok, lens, pk, pv, ck, cv)
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(pk[0], state.self_caches[0].keys)
            torch.testing.assert_close(pv[1], state.self_caches[1].values)
            tok = got[:, -1:].argmax(-1)
    assert pk.shape == (2, 4, 4, 5, 8)


class _Step(torch.nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.decoder = model.decoder

    def forward(self, tok, lens, pk, pv, ck, cv):
        return self.decoder.step(tok, lens, pk, pv, ck, cv)


def test_torch_export_of_the_step_takes_any_past_length_from_0():
    model = _model(11, pos_encoding="learned")
    src, lens = _padded(_sources(2, seed=12))
    with torch.no_grad():
        ck, cv = model.decoder.cross_kv(model.encode(src, lens))
    b, s = Dim("b", min=1, max=64), Dim("s", min=1, max=64)
    t = Dim("t", min=0, max=63)  # positions inside the learned table
    past = {1: b, 3: t}
    ep = torch.export.export(
        _Step(model),
        (torch.ones(2, 1, dtype=torch.long), lens, *torch.randn(2, 2, 2, 4, 3, 8), ck, cv),
        dynamic_shapes=({0: b}, {0: b}, past, past, {1: b, 3: s}, {1: b, 3: s}),
    )
    src, lens = _padded(_sources(5, seed=13))
    with torch.no_grad():
        ck, cv = model.decoder.cross_kv(model.encode(src, lens))
        tok = torch.ones(5, 1, dtype=torch.long)
        for T in (0, 6):
            pk, pv = torch.randn(2, 2, 5, 4, T, 8)
            got = ep.module()(tok, lens, pk, pv, ck, cv)
            for g, w in zip(got, model.decoder.step(tok, lens, pk, pv, ck, cv)):
                torch.testing.assert_close(g, w)


def test_a_tensor_cache_appends_and_a_static_one_refuses():
    c = TensorKVCache(torch.zeros(2, 3, 0, 4), torch.zeros(2, 3, 0, 5))
    assert c.empty and c.length == 0
    k, v = c.append(torch.ones(2, 3, 1, 4), torch.ones(2, 3, 1, 5))
    assert k.shape == (2, 3, 1, 4) and v.shape == (2, 3, 1, 5) and c.length == 1
    static = TensorKVCache(torch.zeros(2, 3, 6, 4), torch.zeros(2, 3, 6, 4), static=True)
    assert not static.empty
    with pytest.raises(RuntimeError, match="static"):
        static.append(k, k)
    with pytest.raises(ValueError, match="values: expected"):
        TensorKVCache(torch.zeros(2, 3, 1, 4), torch.zeros(2, 3, 2, 4))


def test_position_offsets_may_be_tensors_and_bad_ones_are_named():
    pe = PositionalEncoding(8, max_len=16)
    X = torch.zeros(1, 2, 8)
    torch.testing.assert_close(pe(X, torch.tensor(3)), pe(X, 3))
    for bad in (-1, 1.5, torch.tensor(1.0), torch.tensor([1, 2])):
        with pytest.raises(ValueError, match="offset: expected a non-negative int"):
            _offset(bad)


@pytest.mark.slow
def test_torch_compile_of_a_decoder_step_has_no_graph_break():
    model = _model(6, norm_first=True)
    src, lens = _padded(_sources(3, seed=7))
    with torch.no_grad():
        enc = model.encode(src, lens)
        ck, cv = model.decoder.cross_kv(enc)
        step = torch.compile(model.decoder.step, fullgraph=True, backend="eager", dynamic=True)
        decode = torch.compile(model.decode, fullgraph=True, backend="eager")
        state = model.init_state(enc, lens, use_cache=True, capacity=8)
        ref_state = model.init_state(enc, lens, use_cache=True, capacity=8)
        pk = pv = torch.zeros(2, 3, 4, 0, 8)
        tok = torch.ones(3, 1, dtype=torch.long)
        for _ in range(3):
            want, ref_state = model.decode(tok, ref_state)
            got, pk, pv = step(tok, lens, pk, pv, ck, cv)
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(decode(tok, state)[0], want)
            tok = want[:, -1:].argmax(-1)


# ---------------------------------------------------------------------------- ONNX
def _saved(model) -> SavedModel:
    words = [f"w{i}" for i in range(V - 4)]
    tok = WordTokenizer.train([" ".join(words)], min_freq=1)
    assert tok.vocab_size == V
    return SavedModel(model, tok, tok, None, None, torch.device("cpu"))


CONFIGS = {
    "post-norm": {},
    "pre-norm-tied-gelu-bias": {
        "norm_first": True,
        "tie_embeddings": True,
        "activation": "gelu",
        "use_bias": True,
    },
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def exported(request, tmp_path_factory):
    model = _model(8, **CONFIGS[request.param])
    out = export_onnx(_saved(model), tmp_path_factory.mktemp("onnx") / "model")
    return model, out


def _session(path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.mark.slow
def test_onnx_encoder_and_step_equal_eager_within_1e_5(exported):
    model, out = exported
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*ONNX_FILES, "tokenizers", "README.md", "card.json", "manifest.json"]
    )
    src, lens = _padded(_sources(6, seed=9))
    enc, step = _session(out / "encoder.onnx"), _session(out / "decoder_step.onnx")
    ck, cv = enc.run(None, {"src": src.numpy(), "src_len": lens.numpy()})
    with torch.no_grad():
        enc_out = model.encode(src, lens)
        want_k, want_v = model.decoder.cross_kv(enc_out)
        np.testing.assert_allclose(ck, want_k.numpy(), atol=1e-5, rtol=0)
        np.testing.assert_allclose(cv, want_v.numpy(), atol=1e-5, rtol=0)
        state = model.init_state(enc_out, lens, use_cache=True)
        pk = np.zeros((2, 6, 4, 0, 8), np.float32)
        pv = np.zeros((2, 6, 4, 0, 8), np.float32)
        tok = np.ones((6, 1), np.int64)
        for _ in range(4):  # past length 0, 1, 2, 3
            want, state = model.decode(torch.from_numpy(tok), state)
            feed = {"tok": tok, "src_len": lens.numpy(), "past_k": pk, "past_v": pv}
            logits, pk, pv = step.run(None, {**feed, "cross_k": ck, "cross_v": cv})
            np.testing.assert_allclose(logits, want[:, -1].numpy(), atol=1e-5, rtol=0)
            tok = logits.argmax(-1)[:, None].astype(np.int64)


@pytest.mark.slow
def test_onnx_greedy_gives_the_ids_of_qkv_greedy(exported):
    model, out = exported
    sources = _sources(40, seed=10)
    want = generate_ids(model, sources, bos_id=1, eos_id=2)
    lengths = {len(w) for w in want}
    assert len(lengths) > 5  # the EOS bias makes lengths vary, some sentences hit the limit
    translator = OnnxTranslator(out, threads=1)
    assert translator.generate_ids(sources) == want
    assert translator.generate_ids(sources, max_tokens=16) == want  # batching changes nothing
    assert translator.generate_ids(sources, max_output_len=3) == generate_ids(
        model, sources, bos_id=1, eos_id=2, decoding=Decoding(max_output_len=3)
    )
    saved = _saved(model)
    texts = ["w1 w2 w3", "", "w5 w9 w30 w7 w7 w8", "unknown w4"]
    ids = decode_texts(model, texts, saved.src_tokenizer, saved.tgt_tokenizer)
    assert translator.translate(texts) == [saved.tgt_tokenizer.decode(i) for i in ids]


@pytest.mark.slow
def test_export_onnx_refuses_a_folder_with_files_and_keeps_them(exported, tmp_path):
    model, _ = exported
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(ValueError, match=r"out: .* exists and is not empty"):
        export_onnx(_saved(model), tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


def test_export_onnx_reads_a_model_folder_with_load_model(monkeypatch, tmp_path):
    seen = []

    def load_model(path):
        seen.append(path)
        raise CheckpointError("checkpoint: stop here")

    monkeypatch.setattr(onnx_export, "load_model", load_model)
    with pytest.raises(CheckpointError, match="stop here"):
        onnx_export.export_onnx(tmp_path / "run", tmp_path / "out")
    assert seen == [tmp_path / "run"]
    assert not (tmp_path / "out").exists()


def test_export_onnx_and_the_runner_name_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match=r"model: expected a qkv\.inference\.SavedModel"):
        export_onnx(42, tmp_path / "x")
    with pytest.raises(ValueError, match="folder: expected an ONNX model"):
        OnnxTranslator(tmp_path)
    with pytest.raises(ValueError, match="threads: expected an int >= 1"):
        OnnxTranslator(tmp_path, threads=0)
    for f in ONNX_FILES:
        (tmp_path / f).write_text("{}")
    # graphs an older qkv exported, without a manifest
    with pytest.raises(CheckpointError, match=r"has no manifest\.json"):
        OnnxTranslator(tmp_path)
