"""This machine's speed, recorded beside absolute figures: torch's fp32 GEMM rate and the load.

Machines of one kind differ up to about 2x (the same ``make demo`` took 1.9 min on one and 4.0
on another), so a duration means little without the rate of the machine that measured it.
:func:`gemm_rate` times ``torch.mm`` of two ``n x n`` float32 matrices (``2 n^3`` FLOP each) at
a given thread count and returns the best of several repeats in GFLOP/s: the best, because
interference only ever slows a run down. :func:`describe` gives the dict the benchmarks put in
their JSON (``"machine"``), the load average beside it, so a figure measured on a busy machine
says so.

Run: ``python -m benchmarks.machine [--threads 1 2] [--n 1024] [--json P]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch


def gemm_rate(threads: int, n: int = 1024, repeats: int = 7) -> float:
    """fp32 GEMM GFLOP/s of ``torch.mm`` on ``n x n`` matrices with ``threads`` intra-op threads
    (the best of ``repeats`` timed products after one warm-up); torch's thread count is put
    back."""
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads: expected an int >= 1, got {threads!r}")
    if not isinstance(n, int) or n < 16:
        raise ValueError(f"n: expected an int >= 16, got {n!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=g)
        b = torch.randn(n, n, generator=g)
        out = torch.empty(n, n)
        torch.mm(a, b, out=out)  # warm-up: packing buffers, thread pool
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            torch.mm(a, b, out=out)
            best = min(best, time.perf_counter() - t)
    finally:
        torch.set_num_threads(before)
    return 2 * n**3 / best / 1e9


def describe(threads: tuple[int, ...] = (1, 2), n: int = 1024) -> dict[str, Any]:
    """What the benchmarks record of the machine: CPU model, logical CPUs, torch's version,
    the fp32 GEMM rate per thread count (GFLOP/s) and the load averages before and after."""
    load_before = os.getloadavg()
    rates = {str(t): round(gemm_rate(t, n), 1) for t in threads}
    return {
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "gemm_fp32_gflops": rates,
        "gemm_n": n,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.machine", description=__doc__)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--n", type=int, default=1024, help="matrix size (default: 1024)")
    p.add_argument("--json", type=Path, help="write the description to this file too")
    args = p.parse_args(argv)
    info = describe(tuple(args.threads), args.n)
    text = json.dumps(info, indent=1)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
