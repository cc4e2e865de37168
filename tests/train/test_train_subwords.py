"""``qkv train --tokenizer spm.model`` (a SentencePiece model of the user's, used as it is) and
subword regularisation (``--subword-alpha``): trained with, resumed exactly, never sampled at
validation or evaluation."""

from __future__ import annotations

import io
import json
import signal

import pytest
import torch

spm = pytest.importorskip("sentencepiece")

from _train_helpers import ENDED, kill_when_checkpointed, qkv_here, tiny_config  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from qkv._errors import SettingError  # noqa: E402
from qkv.data import TokenBatcher, bundled_pairs, encode_pairs  # noqa: E402
from qkv.inference import load_model  # noqa: E402
from qkv.train import TrainConfig, train  # noqa: E402
from qkv.train.checkpoint import latest_checkpoint  # noqa: E402
from qkv.train.validation import validation_loss  # noqa: E402
from qkv.translate import Translator  # noqa: E402


def _user_model(path, texts, **ids):
    """A SentencePiece model as ``spm_train`` makes it (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, no
    pad unless ``ids`` says), written to ``path``."""
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buf,
        vocab_size=250,
        model_type="unigram",
        minloglevel=2,
        **ids,
    )
    path.write_bytes(buf.getvalue())
    return path


@pytest.fixture(scope="module")
def user_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("spm")
    pairs = bundled_pairs()[:3000]
    src = [s for s, _ in pairs]
    tgt = [t for _, t in pairs]
    return {
        "joint": _user_model(d / "joint.model", src + tgt),
        "src": _user_model(d / "en.model", src),
        "tgt": _user_model(d / "fr.model", tgt, bos_id=0, pad_id=1, eos_id=2, unk_id=3),
    }


def _sp(path):
    return spm.SentencePieceProcessor(model_file=str(path))


def _pieces(tok, text):
    names = tok.tokens()
    return [names[i] for i in tok.encode(text)]


def _spm_pieces(sp, text):
    return ["<unk>" if i == sp.unk_id() else sp.id_to_piece(i) for i in sp.encode(text)]


def test_a_run_trains_with_the_users_joint_model(tmp_path, corpus_file, user_models):
    cfg = tiny_config(
        data=str(corpus_file), tokenizer="auto", tokenizer_model=str(user_models["joint"])
    )
    res = train(cfg, tmp_path / "run", progress=False)
    saved = load_model(res.final_model)
    assert saved.src_tokenizer is saved.tgt_tokenizer
    sp = _sp(user_models["joint"])
    assert saved.src_tokenizer.vocab_size == sp.get_piece_size() + 1  # a pad id added
    assert saved.model.config.src_vocab_size == saved.src_tokenizer.vocab_size
    assert saved.model.config.share_embeddings is True
    for src, _ in bundled_pairs()[:40]:
        text = saved.src_tokenizer.normalize(src)
        assert _pieces(saved.src_tokenizer, text) == _spm_pieces(sp, text)
    resolved = json.loads((res.last_checkpoint / "trainer.json").read_text())["resolved_config"]
    assert resolved["tokenizer"] == "sentencepiece" and resolved["joint_vocab"] is True
    assert resolved["vocab_size"] is None
    assert resolved["tokenizer_model"] == str(user_models["joint"].resolve())


def test_a_run_trains_with_one_model_per_side(tmp_path, corpus_file, user_models):
    models = [str(user_models["src"]), str(user_models["tgt"])]
    cfg = tiny_config(data=str(corpus_file), tokenizer="auto", tokenizer_model=models)
    res = train(cfg, tmp_path / "run", progress=False)
    saved = load_model(res.final_model)
    src_tok, tgt_tok = saved.src_tokenizer, saved.tgt_tokenizer
    assert src_tok is not tgt_tok
    sp_src, sp_tgt = _sp(models[0]), _sp(models[1])
    assert src_tok.vocab_size == sp_src.get_piece_size() + 1
    assert tgt_tok.vocab_size == sp_tgt.get_piece_size()  # fairseq's layout: all four there
    for src, tgt in bundled_pairs()[:40]:
        assert _pieces(src_tok, src_tok.normalize(src)) == _spm_pieces(
            sp_src, src_tok.normalize(src)
        )
        assert _pieces(tgt_tok, tgt_tok.normalize(tgt)) == _spm_pieces(
            sp_tgt, tgt_tok.normalize(tgt)
        )
    assert Translator.load(res.final_model).translate(["go ."])  # it translates


