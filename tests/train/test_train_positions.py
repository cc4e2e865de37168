"""Issue 17, item 3: a learned positional table (``model.max_len``) bounds what a model reads and
writes. Before: a run whose pairs were longer than the table crashed at some update with
``X: positions up to 27 need a table of at least 28 rows ... max_len=12``, and translating a long
sentence (or any sentence, its default length limit being ``2 * source + 10``) crashed the same
way, for every line of the file.
"""

from __future__ import annotations

import logging
import math

import pytest
from _train_helpers import TINY, tiny_config

from qkv.cli import main
from qkv.data import Normalizer, build_tokenizers, bundled_pairs, write_pairs
from qkv.inference import Decoding, corpus_scores, position_limits, save_model
from qkv.nn.seq2seq import Seq2SeqConfig, build_model
from qkv.train import train
from qkv.train.validation import validation_bleu
from qkv.translate import Translator

TABLE = 12
LEARNED = {**TINY["transformer"], "pos_encoding": "learned", "max_len": TABLE}


def _long_pairs(n: int, k: int = 8):
    """Pairs of ``k`` bundled sentences each (each 2 words or more): longer than the table."""
    base = bundled_pairs()[: n * k]
    return [
        (" ".join(s for s, _ in base[i : i + k]), " ".join(t for _, t in base[i : i + k]))
        for i in range(0, n * k, k)
    ]


def test_training_drops_pairs_longer_than_the_table_and_says_so(tmp_path, caplog):
    data = tmp_path / "d.txt"
    write_pairs(data, bundled_pairs()[:500] + _long_pairs(60))
    cfg = tiny_config(data=str(data), max_steps=4, eval_every=2, save_every=2,
                      tune_decoding=False, valid=60, model=LEARNED)  # fmt: skip
    with caplog.at_level(logging.INFO, logger="qkv"):
        res = train(cfg, tmp_path / "run", progress=True)
    assert res.step == 4  # trained to the end (it crashed at an update before)
    greet = next(r.getMessage() for r in caplog.records if "training pairs" in r.getMessage())
    assert f"longer than the model's learned positions (model.max_len={TABLE}) dropped" in greet
    n_dropped = int(greet.split("training pairs (")[1].split()[0])
    assert n_dropped > 0
    assert "X: positions" not in caplog.text


def test_training_where_every_pair_is_too_long_is_refused_before_the_first_update(tmp_path, capsys):
    data = tmp_path / "d.txt"
    write_pairs(data, _long_pairs(120))
    out = tmp_path / "run"
    args = ["train", "--quiet", "--data", str(data), "--out", str(out), "--preset", "none"]
    args += ["--max-steps", "2", "--set", "tokenizer=word", "--set", "valid=10", "--set", "test=10"]
    args += ["--set", "model.pos_encoding=learned", "--set", f"model.max_len={TABLE}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"longer than the model's learned positions (model.max_len={TABLE})" in err
    assert "--set model.max_len=N" in err and err.count("\n") == 1
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())


@pytest.fixture(scope="module")
def translator():
    pairs = bundled_pairs()[:400]
    src, tgt = build_tokenizers(pairs, "word", normalizer=Normalizer.book(), min_freq=1)
    cfg = Seq2SeqConfig(src.vocab_size, tgt.vocab_size, **{**LEARNED, "kind": "transformer"})
    return Translator(build_model(cfg), src, tgt)


def test_the_limits_of_a_model():
    learned = build_model(Seq2SeqConfig(10, 10, pos_encoding="learned", max_len=7))
    assert position_limits(learned) == (7, 7)
    assert position_limits(build_model(Seq2SeqConfig(10, 10))) == (None, None)
    assert position_limits(build_model(Seq2SeqConfig(10, 10, kind="bahdanau"))) == (None, None)


def test_translation_is_capped_at_the_table(translator):
    # an untrained model rarely stops: its default limit (2 * 4 + 10 = 18) is over the table
    out = translator.generate(["go .", "i lost ."])
    assert all(len(ids) <= TABLE for ids in out) and max(map(len, out)) == TABLE  # cut there
    capped = translator.generate(["go ."], max_output_len=500)
    assert len(capped[0]) <= TABLE
    assert translator.generate(["go ."], max_output_len=TABLE)[0] == capped[0]
    # the attention of a translation cut at the table: the rows that produced its tokens
    att = translator.attention("go .", ids=capped[0])
    assert att.cross[0].shape[1] == len(capped[0]) == TABLE
    assert att.tgt_tokens[-1] != "<eos>" and att.tgt_input_tokens[0] == "<bos>"


def test_an_over_long_input_is_reported_for_its_line_only(translator, caplog):
    long_text = _long_pairs(1)[0][0]
    assert len(translator.encode(long_text)) > TABLE
    texts = ["go .", long_text, "i lost ."]
    with caplog.at_level(logging.WARNING, logger="qkv"):
        out = translator.generate(texts)
    assert out[1] == []
    assert out[0] == translator.generate(["go ."])[0]  # the others as they are alone
    assert out[2] == translator.generate(["i lost ."])[0]
    (msg,) = [r.getMessage() for r in caplog.records if "learned positions" in r.getMessage()]
    assert msg.startswith("input 2: more source tokens than the model's 12 learned positions")
    assert "(model.max_len)" in msg
    nbest = translator.generate(texts, beam_size=2, n_best=2)
    assert nbest[1] == [([], -math.inf)] * 2 and len(nbest[0]) == 2
    assert translator.translate(texts, split="none")[1] == ""  # one sentence: the line
    with pytest.raises(ValueError, match=r"text: its source has .* learned positions \(model"):
        translator.attention(long_text, split="none")


def test_validation_bleu_survives_long_sources(translator):
    tr = translator
    (long1, ref1), (long2, ref2) = _long_pairs(2)
    pairs = [("go .", "va !"), (long1, ref1), ("i lost .", "j'ai perdu ."), (long2, ref2)]
    assert all(len(tr.encode(s)) > TABLE for s in (long1, long2))

    def bleu(pairs):
        return validation_bleu(
            tr.model, pairs, tr.src_tokenizer, tr.tgt_tokenizer, "cpu", Decoding(output_len_cap=64)
        )

    ev = bleu(pairs)  # no crash in the middle of a run
    assert ev.n == 4 and ev.references == [t for _, t in pairs]
    hyps = ev.hypotheses
    assert hyps[1] == hyps[3] == ""  # a source longer than the table is not translated
    for i in (0, 2):  # the others translated, each as it is alone
        assert hyps[i] != "" and hyps[i] == bleu([pairs[i]]).hypotheses[0]
    # the BLEU and chrF of those hypotheses against the references, empty ones included
    want = corpus_scores(hyps, ev.references)
    assert (ev.bleu, ev.chrf) == (want.bleu, want.chrf) and math.isfinite(ev.bleu)


def test_qkv_translate_a_file_with_one_long_line(translator, tmp_path, capsys):
    model_dir = save_model(
        translator.model, translator.src_tokenizer, translator.tgt_tokenizer, tmp_path / "m"
    )
    src = tmp_path / "in.txt"
    src.write_text(f"go .\n{_long_pairs(1)[0][0]}\ni lost .\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    args = ["translate", "--model-dir", str(model_dir), "--src", str(src), "--output", str(out)]
    assert main([*args, "--max-len", "100", "--split", "none"]) == 0  # the line: one sentence
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # one line per input
    err = capsys.readouterr().err
    assert "input 2: more source tokens than the model's 12 learned positions" in err
    assert "max_output_len (--max-output-len) 100 is more than the model's 12" in err
    assert "Traceback" not in err
