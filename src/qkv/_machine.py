"""The machine as the kernel describes it: the one module of qkv that reads procfs, sysfs and
the cgroup files.

* **CPUs**: the physical cores of some logical CPUs (sysfs topology, :func:`physical_cores`),
  the cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``,
  :func:`cgroup_cpu_quota`), and the CPU time spent on them (:func:`read_stat`);
* **memory**: what this process can still allocate (:func:`memory_available`), one answer for
  every reader: the memory guard of :func:`qkv.functional.attention`
  (:mod:`qkv.functional._memory`) and the bounds a model folder is checked against
  (:mod:`qkv.inference.bounds`);
* **the umask**, read without changing it (:func:`current_umask`).

:mod:`qkv.runtime` chooses torch's threads from the CPU readings before torch loads. Every
reader takes the files' locations as arguments (a test passes a fake tree; the defaults are
:data:`PROC`, :data:`CGROUP`, :data:`SYS_CPU`, read when called), and answers None where a file
cannot be read (another system, a container without it). This module imports nothing of qkv
and never imports torch (floor 0).

A cgroup limit may sit on the process's own cgroup or on any cgroup above it, and a container
may see its own cgroup at the mount's root while ``/proc/self/cgroup`` names the host's path:
every folder from the named one up to the mount's root is read (:func:`cgroup_folders`), and
the smallest limit found wins.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CGROUP",
    "PROC",
    "SYS_CPU",
    "StatSample",
    "cgroup_cpu_quota",
    "cgroup_folders",
    "current_umask",
    "memory_available",
    "physical_cores",
    "read_stat",
    "runs_niced",
    "threads_running",
]

#: procfs
PROC = Path("/proc")
#: the cgroup mount (v2's unified hierarchy, or v1's folder of one mount per controller)
CGROUP = Path("/sys/fs/cgroup")
#: the CPUs' topology in sysfs
SYS_CPU = Path("/sys/devices/system/cpu")
#: what cgroup v1 writes for "no limit" (PAGE_COUNTER_MAX pages), and anything near it
_NO_LIMIT = 1 << 60
#: the v1 mounts a controller may share (``cpu,cpuacct``), besides its own and the one named
_V1_MOUNTS = {"cpu": ("cpu,cpuacct", "cpuacct,cpu")}


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


# ---------------------------------------------------------------------------- cgroups
def _ancestors(base: Path, rel: str) -> list[Path]:
    """``base/rel`` and each folder above it up to ``base`` (a limit may be set on any)."""
    parts = [p for p in rel.strip("/").split("/") if p and p not in (".", "..")]
    return [base.joinpath(*parts[:k]) for k in range(len(parts), -1, -1)]


def cgroup_folders(
    controller: str,
    root: str | os.PathLike | None = None,
    proc_cgroup: str | os.PathLike | None = None,
) -> list[tuple[int, Path]]:
    """The cgroup folders whose ``controller`` files (``"cpu"``, ``"memory"``) apply to this
    process, as ``(version, folder)``: from ``proc_cgroup`` (``/proc/self/cgroup``) the path of
    each hierarchy, then that folder and each above it under the mount ``root``
    (:data:`CGROUP`): v2's unified hierarchy at ``root`` (or ``root/unified`` on a hybrid
    machine), v1's at ``root/CONTROLLER`` or the mount it shares (``root/cpu,cpuacct``).
    Empty where ``proc_cgroup`` cannot be read."""
    root = CGROUP if root is None else Path(root)
    text = _read(PROC / "self" / "cgroup" if proc_cgroup is None else Path(proc_cgroup))
    found: dict[tuple[int, Path], None] = {}
    for line in (text or "").splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, rel = fields
        if controllers == "":  # v2: the unified hierarchy
            version, bases = 2, [root, root / "unified"]
        elif controller in controllers.split(","):
            names = (controller, controllers, *_V1_MOUNTS.get(controller, ()))
            version, bases = 1, [root / n for n in dict.fromkeys(names)]
        else:
            continue
        for base in bases:
            for folder in _ancestors(base, rel):
                found[(version, folder)] = None
    return list(found)


def _quota_v2(text: str | None) -> float | None:
    """A cgroup v2 ``cpu.max`` (``"max 100000"`` or ``"150000 100000"``) in CPUs."""
    parts = (text or "").split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _quota_v1(quota: str | None, period: str | None) -> float | None:
    """cgroup v1's ``cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``, in CPUs."""
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def cgroup_cpu_quota(
    root: str | os.PathLike | None = None, proc_cgroup: str | os.PathLike | None = None
) -> float | None:
    """The CPU quota of this process's cgroup, in CPUs (the smallest on its way up), or None:
    v2's ``cpu.max``, v1's ``cpu.cfs_quota_us``/``cpu.cfs_period_us``, in each folder of
    :func:`cgroup_folders` (``root``: the mount, ``proc_cgroup``: this process's cgroups)."""
    found = []
    for version, d in cgroup_folders("cpu", root, proc_cgroup):
        if version == 2:
            q = _quota_v2(_read(d / "cpu.max"))
        else:
            q = _quota_v1(_read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us"))
        if q is not None:
            found.append(q)
    return min(found) if found else None


# ---------------------------------------------------------------------------- CPUs
def physical_cores(ids: Iterable[int], sys_cpu: str | os.PathLike | None = None) -> int:
    """How many physical cores the logical CPUs ``ids`` are on (their package and core ids in
    ``sys_cpu/cpuN/topology``, :data:`SYS_CPU`); ``len(ids)`` where the topology cannot be
    read."""
    ids = list(ids)
    base = SYS_CPU if sys_cpu is None else Path(sys_cpu)
    cores = set()
    for i in ids:
        topo = base / f"cpu{i}" / "topology"
        core, package = _read(topo / "core_id"), _read(topo / "physical_package_id")
        if core is None:
            return len(ids)
        cores.add((package, core))
    return max(1, len(cores))


@dataclass(frozen=True)
class StatSample:
    """One reading of the kernel's CPU times for some CPUs, and this process's CPU time then.

    Attributes:
        t: when (``time.monotonic()`` seconds).
        busy: seconds those CPUs spent on anything but idling and waiting for I/O.
        own: seconds of CPU this process used (all its threads).
    """

    t: float
    busy: float
    own: float


def runs_niced() -> bool:
    """Does this process run at a lower priority than the default (``nice`` > 0)?"""
    try:
        return os.getpriority(os.PRIO_PROCESS, 0) > 0
    except (AttributeError, OSError):  # not Unix
        return False


def threads_running(proc: Path = PROC) -> int | None:
    """The threads of this process as the kernel counts them (every thread: Python's, a
    library's, OpenMP's), or None where ``/proc/self/status`` cannot be read."""
    return _int(_field(_read(proc / "self" / "status"), "Threads", ":"))


def read_stat(
    cpus: Iterable[int] | None,
    stat: str | os.PathLike | None = None,
    *,
    now: float | None = None,
    own: float | None = None,
    count_nice: bool | None = None,
) -> StatSample | None:
    """Read ``stat`` (procfs's ``stat``, the CPU time of each CPU in ticks) for the CPUs
    ``cpus`` (None: the ``cpu`` line of all). ``now`` and ``own`` (this process's CPU seconds)
    are read from the clock and ``os.times()`` unless given. None where the file cannot be
    read.

    ``count_nice``: whether the time of niced processes (``nice`` > 0, the second column) is
    busy time. A niced process yields its CPU to one at nice 0 (at ``nice 10`` it gets a tenth
    of a shared core), so for a process at nice 0 it is not (None: decided by
    :func:`runs_niced`; a niced process counts it: the others may be as niced as it is)."""
    if count_nice is None:
        count_nice = runs_niced()
    text = _read(PROC / "stat" if stat is None else Path(stat))
    if text is None:
        return None
    wanted = None if cpus is None else {f"cpu{i}" for i in cpus}
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    ticks, seen = 0, 0
    for line in text.splitlines():
        name, *values = line.split()
        if not name.startswith("cpu") or (wanted is None) != (name == "cpu"):
            continue
        if wanted is not None and name not in wanted:
            continue
        try:
            v = [int(x) for x in values[:8]]
        except ValueError:
            return None
        # user nice system idle iowait irq softirq steal: busy is all but idle and iowait
        ticks += sum(v) - v[3] - (v[4] if len(v) > 4 else 0) - (0 if count_nice else v[1])
        seen += 1
    if not seen:
        return None
    if own is None:
        t = os.times()
        own = t.user + t.system
    return StatSample(time.monotonic() if now is None else now, ticks / hz, own)


# ---------------------------------------------------------------------------- memory
def _int(text: str | None) -> int | None:
    """A cgroup's number; None for ``max``, v1's "no limit", or what is not a number."""
    text = (text or "").strip()
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= _NO_LIMIT else value


def _field(text: str | None, key: str, sep: str = " ") -> str | None:
    """The value of line ``KEY<sep>VALUE`` in ``text`` (``memory.stat``, ``meminfo``)."""
    for line in (text or "").splitlines():
        name, found, value = line.partition(sep)
        if found and name == key:
            return value.strip()
    return None


def _kib(text: str | None, key: str) -> int | None:
    """Line ``KEY: N kB`` of ``meminfo`` or ``status``, in bytes."""
    value = (_field(text, key, ":") or "").split()
    return int(value[0]) * 1024 if value and value[0].isdigit() else None


#: the files of a memory cgroup per version: its limit, its usage, its reclaimable page cache
_MEMORY_FILES = {
    2: ("memory.max", "memory.current", "inactive_file"),
    1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
}


def _cgroup_left(root: Path, proc_cgroup: Path) -> int | None:
    """The least any memory cgroup of this process leaves: ``limit - (usage - inactive file
    cache)``, over the cgroup and its ancestors, v2 and v1; None when none has a limit."""
    lefts = []
    for version, folder in cgroup_folders("memory", root, proc_cgroup):
        limit_file, usage_file, cache_key = _MEMORY_FILES[version]
        limit = _int(_read(folder / limit_file))
        if limit is None:
            continue
        usage = _int(_read(folder / usage_file)) or 0
        cache = _int(_field(_read(folder / "memory.stat"), cache_key)) or 0
        lefts.append(max(0, limit - max(0, usage - cache)))
    return min(lefts) if lefts else None


def _address_space_left(proc: Path) -> int | None:
    """What ``ulimit -v`` (RLIMIT_AS) leaves of this process's virtual size; None: no limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    size = _kib(_read(proc / "self" / "status"), "VmSize")
    return soft if size is None else max(0, soft - size)


def memory_available(
    proc: str | os.PathLike | None = None, cgroup: str | os.PathLike | None = None
) -> int | None:
    """Bytes this process can still allocate on the CPU, or None when nothing can be read:
    the smallest of the kernel's ``MemAvailable``; what each memory cgroup of this process
    (v2 ``memory.max``, v1 ``memory.limit_in_bytes``, the cgroup and its ancestors) leaves,
    its usage less its reclaimable page cache; and what the address-space limit (``ulimit -v``,
    ``RLIMIT_AS``) leaves of the process's virtual size.

    A container or a batch job usually has a cgroup limit far below the machine's free
    memory, and going past it gets the process killed, not a ``MemoryError``. ``proc`` and
    ``cgroup``: where procfs and the cgroup mount are (:data:`PROC`, :data:`CGROUP`)."""
    proc = PROC if proc is None else Path(proc)
    cgroup = CGROUP if cgroup is None else Path(cgroup)
    found = [
        n
        for n in (
            _kib(_read(proc / "meminfo"), "MemAvailable"),
            _cgroup_left(cgroup, proc / "self" / "cgroup"),
            _address_space_left(proc),
        )
        if n is not None
    ]
    return min(found) if found else None


# ---------------------------------------------------------------------------- the umask
_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process's umask, read without changing it where the kernel says it (Linux 4.7+:
    ``Umask:`` in procfs's ``self/status``); elsewhere set and put back at once, under a lock
    (another thread creating a file in between would get umask 022)."""
    with contextlib.suppress(ValueError):
        value = _field(_read(PROC / "self" / "status"), "Umask", ":")
        if value:
            return int(value.split()[0], 8)
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask
