"""Issue 41 rows 11 and 7: the languages of a run are always known (py3langid comes with the
``train`` extra; without it a target in a script of its own is recognised by that script, so
an English->Chinese run still scores with sacreBLEU's ``zh``), and a vocabulary that qkv
chose is never below what SentencePiece needs for the text's characters."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from _train_helpers import ENDED, qkv_here, run_qkv, tiny_config

from qkv._deps import MissingDependency
from qkv.data import languages as L
from qkv.train import TrainConfig, train
from qkv.train.corpus import prepare_corpus
from qkv.train.run_data import vocab_above

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from test_data_languages import SENTENCES
from test_train_languages import scorer_calls

ROOT = Path(__file__).resolve().parents[2]


def _tsv(path: Path, pairs: list[tuple[str, str]]) -> str:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return str(path)


@pytest.fixture
def no_identifier(monkeypatch):
    """py3langid cannot be imported (as when it is not installed)."""
    monkeypatch.setitem(sys.modules, "py3langid", None)
    L._identifier.cache_clear()
    yield
    L._identifier.cache_clear()


def test_the_train_extra_installs_the_language_identifier():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    train_deps = project["optional-dependencies"]["train"]
    assert any(re.match(r"py3langid\b", d) for d in train_deps), train_deps
    pins = (ROOT / "constraints.txt").read_text(encoding="utf-8")
    assert re.search(r"^py3langid==[\d.]+$", pins, re.M)


def test_an_english_chinese_run_without_py3langid_scores_with_zh(
    tmp_path, monkeypatch, no_identifier
):
    pairs = list(zip(SENTENCES["en"], SENTENCES["zh"]))
    data = _tsv(tmp_path / "pairs.tsv", pairs * 3)  # no column names, no suffix: the text says
    seen = scorer_calls(monkeypatch)
    out = tmp_path / "run"
    said = io.StringIO()
    config = tiny_config(data=data, valid=6, test=2, max_steps=4, eval_every=2, save_every=2,
                         eval_sentences=4, tokenizer="sentencepiece", normalizer="plain",
                         vocab_size=600, tune_decoding=False)  # fmt: skip
    train(config, out, progress=True, stream=said)
    with pytest.raises(MissingDependency, match="py3langid"):
        L.detect_language("still unavailable")
    text = said.getvalue()
    assert "recognised by its script" in text and "target zh (confidence 1.00)" in text, text
    assert "BLEU tokenizer zh" in text
    assert seen and set(seen) == {"zh"}, seen  # every validation, the average's included
    trainer = json.loads(next((out / "checkpoints").glob("step-*/trainer.json")).read_text())
    assert trainer["resolved_config"]["tgt_lang"] == "zh"


def _han_pairs(n: int, characters: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` made-up English->Chinese-like pairs: English words, and targets of 4 to 20 Han
    characters drawn (Zipf) from ``characters`` distinct ones: every character frequent enough
    for SentencePiece's 0.9995 coverage to keep most of them."""
    rng = np.random.default_rng(seed)
    han = np.array([chr(0x4E00 + i) for i in rng.choice(20_000, characters, replace=False)])
    p = 1.0 / np.arange(1, characters + 1) ** 0.6
    p /= p.sum()
    words = SENTENCES["en"]
    out = []
    for i in range(n):
        target = "".join(han[rng.choice(characters, rng.integers(4, 21), p=p)]) + "。"
        out.append((f"{words[i % len(words)][:-1]} {i}.", target))
    return out


def test_2000_chinese_pairs_prepare_with_the_default_vocabulary(tmp_path, caplog):
    data = _tsv(tmp_path / "en-zh.tsv", _han_pairs(2000, 1500))
    caplog.set_level("INFO", logger="qkv")
    out = prepare_corpus(TrainConfig(data=data), tmp_path / "bin", workers=1)
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    chosen = manifest["resolved"]["vocab_size"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("vocab_size:")]
    assert len(lines) == 1, lines
    need, used = map(int, re.search(r"needs (\d+)\); using (\d+)", lines[0]).groups())
    assert chosen < need and used == vocab_above(need)  # the preset's size was too small
    assert report["vocab_size"][0] >= need  # the tokenizer holds every character kept


def test_a_vocabulary_the_user_gave_too_small_is_one_line_naming_the_setting(tmp_path):
    data = _tsv(tmp_path / "en-zh.tsv", _han_pairs(2000, 1500))
    r = qkv_here("prepare", "--data", data, "--out", str(tmp_path / "bin"),
                 "--set", "vocab_size=500", "--quiet")  # fmt: skip
    assert r.returncode != 0 and r.stderr.strip().count("\n") == 0, r.stderr
    m = re.search(r"vocab_size.* 500 pieces are too few .* needs at least (\d+) .*--set vocab_size=(\d+)",
                  r.stderr)  # fmt: skip
    assert m and m.group(1) == m.group(2) and int(m.group(1)) > 500, r.stderr


@pytest.mark.slow
def test_2000_chinese_pairs_train_with_the_defaults(tmp_path):
    data = _tsv(tmp_path / "en-zh.tsv", _han_pairs(2000, 1500))
    r = run_qkv("train", "--data", data, "--out", str(tmp_path / "run"), "--set", "max_steps=2",
                "--set", "eval_sentences=4", "--set", "tune_decoding=false", timeout=600)  # fmt: skip
    assert r.returncode in ENDED, r.stderr[-3000:]  # 2 updates learn nothing: status 3
    assert re.search(r"vocab_size: \d+ pieces are too few .* using \d+", r.stderr + r.stdout)
