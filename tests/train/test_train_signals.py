"""SIGINT/SIGTERM during training: the update finishes, a checkpoint is written, the run stops
with a line that says how to resume; a second signal stops at once; handlers are restored."""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from _train_helpers import ENDED, qkv_here, tiny_config
from safetensors.torch import load_file

from qkv.train import TrainingInterrupted, train
from qkv.train.checkpoint import latest_checkpoint
from qkv.train.interrupt import StopSignals
from qkv.train.runlock import LOCK_NAME


@pytest.fixture(autouse=True)
def _sigint_as_in_a_terminal():
    """Python's own SIGINT handler for each test: a test run started in the background by a
    shell (``cmd &``, ``nohup``) inherits SIGINT ignored, which qkv rightly leaves alone."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before if before is not None else signal.SIG_DFL)


def _signal_at(monkeypatch, update: int, *signums: int) -> None:
    """Deliver ``signums`` to this process right after the optimizer update ``update``."""
    import qkv.train.loop as loop

    real, calls = loop.train_update, []

    def update_then_signal(*a, **k):
        stats = real(*a, **k)
        calls.append(1)
        if len(calls) == update:
            for s in signums:
                signal.raise_signal(s)
        return stats

    monkeypatch.setattr(loop, "train_update", update_then_signal)


def _quick(corpus_file, **changes):
    base = {"data": str(corpus_file), "max_steps": 6, "eval_every": 100, "save_every": 100}
    return tiny_config(**{**base, "tune_decoding": False, "average_last": 0, **changes})


def test_stop_signals_first_asks_second_stops_and_handlers_come_back(caplog):
    before = {s: signal.getsignal(s) for s in StopSignals.SIGNALS}
    stops = []

    def stop_now(signum):
        stops.append(signum)
        raise TrainingInterrupted("now", signum=signum, step=0)

    with StopSignals(stop_now) as sig:
        sig.graceful = True
        with caplog.at_level(logging.WARNING, logger="qkv"):
            signal.raise_signal(signal.SIGINT)
        assert sig.received == signal.SIGINT and not stops
        assert "SIGINT received: finishing the current update" in caplog.text
        with pytest.raises(TrainingInterrupted) as info:
            signal.raise_signal(signal.SIGINT)
        assert stops == [signal.SIGINT] and info.value.exit_status == 130
    assert {s: signal.getsignal(s) for s in StopSignals.SIGNALS} == before
    with StopSignals(stop_now), pytest.raises(TrainingInterrupted) as info:
        signal.raise_signal(signal.SIGTERM)  # not graceful (outside the loop): at once
    assert info.value.exit_status == 143 and info.value.signal_name == "SIGTERM"
    assert {s: signal.getsignal(s) for s in StopSignals.SIGNALS} == before


def test_sigterm_finishes_the_update_saves_and_says_how_to_resume(
    tmp_path, corpus_file, monkeypatch, caplog
):
    before = signal.getsignal(signal.SIGTERM)
    _signal_at(monkeypatch, 3, signal.SIGTERM)
    with caplog.at_level(logging.INFO, logger="qkv"), pytest.raises(TrainingInterrupted) as info:
        train(_quick(corpus_file), tmp_path, progress=False)
    e = info.value
    assert (e.step, e.signum, e.exit_status) == (3, signal.SIGTERM, 143)
    assert e.checkpoint == tmp_path / "checkpoints" / "step-00000003"
    assert (e.checkpoint / "manifest.json").is_file()
    line = f"stopped by SIGTERM at update 3; resume with: qkv train --out {tmp_path} --resume"
    assert str(e) == line and line in caplog.text
    assert signal.getsignal(signal.SIGTERM) is before
    assert not (tmp_path / LOCK_NAME).exists()


@pytest.mark.slow
def test_a_run_stopped_by_a_signal_resumes_exactly(tmp_path, corpus_file, monkeypatch):
    cut, ref = tmp_path / "cut", tmp_path / "ref"
    _signal_at(monkeypatch, 3, signal.SIGINT)
    with pytest.raises(TrainingInterrupted):
        train(_quick(corpus_file), cut, progress=False)
    monkeypatch.undo()
    resumed = train(_quick(corpus_file), cut, resume=True, progress=False)
    assert resumed.resumed_from == 3 and resumed.step == 6
    train(_quick(corpus_file), ref, progress=False)
    a = load_file(latest_checkpoint(cut / "checkpoints") / "model.safetensors")
    b = load_file(latest_checkpoint(ref / "checkpoints") / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_second_signal_stops_at_once(tmp_path, corpus_file, monkeypatch):
    _signal_at(monkeypatch, 3, signal.SIGINT, signal.SIGINT)
    with pytest.raises(TrainingInterrupted) as info:
        train(_quick(corpus_file, save_every=2), tmp_path, progress=False)
    e = info.value
    # inside update 3: not finished, not saved; --resume goes on from update 2
    assert e.step == 2 and e.exit_status == 130
    assert e.checkpoint == tmp_path / "checkpoints" / "step-00000002"
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step-00000002"
    assert "stopped by SIGINT at update 2; resume with: " in str(e)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _lines(stream, q):
    for line in stream:
        q.put(line)
    q.put(None)


@pytest.mark.slow
def test_sigterm_to_qkv_train_leaves_a_resumable_checkpoint(tmp_path):
    out = tmp_path / "run"
    args = [
        "train", "--out", str(out), "--max-steps", "400", "--log-every", "1",
        "--eval-every", "1000", "--save-every", "1000", "--threads", "1", "--lr", "3e-3",
        "--set", "max_pairs=600", "--set", "valid=40", "--set", "test=40",
        "--set", "eval_sentences=10", "--set", "tune_decoding=false", "--set", "average_last=0",
        "--set", "model.num_hiddens=32", "--set", "model.ffn_num_hiddens=64",
        "--set", "model.num_heads=2", "--set", "model.num_enc_layers=1",
        "--set", "model.num_dec_layers=1", "--preset", "none", "--max-tokens", "512",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "qkv.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    q: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stderr, q), daemon=True).start()
    seen, deadline = [], time.monotonic() + 120
    while not any("] 1/400 loss" in line for line in seen):  # the first update's progress line
        line = q.get(timeout=max(deadline - time.monotonic(), 0.1))
        assert line is not None, "".join(seen)
        seen.append(line)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, "".join(seen)
    while (line := q.get(timeout=30)) is not None:
        seen.append(line)
    err = "".join(seen)
    stopped = [line for line in seen if "stopped by SIGTERM at update" in line]
    assert len(stopped) == 1, err
    step = int(stopped[0].split("at update ")[1].split(";")[0])
    assert 1 <= step < 400
    assert f"resume with: qkv train --out {out} --resume" in stopped[0]
    assert "Traceback" not in err
    ckpt = latest_checkpoint(out / "checkpoints")
    assert ckpt is not None and ckpt.name == f"step-{step:08d}"
    assert not (out / LOCK_NAME).exists()

    resumed = qkv_here("train", "--out", str(out), "--resume", "--max-steps", str(step + 2))
    assert resumed.returncode in ENDED, resumed.stderr
    assert f"resumed at update {step} from" in resumed.stderr
    assert latest_checkpoint(out / "checkpoints").name == f"step-{step + 2:08d}"


def _worker_pid(out, rank: int) -> int | None:
    """The pid of torchrun's worker ``rank`` training into ``out`` (Linux /proc)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(out).encode() in cmd and b"qkv.cli" in cmd and f"RANK={rank}".encode() in env:
            return int(d)
    return None


