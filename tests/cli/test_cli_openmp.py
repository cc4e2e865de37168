"""The ``qkv`` command leaves OpenMP's wait policy to the user: a value in its environment reaches
torch as it is, none is set for them (PASSIVE slows decoding on a machine that is not busy:
benchmarks/threads.py); ``import qkv`` loads no torch until ``qkv.functional`` is used."""

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
            policy = os.environ.get("OMP_WAIT_POLICY", "<unset>")
            sys.stderr.write(f"OMP_WAIT_POLICY when torch loads: {policy}\\n")
        return None

sys.meta_path.insert(0, _TorchSpy())
"""

ENTRY_POINTS = {
    "python -m qkv": ["-m", "qkv"],
    "python -m qkv.cli": ["-m", "qkv.cli"],
    # what the `qkv` console script runs ([project.scripts] qkv = "qkv.cli:main")
    "console script": ["-c", "import sys; from qkv.cli import main; sys.exit(main())"],
}


def run(tmp_path: Path, args: list[str], policy: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(SPY, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize(
    "entry, policy",
    [(e, None) for e in ENTRY_POINTS] + [(e, "PASSIVE") for e in ENTRY_POINTS],
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
