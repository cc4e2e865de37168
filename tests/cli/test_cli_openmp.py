"""The ``qkv`` command chooses torch's threads before torch loads (qkv.runtime): the user's
OpenMP settings reach torch as they are, a busy machine gets fewer threads, a quiet one torch's
defaults (PASSIVE would slow decoding down there: benchmarks/threads.py); ``--help`` chooses
nothing, and ``import qkv`` loads no torch until ``qkv.functional`` is used.

Each case here is a real process (a torch import, about 2.5 s): one per way a choice reaches
torch (nothing set, qkv's own count, a count read from the command line, a count replaced, a
count torch caps, each entry point). What each setting makes ``qkv.runtime.choose`` decide (the
user's wait policy or thread count given, ``QKV_AUTO_THREADS=0``, every invalid count: its
threads, environment and reason) is tested in-process in tests/test_runtime.py, as is
``configure_threads`` writing a choice into the environment before torch loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Imported by Python at start-up (a sitecustomize on PYTHONPATH): reports the variable as it is
# when torch starts loading, which is when libgomp reads it.
SPY = """
import importlib.abc, os, sys

class _TorchSpy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            for name in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS"):
                value = os.environ.get(name, "<unset>")
                sys.stderr.write(f"{name} when torch loads: {value}\\n")
        return None

