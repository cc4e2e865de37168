"""The training library's messages go through logging (logger qkv.train.loop); the progress line
is the only thing written to the stream directly, and it is wiped before a message prints."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest
from _train_helpers import tiny_config

from qkv.train import train
from qkv.train.progress import Progress, messages_on
from qkv.train.runlock import LOCK_NAME


def _quick(corpus_file, **changes):
    return tiny_config(
        data=str(corpus_file), max_steps=2, eval_every=2, save_every=2, tune_decoding=False,
        average_last=0, **changes,
    )  # fmt: skip


@pytest.fixture
def qkv_logger():
    """The ``qkv`` logger, its level put back afterwards."""
    top = logging.getLogger("qkv")
    level = top.level
    yield top
    top.setLevel(level)


def test_the_run_messages_are_log_records(tmp_path, corpus_file, caplog):
    with caplog.at_level(logging.INFO, logger="qkv"):
        train(_quick(corpus_file, preset="cpu-minutes"), tmp_path, progress=False)
    ours = [r for r in caplog.records if r.name == "qkv.train.loop"]
    text = "\n".join(r.getMessage() for r in ours)
    # every message is INFO but the verdict on two updates: a warning that they learned nothing
    verdicts = [r for r in ours if r.getMessage().startswith("the model is not usable")]
    assert len(verdicts) == 1 and verdicts[0].levelno == logging.WARNING
    assert all(r.levelno == logging.INFO for r in ours if r not in verdicts)
    assert "new run; transformer model" in text
    assert "preset cpu-minutes: " in text and "note: your settings win: " in text
    assert "schedule: peak lr 0.003" in text
    assert "valid @ 2: loss" in text and "stopped (max_steps) at update 2" in text


def test_a_qkv_logger_set_to_warning_shows_no_notes(tmp_path, corpus_file, qkv_logger):
    qkv_logger.setLevel(logging.WARNING)
    buf = io.StringIO()
    train(_quick(corpus_file, log_every=1), tmp_path, stream=buf)
    text = buf.getvalue()
    assert "] 2/2 loss" in text  # the progress line is the stream's own
    assert "new run" not in text and "schedule:" not in text and "valid @" not in text


def test_an_application_without_logging_sees_warnings_only(tmp_path, corpus_file):
    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = {"pid": dead.pid, "host": socket.gethostname(), "started": "then", "command": "x"}
    (out / LOCK_NAME).write_text(json.dumps(stale))  # the one warning of this run
    config = _quick(corpus_file).to_dict()
    script = textwrap.dedent(f"""
        from qkv.train import TrainConfig, train
        train(TrainConfig.from_dict({config!r}), {str(out)!r}, progress=False)
    """)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
    # the warnings: the lock taken over, and the verdict on two updates (they learned nothing)
    lines = res.stderr.splitlines()
    assert lines[0] == (
        f"took over the lock {out / LOCK_NAME} left by pid {dead.pid} on "
        f"{socket.gethostname()} since then: that process is gone"
    )
    assert len(lines) == 2 and lines[1].startswith("the model is not usable: ")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_message_wipes_the_progress_line_on_a_terminal(qkv_logger):
    term = _Terminal()
    bar = Progress(10, True, term)
    with messages_on(bar, stream_given=True):
        bar.update(1, 2.0, 1e-3, 1000.0, 1.0, 9.0, False)
        assert term.getvalue().startswith("\r[##")
        logging.getLogger("qkv.train.loop").info("valid @ 1: loss 1.0")
    assert term.getvalue().endswith("\x1b[K\r\x1b[Kqkv: valid @ 1: loss 1.0\n")
    assert not qkv_logger.handlers  # the handler was for the run only


def test_the_progress_line_never_shows_more_than_its_plan_or_a_negative_eta():
    """A plan the run overran (re-planned soon) shows as done: never ``138/137 eta -1:58``."""
    line = Progress(137, True, io.StringIO())._fmt(138, 1.0, 1e-3, 1000.0, 60.0, -118.0)
    assert "138/138 " in line and line.endswith("eta 0:00") and "[####################]" in line
    assert "7/10 " in Progress(10, True, io.StringIO())._fmt(7, 1.0, 1e-3, 1.0, 6.0, 3.0)


def test_a_timed_run_past_its_plan_replans_and_its_line_never_overruns(
    tmp_path, corpus_file, monkeypatch
):
    # every re-plan finds the run at its end (a machine that keeps speeding up): before the
    # fix the line read 4/3, 5/3 ... with a negative eta until the next re-plan, at update 6
    monkeypatch.setattr("qkv.train.plan.Plan.estimate", lambda self, step, *a, **k: step)
    stream = io.StringIO()
    res = train(
        tiny_config(data=str(corpus_file), max_steps=12, max_minutes=5.0, log_every=1,
                    eval_every=None, save_every=None, warmup_steps=None, schedule="linear",
                    tune_decoding=False, average_last=0),
        tmp_path / "run", stream=stream,
    )  # fmt: skip
    assert res.step == 12
    shown = re.findall(r"\] (\d+)/(\d+) .* eta (\S+)", stream.getvalue())
    assert len(shown) == 12
    assert all(int(a) <= int(b) and not eta.startswith("-") for a, b, eta in shown), shown
