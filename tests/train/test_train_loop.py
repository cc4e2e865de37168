"""One update (accumulation, weight decay, bf16) and the loop's options: early stopping, the time
limit, a non-finite loss."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _train_helpers import tiny_config

from qkv.train import TrainingError, train
from qkv.train.checkpoint import latest_checkpoint


# ---------------------------------------------------------------- one update (train_update)
def _tiny_model(kind: str = "transformer", **options) -> torch.nn.Module:
    from qkv.nn.seq2seq import Seq2SeqConfig, build_model

    torch.manual_seed(0)
    sizes = (
        {"num_hiddens": 16, "ffn_num_hiddens": 32, "num_heads": 2}
        if kind == "transformer"
        else {"num_hiddens": 16, "embed_size": 8}
    )
    cfg = Seq2SeqConfig(src_vocab_size=23, tgt_vocab_size=23, kind=kind, num_enc_layers=1,
                        num_dec_layers=1, dropout=0.0, **sizes, **options)  # fmt: skip
    return build_model(cfg)


def _batches():
    """Two micro-batches of unequal token counts, and one batch of their union."""
    from qkv.data import TokenBatcher

    gen = torch.Generator().manual_seed(1)
    lengths = [(3, 4), (7, 2), (5, 6), (2, 5), (6, 3), (4, 7), (8, 3)]
    src = [torch.randint(4, 23, (n,), generator=gen).tolist() for n, _ in lengths]
    tgt = [torch.randint(4, 23, (m,), generator=gen).tolist() for _, m in lengths]
    batcher = TokenBatcher(src, tgt, max_tokens=10_000, shuffle=False, rank=0, world_size=1)
    first, second = batcher.collate(np.arange(2)), batcher.collate(np.arange(2, 7))
    union = batcher.collate(np.arange(7))
    assert first.num_tokens != second.num_tokens  # a per-micro-batch mean would differ
    return first, second, union


def _sgd_update(model, micro, **kw):
    """``train_update`` with plain SGD, whose step is ``-lr * gradient``: the parameters
    after it show the gradient the update used."""
    from qkv.train import InverseSqrtSchedule, train_update

    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    schedule = InverseSqrtSchedule(opt, peak_lr=0.5, warmup_steps=1)
    stats = train_update(model, opt, schedule, micro, label_smoothing=0.1, clip_norm=0.0,
                         device=torch.device("cpu"), **kw)  # fmt: skip
    return stats, schedule.lr(1)


def test_accumulating_two_halves_is_one_update_on_their_union():
    import copy

    from qkv.train import sequence_loss

    first, second, union = _batches()
    start = _tiny_model().double()
    accumulated, whole, by_hand = (copy.deepcopy(start) for _ in range(3))
    s_acc, lr = _sgd_update(accumulated, [first, second])
    s_one, _ = _sgd_update(whole, [union])
    # the intended update, by hand: the gradient of the smoothed loss summed over the union's
    # real target tokens, divided by their number (the mean loss per target token)
    logits = by_hand(union.src, union.tgt_in, union.src_valid_lens)
    loss_sum, _, n = sequence_loss(logits, union.tgt_out, label_smoothing=0.1)
    (loss_sum / n).backward()
    with torch.no_grad():
        for p in by_hand.parameters():
            p -= lr * p.grad
    assert s_acc.tokens == s_one.tokens == n == first.num_tokens + second.num_tokens
    assert s_acc.loss_sum == pytest.approx(float(loss_sum.detach()), rel=1e-12)
    assert s_acc.grad_norm == pytest.approx(s_one.grad_norm, rel=1e-10)
    moved = False
    for (name, a), b, c, p0 in zip(accumulated.named_parameters(), whole.parameters(),
                                   by_hand.parameters(), start.parameters()):  # fmt: skip
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-12, msg=name)
        torch.testing.assert_close(b, c, rtol=1e-10, atol=1e-12, msg=name)
        moved |= not torch.equal(a, p0)
    assert moved


@pytest.mark.parametrize(
    "kind, options",
    [
        ("transformer", {}),
        ("transformer", {"use_bias": True, "pos_encoding": "learned", "norm_first": True}),
        ("transformer", {"share_embeddings": True, "tie_embeddings": True}),
        ("bahdanau", {}),
    ],
)
def test_weight_decay_falls_on_weight_matrices_only(kind, options):
    """Decay on the matrices of the linear maps (linear layers, GRU weights); none on biases,
    norms or embeddings, a tied output projection included (it is the embedding)."""
    from qkv.train import TrainConfig, make_optimizer

    model = _tiny_model(kind, **options)
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    norms = {id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm)
             for p in m.parameters()}  # fmt: skip
    expect_decay, expect_none, seen = set(), set(), set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        last = name.rsplit(".", 1)[-1]
        is_bias = last == "bias" or last.startswith("bias_")
        if is_bias or id(p) in norms or id(p) in embeddings:
            expect_none.add(id(p))
        else:
            assert last == "weight" or last.startswith("weight_"), name  # a matrix of a map
            expect_decay.add(id(p))
    assert expect_decay and expect_none
    opt = make_optimizer(model, TrainConfig(weight_decay=0.05, lr=1e-3))
    decay, none = opt.param_groups
    assert decay["weight_decay"] == 0.05 and none["weight_decay"] == 0.0
    assert {id(p) for p in decay["params"]} == expect_decay
    assert {id(p) for p in none["params"]} == expect_none
    assert len(decay["params"]) + len(none["params"]) == len(seen)  # each parameter once


def test_bf16_autocast_runs_the_model_in_bfloat16_with_a_finite_loss():
    first, second, _ = _batches()
    model = _tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    dtypes = []
    hook = model.decoder.dense.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    stats, _ = _sgd_update(model, [first, second], bf16=True)
    hook.remove()
    assert dtypes == [torch.bfloat16, torch.bfloat16]  # each micro-batch under autocast
    assert math.isfinite(stats.loss) and stats.loss > 0 and math.isfinite(stats.grad_norm)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the weights stay fp32
    assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_the_forward_precision_is_one_context_for_the_update_the_validation_and_the_probe():
    from qkv.train.losses import forward_precision

    layer, x = torch.nn.Linear(4, 3), torch.randn(2, 4)
    for device in ("cpu", torch.device("cpu")):
        with forward_precision(device, True):
            assert layer(x).dtype == torch.bfloat16
        with forward_precision(device, False):
            assert layer(x).dtype == torch.float32
    assert layer(x).dtype == torch.float32  # nothing left on after the block


def test_a_run_with_accumulation_and_bf16_logs_finite_losses(tmp_path, corpus_file):
    cfg = tiny_config(data=str(corpus_file), max_steps=6, accum_steps=2, bf16=True,
                      eval_every=6, save_every=6, log_every=2)  # fmt: skip
    res = train(cfg, tmp_path, progress=False)
    assert res.step == 6 and res.stopped == "max_steps"
    state = json.loads((latest_checkpoint(tmp_path / "checkpoints") / "trainer.json").read_text())
    losses = [h["loss"] for h in state["history"] if "loss" in h]
    assert len(losses) == 3 and all(math.isfinite(x) and x > 0 for x in losses)


def test_early_stopping(tmp_path, corpus_file, monkeypatch):
    # a validation BLEU that never improves after the first evaluation
    monkeypatch.setattr(
        "qkv.train.validation.validation_bleu",
        lambda *a, **k: SimpleNamespace(bleu=5.0, chrf=1.0, n=1, hypotheses=[t for _, t in a[1]]),
    )
    cfg = tiny_config(data=str(corpus_file), max_steps=50, eval_every=3, patience=2)
    res = train(cfg, tmp_path, progress=False)
    assert res.stopped == "early_stopping" and res.step == 9
    # the same BLEU each time, and a validation loss that went down: the latest is the best
    # (patience counts BLEU only)
    losses = [h["valid_loss"] for h in res.history if "valid_loss" in h]
    assert losses == sorted(losses, reverse=True)
    assert res.best_step == 9 and res.best_checkpoint.name == "step-00000009"


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

    monkeypatch.setattr("qkv.train.update.sequence_loss", poisoned)
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

    monkeypatch.setattr("qkv.train.update.sequence_loss", poisoned_later)
    cfg = tiny_config(data=str(corpus_file), save_every=2, eval_every=100)
    with pytest.raises(TrainingError, match=r"update 4 .*the last checkpoint \(step-00000002"):
        train(cfg, tmp_path, progress=False)


def test_progress_lines(tmp_path, corpus_file):
    import io

    buf = io.StringIO()
    train(tiny_config(data=str(corpus_file), max_steps=10, eval_every=10), tmp_path,
          stream=buf)  # fmt: skip
    text = buf.getvalue()
    assert "qkv: new run; transformer model" in text
    assert "] 5/10 loss " in text and "tok/s" in text and " lr " in text
    assert "valid @ 10: loss" in text and "BLEU" in text


def test_tokens_per_second_leave_out_evaluations_and_checkpoint_writes(
    tmp_path, corpus_file, monkeypatch
):
    # on the loop's clock every update takes 50 ms and counts 100 tokens (2,000 tokens/s), a
    # checkpoint write 300 ms and an evaluation 700 ms more: every progress line reads 2,000.
    # A window that restarted its clock after a pause but kept the tokens before it read about
    # 4,000; one that counted the pauses as training, under 400
    import time

    from qkv.train import loop, update

    class Clock:
        now = 0.0

        def monotonic(self) -> float:
            return self.now

        def __getattr__(self, name):
            return getattr(time, name)

    clock = Clock()
    real_checkpoint, real_evaluate = loop._Run._checkpoint, loop._Run._evaluate

    def timed_update(*args, **kw):
        clock.now += 0.05
        return update.StepStats(loss_sum=200.0, nll_sum=200.0, tokens=100, grad_norm=1.0,
                                lr=1e-3)  # fmt: skip

    def slow_checkpoint(self, step):
        clock.now += 0.3
        return real_checkpoint(self, step)

    def slow_evaluate(self, step, **kw):
        clock.now += 0.7
        return real_evaluate(self, step, **kw)

    monkeypatch.setattr(loop, "time", clock)
    monkeypatch.setattr(loop, "train_update", timed_update)
    monkeypatch.setattr(loop._Run, "_checkpoint", slow_checkpoint)
    monkeypatch.setattr(loop._Run, "_evaluate", slow_evaluate)
    cfg = tiny_config(data=str(corpus_file), max_steps=8, save_every=1, log_every=2,
                      eval_every=3)  # fmt: skip
    res = train(cfg, tmp_path, progress=False)
    rates = [h["tok_s"] for h in res.history if "tok_s" in h]
    assert sum("valid_loss" in h for h in res.history) >= 2  # the pauses happened
    assert rates == [2000] * 4


def test_tensorboard_missing_is_a_clear_error_before_any_work(tmp_path, corpus_file, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # find_spec: not installed
    with pytest.raises(ImportError, match=r"needs tensorboard: pip install 'qkv\[tensorboard\]'"):
        train(tiny_config(data=str(corpus_file), tensorboard=True), tmp_path, progress=False)
    assert not (tmp_path / "checkpoints").exists()


def test_threads_are_the_runs_own(tmp_path, corpus_file):
    before = torch.get_num_threads()
    threads = 1 if before > 1 else 2
    train(
        tiny_config(data=str(corpus_file), max_steps=2, threads=threads), tmp_path, progress=False
    )
    assert torch.get_num_threads() == before  # the caller's setting comes back


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
        "qkv.train.validation.validation_bleu",
        lambda *a, **k: SimpleNamespace(bleu=5.0, chrf=1.0, n=1, hypotheses=[t for _, t in a[1]]),
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


def _evals(*pairs):
    history = [{"step": 10, "loss": 5.0, "lr": 1e-3, "tok_s": 100}]  # a training line
    for step, (bleu, loss) in enumerate(pairs, 1):
        history.append({"step": 100 * step, "valid_loss": loss, "valid_bleu": bleu})
    return history


def test_the_best_checkpoint_is_the_highest_bleu_or_a_close_one_with_a_lower_loss():
    from qkv.train.loop import BLEU_NOISE, is_better

    assert is_better([], None, 0.0, 9.0)  # the first evaluation
    history = _evals((30.41, 1.791))
    assert is_better(history, 100, 30.5, 1.9)  # a higher BLEU wins whatever its loss
    assert is_better(history, 100, 29.98, 1.756)  # within the noise, a lower loss
    assert not is_better(history, 100, 29.98, 1.80)  # within the noise, a higher loss
    assert not is_better(history, 100, 30.41 - BLEU_NOISE - 0.01, 1.0)  # clearly lower BLEU
    # the band is measured from the highest BLEU, not from a best that was chosen by its loss:
    # a run cannot walk down a point at a time
    history = _evals((30.41, 1.791), (29.6, 1.70))
    assert not is_better(history, 200, 29.3, 1.60)
    assert not is_better(history, 200, 30.0, 1.75)  # above the best's BLEU, not its loss
    assert is_better(history, 200, 29.5, 1.65)


def test_a_validation_keeps_the_model_in_evaluation_mode_across_its_decoding_calls(
    tmp_path, corpus_file, monkeypatch
):
    """The fast path's kept weights are dropped when a model changes mode: a validation that
    went back to training mode after each of its decoding calls (one per length cap) made
    them again for every call (25% of a validation's time on the 10-minute benchmark's model)."""
    from qkv.nn import _fast_decode
    from qkv.train import validation

    forgets, calls, seen = [0], [0], []
    real_forget, real_decode = _fast_decode.forget, validation.decode_texts

    def counting_forget(module):
        forgets[0] += 1
        real_forget(module)

    def counting_decode(*a, **k):
        calls[0] += 1
        return real_decode(*a, **k)

    real_capped = validation._decode_capped

    def capped(*a, **k):
        forgets[0], calls[0] = 0, 0
        out = real_capped(*a, **k)
        seen.append((calls[0], forgets[0]))
        return out

    monkeypatch.setattr(_fast_decode, "forget", counting_forget)
    monkeypatch.setattr(validation, "decode_texts", counting_decode)
    monkeypatch.setattr(validation, "_decode_capped", capped)
    train(tiny_config(data=str(corpus_file), max_steps=3, eval_every=3), tmp_path, progress=False)
    assert seen and max(c for c, _ in seen) >= 2, seen  # several length caps, several calls
    # into evaluation mode and back once (the encoder's and the decoder's stacks each)
    assert all(f <= 4 for _, f in seen), seen
