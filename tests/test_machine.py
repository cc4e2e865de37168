"""qkv._machine: one reading of procfs and the cgroups, one answer to "how much memory is
left" for every reader (attention's memory guard, a model folder's bounds)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from qkv import _machine
from qkv.functional import _memory
from qkv.inference import bounds

GiB = 1 << 30


def _tree(root: Path, files: dict[str, str]) -> tuple[Path, Path]:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root / "proc", root / "cg"


#: a machine of 64 GiB available whose process is limited by its cgroup, v2 or v1: the limit
#: sits above the process's own cgroup, and 1 GiB of the usage is reclaimable page cache
TREES = {
    "v2": {
        "proc/meminfo": f"MemTotal: 1 kB\nMemAvailable: {64 * GiB // 1024} kB\n",
        "proc/self/cgroup": "0::/job/step\n",
        "cg/job/step/memory.max": "max\n",
        "cg/job/memory.max": f"{6 * GiB}\n",
        "cg/job/memory.current": f"{5 * GiB}\n",
        "cg/job/memory.stat": f"anon 1\ninactive_file {GiB}\n",
    },
    "v1": {
        "proc/meminfo": f"MemAvailable: {64 * GiB // 1024} kB\n",
        "proc/self/cgroup": "9:cpu,cpuacct:/job/step\n4:memory:/job/step\n0::/\n",
        "cg/memory/job/step/memory.limit_in_bytes": "9223372036854771712\n",  # v1's none
        "cg/memory/job/memory.limit_in_bytes": f"{6 * GiB}\n",
        "cg/memory/job/memory.usage_in_bytes": f"{5 * GiB}\n",
        "cg/memory/job/memory.stat": f"cache 9\ntotal_inactive_file {GiB}\n",
    },
}


@pytest.mark.parametrize("version", sorted(TREES))
def test_every_reader_gets_one_answer_under_cgroup_v1_and_v2(tmp_path, monkeypatch, version):
    """The memory guard of attention and the bounds of a model folder read one function: under
    a cgroup limit of either version (on an ancestor of the process's cgroup) both say what the
    limit leaves, the reclaimable cache counted as free."""
    monkeypatch.setattr("resource.getrlimit", lambda r: (-1, -1))
    proc, cg = _tree(tmp_path, TREES[version])
    monkeypatch.setattr(_machine, "PROC", proc)
    monkeypatch.setattr(_machine, "CGROUP", cg)
    left = 6 * GiB - (5 * GiB - GiB)
    assert _machine.memory_available() == left
    assert _memory.available_memory(torch.device("cpu")) == left
    assert _memory.cpu_available_memory(proc, cg) == left
    assert bounds.available_memory() == left


def test_without_a_limit_the_kernels_figure_is_the_answer(tmp_path, monkeypatch):
    monkeypatch.setattr("resource.getrlimit", lambda r: (-1, -1))
    proc, cg = _tree(tmp_path, {**TREES["v2"], "cg/job/memory.max": "max\n"})
    assert _machine.memory_available(proc, cg) == 64 * GiB
    assert _machine.memory_available(tmp_path / "none", tmp_path / "none") is None


def test_the_cgroup_folders_of_both_versions(tmp_path):
    proc, cg = _tree(tmp_path, {"proc/self/cgroup": TREES["v1"]["proc/self/cgroup"]})
    memory = _machine.cgroup_folders("memory", cg, proc / "self" / "cgroup")
    assert memory[:3] == [(1, cg / "memory/job/step"), (1, cg / "memory/job"), (1, cg / "memory")]
    assert (2, cg) in memory and (2, cg / "unified") in memory  # the v2 line ("0::/")
    cpu = {d for v, d in _machine.cgroup_folders("cpu", cg, proc / "self" / "cgroup") if v == 1}
    assert {cg / "cpu/job/step", cg / "cpu,cpuacct/job/step", cg / "cpuacct,cpu"} <= cpu
    assert _machine.cgroup_folders("memory", cg, tmp_path / "missing") == []


def test_the_umask_is_read_from_procfs_without_changing_it(tmp_path, monkeypatch):
    _tree(tmp_path, {"proc/self/status": "Name:\tpython\nUmask:\t0027\nState:\tR\n"})
    monkeypatch.setattr(_machine, "PROC", tmp_path / "proc")
    assert _machine.current_umask() == 0o027
    monkeypatch.setattr(_machine, "PROC", tmp_path / "none")  # elsewhere: set and put back
    mask = os.umask(0o022)
    os.umask(mask)
    assert _machine.current_umask() == mask


def test_the_threads_are_the_kernels_count(tmp_path):
    """Every thread of the process, a thread Python did not start included; None without
    procfs."""
    import threading

    before = _machine.threads_running()
    assert before is not None and before >= threading.active_count()
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert _machine.threads_running() == before + 1
    finally:
        stop.set()
        other.join()
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text("Name:\tpython\nThreads:\t7\n")
    assert _machine.threads_running(tmp_path) == 7
    assert _machine.threads_running(tmp_path / "none") is None
