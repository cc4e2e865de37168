"""The benchmark runner shared by every ``benchmarks/*.py``.

Each case times a peer and qkv on the same inputs in one process run: both are warmed up, then
timed alternately (peer, qkv / qkv, peer in turns) for ``repeats`` rounds; each sample is the mean
of ``number`` calls.  The table reports medians and, last, the ratio ``peer / qkv`` (> 1 means qkv
is faster).  ``--json PATH`` writes the same figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

__all__ = ["Case", "Result", "add_arguments", "print_table", "run_cases", "write_json"]


@dataclass
class Case:
    """One comparison: ``peer()`` and ``qkv()`` do the same work."""

    name: str
    peer_name: str
    peer: Callable[[], object]
    qkv: Callable[[], object]
    target: float | None = None  # the ratio the issue asks for, printed beside the result
    note: str = ""


@dataclass
class Result:
    name: str
    peer_name: str
    peer_ms: float
    qkv_ms: float
    ratio: float
    target: float | None
    peer_samples: list[float] = field(default_factory=list)
    qkv_samples: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def meets_target(self) -> bool | None:
        return None if self.target is None else self.ratio >= self.target


def _sample(fn: Callable[[], object], number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number * 1e3


def _calibrate(fn: Callable[[], object], min_ms: float) -> int:
    t = _sample(fn, 1)
    return max(1, int(min_ms / max(t, 1e-3)))


def run_cases(
    cases: Sequence[Case], repeats: int = 7, warmup: int = 2, min_sample_ms: float = 200.0
) -> list[Result]:
    """Time every case (peer and qkv interleaved) and return the medians."""
    results = []
    for case in cases:
        for _ in range(warmup):
            case.peer()
            case.qkv()
        number = min(_calibrate(case.peer, min_sample_ms), _calibrate(case.qkv, min_sample_ms))
        ps, qs = [], []
        for r in range(repeats):
            if r % 2 == 0:
                ps.append(_sample(case.peer, number))
                qs.append(_sample(case.qkv, number))
            else:
                qs.append(_sample(case.qkv, number))
                ps.append(_sample(case.peer, number))
        p, q = statistics.median(ps), statistics.median(qs)
        results.append(
            Result(case.name, case.peer_name, p, q, p / q, case.target, ps, qs, case.note)
        )
    return results


def print_table(results: Sequence[Result], title: str = "") -> None:
    """Peer and qkv medians, then the ratio last."""
    if title:
        print(title)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}")
    w = max(len(r.name) for r in results)
    pw = max(len(r.peer_name) for r in results)
    print(f"{'case':<{w}}  {'peer':<{pw}}  {'peer ms':>9}  {'qkv ms':>9}  {'target':>7}  ratio")
    for r in results:
        tgt = "" if r.target is None else f">={r.target:g}x"
        flag = "" if r.meets_target is None else ("  ok" if r.meets_target else "  MISSED")
        print(
            f"{r.name:<{w}}  {r.peer_name:<{pw}}  {r.peer_ms:>9.2f}  {r.qkv_ms:>9.2f}  "
            f"{tgt:>7}  {r.ratio:.2f}x{flag}"
        )


def write_json(results: Sequence[Result], path: str, meta: dict | None = None) -> None:
    data = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        # the machine's 1-minute load when the run ended (its own threads included): a figure
        # taken beside other work is slower than the machine
        "load_average_at_end": round(os.getloadavg()[0], 2),
        **(meta or {}),
        "results": [asdict(r) | {"meets_target": r.meets_target} for r in results],
    }
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds (median)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (smoke)")
