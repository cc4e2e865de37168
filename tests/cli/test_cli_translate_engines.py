"""Fast translation: ``--quantize int8`` (dynamic int8 linear layers), ``--batch-tokens`` in
evaluate, and ``--engine ctranslate2``'s refusals."""

from __future__ import annotations

import sys

import pytest
import torch
from _train_helpers import tiny_config
from torch import nn

from qkv.cli import main
from qkv.data import write_pairs
from qkv.inference import Decoding, check_quantize, decode_texts, load_model, quantize_model
from qkv.translate import Translator

TEXTS = ["go .", "i lost .", "he is calm .", "we are here .", "", "who is it ?"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, corpus_file):
    """One tiny Transformer run (30 updates, about a second)."""
    from qkv.train import train

    out = tmp_path_factory.mktemp("run-speed")
    train(tiny_config("transformer", data=str(corpus_file)), out, progress=False)
    return out


def _linears(model: nn.Module) -> tuple[int, int]:
    from torch.ao.nn.quantized.dynamic import Linear as QLinear

    mods = list(model.modules())
    plain = sum(type(m) is nn.Linear for m in mods)
    return plain, sum(isinstance(m, QLinear) for m in mods)


def test_quantize_model_replaces_every_linear_and_leaves_the_original(run):
    saved = load_model(run)
    before = {k: v.clone() for k, v in saved.model.state_dict().items()}
    plain, _ = _linears(saved.model)
    q = quantize_model(saved.model, "int8")
    assert plain > 0 and _linears(q) == (0, plain)
    assert _linears(saved.model) == (plain, 0)  # the original is untouched
    for k, v in saved.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    # int8 weights: close to fp32, not equal (it did quantize)
    src = torch.tensor([[4, 5, 6, 2]])
    with torch.inference_mode():
        a = saved.model.encode(src, torch.tensor([4]))
        b = q.encode(src, torch.tensor([4]))
    a, b = (x[0] if isinstance(x, tuple) else x for x in (a, b))
    assert not torch.equal(a, b)
    assert (a - b).abs().max() < 0.1 * a.abs().max()


def test_int8_translations_mostly_match_fp32(run):
    fp32 = Translator.load(run)
    int8 = Translator.load(run, quantize="int8")
    assert _linears(int8.model)[0] == 0
    a, b = fp32.translate(TEXTS, beam_size=1), int8.translate(TEXTS, beam_size=1)
    assert b[4] == "" and sum(x == y for x, y in zip(a, b)) >= len(TEXTS) // 2, (a, b)


@pytest.mark.parametrize("bad", ["int4", "float16", 8])
def test_an_unknown_quantization_is_refused(bad):
    with pytest.raises(ValueError, match=r"^quantize: expected one of int8 or None, got"):
        check_quantize(bad)


def test_quantize_on_cuda_is_refused_before_loading(tmp_path):
    # no GPU needed: refused from the device name, before the (missing) model is read
    with pytest.raises(ValueError, match=r"^quantize: int8 runs on the CPU only.*'cuda'"):
        Translator.load(tmp_path / "none", device="cuda", quantize="int8")
    net = nn.Linear(2, 2, device="meta")  # a model that is not on the CPU
    with pytest.raises(ValueError, match=r"^quantize: int8 runs on the CPU only"):
        quantize_model(net)


def test_cli_translate_and_evaluate_with_quantize(run, tmp_path, capsys):
    args = ["--model-dir", str(run), "--beam", "1"]
    assert main(["translate", *args, "--quantize", "int8", *TEXTS[:3]]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == Translator.load(run, quantize="int8").translate(TEXTS[:3], beam_size=1)
    assert main(["evaluate", *args, "--quantize", "int8", "--json", "--limit", "10"]) == 0
    assert '"bleu"' in capsys.readouterr().out
    assert main(["translate", *args, "--quantize", "int8", "--device", "cuda", "go ."]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv translate: error: --quantize: int8 runs on the CPU only")
    assert err.count("\n") == 1


def test_evaluate_batch_tokens_changes_batching_not_scores(run, capsys, monkeypatch):
    import qkv.inference.decode as decode

    calls = []
    real = decode.search_hypotheses

    def counting(*a, **k):
        calls.append(a[1].shape[0])
        return real(*a, **k)

    monkeypatch.setattr(decode, "search_hypotheses", counting)
    base = ["evaluate", "--model-dir", str(run), "--json", "--limit", "20", "--beam", "1"]
    assert main([*base, "--batch-tokens", "4096"]) == 0
    big, n_big = capsys.readouterr().out, len(calls)
    calls.clear()
    assert main([*base, "--batch-tokens", "16"]) == 0
    small, n_small = capsys.readouterr().out, len(calls)
    assert n_big == 1 and n_small > 1 and max(calls) * 4 <= 16 + 4 * 8
    assert big == small
    assert main([*base, "--batch-tokens", "0"]) == 2
    assert capsys.readouterr().err.startswith("qkv evaluate: error: --batch-tokens: expected >= 1")


def test_engine_ctranslate2_missing_is_one_line(run, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # as if not installed
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    assert main(["translate", "--model-dir", str(run), "--engine", "ctranslate2", "go ."]) == 1
    err = capsys.readouterr().err
    assert err == "qkv translate needs ctranslate2: pip install 'qkv[ct2]'\n"


def test_engine_ctranslate2_without_an_exported_model_is_refused(run, capsys):
    assert main(["translate", "--model-dir", str(run), "--engine", "ctranslate2", "go ."]) == 2
    err = capsys.readouterr().err
    assert "holds no CTranslate2 model" in err and err.count("\n") == 1


def test_decode_texts_is_unchanged_by_batching(run):
    saved = load_model(run)
    args = (saved.model, TEXTS, saved.src_tokenizer, saved.tgt_tokenizer)
    for beam in (1, 3):
        whole = decode_texts(*args, Decoding(beam_size=beam, max_tokens=4096))
        assert decode_texts(*args, Decoding(beam_size=beam, max_tokens=8)) == whole


def test_engine_ctranslate2_translates_as_qkv(run, tmp_path, capsys):
    import qkv.export.ctranslate2 as export

    export.export_ctranslate2(run, tmp_path / "ct2")
    texts = TEXTS[:4]
    args = ["--model-dir", str(tmp_path / "ct2"), "--beam", "1"]
    assert main(["translate", *args, *texts]) == 0
    want = capsys.readouterr().out
    for where in (tmp_path / "ct2", tmp_path / "ct2" / "ctranslate2"):  # the folder or its ct2/
        argv = ["translate", "--model-dir", str(where), "--beam", "1", "--engine", "ctranslate2"]
        assert main([*argv, *texts]) == 0
        assert capsys.readouterr().out == want
    ev = ["evaluate", *args, "--engine", "ctranslate2", "--json", "--data"]
    write_pairs(tmp_path / "pairs.txt", [(t, "va .") for t in texts[:3]])
    assert main([*ev, str(tmp_path / "pairs.txt")]) == 0
    assert '"bleu"' in capsys.readouterr().out
    assert main(["translate", *args, "--engine", "ctranslate2", "--n-best", "2", "go ."]) == 2
    assert "--n-best" in capsys.readouterr().err
