"""qkv -> CTranslate2: the exported model translates the same text as qkv (greedy fp32), for
both tokenizers, every positional encoding, pre- and post-norm; int8 runs."""

from __future__ import annotations

import contextlib
import io
import logging
import sys

import pytest
import torch

from qkv.cli import main
from qkv.data import Normalizer, SentencePieceTokenizer, WordTokenizer, bundled_pairs
from qkv.export import save_model
from qkv.export.ctranslate2 import Ct2Translator, export_ctranslate2
from qkv.inference import default_output_len, load_model
from qkv.nn import Seq2SeqConfig, build_model
from qkv.translate import Translator

log = logging.getLogger(__name__)

PAIRS = bundled_pairs()[:2000]
TEXTS = [s for s, _ in bundled_pairs()[2000:2120]] + [
    "",
    "   ",
    "<eos> go .",
    "<pad> <bos> <unk>",
    "Ça va, Zoë ? ÿ€ 漢字",
]


@pytest.fixture(scope="module")
def tokenizers() -> dict:
    norm = Normalizer.book()
    srcs, tgts = [s for s, _ in PAIRS], [t for _, t in PAIRS]
    sp = {"vocab_size": 400, "byte_fallback": True, "normalizer": norm}
    return {
        "word": (
            WordTokenizer.train(srcs, normalizer=norm),
            WordTokenizer.train(tgts, normalizer=norm),
        ),
        "sentencepiece": (
            SentencePieceTokenizer.train(srcs, **sp),
            SentencePieceTokenizer.train(tgts, **sp),
        ),
    }


def random_model(src, tgt, *, seed: int = 0, eos_bias: float = 1.0, **over):
    """Random weights with every LayerNorm and bias perturbed (a mis-mapped tensor shows) and
    ``<eos>`` made likely, so some translations stop before their length limit."""
    torch.manual_seed(seed)
    kw = {
        "src_vocab_size": src.vocab_size,
        "tgt_vocab_size": tgt.vocab_size,
        "num_hiddens": 32,
        "ffn_num_hiddens": 64,
        "num_heads": 4,
        "num_enc_layers": 2,
        "num_dec_layers": 2,
        "dropout": 0.0,
        **over,
    }
    model = build_model(Seq2SeqConfig(**kw)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("ln.weight", "norm.weight")):
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("pos_encoding.embedding.weight"):
                p.normal_(0.0, 0.5)
        model.decoder.dense.bias[2] += eos_bias
    return model


def _both(tmp_path, model, src, tgt, **kw) -> tuple[list, list, Ct2Translator]:
    folder = save_model(model, src, tgt, tmp_path / "qkv")
    ct2 = export_ctranslate2(folder, tmp_path / "ct2", **kw)
    engine = Ct2Translator(ct2, threads=1)
    qkv = Translator.load(folder)
    return qkv.translate(TEXTS, beam_size=1), engine.translate(TEXTS, beam_size=1), engine


def _agreement(a: list, b: list) -> float:
    assert len(a) == len(b)
    return sum(x == y for x, y in zip(a, b)) / len(a)


@pytest.mark.parametrize("kind", ["word", "sentencepiece"])
def test_greedy_fp32_translates_the_same_text_as_qkv(tokenizers, tmp_path, kind):
    src, tgt = tokenizers[kind]
    want, got, _ = _both(tmp_path, random_model(src, tgt), src, tgt)
    share = _agreement(want, got)
    log.info("%s: CT2 fp32 greedy identical on %.1f%% of %d texts", kind, 100 * share, len(want))
    assert share >= 0.95
    assert got[-5:] == want[-5:]  # blank, literal special tokens, unseen characters
    assert got[TEXTS.index("")] == "" and got[TEXTS.index("   ")] == "   "  # layout kept
    assert sum(len(x) > 0 for x in want) > len(want) // 2  # not a test of empty outputs