@pytest.mark.parametrize(
    ("changes", "key", "match"),
    [
        ({"tokenizer": "word", "subword_alpha": 0.1}, "subword_alpha", "word tokenizer"),
        ({"subword_alpha": 0.1}, "subword_alpha", "the bundled corpus"),
        ({"subword_alpha": -0.1}, "subword_alpha", "a number >= 0"),
        ({"subword_nbest_size": 1}, "subword_nbest_size", "-1 .all segmentations. or an int >= 2"),
        ({"tokenizer_model": "a.model", "vocab_size": 300}, "vocab_size", "the model's vocabulary"),
        ({"tokenizer_model": "a.model", "tokenizer": "word"}, "tokenizer", "'sentencepiece'"),
        (
            {"tokenizer_model": ["a.model", "b.model"], "joint_vocab": True},
            "joint_vocab",
            "two models",
        ),
        ({"tokenizer_model": "a.model", "joint_vocab": False}, "joint_vocab", "one model"),
        ({"tokenizer_model": ["a", "b", "c"]}, "tokenizer_model", "two files"),
    ],
)
def test_bad_subword_settings_are_named(changes, key, match):
    with pytest.raises(SettingError, match=match) as e:
        TrainConfig().updated(changes)
    assert e.value.key == key


def test_the_cli_names_the_flags(tmp_path, corpus_file, user_models):
    m = str(user_models["joint"])
    res = qkv_here("train", "--data", str(corpus_file), "--out", str(tmp_path / "a"),
                   "--tokenizer", m, m, m)  # fmt: skip
    assert res.returncode == 2 and "--tokenizer: expected one SentencePiece model" in res.stderr
    res = qkv_here("train", "--out", str(tmp_path / "b"), "--subword-alpha", "0.1")
    assert res.returncode == 2 and "--subword-alpha: expected 0 with the word" in res.stderr
    res = qkv_here("train", "--data", str(corpus_file), "--out", str(tmp_path / "c"),
                   "--tokenizer", str(tmp_path / "nope.model"))  # fmt: skip
    assert res.returncode == 2 and "--tokenizer: expected a SentencePiece .model file" in res.stderr


def test_init_from_keeps_its_tokenizers(tmp_path, corpus_file, trained, user_models):
    cfg = tiny_config(data=str(corpus_file), tokenizer="auto", normalizer="auto",
                      tokenizer_model=str(user_models["joint"]))  # fmt: skip
    with pytest.raises(SettingError, match="tokenizer_model: the model's own tokenizers"):
        train(cfg, tmp_path / "run", init_from=trained["transformer"], progress=False)


def _sampled(**changes):
    base = dict(tokenizer="sentencepiece", vocab_size=200, byte_fallback=False, subword_alpha=0.3, max_steps=40,
                eval_every=20, save_every=10)  # fmt: skip
    return {**base, **changes}


