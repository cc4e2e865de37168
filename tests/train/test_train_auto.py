"""Issue 11: the schedule that fits the budget, the automatic preset, real text in and out,
scoring against raw references, checkpoint averaging and the final model."""

from __future__ import annotations

import itertools
import json
import math
import time
from types import SimpleNamespace

import pytest
import torch
from _train_helpers import DilatedTime, qkv_here, tiny_config

from qkv.data import Normalizer, SentencePieceTokenizer, bundled_pairs, write_pairs
from qkv.inference.layout import step_of
from qkv.train import CheckpointError, TrainConfig, train
from qkv.train.checkpoint import (
    average_checkpoints,
    average_weights,
    find_checkpoints,
    read_weights,
)
from qkv.train.presets import (
    FEW_EPOCHS,
    LABEL_SMOOTHING,
    REFERENCE_TIER,
    TIERS,
    Speed,
    choose_preset,
    dropout_for,
    label_smoothing_for,
    resolve_config,
    vocab_size_for,
)
from qkv.train.schedules import Schedule, scheduled_lr
from qkv.translate import Translator


# ---------------------------------------------------------------- schedules
@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_decay_reaches_its_floor_right_after_the_planned_end(kind):
    lr = lambda s: scheduled_lr(s, kind=kind, peak_lr=2.0, warmup_steps=10, total_steps=109,  # noqa: E731
                                min_lr_ratio=0.1)  # fmt: skip
    assert lr(1) == pytest.approx(0.2) and lr(5) == pytest.approx(1.0) and lr(10) == 2.0
    assert lr(109) > 0.2  # the last planned update still learns
    assert lr(110) == pytest.approx(0.2) and lr(500) == pytest.approx(0.2)
    mid = 0.2 + 1.8 * 0.5  # half-way through the decay, both shapes are at the middle
    assert lr(60) == pytest.approx(mid)
    decay = [lr(s) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(decay))  # never rises after the peak
    if kind == "linear":
        assert lr(35) == pytest.approx(2.0 - 1.8 * 0.25)
    else:
        assert lr(35) == pytest.approx(0.2 + 1.8 * 0.5 * (1 + math.cos(math.pi * 0.25)))


def test_schedule_replans_and_restores_its_plan():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    s = Schedule(opt, peak_lr=1.0, warmup_steps=2, kind="linear", total_steps=10)
    for _ in range(4):
        s.step()
    s.plan(total_steps=20, warmup_steps=4)
    assert s.step() == pytest.approx(1.0 - 1 / 17)  # step 5 of a 4-warm-up, 20-update run
    state = s.state_dict()
    other = Schedule(opt, peak_lr=1.0, warmup_steps=2, kind="linear", total_steps=10)
    other.load_state_dict(state)
    assert (other.last_step, other.warmup_steps, other.total_steps) == (5, 4, 20)
    assert other.lr(12) == s.lr(12)
    with pytest.raises(ValueError, match="total_steps"):
        s.plan(total_steps=0)
    assert s.total_steps == 20  # a refused plan changes nothing
    with pytest.raises(ValueError, match="kind"):
        scheduled_lr(1, kind="step", peak_lr=1.0, warmup_steps=0)
    with pytest.raises(ValueError, match="total_steps"):
        Schedule(opt, peak_lr=1.0, warmup_steps=2, kind="cosine")  # no planned end


# ---------------------------------------------------------------- the preset
def test_preset_follows_budget_device_and_corpus():
    short = choose_preset(20_000, minutes=10, max_steps=10_000)
    hour = choose_preset(20_000, minutes=30, max_steps=10_000)
    gpu = choose_preset(2_000_000, minutes=600, max_steps=10_000, device="cuda")
    assert (short.name, hour.name, gpu.name) == ("cpu-minutes", "cpu-hour", "gpu-base")
    assert (
        short.model["num_enc_layers"] < hour.model["num_enc_layers"] < gpu.model["num_enc_layers"]
    )
    assert short.max_tokens < hour.max_tokens < gpu.max_tokens
    assert gpu.vocab_size > short.vocab_size and gpu.model["num_hiddens"] == 512
    assert "10-minute budget" in short.reason and "cpu-minutes" in short.reason
    # two processes do the work of one for twice the time
    assert choose_preset(20_000, minutes=15, max_steps=10_000, world_size=2).name == "cpu-hour"
    # a small corpus shrinks the tier's model and says so
    small = choose_preset(3_000, minutes=600, max_steps=10_000)
    assert small.model["num_hiddens"] == 256 and small.model["num_enc_layers"] == 2
    assert small.notes and "3000 training pairs" in small.notes[0]
    # dropout grows with the epochs the budget allows
    assert dropout_for(12) < dropout_for(30) < dropout_for(100)
    assert choose_preset(2_000, minutes=10, max_steps=1).model["dropout"] > short.model["dropout"]
    assert vocab_size_for(1_000) < vocab_size_for(20_000) < vocab_size_for(2_000_000)
    with pytest.raises(ValueError, match="tier"):
        choose_preset(100, minutes=1, max_steps=1, tier="huge")


