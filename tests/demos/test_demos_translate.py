"""`qkv demo translate` on a slow machine (issue 28): it plans its updates from its measured speed
as `qkv train --max-minutes` does, a run its clock stopped still ends with its figures and one
BLEU, and one that could not learn in time says how to continue it, never "FAILED". The training
is a fake here (a result given, or the quick demo's trained model copied in its place): what is
tested is the demo around it. `qkv demo --quick` itself runs once, for real, in this module."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _folders import assert_not_blank_png

from qkv.cli import build_parser, main
from qkv.demos import translate as demo
from qkv.train import TrainConfig

#: the full demo's budget, and what the command that continues it asks for
BUDGET = demo.FULL["max_minutes"]
AGAIN = 2 * BUDGET


def _result(run_dir: Path, **kw) -> SimpleNamespace:
    base = dict(out=run_dir, step=350, minutes=7.0, stopped="max_minutes", best_bleu=40.0,
                verdict=None)  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_the_full_demo_plans_its_length_from_its_speed():
    """A clock and a cap, a schedule that decays to the end of the plan, and a warm-up and
    cadences that follow the planned length (the issue's run warmed up over 300 fixed updates
    and stopped at update 144 with its learning rate still rising)."""
    c = TrainConfig().updated(demo.FULL)
    c.validate()
    assert c.max_minutes is not None and c.max_steps is not None
    assert c.schedule == "linear"
    assert (c.warmup_steps, c.eval_every, c.save_every) == (None, None, None)


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory) -> SimpleNamespace:
    """``qkv demo --quick``, run once for this module on one torch thread (as every test runs):
    its folder, exit status and stdout (shown again, for a failure's report)."""
    out, said = tmp_path_factory.mktemp("quick-demo"), io.StringIO()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(said):
            rc = main(["demo", "--quick", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
        sys.stdout.write(said.getvalue())
    return SimpleNamespace(out=out, rc=rc, stdout=said.getvalue())


def test_demo_quick(quick_demo, capsys):
    assert quick_demo.rc == 0, quick_demo.stdout
    out, folder = quick_demo.stdout, quick_demo.out
    assert "test BLEU = " in out and "the book's four sentences" in out
    for en in ("go .", "i lost .", "he's calm .", "i'm home ."):
        assert f"  {en}" in out
    assert_not_blank_png(folder / "attention-hes-calm.png")
    assert (folder / "attention-hes-calm.html").exists()
    summary = json.loads((folder / "translate-demo.json").read_text())
    assert summary["quick"] is True and summary["n"] > 0
    assert "\ndone in " in out  # it learned, and says so
    # the run folder is a usable model dir
    assert main(["translate", "--model-dir", str(folder / "translator"), "go ."]) == 0
    assert capsys.readouterr().out.strip()


@pytest.mark.slow
def test_a_run_its_clock_stopped_shows_its_model_and_says_how_to_go_on(
    quick_demo, tmp_path, capsys, monkeypatch
):
    assert quick_demo.rc == 0, quick_demo.stdout

    def fake_train(config, run_dir, **kw):
        # the quick recipe's run, really trained (a model that translates), told as a full
        # run that its clock stopped at update 350
        shutil.copytree(quick_demo.out / "translator", run_dir, dirs_exist_ok=True)
        return _result(Path(run_dir))

    monkeypatch.setattr("qkv.train.train", fake_train)
    assert main(["demo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    run_dir = tmp_path / "translator"
    assert f"trained 350 updates in 7.0 min (of at most {demo.FULL['max_steps']}: " in out
    # one BLEU: the test split's, of the model the demo translates with
    assert out.count("BLEU") == 1 and "test BLEU = " in out
    assert "FAILED" not in out
    # the quick recipe's model: far from the book's four sentences
    assert re.search(r"not finished: [0-3] of the book's 4 sentences right after 350 updates", out)
    assert f"continue with: qkv train --out {run_dir} --resume --max-minutes {AGAIN:g}" in out
    assert (tmp_path / "attention-hes-calm.png").stat().st_size > 0
    assert (tmp_path / "attention-hes-calm.html").exists()
    summary = json.loads((tmp_path / "translate-demo.json").read_text())
    assert summary["updates"] == 350 and summary["stopped"] == "max_minutes"
    assert not list(tmp_path.glob(".translate-demo.json*"))  # written atomically


def test_a_run_that_could_not_learn_in_time_is_not_finished_not_failed(
    tmp_path, capsys, monkeypatch
):
    """The issue's run: the budget ran out at update 144 with BLEU 10.6."""
    fake = _result(tmp_path / "translator", step=144, minutes=7.5, best_bleu=10.6)
    monkeypatch.setattr("qkv.train.train", lambda *a, **k: fake)
    assert main(["demo", "--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "FAILED" not in captured.err + captured.out and "test BLEU" not in captured.out
    line = captured.err.strip().splitlines()[-1]
    assert line.startswith(
        "qkv demo translate: not finished: its best validation BLEU 10.6 is below 30 after 144 "
        f"updates in 7.5 min: this machine trained too slowly for the demo's {BUDGET:g}-minute budget"
    )
    run_dir = tmp_path / "translator"
    assert line.endswith(
        f"continue with: qkv train --out {run_dir} --resume --max-minutes {AGAIN:g}"
    )


def test_a_run_that_finished_its_plan_without_learning_failed(tmp_path, capsys, monkeypatch):
    fake = _result(tmp_path / "translator", step=700, minutes=3.0, stopped="max_steps")
    fake.best_bleu = 0.0
    monkeypatch.setattr("qkv.train.train", lambda *a, **k: fake)
    assert main(["demo", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert (
        "qkv demo translate: FAILED: the model did not learn: its best validation BLEU 0.0 " in err
    )
    assert "(after 700 updates in 3.0 min, stopped: max_steps)" in err
    assert "continue with" not in err


@pytest.mark.parametrize("settings", [demo.FULL, demo.QUICK])
def test_the_continue_command_is_one_qkv_train_takes(tmp_path, settings):
    """`qkv train` parses it: a resumed run of the demo's folder, with twice its budget (a
    run's budget counts all its invocations)."""
    cmd = shlex.split(demo.continue_command(tmp_path / "a run", settings))
    assert cmd[:2] == ["qkv", "train"]
    args = build_parser().parse_args(cmd[1:])
    assert args.resume and Path(args.out) == tmp_path / "a run"
    assert float(args.max_minutes) == 2 * settings["max_minutes"]
