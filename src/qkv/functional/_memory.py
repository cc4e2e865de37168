"""How much memory this process can still allocate: what the memory guard of
:func:`qkv.functional.attention` compares a materialisation with.

On the CPU the smallest of: the kernel's ``MemAvailable``; what each cgroup this process is in
(v2 ``memory.max``, v1 ``memory.limit_in_bytes``, the cgroup and its ancestors) leaves, its usage
less its reclaimable page cache; and what the address-space limit (``ulimit -v``,
``RLIMIT_AS``) leaves of the process's virtual size.  A container or a batch job usually has a
cgroup limit far below the machine's free memory: going past it gets the process killed, not a
``MemoryError``.  On CUDA: ``torch.cuda.mem_get_info``.  None when nothing can be read.
"""

from __future__ import annotations

import resource
from pathlib import Path

import torch

__all__ = ["available_memory", "cpu_available_memory"]

# what cgroup v1 writes for "no limit" (PAGE_COUNTER_MAX pages), and anything near it
_NO_LIMIT = 1 << 60


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= _NO_LIMIT else value


def _stat(text: str | None, key: str) -> int:
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return _int(value) or 0
    return 0


def _meminfo(proc: Path) -> int | None:
    for line in (_read(proc / "meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) > 1 and parts[1].isdigit() else None
    return None


def _ancestors(root: Path, rel: str) -> list[Path]:
    """``root/rel`` and each folder above it up to ``root`` (a limit may be set on any)."""
    parts = [p for p in rel.strip("/").split("/") if p and p not in (".", "..")]
    return [root.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _cgroup_left(proc: Path, cgroup: Path) -> int | None:
    """The least any memory cgroup of this process leaves: ``limit - (usage - inactive file
    cache)``, over the cgroup and its ancestors, v2 and v1; None when none has a limit."""
    lefts: list[int] = []
    for line in (_read(proc / "self" / "cgroup") or "").splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, rel = fields
        if controllers == "":  # v2: the unified hierarchy (or its hybrid mount)
            bases = [cgroup, cgroup / "unified"]
            names = ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            bases = list(dict.fromkeys([cgroup / "memory", cgroup / controllers]))
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        for base in bases:
            # inside a container the cgroup's path may not exist under the mount (a cgroup
            # namespace shows its own root): the mount's root is then the process's cgroup
            for folder in _ancestors(base, rel):
                limit = _int(_read(folder / names[0]))
                if limit is None:
                    continue
                usage = _int(_read(folder / names[1])) or 0
                cache = _stat(_read(folder / "memory.stat"), names[2])
                lefts.append(max(0, limit - max(0, usage - cache)))
    return min(lefts) if lefts else None


def _address_space_left(proc: Path) -> int | None:
    """What ``ulimit -v`` (RLIMIT_AS) leaves of this process's virtual size; None: no limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    for line in (_read(proc / "self" / "status") or "").splitlines():
        if line.startswith("VmSize:"):
            parts = line.split()
            if len(parts) > 1 and parts[1].isdigit():
                return max(0, soft - int(parts[1]) * 1024)
    return soft


def cpu_available_memory(
    proc: str | Path = "/proc", cgroup: str | Path = "/sys/fs/cgroup"
) -> int | None:
    """Bytes this process can still allocate on the CPU (see the module's notes), or None when
    nothing can be read.  ``proc``/``cgroup`` are where procfs and the cgroup mount are."""
    proc, cgroup = Path(proc), Path(cgroup)
    found = [
        v
        for v in (_meminfo(proc), _cgroup_left(proc, cgroup), _address_space_left(proc))
        if v is not None
    ]
    return min(found) if found else None


def available_memory(device: torch.device) -> int | None:
    """Bytes ``device`` can still allocate for this process (None when unknown)."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0])
        if device.type == "cpu":
            return cpu_available_memory()
    except (OSError, RuntimeError, ValueError):  # pragma: no cover - platform dependent
        return None
    return None
