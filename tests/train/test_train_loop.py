"""The loop's options: accumulation, bf16, early stopping, the time limit, a non-finite loss."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import pytest
import torch
from _train_helpers import tiny_config

from qkv.train import TrainingError, train
from qkv.train.checkpoint import latest_checkpoint


def test_accumulation_and_bf16_run(tmp_path, corpus_file):
    cfg = tiny_config(data=str(corpus_file), max_steps=6, accum_steps=2, bf16=True,
                      eval_every=6, save_every=6, log_every=2)  # fmt: skip
    res = train(cfg, tmp_path, progress=False)
    assert res.step == 6 and res.stopped == "max_steps"
    state = json.loads((latest_checkpoint(tmp_path / "checkpoints") / "trainer.json").read_text())
    losses = [h["loss"] for h in state["history"] if "loss" in h]
    assert len(losses) == 3 and all(x == x for x in losses)  # finite, logged every 2 updates


def test_early_stopping(tmp_path, corpus_file, monkeypatch):
    # a validation BLEU that never improves after the first evaluation
    monkeypatch.setattr(
        "qkv.train.loop.validation_bleu",
        lambda *a, **k: SimpleNamespace(bleu=5.0, chrf=1.0, n=1),
    )
    cfg = tiny_config(data=str(corpus_file), max_steps=50, eval_every=3, patience=2)
    res = train(cfg, tmp_path, progress=False)
    assert res.stopped == "early_stopping" and res.step == 9
    assert res.best_step == 3 and res.best_checkpoint.name == "step-00000003"


def test_time_limit(tmp_path, corpus_file):
    res = train(tiny_config(data=str(corpus_file), max_steps=10_000, max_minutes=1e-4),
                tmp_path, progress=False)  # fmt: skip
    assert res.stopped == "max_minutes" and res.step < 10_000
    assert latest_checkpoint(tmp_path / "checkpoints").name == f"step-{res.step:08d}"


def test_non_finite_loss_stops_with_a_clear_message(tmp_path, corpus_file, monkeypatch):
    from qkv.train import losses

    real = losses.sequence_loss

    def poisoned(logits, target, **kw):
        loss, nll, n = real(logits, target, **kw)
        return loss * float("nan"), nll, n

    monkeypatch.setattr("qkv.train.loop.sequence_loss", poisoned)
    with pytest.raises(TrainingError, match="non-finite at update 1") as info:
        train(tiny_config(data=str(corpus_file)), tmp_path, progress=False)
    assert "no checkpoint was written yet" in str(info.value)
    assert "intact" not in str(info.value)


def test_non_finite_loss_after_a_checkpoint_names_it(tmp_path, corpus_file, monkeypatch):
    from qkv.train import losses

    real = losses.sequence_loss
    calls = []

    def poisoned_later(logits, target, **kw):
        loss, nll, n = real(logits, target, **kw)
        calls.append(1)
        return (loss * float("nan") if len(calls) > 3 else loss), nll, n

    monkeypatch.setattr("qkv.train.loop.sequence_loss", poisoned_later)
    cfg = tiny_config(data=str(corpus_file), save_every=2, eval_every=100)
    with pytest.raises(TrainingError, match=r"update 4 .*the last checkpoint \(step-00000002"):
        train(cfg, tmp_path, progress=False)


def test_progress_lines(tmp_path, corpus_file):
    import io

    buf = io.StringIO()
    train(tiny_config(data=str(corpus_file), max_steps=10, eval_every=10), tmp_path,
          stream=buf)  # fmt: skip
    text = buf.getvalue()
    assert "qkv train: new run; transformer model" in text
    assert "] 5/10 loss " in text and "tok/s" in text and " lr " in text
    assert "valid @ 10: loss" in text and "BLEU" in text


@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is not None, reason="tensorboard is installed"
)
def test_tensorboard_missing_is_a_clear_error(tmp_path, corpus_file):
    with pytest.raises(ImportError, match="pip install"):
        train(tiny_config(data=str(corpus_file), tensorboard=True), tmp_path, progress=False)


def test_bad_arguments():
    with pytest.raises(TypeError, match="config"):
        train({"max_steps": 3}, "x")
    assert torch.get_num_threads() >= 1


def test_sentencepiece_with_shared_and_tied_embeddings(tmp_path, corpus_file):
    from safetensors.torch import load_file

    from qkv.translate import Translator

    cfg = tiny_config(
        data=str(corpus_file), max_steps=4, eval_every=4, save_every=4, tokenizer="sentencepiece",
        vocab_size=120, joint_vocab=True, byte_fallback=False,
    ).updated({"model.share_embeddings": True, "model.tie_embeddings": True})  # fmt: skip
    train(cfg, tmp_path, progress=False)
    ckpt = latest_checkpoint(tmp_path / "checkpoints")
    assert (ckpt / "tokenizers" / "joint" / "spm.model").is_file()
    stored = load_file(ckpt / "model.safetensors")
    aliases = json.loads((ckpt / "model.json").read_text())["aliases"]
    assert len(aliases) == 2  # one embedding matrix stored once, used three times
    assert not set(aliases) & set(stored)
    tr = Translator.load(tmp_path)
    m = tr.model
    assert m.encoder.embedding.weight is m.decoder.embedding.weight
    att = tr.attention("he's calm .")
    assert att.src_tokens[-1] == "<eos>" and len(att.cross[0][0]) == len(att.tgt_tokens)
    for name, t in m.state_dict().items():
        ref = stored[aliases.get(name, name)]
        assert torch.equal(t, ref), name


def test_resuming_an_early_stopped_run_does_nothing(tmp_path, corpus_file, monkeypatch):
    import io

    monkeypatch.setattr(
        "qkv.train.loop.validation_bleu",
        lambda *a, **k: SimpleNamespace(bleu=5.0, chrf=1.0, n=1),
    )
    cfg = tiny_config(data=str(corpus_file), max_steps=50, eval_every=3, patience=2)
    res = train(cfg, tmp_path, progress=False)
    assert res.stopped == "early_stopping" and res.step == 9
    ckpt = latest_checkpoint(tmp_path / "checkpoints")
    assert json.loads((ckpt / "trainer.json").read_text())["stopped"] == "early_stopping"
    before = (ckpt / "model.safetensors").read_bytes()
    buf = io.StringIO()
    again = train(cfg, tmp_path, resume=True, stream=buf)
    assert again.stopped == "early_stopping" and again.step == 9
    assert "already stopped early at update 9" in buf.getvalue()
    assert latest_checkpoint(tmp_path / "checkpoints") == ckpt
    assert (ckpt / "model.safetensors").read_bytes() == before
    # more patience goes on: one more evaluation without a better BLEU, then it stops again
    more = train(cfg.updated({"patience": 3}), tmp_path, resume=True, progress=False)
    assert more.stopped == "early_stopping" and more.step == 12