@pytest.mark.slow  # two processes under torchrun
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds torchrun's workers in /proc")
def test_sigterm_to_one_torchrun_worker_stops_every_rank_at_one_update(tmp_path):
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "qkv.cli", "train", "--out", str(out), "--max-steps", "3000", "--log-every", "1",
        "--save-every", "1000", "--eval-every", "3000", "--max-tokens", "256", "--lr", "3e-3",
        "--device", "cpu", "--preset", "none", "--set", "max_pairs=600", "--set", "valid=40",
        "--set", "test=40", "--set", "eval_sentences=10", "--set", "model.num_hiddens=32",
        "--set", "model.ffn_num_hiddens=64", "--set", "model.num_heads=2",
        "--set", "model.num_enc_layers=1", "--set", "model.num_dec_layers=1",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    q: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stderr, q), daemon=True).start()
    seen, deadline = [], time.monotonic() + 180
    while not any("] 2/3000 loss" in line for line in seen):
        line = q.get(timeout=max(deadline - time.monotonic(), 0.1))
        assert line is not None, "".join(seen)
        seen.append(line)
    pid = _worker_pid(out, 1)
    assert pid is not None
    os.kill(pid, signal.SIGTERM)  # rank 1 only
    assert proc.wait(timeout=180) != 0  # torchrun reports its workers' 143
    while (line := q.get(timeout=30)) is not None:
        seen.append(line)
    err = "".join(seen)
    stopped = [line for line in seen if "stopped by SIGTERM at update" in line]
    assert len(stopped) == 1, err  # said once, by rank 0, which got no signal itself
    step = int(stopped[0].split("at update ")[1].split(";")[0])
    assert latest_checkpoint(out / "checkpoints").name == f"step-{step:08d}"
    assert err.count("SIGTERM received") == 1  # rank 1's; rank 0 heard it from rank 1
    assert "exitcode  : 143" in err  # (the traceback after it is torchrun's own)
    assert not (out / LOCK_NAME).exists()


def test_ignored_signals_stay_ignored():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a shell's background job
    try:
        with StopSignals(lambda s: None):
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_handlers_are_installed_in_the_main_thread_only():
    before = {s: signal.getsignal(s) for s in StopSignals.SIGNALS}
    seen = {}

    def elsewhere():
        with StopSignals(lambda s: None):
            seen.update({s: signal.getsignal(s) for s in StopSignals.SIGNALS})

    t = threading.Thread(target=elsewhere)
    t.start()
    t.join()
    assert seen == before
