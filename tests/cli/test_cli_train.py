"""qkv translate / evaluate / demo, and the attention of a translation, for both model kinds."""

from __future__ import annotations

import io
import json

import pytest
import torch
from _folders import assert_not_blank_png

from qkv.cli import main
from qkv.translate import SentenceAttention, Translator, corpus_scores

KINDS = ["transformer", "bahdanau"]


@pytest.mark.parametrize("kind", KINDS)
def test_translate_arguments_and_stdin(trained, kind, capsys, monkeypatch):
    d = str(trained[kind])
    assert main(["translate", "--model-dir", d, "I lost.", "He's calm."]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    tr = Translator.load(d)
    # the CLI normalises as training did: "I lost." is "i lost ."
    assert lines == tr.translate(["i lost .", "he's calm ."])
    monkeypatch.setattr("sys.stdin", io.StringIO("I lost.\nHe's calm.\n"))
    assert main(["translate", "--model-dir", d]) == 0
    assert capsys.readouterr().out.splitlines() == lines


@pytest.mark.parametrize("kind", KINDS)
def test_translate_n_best(trained, kind, capsys):
    d = str(trained[kind])
    assert (
        main(["translate", "--model-dir", d, "--beam", "3", "--n-best", "2", "go .", "i lost ."])
        == 0
    )
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [r[0] for r in rows] == ["0", "0", "1", "1"]
    scores = [float(r[1]) for r in rows]
    assert scores[0] >= scores[1] and scores[2] >= scores[3]
    assert main(["translate", "--model-dir", d, "--beam", "2", "--n-best", "3", "go ."]) == 2
    assert "--n-best" in capsys.readouterr().err


@pytest.mark.parametrize("kind", KINDS)
def test_evaluate_json(trained, kind, capsys, corpus_file):
    d = str(trained[kind])
    assert (
        main(["evaluate", "--model-dir", d, "--data", str(corpus_file), "--limit", "30", "--json"])
        == 0
    )
    out = capsys.readouterr().out
    res = json.loads(out)
    assert res["n"] == 30 and 0 <= res["bleu"] <= 100 and 0 <= res["chrf"] <= 100
    assert (
        res["signatures"]["bleu"].startswith("nrefs:1|") and "chrF" not in res["signatures"]["bleu"]
    )
    assert "nc:6" in res["signatures"]["chrf"]
    # the default data: the run's own test split, scored the same way by hand
    assert main(["evaluate", "--model-dir", d, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["n"] == 40 and "test split" in res["data"]
    assert main(["evaluate", "--model-dir", d]) == 0
    text = capsys.readouterr().out
    assert "BLEU = " in text and "chrF = " in text and "signature: nrefs:1" in text


def test_corpus_scores_match_sacrebleu():
    import sacrebleu

    hyps, refs = (
        ["il est calme .", "je suis chez moi ."],
        ["il est calme .", "je suis à la maison ."],
    )
    ev = corpus_scores(hyps, refs)
    assert ev.bleu == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert ev.chrf == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert corpus_scores(refs, refs).bleu == pytest.approx(100.0)
    with pytest.raises(ValueError, match="hypotheses"):
        corpus_scores(hyps, refs[:1])


def _check_weights(w: torch.Tensor, rows: int, cols: int) -> None:
    assert w.shape[-2:] == (rows, cols)
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5, rtol=0)


def test_attention_api_transformer(trained):
    tr = Translator.load(trained["transformer"])
    att = tr.attention("he's calm .")
    assert isinstance(att, SentenceAttention) and att.kind == "transformer"
    S, T = len(att.src_tokens), len(att.tgt_tokens)
    assert att.src_tokens[-1] == "<eos>" and att.tgt_tokens[-1] == "<eos>"
    assert att.tgt_input_tokens[0] == "<bos>" and att.tgt_input_tokens[1:] == att.tgt_tokens[:-1]
    assert att.translation == tr.translate("he's calm .")
    assert len(att.encoder_self) == 2 and len(att.decoder_self) == 1 and len(att.cross) == 1
    for w in att.encoder_self:
        assert w.shape[0] == 2
        _check_weights(w, S, S)
    for w in att.decoder_self:
        _check_weights(w, T, T)
        assert torch.all(w.triu(1) == 0)  # causal
    for w in att.cross:
        _check_weights(w, T, S)
    _check_weights(att.cross_mean(), T, S)
    torch.testing.assert_close(att.cross_mean(0), att.cross[0].mean(0))
    assert att.bahdanau is None
    names = [k.name for k in att.kinds()]
    assert names == ["encoder self-attention", "decoder self-attention", "cross-attention"]


def test_attention_api_bahdanau(trained):
    tr = Translator.load(trained["bahdanau"])
    att = tr.attention("i lost .")
    S, T = len(att.src_tokens), len(att.tgt_tokens)
    assert att.kind == "bahdanau" and att.encoder_self is None and att.decoder_self is None
    _check_weights(att.bahdanau, T, S)
    assert [k.name for k in att.kinds()] == ["Bahdanau attention"]


@pytest.mark.parametrize("kind", KINDS)
def test_translate_attention_files(trained, kind, tmp_path, capsys):
    d = str(trained[kind])
    png, svg, html = tmp_path / "a.png", tmp_path / "a.svg", tmp_path / "a.html"
    for path in (png, svg, html):
        assert main(["translate", "--model-dir", d, "--attention", str(path), "he's calm ."]) == 0
        assert path.stat().st_size > 1000
    assert_not_blank_png(png)
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg"))
    page = html.read_text()
    assert "<canvas" in page and "http://" not in page.replace("http://www.w3.org", "")
    assert ("Bahdanau attention" if kind == "bahdanau" else "cross-attention") in page
    # several sentences: one file each
    assert (
        main(
            [
                "translate",
                "--model-dir",
                d,
                "--attention",
                str(tmp_path / "m.png"),
                "go .",
                "i lost .",
            ]
        )
        == 0
    )
    assert (tmp_path / "m-1.png").exists() and (tmp_path / "m-2.png").exists()
    assert (
        main(["translate", "--model-dir", d, "--attention", str(tmp_path / "x.gif"), "go ."]) == 2
    )
    assert "--attention" in capsys.readouterr().err


def test_the_demo_floor():
    from qkv.demos.translate import FULL_FLOOR, QUICK_FLOOR, did_not_learn

    assert did_not_learn(None, QUICK_FLOOR) == "it stopped before its first validation"
    assert "below 30" in did_not_learn(29.9, FULL_FLOOR)
    assert did_not_learn(30.0, FULL_FLOOR) is None
    assert did_not_learn(42.0, QUICK_FLOOR, ["va !", ""]) is None
    assert "to nothing" in did_not_learn(42.0, QUICK_FLOOR, ["", " ", "", ""])


def test_demo_default_is_translate():
    from qkv import demos

    assert demos.DEFAULT == "translate"
    assert {"translate", "tour", "masks"} <= set(demos.load())


def test_blank_inputs_translate_to_nothing(trained, capsys, monkeypatch):
    d = str(trained["transformer"])
    tr = Translator.load(d)
    calls = []
    real = tr.model.encode
    monkeypatch.setattr(tr.model, "encode", lambda *a, **k: calls.append(1) or real(*a, **k))
    # a blank text comes back as it is (its layout kept), nothing decoded
    assert tr.translate("") == "" and tr.translate(" \t ") == " \t "
    nothing = [("", 0.0), ("", float("-inf"))]  # n-best: the shape of any text's
    spaces = [("  ", 0.0), ("", float("-inf"))]
    assert tr.translate(["", "  "], beam_size=3, n_best=2) == [nothing, spaces]
    assert tr.translate_ids("   ") == []
    assert not calls  # nothing was decoded
    mixed = tr.translate(["go .", "   ", "i lost ."])
    assert mixed == [tr.translate("go ."), "   ", tr.translate("i lost .")]
    monkeypatch.setattr("sys.stdin", io.StringIO("go .\n\n   \ni lost .\n"))
    assert main(["translate", "--model-dir", d]) == 0
    assert capsys.readouterr().out.splitlines() == [mixed[0], "", "   ", mixed[2]]
    ev = tr.evaluate([("go .", "va !"), (" ", "rien .")])
    assert ev.n == 2 and ev.hypotheses[1] == ""


@pytest.mark.parametrize("kind", KINDS)
def test_attention_is_that_of_the_printed_translation(trained, kind, tmp_path, capsys, monkeypatch):
    d = str(trained[kind])
    texts = ["go .", "he's calm .", "i lost the game and we are all very sad today ."]
    tr = Translator.load(d)
    for text in texts:  # the API: the same decoding as translate()
        want = tr.translate(text, beam_size=4, length_penalty=0.0, max_output_len=7)
        att = tr.attention(text, beam_size=4, length_penalty=0.0, max_output_len=7)
        assert att.translation == want
    seen = []
    real = Translator.attention

    def spy(self, *a, **k):
        att = real(self, *a, **k)
        seen.append(att)
        return att

    monkeypatch.setattr(Translator, "attention", spy)
    out = tmp_path / "att.html"
    args = ["translate", "--model-dir", d, "--beam", "4", "--length-penalty", "0"]
    assert main([*args, "--attention", str(out), *texts]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == len(texts) == len(seen)
    for line, att in zip(printed, seen):
        ids = tr.tgt_tokenizer.encode(line)
        assert att.translation == line and att.tgt_tokens[-1] == "<eos>"
        assert len(att.tgt_tokens) == len(ids) + 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_cuda_without_cuda_is_a_one_line_error(trained, command, capsys):
    d = str(trained["transformer"])
    args = ["go ."] if command == "translate" else ["--limit", "2"]
    assert main([command, "--model-dir", d, "--device", "cuda", *args]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip()
        == f"qkv {command}: error: device: 'cuda' was asked for, but CUDA is not available"
    )
    with pytest.raises(ValueError, match=r"device: expected .* got 'banana'"):
        Translator.load(d, device="banana")
    assert Translator.load(d, device="auto").device == torch.device("cpu")


@pytest.mark.parametrize(
    "args, flag",
    [
        (["translate", "--beam", "0", "go ."], "--beam"),
        (["translate", "--n-best", "0", "go ."], "--n-best"),
        (["translate", "--max-output-len", "0", "go ."], "--max-output-len"),
        (["translate", "--max-len", "0", "go ."], "--max-output-len"),  # its old name
        (["evaluate", "--beam", "0"], "--beam"),
    ],
)
def test_counts_below_one_are_refused(trained, args, flag, capsys):
    d = str(trained["transformer"])
    assert main([args[0], "--model-dir", d, *args[1:]]) == 2
    assert f"error: {flag}: expected >= 1, got 0" in capsys.readouterr().err


def test_saved_run_pairs_are_the_runs_own_split(trained, corpus_file):
    from qkv.data import read_pairs
    from qkv.train import saved_run_pairs

    raw, _ = read_pairs(corpus_file)
    for part in ("valid", "test"):
        pairs, what = saved_run_pairs(trained["transformer"], part)
        assert len(pairs) == 40 and set(pairs) <= set(raw)  # as the file holds them
        assert what == f"the {part} split of {corpus_file.resolve()}"
    valid, _ = saved_run_pairs(trained["transformer"], "valid")
    assert not set(valid) & set(pairs)  # the parts do not overlap
    with pytest.raises(ValueError, match="part: expected one of"):
        saved_run_pairs(trained["transformer"], "dev")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_train_messages_never_land_on_the_progress_line(tmp_path, corpus_file, monkeypatch):
    """Under the qkv command (its stderr handler installed) a run on a terminal still wipes its
    progress line before each message: every ``qkv: ...`` starts on a clean line."""
    import yaml
    from _train_helpers import tiny_config

    # a validation at update 2 of 4: a message while the line of update 1 or 2 is drawn
    config = tiny_config(data=str(corpus_file), max_steps=4, eval_every=2, save_every=2)
    config = config.updated({"tune_decoding": False, "average_last": 0, "log_every": 100})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config.to_dict()))
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    args = ["train", "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "run")]
    assert main(args) == 3  # 4 updates learn nothing: the run says so (the verdict's line)
    text = term.getvalue()
    assert "\r[#" in text and text.count("qkv: ") >= 3  # drawn in place; messages
    starts = [i for i in range(len(text)) if text.startswith("qkv: ", i)]
    for i in starts:
        line = text[:i].rsplit("\n", 1)[-1].rsplit("\r", 1)[-1]
        assert line.replace("\x1b[K", "") == "", repr(text[max(0, i - 80) : i + 20])