def test_sampling_changes_training_and_never_validation(tmp_path, corpus_file):
    plain = train(tiny_config(data=str(corpus_file), **_sampled(subword_alpha=0.0)),
                  tmp_path / "plain", progress=False)  # fmt: skip
    cfg = tiny_config(data=str(corpus_file), **_sampled())
    sampled = train(cfg, tmp_path / "sampled", progress=False)
    a = load_file(latest_checkpoint(plain.out / "checkpoints") / "model.safetensors")
    b = load_file(latest_checkpoint(sampled.out / "checkpoints") / "model.safetensors")
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the batches were sampled
    # the validation loss logged at update 20 is the one of the best segmentation
    ckpt = sampled.out / "checkpoints" / "step-00000020"
    state = json.loads((ckpt / "trainer.json").read_text())
    logged = next(
        h["valid_loss"] for h in state["history"] if h.get("step") == 20 and "valid_loss" in h
    )
    saved = load_model(ckpt)
    tok = saved.src_tokenizer
    from qkv.data import Split
    from qkv.train.run_data import load_run_data

    data = load_run_data(cfg.updated({"normalizer": "book"}), split=Split.from_dict(
        json.loads((ckpt / "split.json").read_text())), tokenizers=(tok, saved.tgt_tokenizer))  # fmt: skip
    kw = dict(max_tokens=512, shuffle=False, rank=0, world_size=1, max_pair_len=64, truncate=True)
    vs, vt = encode_pairs(data.valid, tok, tok, pre_normalized=True)
    best = validation_loss(saved.model, TokenBatcher(vs, vt, **kw), torch.device("cpu"))
    assert round(best, 5) == logged
    ss = tok.sample_encode([s for s, _ in data.valid], alpha=0.3, seed=1)
    st = tok.sample_encode([t for _, t in data.valid], alpha=0.3, seed=2)
    drawn = validation_loss(saved.model, TokenBatcher(ss, st, **kw), torch.device("cpu"))
    assert round(drawn, 5) != logged  # a sampled validation would have shown
    # evaluation and translation: the one best segmentation, the same every time
    final = Translator.load(sampled.final_model)
    sources = [s for s, _ in data.valid[:30]]
    first = final.translate(sources)
    assert final.translate(sources) == first
    assert final.evaluate(data.valid[:30]).bleu == final.evaluate(data.valid[:30]).bleu


def test_sampling_is_refused_on_a_prepared_corpus(tmp_path, corpus_file):
    cfg = tiny_config(data=str(corpus_file), prepare_data="always", **_sampled())
    with pytest.raises(SettingError, match="holds its pairs as tokens only") as e:
        train(cfg, tmp_path / "run", progress=False)
    assert e.value.key == "subword_alpha"


STEPS = 40


def _args(data, out):
    return [
        "train", "--data", str(data), "--out", str(out), "--max-steps", str(STEPS),
        "--save-every", "10", "--eval-every", "1000", "--log-every", "10", "--threads", "1",
        "--max-tokens", "768", "--warmup-steps", "10", "--lr", "3e-3", "--seed", "3",
        "--subword-alpha", "0.3", "--preset", "none",
        "--set", "tokenizer=sentencepiece", "--set", "vocab_size=200", "--set", "byte_fallback=false",
        "--set", "valid=40", "--set", "test=40", "--set", "eval_sentences=10",
        "--set", "model.num_hiddens=32", "--set", "model.ffn_num_hiddens=64",
        "--set", "model.num_heads=2", "--set", "model.num_enc_layers=1",
        "--set", "model.num_dec_layers=1", "--set", "model.dropout=0.1",
    ]  # fmt: skip


@pytest.mark.slow
def test_a_sampled_run_killed_and_resumed_matches_an_uninterrupted_one(tmp_path, corpus_file):
    ref_out, cut_out = tmp_path / "reference", tmp_path / "interrupted"
    code = kill_when_checkpointed(
        _args(corpus_file, cut_out), cut_out / "checkpoints" / "step-00000010"
    )
    assert code == -signal.SIGKILL
    resumed = qkv_here(*_args(corpus_file, cut_out), "--resume")
    assert resumed.returncode in ENDED, resumed.stderr
    assert "resumed at update" in resumed.stderr and "subword sampling alpha 0.3" in resumed.stderr
    reference = qkv_here(*_args(corpus_file, ref_out))
    assert reference.returncode in ENDED, reference.stderr
    a = latest_checkpoint(ref_out / "checkpoints")
    b = latest_checkpoint(cut_out / "checkpoints")
    assert a.name == b.name == f"step-{STEPS:08d}"
    ta = json.loads((a / "trainer.json").read_text())
    tb = json.loads((b / "trainer.json").read_text())
    assert ta["data"]["epoch"] >= 2  # epochs were sampled after the resume point
    assert ta["data"] == tb["data"] and ta["target_tokens"] == tb["target_tokens"]
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    for k in wa:
        assert torch.equal(wa[k], wb[k]), f"{k} differs after resuming"
    la = {h["step"]: h["loss"] for h in ta["history"] if "loss" in h}
    lb = {h["step"]: h["loss"] for h in tb["history"] if "loss" in h}
    assert la == lb