def test_the_shortest_budgets_get_the_smallest_tiers_and_their_small_vocabularies():
    micro = choose_preset(20_000, minutes=1.5, max_steps=None)
    tiny = choose_preset(20_000, minutes=3, max_steps=None)
    assert choose_preset(20_000, minutes=2, max_steps=None).name == "cpu-tiny"
    assert choose_preset(20_000, minutes=5, max_steps=None).name == "cpu-tiny"
    assert choose_preset(20_000, minutes=6, max_steps=None).name == "cpu-minutes"
    # a budget that would show a small corpus to the tiny model dozens of times gets cpu-small
    small = choose_preset(3_483, minutes=5, max_steps=None)
    assert (micro.name, tiny.name, small.name) == ("cpu-micro", "cpu-tiny", "cpu-small")
    assert "3483 training pairs about 133 times" in small.notes[0] and not tiny.notes
    # and to the micro model: the tiny one
    assert choose_preset(3_483, minutes=1.5, max_steps=None).name == "cpu-tiny"
    busy = Speed({REFERENCE_TIER: 848.0}, 1)  # a busy machine: the small models see it less
    assert choose_preset(3_483, minutes=1, max_steps=None, speed=busy).name == "cpu-micro"
    # a busy machine's 3 minutes are under one of the reference machine's
    assert choose_preset(20_000, minutes=3, max_steps=None, speed=busy).name == "cpu-micro"
    assert micro.model["num_enc_layers"] == micro.model["num_dec_layers"] == 1
    assert tiny.model["num_enc_layers"] == 2 and micro.max_tokens == tiny.max_tokens // 2
    assert micro.model["num_hiddens"] == tiny.model["num_hiddens"] < small.model["num_hiddens"]
    assert (micro.vocab_size, tiny.vocab_size, small.vocab_size) == (2_000, 2_000, 4_000)
    assert "vocabulary of up to 2000" in tiny.reason and "width 128" in tiny.reason
    # a corpus whose own vocabulary is smaller keeps it
    assert choose_preset(1_500, minutes=3, max_steps=None).vocab_size == 1_000


def test_a_run_that_sees_its_data_a_few_times_regularises_nothing():
    # regularise only what repeats: below FEW_EPOCHS no dropout and no label smoothing
    assert dropout_for(FEW_EPOCHS - 0.1) == label_smoothing_for(FEW_EPOCHS - 0.1) == 0.0
    assert dropout_for(FEW_EPOCHS) > 0 and label_smoothing_for(FEW_EPOCHS) == LABEL_SMOOTHING
    busy = Speed({REFERENCE_TIER: 848.0}, 1)
    few = choose_preset(20_000, minutes=3, max_steps=None, speed=busy)
    many = choose_preset(20_000, minutes=30, max_steps=None)
    assert few.model["dropout"] == few.label_smoothing == 0.0
    assert "dropout 0 and label smoothing 0 (about" in few.reason
    assert many.model["dropout"] > 0 and many.label_smoothing == LABEL_SMOOTHING
    assert "label smoothing 0.1" in many.reason
    # a small corpus shrinks a large tier and regularises it, whatever the budget
    small = choose_preset(3_000, minutes=600, max_steps=None)
    assert small.model["dropout"] >= 0.1 and small.label_smoothing == LABEL_SMOOTHING
    # the run gets the preset's unless given; no preset and fine-tuning get the usual 0.1
    cfg = TrainConfig(data="x.tsv", max_minutes=3)
    assert resolve_config(cfg, 20_000, probe=None)[0].label_smoothing == 0.0
    given = cfg.updated({"label_smoothing": 0.2})
    run, preset = resolve_config(given, 20_000, probe=None)
    assert run.label_smoothing == 0.2 and "label_smoothing" in preset.notes[-1]
    plain = cfg.updated({"preset": "none"})
    assert resolve_config(plain, 20_000, probe=None)[0].label_smoothing == LABEL_SMOOTHING
    tuned = resolve_config(cfg, 20_000, probe=None, fine_tuning=True)[0]
    assert tuned.label_smoothing == LABEL_SMOOTHING


