"""Issue 26: aligned files and --valid/--test from the command line, languages recorded in the
model (given, read from the data, or detected), the scorer following the target language in
training and in ``qkv evaluate`` as ``sacrebleu -l`` scores."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from _train_helpers import ENDED, qkv_here, tiny_config

from qkv._deps import MissingDependency
from qkv.data import Split
from qkv.inference import load_model
from qkv.train import TrainConfig, train
from qkv.train import validation as V
from qkv.train.run_data import character_coverage, run_languages
from qkv.translate import Translator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from test_data_languages import SENTENCES

EN, ZH, DE = SENTENCES["en"], SENTENCES["zh"], SENTENCES["de"]


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    return str(path)


def _zh_files(tmp_path: Path) -> dict[str, str]:
    """train.en/train.zh (15 pairs, each 4 times) and dev.en/dev.zh (the other 5)."""
    return {
        "train.en": _write(tmp_path / "train.en", EN[:15] * 4),
        "train.zh": _write(tmp_path / "train.zh", ZH[:15] * 4),
        "dev.en": _write(tmp_path / "dev.en", EN[15:]),
        "dev.zh": _write(tmp_path / "dev.zh", ZH[15:]),
    }


def _zh_config(files: dict[str, str], **changes) -> TrainConfig:
    return tiny_config(
        data=[files["train.en"], files["train.zh"]],
        valid_data=[files["dev.en"], files["dev.zh"]],
        valid=0.1,
        test=2,
        max_steps=4,
        eval_every=2,
        save_every=2,
        eval_sentences=5,
        tokenizer="sentencepiece",
        normalizer="plain",
        vocab_size=700,
        tune_decoding=False,
        **changes,
    )


def scorer_calls(monkeypatch) -> list[str | None]:
    """The BLEU tokenizer of every validation score a run computes from now on, in order."""
    seen: list[str | None] = []
    real = V.corpus_scores
    monkeypatch.setattr(
        V, "corpus_scores", lambda h, r, **kw: seen.append(kw.get("tokenize")) or real(h, r, **kw)
    )
    return seen


def test_aligned_files_and_a_valid_set_train_a_model_that_knows_its_languages(
    tmp_path, monkeypatch
):
    files = _zh_files(tmp_path)
    seen = scorer_calls(monkeypatch)
    out = tmp_path / "run"
    said = io.StringIO()
    train(_zh_config(files), out, progress=True, stream=said)
    # every validation BLEU of the run (checkpoints, the average) used sacreBLEU's zh tokenizer
    assert seen and set(seen) == {"zh"}, seen
    assert "languages: English (en) -> Chinese (zh), the files' suffixes; BLEU tokenizer zh" in (
        said.getvalue()
    )
    saved = load_model(out)
    assert saved.languages == ("en", "zh")
    meta = json.loads((saved.path / "model.json").read_text(encoding="utf-8"))
    assert meta["languages"] == {"source": "en", "target": "zh"}
    assert Translator.load(out).languages == ("en", "zh")
    # the run's split is the files: the validation part is dev.* exactly, recorded
    split = Split.from_dict(json.loads((saved.path / "split.json").read_text(encoding="utf-8")))
    assert split.n == 65 and split.valid == tuple(range(60, 65)) and len(split.test) >= 2
    # the checkpoints record the languages too, and qkv evaluate scores with zh by itself
    ckpt = sorted((out / "checkpoints").glob("step-*"))[-1]
    assert load_model(ckpt).languages == ("en", "zh")
    ev = Translator.load(out).evaluate(list(zip(EN[15:], ZH[15:])))
    assert ev.tokenize == "zh" and "tok:zh" in ev.signatures["bleu"]


def _near(reference: str) -> str:
    """A Chinese translation close to ``reference``: one character in the middle replaced. One
    13a token per sentence (no spaces, full-width punctuation kept whole), so 13a finds no
    n-gram in common; the zh tokenizer finds most of the characters."""
    m = len(reference) // 2
    return reference[:m] + "的" + reference[m + 1 :]


#: each English sentence's "translation": its reference with one character changed
NEAR = {e: _near(z) for e, z in zip(EN, ZH)}


def _sacrebleu(hyps: list[str], refs: list[str], tokenize: str) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu(hyps, [refs], tokenize=tokenize).score


def test_validation_bleu_of_a_zh_run_is_sacrebleus_zh_score(tmp_path, monkeypatch):
    """The issue's "done when": training's validation BLEU (every checkpoint, the best one
    kept, the average) is the number sacreBLEU gives with tokenize="zh", not 13a's. The
    model's decoding is replaced by near-references, so the score is far from 0 and the two
    tokenizers disagree."""
    files = _zh_files(tmp_path)

    def near_ids(model, sources, src_tok, tgt_tok, *args, **kwargs):
        return [tgt_tok.encode(NEAR[s]) for s in sources]

    scored: list[tuple[list[str], list[str], float, str]] = []
    real = V.corpus_scores

    def record(h, r, **kw):
        ev = real(h, r, **kw)
        scored.append((list(h), list(r), ev.bleu, ev.signatures["bleu"]))
        return ev

    monkeypatch.setattr(V, "decode_texts", near_ids)
    monkeypatch.setattr(V, "corpus_scores", record)
    out = tmp_path / "run"
    train(_zh_config(files), out, progress=False)
    assert len(scored) >= 2  # the scheduled evaluations, and the average's
    for hyps, refs, bleu, signature in scored:
        assert refs == ZH[15:] and hyps == [NEAR[e] for e in EN[15:]]
        assert "tok:zh" in signature
        assert bleu == pytest.approx(_sacrebleu(hyps, refs, "zh"), abs=1e-9)
        assert bleu > 40 and _sacrebleu(hyps, refs, "13a") == 0.0
    # what the run kept is that number
    best = json.loads((out / "checkpoints" / "best.json").read_text(encoding="utf-8"))
    assert best["bleu"] == pytest.approx(scored[0][2], abs=1e-3)


def test_qkv_evaluate_of_a_zh_model_prints_what_sacrebleu_l_en_zh_prints(
    tmp_path, monkeypatch, capsys
):
    """The issue's "done when": for an en->zh model, ``qkv evaluate`` prints the BLEU that
    ``sacrebleu -l en-zh`` prints on the same output and references (and ``--tokenize 13a``
    what ``sacrebleu --tokenize 13a`` prints). The model's output is replaced by near-references
    (a 4-update model translates nothing right, and two scores of 0 would prove nothing)."""
    from qkv.cli import main
    from qkv.translate import Translator as T

    files = _zh_files(tmp_path)
    out = tmp_path / "run"
    train(_zh_config(files), out, progress=False)
    capsys.readouterr()

    def near_ids(self, texts, decoding, progress=None, **options):
        return [[(self.tgt_tokenizer.encode(NEAR[t]), 0.0)] for t in texts]

    monkeypatch.setattr(T, "_decode", near_ids)
    tok = Translator.load(out).tgt_tokenizer
    hyps = [tok.decode(tok.encode(NEAR[e])) for e in EN[15:]]
    assert hyps == [NEAR[e] for e in EN[15:]]  # SentencePiece gives the text back
    hyp_file = _write(tmp_path / "hyp.zh", hyps)
    data = ["--data", files["dev.en"], files["dev.zh"]]
    scores = {}
    for flags in ([], ["--tokenize", "13a"]):
        assert main(["evaluate", "--model-dir", str(out), *data, "--json", *flags]) == 0
        got = json.loads(capsys.readouterr().out)
        sb = subprocess.run(
            [sys.executable, "-m", "sacrebleu", files["dev.zh"], "-i", hyp_file, "-b", "-w", "4"]
            + (["--tokenize", "13a", "-l", "en-zh"] if flags else ["-l", "en-zh"]),
            capture_output=True,
            text=True,
            check=True,
        )
        assert f"{got['bleu']:.4f}" == sb.stdout.strip(), (flags, got, sb.stdout)
        scores[got["tokenize"]] = got["bleu"]
    assert set(scores) == {"zh", "13a"} and scores["zh"] > 40 and scores["13a"] == 0.0
    # the printed report names the tokenizer in sacreBLEU's signature
    assert main(["evaluate", "--model-dir", str(out), *data]) == 0
    text = capsys.readouterr().out
    assert f"BLEU = {scores['zh']:.2f}" in text and "tok:zh" in text


def test_languages_are_read_from_columns_suffixes_fra_names_or_detected(tmp_path):
    pairs = list(zip(EN, ZH))

    def langs(**kw):
        return run_languages(TrainConfig().updated(kw), pairs, kw.get("data_format"))

    assert langs(src_lang="en", tgt_lang="zh-cn")[:2] == ("en", "zh-CN")
    assert langs()[:2] == ("en", "fr")  # the bundled corpus
    tsv = _write(tmp_path / "p.tsv", ["en\tzh"])
    assert langs(data=tsv, src_column="English", tgt_column="zh")[:2] == ("en", "zh")
    assert langs(data=["a.de", "a.en"])[:2] == ("de", "en")
    assert langs(data=str(tmp_path / "deu.txt"), data_format="fra")[:2] == ("en", "de")
    # nothing in the names: detected from a sample, with the confidence said
    src, tgt, how = langs(data=tsv, data_format="fra")
    assert (src, tgt) == ("en", "zh") and "detected in 20 sampled pairs" in how
    assert "confidence" in how
    # one given, the other detected
    src, tgt, how = langs(data=tsv, data_format="fra", src_lang="en")
    assert (src, tgt) == ("en", "zh") and "target zh" in how and "source" not in how


def test_detection_missing_leaves_the_language_unrecorded(tmp_path, monkeypatch):
    import qkv.train.run_data as RD

    def absent(_texts):
        raise MissingDependency("detecting a language", ["py3langid"], ["langid"])

    monkeypatch.setattr(RD, "detect_language", absent)
    src, tgt, how = RD.run_languages(TrainConfig().updated({"data": "x.tsv"}), [("a", "b")], "fra")
    assert (src, tgt) == (None, None)  # Latin script names no language
    assert "--src-lang/--tgt-lang" in how and "qkv[train]" in how
    # a script of its own does
    src, tgt, how = RD.run_languages(TrainConfig().updated({"data": "x.tsv"}), list(zip(EN, ZH)))
    assert (src, tgt) == (None, "zh") and "recognised by its script" in how
    assert "the source language could not be recognised" in how


def test_character_coverage_follows_the_script():
    assert character_coverage(TrainConfig(src_lang="en", tgt_lang="zh")) == 0.9995
    assert character_coverage(TrainConfig(src_lang="ja", tgt_lang="de")) == 0.9995
    assert character_coverage(TrainConfig(src_lang="en", tgt_lang="ar")) == 1.0
    assert character_coverage(TrainConfig()) == 1.0
    assert character_coverage(TrainConfig(tgt_lang="zh", character_coverage=1)) == 1.0
    with pytest.raises(ValueError, match="character_coverage"):
        TrainConfig(character_coverage=0.5)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match=r"^src_lang: .*did you mean 'en'"):
        TrainConfig(src_lang="english")
    with pytest.raises(ValueError, match=r"^tokenize: expected one of 13a, zh"):
        TrainConfig(tokenize="spm")
    with pytest.raises(ValueError, match=r"^valid_data: expected a path, two aligned files"):
        TrainConfig(valid_data=["a", "b", "c"])
    assert TrainConfig(tgt_lang="zh-hans").tgt_lang == "zh-Hans"


def test_a_japanese_target_without_mecab_is_one_line_before_training(tmp_path):
    pytest.importorskip("sacrebleu")
    from qkv._deps import missing

    if not missing(["MeCab", "ipadic"]):
        pytest.skip("MeCab is installed here")
    with pytest.raises(MissingDependency, match=r"pip install 'qkv\[ja\]'"):
        train(tiny_config(tgt_lang="ja"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # before anything was read or written
    r = qkv_here("train", "--tgt-lang", "ja", "--out", str(tmp_path / "r2"))
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "qkv train needs ipadic, mecab-python3: pip install 'qkv[ja]'" in r.stderr


def test_cli_aligned_files_valid_and_pair(tmp_path):
    """The issue's "done when": `qkv train --data train.en train.zh --valid dev.en dev.zh`
    trains and the model knows it is en->zh without a language flag; `--data PREFIX --pair`
    reads PREFIX.SRC and PREFIX.TGT; qkv evaluate prints what sacrebleu -l en-zh prints."""
    files = _zh_files(tmp_path)
    common = ["--max-steps", "4", "--eval-every", "2", "--save-every", "2", "--preset", "none"]
    common += ["--set", "model.num_hiddens=32", "--set", "model.ffn_num_hiddens=64"]
    common += ["--set", "model.num_heads=2", "--set", "model.num_enc_layers=1"]
    common += ["--set", "model.num_dec_layers=1", "--set", "vocab_size=700", "--quiet"]
    common += ["--set", "test=2", "--set", "eval_sentences=5", "--set", "tune_decoding=false"]
    out = tmp_path / "run"
    r = qkv_here(
        "train", "--data", files["train.en"], files["train.zh"], "--valid", files["dev.en"],
        files["dev.zh"], "--out", str(out), *common,
    )  # fmt: skip
    assert r.returncode in ENDED, r.stderr
    assert load_model(out).languages == ("en", "zh")
    # --pair with a prefix
    out2 = tmp_path / "run2"
    prefix = str(tmp_path / "train")
    r = qkv_here(
        "train", "--data", prefix, "--pair", "en-zh", "--valid", str(tmp_path / "dev"),
        "--out", str(out2), *common,
    )  # fmt: skip
    assert r.returncode in ENDED, r.stderr
    assert load_model(out2).languages == ("en", "zh")
    # qkv evaluate == sacrebleu -l en-zh on the same output and references
    r = qkv_here(
        "evaluate", "--model-dir", str(out), "--data", files["dev.en"], files["dev.zh"], "--json"
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["tokenize"] == "zh" and got["languages"] == ["en", "zh"]
    hyps = _write(tmp_path / "hyp.zh", Translator.load(out).translate(EN[15:]))
    sb = subprocess.run(
        [sys.executable, "-m", "sacrebleu", "-l", "en-zh", files["dev.zh"], "-i", hyps, "-b"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"{got['bleu']:.1f}" == sb.stdout.strip()
    # --tokenize overrides, and the signature says so
    r = qkv_here("evaluate", "--model-dir", str(out), "--data", files["dev.en"], files["dev.zh"],
                 "--tokenize", "13a")  # fmt: skip
    assert r.returncode == 0 and "tok:13a" in r.stdout, r.stderr
    # a bad --pair, a bad language: one line naming the flag
    r = qkv_here("train", "--data", prefix, "--pair", "enzh", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "--pair: expected SRC-TGT" in r.stderr, r.stderr
    r = qkv_here("train", "--src-lang", "english", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "--src-lang: expected an ISO 639-1" in r.stderr, r.stderr
