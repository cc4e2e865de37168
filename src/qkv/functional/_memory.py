"""How much memory this process can still allocate: what the memory guard of
:func:`qkv.functional.attention` compares a materialisation with.

On the CPU :func:`qkv._machine.memory_available`, the one answer qkv has (the smallest of the
kernel's ``MemAvailable``, what each memory cgroup of this process leaves, and what
``ulimit -v`` leaves), which the bounds of a model folder (:mod:`qkv.inference.bounds`) read
too. On CUDA: ``torch.cuda.mem_get_info``. None when nothing can be read.
"""

from __future__ import annotations

import os

import torch

from .._machine import memory_available

__all__ = ["available_memory", "cpu_available_memory"]


def cpu_available_memory(
    proc: str | os.PathLike | None = None, cgroup: str | os.PathLike | None = None
) -> int | None:
    """Bytes this process can still allocate on the CPU (:func:`qkv._machine.memory_available`),
    or None when nothing can be read. ``proc``/``cgroup``: where procfs and the cgroup mount are
    (None: the machine's)."""
    return memory_available(proc, cgroup)


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