def test_bahdanau_keeps_its_defaults_and_gets_a_vocabulary_sized_to_the_corpus():
    run, preset = resolve_config(TrainConfig(data="x.tsv", model="bahdanau"), 3_000)
    assert preset is None and run.lr == 1e-3 and run.max_tokens == 4096
    assert run.vocab_size == vocab_size_for(3_000) and "num_enc_layers" not in run.model_options
    assert run.model_options["share_embeddings"] and not run.model_options["tie_embeddings"]


def test_resolve_config_fills_only_what_was_not_given():
    cfg = TrainConfig(data="x.tsv", max_minutes=10).updated(
        {"lr": 5e-4, "model.num_hiddens": 128, "model.num_heads": 2}
    )
    run, preset = resolve_config(cfg, 20_000)
    assert preset is not None and preset.name == "cpu-minutes"
    assert run.lr == 5e-4  # given
    assert run.max_tokens == preset.max_tokens and run.vocab_size == preset.vocab_size
    assert run.model_options["num_hiddens"] == 128 and run.model_options["num_heads"] == 2
    assert run.model_options["num_enc_layers"] == preset.model["num_enc_layers"]
    assert run.model_options["norm_first"] is True
    # real text for a user's file: SentencePiece on plain text, one vocabulary, shared tables
    assert (run.normalizer, run.tokenizer, run.joint_vocab) == ("plain", "sentencepiece", True)
    assert run.model_options["share_embeddings"] and run.model_options["tie_embeddings"]
    assert run.schedule == "linear" and run.warmup_steps is None
    assert "your settings win: lr, model.num_hiddens, model.num_heads" in preset.notes[-1]
    # the bundled corpus keeps the book's pipeline
    book, _ = resolve_config(TrainConfig(), 20_000)
    assert (book.normalizer, book.tokenizer, book.joint_vocab) == ("book", "word", False)
    # preset none: the plain defaults of every class; a named tier: its values
    plain, none = resolve_config(TrainConfig(data="x.tsv", preset="none"), 20_000)
    assert none is None and plain.lr == 1e-3 and plain.max_tokens == 4096
    assert "num_enc_layers" not in plain.model_options
    named, p = resolve_config(TrainConfig(data="x.tsv", preset="cpu-long"), 200_000)
    assert p.name == "cpu-long" and named.max_tokens == TIERS["cpu-long"][3]
    with pytest.raises(ValueError, match="preset: expected"):
        TrainConfig(preset="fast")


# ---------------------------------------------------------------- the run fits its budget
def test_a_timed_run_plans_its_length_and_decays_within_the_budget(
    tmp_path, corpus_file, monkeypatch
):
    # minutes: enough updates to see warm-up and decay on a loaded 2-core machine, on a clock
    # running 4 times faster (the plan of a machine 4 times slower, in 7.5 s)
    budget = 0.5
    monkeypatch.setattr("qkv.train.loop.time", DilatedTime(4))
    cfg = tiny_config(data=str(corpus_file), max_steps=100_000, max_minutes=budget,
                      schedule="auto", warmup_steps=None, eval_every=None, save_every=None,
                      log_every=1)  # fmt: skip
    res = train(cfg, tmp_path, progress=False)
    assert res.stopped == "max_minutes" and res.step > 20
    lrs = [h["lr"] for h in res.history if "lr" in h]
    peak = max(lrs)
    assert peak == pytest.approx(cfg.lr, rel=0.05)
    assert lrs[-1] < 0.3 * peak  # decayed to (nearly) nothing by the end of the budget
    assert lrs.index(peak) < 0.3 * len(lrs)  # and peaked early
    evals = [h["step"] for h in res.history if "valid_bleu" in h]
    # several evaluations over the run, not "every 1000": as many as fit in a tenth of the
    # budget once the first is measured (a loaded machine fits fewer), and the final one
    assert len(evals) >= 2
    state = json.loads(
        (find_checkpoints(tmp_path / "checkpoints")[-1] / "trainer.json").read_text()
    )
    assert state["resolved_config"]["schedule"] == "linear"
    assert res.final_model == tmp_path / "final"