def _lengthening(kind: str):
    """A tokenizer of ``kind`` trained on the bundled pairs and the run data of those pairs."""
    from types import SimpleNamespace

    from qkv.data import SentencePieceTokenizer

    pairs = bundled_pairs()[:4000]
    tok = SentencePieceTokenizer.train(
        [s for s, _ in pairs] + [t for _, t in pairs], vocab_size=2000, model_type=kind
    )
    train_pairs = [(tok.normalize(s), tok.normalize(t)) for s, t in pairs]
    return SimpleNamespace(train=train_pairs, prepared=None, src_tokenizer=tok, tgt_tokenizer=tok)


def test_sampling_that_lengthens_the_sentences_much_is_said_with_its_fix():
    """Unigram sampling over all segmentations with a small alpha, or BPE-dropout with a large
    probability, draws sentences of many more pieces than their best segmentation (unigram
    alpha 0.1 doubled them on benchmarks/real.py's English-French corpus, and the run learned
    far slower): the greeting says so, with the settings that sample closer for that model; a
    mild setting, a prepared corpus and no sampling say nothing."""
    from types import SimpleNamespace

    from qkv.train.loop import _long_samples
    from qkv.train.subwords import LONG_SAMPLES, sampled_length_ratios

    cfg = TrainConfig(tokenizer="sentencepiece")
    unigram = _lengthening("unigram")
    wild = sampled_length_ratios(cfg.updated({"subword_alpha": 0.05}), unigram)
    mild = sampled_length_ratios(cfg.updated({"subword_alpha": 0.5}), unigram)
    assert min(wild) > LONG_SAMPLES and max(mild) < 1.2
    assert _long_samples(cfg.updated({"subword_alpha": 0.05}), unigram) == (
        f"subword sampling alpha 0.05 over all segmentations gives the training sentences "
        f"{wild[0]:.2f} (source) and {wild[1]:.2f} (target) times the pieces of their best "
        "segmentation: each batch holds that many times fewer sentences, and the model learns "
        "far slower; a larger --subword-alpha (0.5) or --subword-nbest-size 64 samples closer "
        "to the best"
    )
    assert _long_samples(cfg.updated({"subword_alpha": 0.5}), unigram) == ""
    # the two best segmentations only: close to the best, nothing to say
    assert (
        _long_samples(cfg.updated({"subword_alpha": 0.05, "subword_nbest_size": 2}), unigram) == ""
    )
    # BPE: alpha drops merges, so more of it lengthens the sentences, and less is the fix
    bpe = _lengthening("bpe")
    ratios = sampled_length_ratios(cfg.updated({"subword_alpha": 0.5}), bpe)
    assert min(ratios) > LONG_SAMPLES
    assert max(sampled_length_ratios(cfg.updated({"subword_alpha": 0.05}), bpe)) < LONG_SAMPLES
    assert _long_samples(cfg.updated({"subword_alpha": 0.5}), bpe) == (
        f"subword sampling (BPE-dropout 0.5) gives the training sentences {ratios[0]:.2f} "
        f"(source) and {ratios[1]:.2f} (target) times the pieces of their best segmentation: "
        "each batch holds that many times fewer sentences, and the model learns far slower; a "
        "smaller --subword-alpha (BPE-dropout's 0.1) drops fewer merges"
    )
    assert sampled_length_ratios(cfg, unigram) is None  # no sampling
    prepared = SimpleNamespace(**{**vars(unigram), "prepared": object()})
    assert sampled_length_ratios(cfg.updated({"subword_alpha": 0.05}), prepared) is None


def test_a_run_whose_sampling_lengthens_the_sentences_says_so_before_its_schedule(
    tmp_path, corpus_file, caplog
):
    cfg = tiny_config(data=str(corpus_file), **_sampled(subword_alpha=0.01, vocab_size=1000, max_steps=1,
                      eval_every=1, save_every=1), tune_decoding=False, average_last=0)  # fmt: skip
    with caplog.at_level("INFO", logger="qkv"):
        train(cfg, tmp_path / "run", progress=False)
    lines = [r.getMessage() for r in caplog.records]
    note = next(i for i, line in enumerate(lines) if line.startswith("note: subword sampling"))
    assert "alpha 0.01 over all segmentations" in lines[note]
    assert lines[note + 1].startswith("schedule:")
