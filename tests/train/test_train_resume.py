"""Resuming is exact: a run killed (SIGKILL) after a checkpoint and resumed ends with bitwise the
same weights, optimizer state and data position as a run that was never interrupted."""

from __future__ import annotations

import json
import signal

import pytest
import torch
from _train_helpers import ENDED, kill_when_checkpointed, qkv_here
from safetensors.torch import load_file

from qkv.train.checkpoint import latest_checkpoint

STEPS = 40


def _train_args(data, out):
    return [
        "train", "--data", str(data), "--out", str(out), "--max-steps", str(STEPS),
        "--save-every", "10", "--eval-every", "1000", "--log-every", "10", "--threads", "1",
        "--max-tokens", "768", "--warmup-steps", "10", "--lr", "3e-3", "--seed", "3",
        "--set", "valid=40", "--set", "test=40", "--set", "eval_sentences=10",
        "--set", "model.num_hiddens=32", "--set", "model.ffn_num_hiddens=64",
        "--set", "model.num_heads=2", "--set", "model.num_enc_layers=2",
        "--set", "model.num_dec_layers=1", "--set", "model.dropout=0.2",
        "--set", "average_last=1", "--set", "tune_decoding=false",
    ]  # fmt: skip


def _final(out):
    ckpt = latest_checkpoint(out / "checkpoints")
    assert ckpt is not None and ckpt.name == f"step-{STEPS:08d}", ckpt
    return ckpt


def test_killed_and_resumed_run_matches_an_uninterrupted_one(tmp_path, corpus_file):
    ref_out, cut_out = tmp_path / "reference", tmp_path / "interrupted"

    # the interrupted run: SIGKILL as soon as its first checkpoint is on disk
    args = _train_args(corpus_file, cut_out)
    code = kill_when_checkpointed(args, cut_out / "checkpoints" / "step-00000010")
    assert code == -signal.SIGKILL
    killed_at = latest_checkpoint(cut_out / "checkpoints")
    assert killed_at is not None and killed_at.name < f"step-{STEPS:08d}", "ran to the end"

    # resume it, and run the reference without interruption
    resumed = qkv_here(*_train_args(corpus_file, cut_out), "--resume")
    assert resumed.returncode in ENDED, resumed.stderr
    assert "resumed at update" in resumed.stderr
    reference = qkv_here(*_train_args(corpus_file, ref_out))
    assert reference.returncode in ENDED, reference.stderr

    a, b = _final(ref_out), _final(cut_out)
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), f"{k} differs after resuming"
    sa = torch.load(a / "trainer.pt", weights_only=True)
    sb = torch.load(b / "trainer.pt", weights_only=True)
    for (i, x), (_, y) in zip(sa["optimizer"]["state"].items(), sb["optimizer"]["state"].items()):
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(x[key], y[key]), f"optimizer {key} of {i} differs"
    assert torch.equal(sa["rng"][0]["torch"], sb["rng"][0]["torch"])
    ta = json.loads((a / "trainer.json").read_text())
    tb = json.loads((b / "trainer.json").read_text())
    assert ta["data"] == tb["data"] and ta["target_tokens"] == tb["target_tokens"]
    # the losses logged after the resume point are the uninterrupted run's
    la = {h["step"]: h["loss"] for h in ta["history"] if "loss" in h}
    lb = {h["step"]: h["loss"] for h in tb["history"] if "loss" in h}
    assert la == lb


def test_resume_of_a_finished_run_changes_nothing(tmp_path, trained):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(trained["transformer"], out)
    before = (latest_checkpoint(out / "checkpoints") / "model.safetensors").read_bytes()
    res = qkv_here("train", "--out", str(out), "--resume", "--quiet")
    assert res.returncode in ENDED, res.stderr
    after = (latest_checkpoint(out / "checkpoints") / "model.safetensors").read_bytes()
    assert before == after


@pytest.mark.parametrize("extra", [["--max-steps", "45"]])
def test_resume_can_extend_a_run(tmp_path, trained, extra):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(trained["transformer"], out)
    res = qkv_here("train", "--out", str(out), "--resume", *extra)
    assert res.returncode in ENDED, res.stderr
    assert latest_checkpoint(out / "checkpoints").name == "step-00000045"
    assert "resumed at update 30" in res.stderr


def _same_weights(a, b):
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_final_evaluation_off_the_grid_does_not_count_toward_patience(
    tmp_path, corpus_file, monkeypatch
):
    from types import SimpleNamespace

    from _train_helpers import tiny_config

    from qkv.train import train

    # a validation BLEU that never improves: patience decides where the run stops
    monkeypatch.setattr(
        "qkv.train.validation.validation_bleu",
        lambda *a, **k: SimpleNamespace(bleu=5.0, chrf=1.0, n=1, hypotheses=[t for _, t in a[1]]),
    )
    cfg = tiny_config(data=str(corpus_file), max_steps=30, eval_every=7, patience=2,
                      save_every=100, threads=1)  # fmt: skip
    ref = train(cfg, tmp_path / "ref", progress=False)
    cut = tmp_path / "cut"
    first = train(cfg.updated({"max_steps": 10}), cut, progress=False)
    assert first.step == 10 and first.stopped == "max_steps"
    res = train(cfg, cut, resume=True, progress=False)
    assert ref.stopped == res.stopped == "early_stopping"
    assert ref.step == res.step == 21
    assert _same_weights(ref.last_checkpoint, res.last_checkpoint)


def test_logged_losses_after_a_kill_between_progress_lines(tmp_path, corpus_file, monkeypatch):
    from _train_helpers import tiny_config

    import qkv.train.loop as loop
    from qkv.train import train

    cfg = tiny_config(data=str(corpus_file), max_steps=20, eval_every=100, save_every=7,
                      log_every=5, threads=1)  # fmt: skip
    ref = train(cfg, tmp_path / "ref", progress=False)
    real = loop.save_checkpoint

    def killed(root, step, **kw):  # killed right after the checkpoint of update 7
        path = real(root, step, **kw)
        if step == 7:
            raise KeyboardInterrupt("killed")
        return path

    monkeypatch.setattr(loop, "save_checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "cut", progress=False)
    monkeypatch.setattr(loop, "save_checkpoint", real)
    res = train(cfg, tmp_path / "cut", resume=True, progress=False)
    assert res.resumed_from == 7
    losses = [{h["step"]: h["loss"] for h in r.history if "loss" in h} for r in (ref, res)]
    assert list(losses[0]) == [5, 10, 15, 20]
    assert losses[0] == losses[1]
    assert _same_weights(ref.last_checkpoint, res.last_checkpoint)