def test_an_evaluation_due_just_before_the_planned_end_is_the_last_and_no_save_falls_there():
    from qkv.train.plan import Plan

    plan = Plan(TrainConfig(max_minutes=3, max_steps=100_000), timed=True)
    every = plan.eval_every(2540)  # 424: 6 evaluations planned
    ends = plan.ends_at_evaluation
    # due (424 updates since the last), within a quarter interval of the planned end, in the
    # last fifth of the budget: the run ends here, its final evaluation this one
    assert ends(2534, 2540, 2110, 170.0, 180.0)
    assert ends(2540 - every // 4 + 1, 2540, 2540 - every // 4 + 1 - every, 170.0, 180.0)
    assert not ends(2540 - every // 4 - 1, 2540, 2540 - every // 4 - 1 - every, 170.0, 180.0)
    assert not ends(2534, 2540, 2200, 170.0, 180.0)  # not due: the run goes on
    assert not ends(2534, 2540, 2110, 100.0, 180.0)  # early in the budget: the plan may move
    fixed = Plan(TrainConfig(max_minutes=3, max_steps=100_000, eval_every=424), timed=True)
    assert not fixed.ends_at_evaluation(2534, 2540, 2110, 170.0, 180.0)  # the user's cadence
    steps = Plan(TrainConfig(max_steps=2540), timed=False)
    assert not steps.ends_at_evaluation(2534, 2540, 2110, 170.0, 180.0)  # no clock
    # a checkpoint due there is left out (the last update is saved anyway), elsewhere not
    assert plan.cadence(2540) == (every, 212)
    assert plan.skips_save(2540 - 52, 2540, 170.0, 180.0)
    assert not plan.skips_save(2540 - 54, 2540, 170.0, 180.0)
    assert not plan.skips_save(2534, 2540, 100.0, 180.0)
    saved = Plan(TrainConfig(max_minutes=3, max_steps=100_000, save_every=212), timed=True)
    assert not saved.skips_save(2534, 2540, 170.0, 180.0) and not steps.skips_save(
        2534, 2540, 170.0, 180.0
    )


def test_a_checkpoint_due_just_before_an_evaluation_is_left_to_it():
    from qkv.train.plan import Plan

    plan = Plan(TrainConfig(max_minutes=3, max_steps=100_000), timed=True)
    assert plan.cadence(2540) == (424, 212)
    save = 212
    # the evaluation due at 2110 + 424 = 2534 saves; a checkpoint due within a quarter of the
    # save cadence before it (53 updates) is left out, one further away or after it is not
    assert plan.leaves_save_to_evaluation(2533, 2540, 2110)
    assert plan.leaves_save_to_evaluation(2534 - save // 4 + 1, 2540, 2110)
    assert not plan.leaves_save_to_evaluation(2534 - save // 4 - 1, 2540, 2110)
    assert not plan.leaves_save_to_evaluation(2534 - save // 4, 2540, 2110)  # a quarter: kept
    assert not plan.leaves_save_to_evaluation(2534, 2540, 2110)  # due together: one save
    assert not plan.leaves_save_to_evaluation(2322, 2540, 2110)  # the midway checkpoint
    # the user's cadences are kept as given
    for config in (TrainConfig(save_every=212), TrainConfig(eval_every=424)):
        assert not Plan(config, timed=True).leaves_save_to_evaluation(2533, 2540, 2110)


def test_a_run_saves_no_checkpoint_one_update_before_an_evaluation(
    tmp_path, corpus_file, monkeypatch
):
    """A real run whose cadences drifted apart (as re-planned ones do: faked here, evaluations
    every 7 updates, checkpoints every 6) leaves the checkpoints due at 6 and 13 to the
    evaluations at 7 and 14, so its newest checkpoints are 7, 14 and the end, not 13, 14, 20."""
    from qkv.train.plan import Plan

    monkeypatch.setattr(Plan, "cadence", lambda self, planned: (7, 6))
    cfg = tiny_config(data=str(corpus_file), max_steps=20, eval_every=None, save_every=None,
                      keep_last=10, average_last=0)  # fmt: skip
    train(cfg, tmp_path, progress=False)
    steps = [step_of(p) for p in find_checkpoints(tmp_path / "checkpoints")]
    assert steps == [7, 14, 20]


def test_the_plan_keeps_time_for_evaluations_and_the_final_model():
    from qkv.train.plan import Clock, Plan

    plan = Plan(TrainConfig(max_minutes=10, max_steps=100_000), timed=True)
    clock = Clock(t_start=0.0)
    assert plan.estimate(3, 3, 3.0, 600.0, clock, 777) == 777  # nothing measured: the plan
    # 1 s an update, no evaluation yet: guessed at 10 updates' time each
    total = plan.estimate(13, 13, 13.0, 600.0, clock, 777)
    reserve = plan.FINAL_EVALS * 10 + plan.EVALS * 10  # final evaluations, then the scheduled
    assert 600 - reserve - 30 <= total <= 600 - plan.FINAL_EVALS * 10
    # once evaluations are measured (2 s each) they replace the guess: a longer run
    clock.evals += [2.0, 2.0]
    assert plan.estimate(113, 113, 117.0, 600.0, clock, total) > total
    # never more than the budget allows, never less than done
    assert plan.estimate(500, 500, 700.0, 600.0, clock, total) == 500
    assert plan.warmup(1000) == 100 and plan.warmup(50) == 10 and plan.warmup(5) == 5
    assert plan.eval_every(600) == 100 and plan.save_every(600) == 50
    assert plan.save_every(600, 101) == 51  # half the evaluation interval, rounded up
    assert plan.final_reserve(clock, 600.0) == pytest.approx(plan.FINAL_EVALS * 2.0)


def test_an_update_bounded_run_decays_to_zero_at_max_steps(tmp_path, corpus_file):
    cfg = tiny_config(data=str(corpus_file), max_steps=40, schedule="auto", warmup_steps=None,
                      eval_every=20, save_every=20, log_every=1)  # fmt: skip
    res = train(cfg, tmp_path, progress=False)
    lrs = {h["step"]: h["lr"] for h in res.history if "lr" in h}
    assert lrs[10] == pytest.approx(cfg.lr)  # warm-up: 10% of 40 updates, at least 10
    # then linear to zero at update 41: the last update still learns a little
    assert lrs[25] == pytest.approx(cfg.lr * 16 / 31) and lrs[40] == pytest.approx(cfg.lr / 31)


def test_evaluation_decodes_at_most_max_pair_len_tokens(tmp_path, corpus_file, monkeypatch):
    import qkv.inference.decode as decode_mod

    seen = []
    real = decode_mod.search_hypotheses

    def spy(*a, **k):
        seen.append(k["decoding"].output_len_cap)
        return real(*a, **k)

    monkeypatch.setattr(decode_mod, "search_hypotheses", spy)
    train(tiny_config(data=str(corpus_file), max_steps=4, eval_every=4, max_pair_len=9,
                      tune_decoding=False), tmp_path, progress=False)  # fmt: skip
    assert seen and set(seen) == {9}


# ---------------------------------------------------------------- real text in, real text out
def test_sentencepiece_with_byte_fallback_gives_back_real_text():
    texts = ["Je suis chez moi.", "Il est calme !", "Où est-ce ? C'est là."] * 20
    tok = SentencePieceTokenizer.train(texts, vocab_size=300, byte_fallback=True,
                                       normalizer=Normalizer())  # fmt: skip
    for t in ["Je suis chez moi.", "L'été à Zürich — déjà ✓"]:  # unseen characters too
        ids = tok.encode(t)
        assert tok.unk_id not in ids
        assert tok.decode(ids) == t  # cased, detokenised, nothing lost


def test_default_run_on_a_users_file_translates_to_cased_detokenised_text(tmp_path):
    # a cased corpus with French punctuation, as a user's file would be
    raw = [(en.capitalize().replace(" .", ".").replace(" !", "!"),
            fr.capitalize().replace(" .", ".").replace(" !", " !"))
           for en, fr in bundled_pairs()[:800]]  # fmt: skip
    data = tmp_path / "corpus.tsv"
    write_pairs(data, raw)
    cfg = TrainConfig(data=str(data), max_steps=6, valid=40, test=40, eval_sentences=10,
                      tune_decoding=False).updated({"model.num_hiddens": 32,
                                                    "model.ffn_num_hiddens": 64})  # fmt: skip
    train(cfg, tmp_path / "run", progress=False)
    tr = Translator.load(tmp_path / "run")
    assert tr.src_tokenizer is tr.tgt_tokenizer  # joint SentencePiece
    assert tr.src_tokenizer.normalizer == Normalizer()  # plain: cased, punctuation untouched
    # what the model emits is decoded to real text: a reference's ids come back verbatim
    for _, fr in raw[:50]:
        assert tr.tgt_tokenizer.decode(tr.tgt_tokenizer.encode(fr)) == fr
    out = tr.translate(["I'm home.", "Zürich — ✓"])
    assert all(isinstance(o, str) and "<unk>" not in o and "⁇" not in o for o in out)


# ---------------------------------------------------------------- scoring like sacreBLEU
def test_evaluate_scores_against_raw_references(trained):
    tr = Translator.load(trained["transformer"])
    pairs = [("he's calm .", "Il est calme."), ("i lost .", "J'ai perdu.")]
    ev = tr.evaluate(pairs)
    assert ev.references == ["Il est calme.", "J'ai perdu."] and not ev.references_normalized
    assert "case:mixed" in ev.signatures["bleu"] and "normalised" not in ev.signatures["bleu"]
    norm = tr.evaluate(pairs, normalize_references=True)
    assert norm.references == ["il est calme .", "j'ai perdu ."]
    assert norm.references_normalized and "normalised" in norm.signatures["bleu"]
    assert norm.to_dict()["references_normalized"] is True


def test_cli_evaluate_labels_normalised_references(trained):
    r = qkv_here("evaluate", "--model-dir", str(trained["transformer"]), "--limit", "5",
                 "--normalized-refs")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "NOTE: references normalised" in r.stdout and "[references normalised" in r.stdout
    plain = qkv_here("evaluate", "--model-dir", str(trained["transformer"]), "--limit", "5")
    assert "NOTE" not in plain.stdout and "tok:13a" in plain.stdout


# ---------------------------------------------------------------- averaging, the final model
def test_average_weights_is_the_elementwise_mean(trained, tmp_path):
    folders = find_checkpoints(trained["transformer"] / "checkpoints")[-2:]
    assert len(folders) == 2
    a, b = (read_weights(f) for f in folders)
    avg = average_weights(folders)
    for k in a:
        torch.testing.assert_close(avg[k], (a[k].double() + b[k].double()).div(2).float())
    out = average_checkpoints(folders, tmp_path / "avg")
    tr = Translator.load(out)
    assert tr.path == out and not (out / "trainer.pt").exists()
    for k, v in tr.model.state_dict().items():
        torch.testing.assert_close(v, avg[k])
    # checkpoints of another model cannot be averaged with these
    other = find_checkpoints(trained["bahdanau"] / "checkpoints")[-1]
    with pytest.raises(CheckpointError, match="another model"):
        average_weights([folders[0], other])
    with pytest.raises(ValueError, match="at least one"):
        average_weights([])


def test_cli_average(trained, tmp_path):
    r = qkv_here("average", "--model-dir", str(trained["transformer"]), "--last", "2",
                 "--out", str(tmp_path / "avg"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "averaged 2 checkpoints" in r.stdout and (tmp_path / "avg" / "manifest.json").is_file()
    bad = qkv_here(
        "average", "--model-dir", str(tmp_path / "nothing"), "--out", str(tmp_path / "x")
    )
    assert bad.returncode != 0 and "qkv average: error" in bad.stderr


def test_final_model_is_the_average_when_it_validates_better(tmp_path, corpus_file, monkeypatch):
    import qkv.train.validation as validation

    # scheduled evaluations score 5 and 6; the average scores 9; beams score 1
    scores = itertools.chain([5.0, 6.0, 6.0, 9.0], itertools.repeat(1.0))
    monkeypatch.setattr(validation, "validation_bleu",
                        lambda *a, **k: SimpleNamespace(bleu=next(scores), chrf=1.0, n=1,
                                                        hypotheses=[t for _, t in a[1]]))  # fmt: skip
    cfg = tiny_config(data=str(corpus_file), max_steps=12, eval_every=4, save_every=4,
                      keep_last=3, average_last=3)  # fmt: skip
    res = train(cfg, tmp_path, progress=False)
    final = tmp_path / "final"
    meta = json.loads((final / "trainer.json").read_text())
    assert meta["weights"] == {"kind": "average", "steps": [4, 8, 12]}
    # the decodings (all scored 1.0) then pick greedy, the first; no 3-gram repeated
    assert res.decoding.beam_size == 1 and res.decoding.no_repeat_ngram == 3
    expected = average_weights(find_checkpoints(tmp_path / "checkpoints")[-3:])
    got = read_weights(final)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k])


def test_final_model_carries_the_decoding_chosen_on_validation(tmp_path, corpus_file, monkeypatch):
    import qkv.train.validation as validation

    def fake(model, pairs, src_tok, tgt_tok, device, decoding, **k):
        bleu = 20.0 if (decoding.beam_size, decoding.length_penalty) == (4, 0.6) else 10.0
        return SimpleNamespace(bleu=bleu, chrf=1.0, n=1, hypotheses=[t for _, t in pairs])

    monkeypatch.setattr(validation, "validation_bleu", fake)
    train(tiny_config(data=str(corpus_file), max_steps=4, eval_every=4, average_last=0),
          tmp_path, progress=False)  # fmt: skip
    dec = json.loads((tmp_path / "final" / "decoding.json").read_text())
    assert (dec["beam_size"], dec["length_penalty"]) == (4, 0.6)
    tr = Translator.load(tmp_path)
    assert (tr.decoding.beam_size, tr.decoding.length_penalty) == (4, 0.6)
    one = tr.decoding.replace(beam_size=1, length_penalty=None)
    assert (one.beam_size, one.length_penalty) == (1, 0.6)
    # qkv translate uses it by default; --n-best K needs a beam of K
    r = qkv_here("translate", "--model-dir", str(tmp_path), "--n-best", "2", "go .")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2
    assert qkv_here("translate", "--model-dir", str(tmp_path), "--beam", "1", "--n-best", "2",
                    "go .").returncode == 2  # fmt: skip


def test_a_run_with_no_time_to_choose_a_decoding_keeps_greedy_without_repeats():
    """A short timed run (a busy machine's 3 minutes) has no time to compare decodings: it keeps
    the first candidate, greedy never repeating a 3-gram (its undertrained model's loops,
    ``Datei Datei Datei Datei``, are what plain greedy would keep); a run told not to tune keeps
    plain greedy."""
    from qkv.inference import CANDIDATES, Decoding
    from qkv.train.finish import _choose_decoding

    said = []
    setup = SimpleNamespace(config=SimpleNamespace(tune_decoding=True))
    decoding, bleu = _choose_decoding(setup, said.append, time.monotonic() + 4.0, 1.0)
    assert (decoding, bleu) == (CANDIDATES[0], None)
    assert decoding.no_repeat_ngram == 3 and decoding.beam_size == 1
    assert said == ["no time left to choose a beam on the validation split; greedy, no 3-gram "
                    "repeated kept"]  # fmt: skip
    setup.config.tune_decoding = False
    assert _choose_decoding(setup, said.append, time.monotonic() + 4.0, 1.0) == (Decoding(), None)


def test_corrupt_decoding_file_is_refused(tmp_path, trained):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained["transformer"], run)
    (run / "final" / "decoding.json").write_text('{"beam_size": 0}')
    with pytest.raises(CheckpointError, match=r"decoding\.json"):
        Translator.load(run)


# ---------------------------------------------------------------- bad input
def test_a_corpus_with_nothing_to_train_on_is_refused_before_training(tmp_path):
    long = " ".join(["word"] * 80)
    data = tmp_path / "long.tsv"
    write_pairs(data, [(f"{long} {i}", f"{long} {i}") for i in range(60)])
    cfg = tiny_config(data=str(data), valid=5, test=5)
    with pytest.raises(ValueError, match="longer than max_pair_len=64"):
        train(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_resume_keeps_the_resolved_plan(tmp_path, corpus_file):
    cfg = tiny_config(data=str(corpus_file), max_steps=6, eval_every=3, save_every=3,
                      preset="auto", tokenizer="auto", normalizer="auto", vocab_size=None,
                      lr=None, max_tokens=None, tune_decoding=False)  # fmt: skip
    first = train(cfg.updated({"max_steps": 3}), tmp_path, progress=False)
    assert first.step == 3
    res = train(cfg, tmp_path, resume=True, progress=False)
    assert res.step == 6 and res.resumed_from == 3
    ck = find_checkpoints(tmp_path / "checkpoints")[-1]
    state = json.loads((ck / "trainer.json").read_text())
    assert state["resolved_config"]["tokenizer"] == "sentencepiece"
    # chosen once, from the first invocation's budget (3 updates: few, a small model), and kept
    # on resume
    assert state["preset"]["name"] == "cpu-micro" and "3 updates" in state["preset"]["reason"]


def test_a_timed_run_resumed_keeps_its_budget_and_its_final_model(
    tmp_path, corpus_file, monkeypatch
):
    monkeypatch.setattr("qkv.train.loop.time", DilatedTime(3))  # 9 s of budget in 3
    cfg = tiny_config(data=str(corpus_file), max_steps=None, max_minutes=0.15, schedule="auto",
                      warmup_steps=None, eval_every=None, save_every=None)  # fmt: skip
    first = train(cfg, tmp_path, progress=False)
    assert first.stopped == "max_minutes" and first.final_model is not None
    before = (tmp_path / "final" / "model.safetensors").read_bytes()
    # the budget is the run's: resumed with the same one, there is nothing left to do
    again = train(cfg, tmp_path, resume=True, progress=False)
    assert again.step == first.step and again.stopped == "max_minutes"
    assert (tmp_path / "final" / "model.safetensors").read_bytes() == before
    assert again.final_model == tmp_path / "final"
    state = json.loads(
        (find_checkpoints(tmp_path / "checkpoints")[-1] / "trainer.json").read_text()
    )
    assert 0 < state["train_seconds"] <= 0.15 * 60 * 2


def test_a_stale_final_model_is_not_used(tmp_path, trained):
    import shutil

    from qkv.train import resolve_model_dir

    run = tmp_path / "run"
    shutil.copytree(trained["transformer"], run)
    assert resolve_model_dir(run) == run / "final"
    # a resumed run that wrote a newer checkpoint and was stopped before its final model
    newest = find_checkpoints(run / "checkpoints")[-1]
    manifest = json.loads((run / "final" / "manifest.json").read_text())
    manifest["step"] = json.loads((newest / "manifest.json").read_text())["step"] - 1
    (run / "final" / "manifest.json").write_text(json.dumps(manifest))
    assert resolve_model_dir(run) != run / "final"


def test_average_refuses_to_overwrite_what_it_did_not_write(trained, tmp_path):
    folders = find_checkpoints(trained["transformer"] / "checkpoints")[-2:]
    for bad in (trained["transformer"], trained["transformer"] / "checkpoints", folders[0]):
        with pytest.raises(ValueError, match="choose a new folder"):
            average_checkpoints(folders, bad)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(ValueError, match="choose a new folder"):
        average_checkpoints(folders, tmp_path / "notes")
    out = average_checkpoints(folders, tmp_path / "avg")
    with pytest.raises(ValueError, match="force"):  # not without being asked (issue 27)
        average_checkpoints(folders, out)
    assert average_checkpoints(folders, out, force=True) == out  # its own output, with force


def test_resume_of_a_run_written_before_settings_were_automatic(tmp_path, corpus_file):
    # a script resuming with TrainConfig defaults ("auto") a run whose train.json holds the
    # explicit values of the time
    old = tiny_config(data=str(corpus_file), max_steps=3, eval_every=3, save_every=3,
                      tune_decoding=False)  # fmt: skip
    train(old, tmp_path, progress=False)
    ck = find_checkpoints(tmp_path / "checkpoints")[-1]
    state = json.loads((ck / "trainer.json").read_text())
    del state["resolved_config"]  # as written before this version
    (ck / "trainer.json").write_text(json.dumps(state))
    from qkv.train.checkpoint import sha256_file as _sha256

    manifest = json.loads((ck / "manifest.json").read_text())
    manifest["files"]["trainer.json"] = {
        "bytes": (ck / "trainer.json").stat().st_size,
        "sha256": _sha256(ck / "trainer.json"),
    }
    (ck / "manifest.json").write_text(json.dumps(manifest))
    given = old.updated({"normalizer": "auto", "tokenizer": "auto", "max_steps": 6})
    res = train(given, tmp_path, resume=True, progress=False)
    assert res.step == 6 and res.resumed_from == 3


def test_byte_fallback_models_never_emit_unk(trained):
    from qkv.translate import never_generated

    tr = Translator.load(trained["transformer"])
    assert never_generated(tr.tgt_tokenizer) == []  # words: <unk> is a real output
    texts = ["Je suis chez moi.", "Il est calme !"] * 20
    spm = SentencePieceTokenizer.train(texts, vocab_size=300, byte_fallback=True)
    assert spm.byte_fallback and never_generated(spm) == [spm.unk_id]
    plain = SentencePieceTokenizer.train(texts, vocab_size=40)
    assert not plain.byte_fallback and never_generated(plain) == []