sys.meta_path.insert(0, _TorchSpy())
"""

ENTRY_POINTS = {
    "python -m qkv": ["-m", "qkv"],
    "python -m qkv.cli": ["-m", "qkv.cli"],
    # what the `qkv` console script runs ([project.scripts] qkv = "qkv.cli:main")
    "console script": ["-c", "import sys; from qkv.cli import main; sys.exit(main())"],
}


#: a `qkv` whose machine has 2 CPUs and whose look finds ``LOAD`` CPUs kept busy by others
ON_A_GIVEN_MACHINE = (
    "import os, sys\n"
    "import qkv.runtime as r\n"
    "r.machine_cpus = lambda: r.Cpus((0, 1), cores=2, online=2)\n"
    "r.others_load = lambda cpus, look: r.Load(float(os.environ['LOAD']), look)\n"
    "import logging, qkv.cli as c\n"
    "def started(run):\n"  # the command's first message: the choice is said just before it
    "    def logged(args):\n"
    "        logging.getLogger('qkv.cli').info('started')\n"
    "        return run(args)\n"
    "    return logged\n"
    "for m in c.COMMANDS.values():\n"
    "    m.run = started(m.run)\n"
    "sys.exit(c.main())\n"
)
CLEARED = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "QKV_AUTO_THREADS")


def run(
    tmp_path: Path, args: list[str], policy: str | None, **env_vars: str
) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(SPY, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(env_vars)
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize(
    "entry, policy", [(e, None) for e in ENTRY_POINTS] + [("console script", "PASSIVE")]
)
def test_the_users_wait_policy_reaches_torch_and_none_is_imposed(tmp_path, entry, policy):
    # `train --help` loads torch (the defaults it shows come from the library)
    res = run(tmp_path, [*ENTRY_POINTS[entry], "train", "--help"], policy)
    assert res.returncode == 0, res.stderr
    assert "usage:" in res.stdout
    expected = "<unset>" if policy is None else policy
    assert f"OMP_WAIT_POLICY when torch loads: {expected}" in res.stderr, res.stderr


def test_importing_qkv_changes_nothing_and_loads_torch_on_first_use(tmp_path):
    code = (
        "import sys, qkv\n"
        "assert 'torch' not in sys.modules, 'import qkv loaded torch'\n"
        "assert 'functional' in dir(qkv) and qkv.__version__\n"
        "import torch\n"
        "out, _ = qkv.functional.attention(*[torch.ones(1, 2, 4)] * 3)\n"
        "from qkv import functional as qf\n"
        "import qkv.functional\n"
        "assert qf is qkv.functional and out.shape == (1, 2, 4)\n"
        "from qkv import *\n"
        "assert functional is qf\n"
        "try:\n"
        "    qkv.nothing\n"
        "except AttributeError as e:\n"
        "    assert str(e) == \"module 'qkv' has no attribute 'nothing'\", e\n"
        "else:\n"
        "    raise AssertionError('qkv.nothing did not raise')\n"
        "print('ok')\n"
    )
    res = run(tmp_path, ["-c", code], None)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"
    # a library user's process is left alone: torch loads with the variable unset
    assert "OMP_WAIT_POLICY when torch loads: <unset>" in res.stderr


@pytest.mark.parametrize(
    "args, load, env_vars, policy, threads, line",
    [
        # quiet: torch's own defaults (nothing set)
        (["evaluate"], "0.1", {}, "<unset>", "<unset>", "quiet: torch's default"),
        # busy: one thread per free CPU (qkv's count set), the wait left alone
        (["evaluate"], "1.9", {}, "<unset>", "1", "threads: 1 of 2 CPUs"),
        # the user's thread count, read from the command line before torch loads; it does not
        # fit beside the others: passive waiting
        (["train", "--threads", "2"], "1.9", {}, "PASSIVE", "<unset>", "--threads given"),
    ],
)
def test_the_choice_reaches_torch_and_is_logged(
    tmp_path, args, load, env_vars, policy, threads, line
):
    # both commands fail on their missing files after torch loaded, having chosen first
    missing = ["--data", str(tmp_path / "missing.tsv")]
    argv = [*args, *missing, "--out", str(tmp_path / "run")] if args[0] == "train" else [
        *args, "--model-dir", str(tmp_path / "missing"), *missing
    ]  # fmt: skip
    res = run(tmp_path, ["-c", ON_A_GIVEN_MACHINE, *argv], None, LOAD=load, **env_vars)
    assert res.returncode == 2, res.stderr
    assert f"OMP_WAIT_POLICY when torch loads: {policy}" in res.stderr, res.stderr
    assert f"OMP_NUM_THREADS when torch loads: {threads}" in res.stderr, res.stderr
    # one line, just before the command's first message
    lines = res.stderr.splitlines()
    logged = [i for i, x in enumerate(lines) if x.startswith("qkv: threads: ")]
    assert len(logged) == 1 and line in lines[logged[0]], res.stderr
    assert lines[logged[0] + 1] == "qkv: started", res.stderr


def _torch_threads(env_vars: dict[str, str]) -> int:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    code = "import torch; print(torch.get_num_threads())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**env, **env_vars}
    )
    return int(out.stdout)


def test_an_invalid_omp_num_threads_is_warned_about_in_one_line(tmp_path, value="junk"):
    argv = ["evaluate", "--model-dir", str(tmp_path / "missing"), "--data", "x.tsv"]
    res = run(tmp_path, ["-c", ON_A_GIVEN_MACHINE, *argv], None, LOAD="0.1", OMP_NUM_THREADS=value)
    assert res.returncode == 2, res.stderr
    assert "OMP_NUM_THREADS when torch loads: 2" in res.stderr, res.stderr
    warned = [x for x in res.stderr.splitlines() if "is not a thread count" in x]
    assert warned == [
        f"qkv: OMP_NUM_THREADS={value!r} is not a thread count (expected a whole "
        "number >= 1): ignored, 2 threads used instead (others kept 0.1 CPUs busy over 0.2 s, "
        "quiet: torch's default)"
    ], res.stderr


def test_a_thread_count_torch_caps_is_reported_as_torch_runs_it(tmp_path):
    running = _torch_threads({"OMP_NUM_THREADS": "99999"})
    assert running < 99999
    argv = ["evaluate", "--model-dir", str(tmp_path / "missing"), "--data", "x.tsv"]
    res = run(
        tmp_path, ["-c", ON_A_GIVEN_MACHINE, *argv], None, LOAD="0.1", OMP_NUM_THREADS="99999"
    )
    assert res.returncode == 2, res.stderr
    lines = res.stderr.splitlines()
    said = [x for x in lines if x.startswith("qkv: threads: ")]
    assert len(said) == 1 and said[0].startswith(f"qkv: threads: {running} of 2 CPUs"), lines
    warned = [x for x in lines if "not honoured" in x]
    noun = "thread" if running == 1 else "threads"
    assert warned == [
        f"qkv: OMP_NUM_THREADS=99999 was not honoured: torch runs {running} {noun}"
    ], lines
