"""Tiny training settings and ways to run `qkv` (in a subprocess, or in this process where a
test is about what a command does and not about its process), shared by the train tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _folders import cli_here

#: the exit statuses of a tiny test run that ended: 0, or 3 when its model learned too little to
#: use (qkv.train.verdict.EXIT_NOT_LEARNED; tests/train/test_train_verdict.py checks which)
ENDED = (0, 3)

TINY = {
    "transformer": {
        "kind": "transformer",
        "num_hiddens": 32,
        "ffn_num_hiddens": 64,
        "num_heads": 2,
        "num_enc_layers": 2,
        "num_dec_layers": 1,
    },
    "bahdanau": {"kind": "bahdanau", "embed_size": 32, "num_hiddens": 32},
}


def tiny_config(kind: str = "transformer", **changes):
    """A config that trains in about a second on the CPU."""
    from qkv.train import TrainConfig

    base = {
        "model": TINY[kind],
        "valid": 40,
        "test": 40,
        "max_steps": 30,
        "max_tokens": 512,
        "warmup_steps": 10,
        "lr": 3e-3,
        "eval_every": 15,
        "eval_sentences": 20,
        "save_every": 15,
        "log_every": 5,
        # one thread, whatever the test process runs on: a resumed run is bit-exact only on
        # the thread count its checkpoint was written with (float sums split by thread)
        "threads": 1,
        # the book's text pipeline and no preset: these tests check the machinery on the
        # bundled (book-normalised) corpus; tests of the automatic choices set their own
        "normalizer": "book",
        "tokenizer": "word",
        "preset": "none",
    }
    base.update(changes)
    return TrainConfig().updated(base)


class DilatedTime:
    """The ``time`` module with a clock that runs ``factor`` times faster from its creation:
    ``monkeypatch.setattr("qkv.train.loop.time", DilatedTime(3))`` makes a run with a budget of
    M minutes plan, train, evaluate and stop by its budget in M / 3 minutes of the test's time.
    What the loop measures (its speed, the cost of an evaluation) it measures on this clock, so
    its plan is the plan of a machine ``factor`` times slower: the same decisions, in less
    time. Every other name is ``time``'s."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self._t0 = time.monotonic()

    def monotonic(self) -> float:
        return self._t0 + (time.monotonic() - self._t0) * self.factor

    def __getattr__(self, name: str):
        return getattr(time, name)


def run_qkv(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """``python -m qkv.cli ARGS`` in a subprocess, one torch thread, output captured."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "qkv.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        **kw,
    )


def qkv_here(*args: str) -> subprocess.CompletedProcess:
    """``qkv ARGS`` called in this process (:func:`_folders.cli_here`, on the test's one torch
    thread): what :func:`run_qkv` returns, without the second or two of a process starting
    torch. For what a command computes and writes; signals, exit statuses and the streams of a
    real process stay with :func:`run_qkv`."""
    code, out, err = cli_here(*args)
    return subprocess.CompletedProcess(["qkv", *args], code, out, err)


def kill_when_checkpointed(args: list[str], checkpoint: Path, within_s: float = 120) -> int:
    """Run ``qkv ARGS`` (one thread) and SIGKILL it as soon as ``checkpoint`` (a checkpoint
    folder) is wholly on disk (its manifest written); the process's return code."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "qkv.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    manifest = checkpoint / "manifest.json"
    deadline = time.monotonic() + within_s
    while not manifest.exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, f"no checkpoint within {within_s:g} s"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    return proc.returncode