@pytest.mark.parametrize(
    "over",
    [
        {"pos_encoding": "sinusoidal", "norm_first": False},
        {"pos_encoding": "sinusoidal", "norm_first": True},
        {"pos_encoding": "learned", "norm_first": False, "max_len": 64},
        {"pos_encoding": "learned", "norm_first": True, "max_len": 64},
        {"pos_encoding": "rotary", "norm_first": False},
        {"pos_encoding": "rotary", "norm_first": True},
        {"pos_encoding": "none", "norm_first": False},
        {"pos_encoding": "none", "norm_first": True},
        {"activation": "gelu", "use_bias": True, "tie_embeddings": True},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
def test_every_position_kind_and_norm_maps_exactly(tokenizers, tmp_path, over):
    src, tgt = tokenizers["word"]
    want, got, _ = _both(tmp_path, random_model(src, tgt, seed=1, **over), src, tgt)
    assert _agreement(want, got) >= 0.95


def test_the_length_limit_is_each_sentences_own(tokenizers, tmp_path):
    src, tgt = tokenizers["word"]
    model = random_model(src, tgt, eos_bias=-1e4)  # never stops: every output hits its limit
    folder = save_model(model, src, tgt, tmp_path / "qkv")
    engine = Ct2Translator(export_ctranslate2(folder, tmp_path / "ct2"), threads=1)
    texts = ["go .", "i lost my keys at the station yesterday ."]
    ids = engine.generate(texts, beam_size=1)
    assert [len(x) for x in ids] == [default_output_len(len(src.encode(t)) + 1) for t in texts]
    assert ids == [Translator.load(folder).translate_ids(t, beam_size=1) for t in texts]
    assert [len(x) for x in engine.generate(texts, max_output_len=7)] == [7, 7]


def test_pad_and_bos_are_never_emitted_as_by_qkv(tokenizers, tmp_path):
    src, tgt = tokenizers["word"]
    model = random_model(src, tgt)
    with torch.no_grad():  # make <pad> and <bos> the likeliest tokens: qkv skips them
        model.decoder.dense.bias[:2] += 4.0
    want, got, _ = _both(tmp_path, model, src, tgt)
    assert _agreement(want, got) >= 0.95


def test_int8_runs_and_its_agreement_is_reported(tokenizers, tmp_path):
    src, tgt = tokenizers["sentencepiece"]
    want, got, engine = _both(tmp_path, random_model(src, tgt), src, tgt, quantize="int8")
    log.info("int8: identical to qkv fp32 on %.1f%% (random weights)", 100 * _agreement(want, got))
    assert len(got) == len(TEXTS) and all(isinstance(t, str) for t in got)
    fp32 = export_ctranslate2(tmp_path / "qkv", tmp_path / "fp32") / "model.bin"
    assert (engine.path / "model.bin").stat().st_size < 0.7 * fp32.stat().st_size


def test_beam_search_runs_with_the_models_decoding(tokenizers, tmp_path):
    src, tgt = tokenizers["word"]
    model = random_model(src, tgt)
    folder = save_model(model, src, tgt, tmp_path / "qkv", decoding={"beam_size": 4})
    engine = Ct2Translator(export_ctranslate2(folder, tmp_path / "ct2"), threads=1)
    assert engine.decoding.beam_size == 4
    want = Translator.load(folder).translate(TEXTS[:40])
    assert _agreement(want, engine.translate(TEXTS[:40])) >= 0.9


def test_a_bahdanau_model_is_refused_and_nothing_written(tokenizers, tmp_path):
    src, tgt = tokenizers["word"]
    model = build_model(
        Seq2SeqConfig(
            src_vocab_size=src.vocab_size,
            tgt_vocab_size=tgt.vocab_size,
            kind="bahdanau",
            embed_size=16,
            num_hiddens=16,
        )
    )
    folder = save_model(model, src, tgt, tmp_path / "qkv")
    with pytest.raises(ValueError, match=r"model: CTranslate2 takes a Transformer.*bahdanau"):
        export_ctranslate2(load_model(folder), tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()


def test_cli_writes_a_folder_both_engines_read(tokenizers, tmp_path):
    src, tgt = tokenizers["word"]
    folder = save_model(random_model(src, tgt), src, tgt, tmp_path / "qkv")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["export", "--model-dir", str(folder), "--out", str(tmp_path / "d"),
                   "--format", "ctranslate2", "--quantize", "int8",
                   "--keep-float-weights"])  # fmt: skip
    assert rc == 0, err.getvalue()
    d = tmp_path / "d"
    assert (d / "ctranslate2" / "model.bin").is_file()
    manifest = (d / "manifest.json").read_text()
    assert "ctranslate2/model.bin" in manifest  # checksummed with the rest
    assert Translator.load(d).translate(TEXTS[:5]) == Translator.load(folder).translate(TEXTS[:5])
    assert len(Ct2Translator(d).translate(TEXTS[:5])) == 5  # the folder or its subfolder
    with pytest.raises(FileNotFoundError, match="no CTranslate2 model"):
        Ct2Translator(folder)


def test_without_ctranslate2_the_command_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # as if not installed
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["export", "--model-dir", str(tmp_path), "--out", str(tmp_path / "d"),
                   "--format", "ctranslate2"])  # fmt: skip
    assert rc == 1 and "pip install 'qkv[ct2]'" in err.getvalue()
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("kind", ["word", "sentencepiece"])
def test_tokenizer_token_strings_index_as_its_ids(tokenizers, kind):
    src, _ = tokenizers[kind]
    strings = src.tokens()
    assert len(strings) == src.vocab_size and strings[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    index = {t: i for i, t in enumerate(strings)}
    for text in TEXTS:
        assert [index[t] for t in src.to_tokens(text)] == src.encode(text)
