"""torch's CPU threads beside other busy processes: qkv's automatic choice against fixed policies.

torch's CPU threads are OpenMP threads; a thread that waits spins a while first (libgomp's
default), which is fast on a quiet machine and slow beside other busy processes. ``qkv``
chooses the thread count and the wait from the machine's state before torch loads
(:mod:`qkv.runtime`); this benchmark measures that choice against the fixed ones:

* **auto**: what the ``qkv`` command does: :func:`qkv.runtime.configure_threads` in the
  worker before it imports torch (a quiet machine: torch's default; busy: one thread per free
  CPU);
* **default**: today's default without qkv: ``OMP_WAIT_POLICY`` unset (spin, then sleep), one
  thread per core;
* **passive**: ``OMP_WAIT_POLICY=PASSIVE``, one thread per core;
* **one**: one thread, ``PASSIVE``.

Two workloads, both loops of small operations, as the demo and ``qkv translate`` run them:

* **translation**: greedy decoding of ``--steps`` tokens with the KV cache, batch 8, a 2+2-layer
  Transformer 128 wide, 4 heads (``benchmarks.seq2seq``'s decoding case at that size);
* **training**: ``--updates`` training updates (forward, cross-entropy, backward, AdamW) of the
  same model size on 16 sentence pairs of 16 tokens (``benchmarks.seq2seq``'s training case).

Each beside 0, 1 and as many busy processes as this process has CPUs (``python -c 'while True:
pass'``, started before the worker), each configuration in a fresh process (OpenMP reads its
settings when torch loads), the policies in a rotating order, ``--repeats`` rounds. The table
shows the median milliseconds of a sample; last, per row, the ratio of auto's time to the best
policy's (targets: <= 1.2 beside as many busy processes as CPUs) and, on a quiet machine, to
the default's (target: <= 1.05).

Run: ``python -m benchmarks.threads [--quick] [--repeats N] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

#: policy -> (the environment it sets, what it is in words)
POLICIES: dict[str, tuple[dict[str, str], str]] = {
    "auto": ({}, "qkv's choice (qkv.runtime.configure_threads)"),
    "default": ({}, "OMP_WAIT_POLICY unset, one thread per core"),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, "PASSIVE, one thread per core"),
    "one": ({"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}, "one thread, PASSIVE"),
}
WORKLOADS = ("training", "translation")
#: the variables a policy's worker starts without (the user's settings would win over auto's)
CLEARED = (
    "OMP_WAIT_POLICY",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "GOMP_SPINCOUNT",
    "KMP_BLOCKTIME",
    "QKV_AUTO_THREADS",
    "QKV_THREADS_SET",
)
#: the targets: auto / best beside as many busy processes as CPUs, auto / default when quiet
BUSY_TARGET, QUIET_TARGET = 1.2, 1.05


def cpu_count() -> int:
    """The CPUs this process may use (its affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ---------------------------------------------------------------------------- worker
def worker(workload: str, auto: bool, quick: bool, samples: int, steps: int, updates: int) -> dict:
    """Time ``samples`` calls of ``workload`` in this process; return the seconds of each.

    ``auto``: choose the threads as the ``qkv`` command does, before torch loads."""
    choice = None
    if auto:
        from qkv.runtime import configure_threads

        choice = configure_threads().describe()
    import torch

    from .seq2seq import decoding_case, training_case

    if workload == "translation":
        run = decoding_case(B=8, steps=steps, D=64 if quick else 128, layers=2, src_len=16).qkv
    else:
        case = training_case(B=16, L=16, D=64 if quick else 128, heads=4, layers=2, ffn=256)

        def run() -> None:
            for _ in range(updates):
                case.qkv()

    run()  # warm-up
    seconds = []
    for _ in range(samples):
        t0 = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - t0)
    return {
        "seconds": seconds,
        "threads": torch.get_num_threads(),
        "wait": os.environ.get("OMP_WAIT_POLICY", ""),
        "choice": choice,
    }


def worker_env(policy: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of ``policy``'s worker: ``environ`` (``os.environ``) without the thread
    settings of :data:`CLEARED`, plus the policy's own."""
    base = dict(os.environ if environ is None else environ)
    env = {k: v for k, v in base.items() if k not in CLEARED}
    env.update(POLICIES[policy][0])
    return env


def run_in_process(args: argparse.Namespace, workload: str, policy: str, busy: int) -> dict:
    """``worker(...)`` in a fresh interpreter under ``policy``, beside ``busy`` busy processes."""
    cmd = [sys.executable, "-m", "benchmarks.threads", "--worker", workload]
    cmd += ["--samples", str(args.samples), "--steps", str(args.steps)]
    cmd += ["--updates", str(args.updates)] + (["--quick"] if args.quick else [])
    cmd += ["--auto"] if policy == "auto" else []
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        if hogs:
            time.sleep(0.5)  # running before the worker looks at the machine
        res = subprocess.run(
            cmd, capture_output=True, text=True, env=worker_env(policy), check=False
        )
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    if res.returncode != 0:
        return {"seconds": [], "error": res.stderr[-500:]}
    return json.loads(res.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- table
def summarise(workload: str, busy: int, per_policy: dict[str, dict]) -> dict:
    """One row: each policy's median ms over its rounds, the best policy, and auto's ratios.

    ``per_policy``: policy -> ``{"rounds_ms": [...], "threads": n, ...}``; a policy without
    rounds has a NaN median and is never the best."""
    med = {
        p: statistics.median(v["rounds_ms"]) if v["rounds_ms"] else math.nan
        for p, v in per_policy.items()
    }
    timed = {p: m for p, m in med.items() if not math.isnan(m)}
    best = min(timed, key=timed.__getitem__) if timed else None
    auto = med.get("auto", math.nan)
    return {
        "workload": workload,
        "busy": busy,
        "policies": {p: {**v, "ms": med[p]} for p, v in per_policy.items()},
        "best": best,
        "auto_over_best": auto / timed[best] if best is not None else math.nan,
        "auto_over_default": auto / med.get("default", math.nan),
    }


def measure(args: argparse.Namespace) -> list[dict]:
    """Every (workload, busy processes) with every policy, rotating over ``args.repeats``."""
    rows, names = [], list(POLICIES)
    for workload in WORKLOADS:
        for busy in args.busy:
            per: dict[str, dict] = {p: {"rounds_ms": [], "errors": []} for p in names}
            started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            for r in range(args.repeats):
                for policy in names[r % len(names) :] + names[: r % len(names)]:
                    res = run_in_process(args, workload, policy, busy)
                    if not res["seconds"]:
                        per[policy]["errors"].append(res["error"])
                        continue
                    per[policy]["rounds_ms"].append(statistics.median(res["seconds"]) * 1e3)
                    per[policy].update(threads=res["threads"], wait=res["wait"])
                    if res.get("choice"):
                        per[policy]["choice"] = res["choice"]
            rows.append({**summarise(workload, busy, per), "started": started, "load": load})
            print(f"  measured {workload} beside {busy} busy", file=sys.stderr, flush=True)
    return rows


def merge_rows(measured: list[dict], earlier: dict | None) -> list[dict]:
    """``measured`` rows, and the rows of an ``earlier`` JSON record for the (workload, busy)
    pairs not measured again (each keeps its time and load; the file's load where the row has
    none), in the table's order."""
    if not earlier:
        return measured
    done = {(r["workload"], r["busy"]) for r in measured}
    kept = [
        {"load": earlier.get("load_at_start"), **r}
        for r in earlier.get("rows", [])
        if (r["workload"], r["busy"]) not in done
    ]
    order = {w: i for i, w in enumerate(WORKLOADS)}
    return sorted(measured + kept, key=lambda r: (order.get(r["workload"], 99), r["busy"]))


def verdict(rows: list[dict], cpus: int) -> list[str]:
    """The targets, one line each: auto / best beside ``cpus`` busy processes (<= 1.2), and
    auto / default on a quiet machine (<= 1.05)."""
    lines = []
    for r in rows:
        if r["busy"] == cpus:
            x, target, what = r["auto_over_best"], BUSY_TARGET, f"best ({r['best']})"
        elif r["busy"] == 0:
            x, target, what = r["auto_over_default"], QUIET_TARGET, "default"
        else:
            continue
        ok = "met" if x <= target else "MISSED"
        lines.append(
            f"{r['workload']} beside {r['busy']} busy: auto / {what} {x:.2f}x "
            f"(target <= {target:g}x: {ok})"
        )
    return lines


def print_rows(rows: list[dict], args: argparse.Namespace, cpus: int) -> None:
    import torch

    print(
        f"torch {torch.__version__}, {cpus} CPUs, {platform.machine()}; translation "
        f"{args.steps} tokens, training {args.updates} updates per sample; median ms of "
        f"{args.repeats} rounds; threads in brackets"
    )
    names = list(POLICIES)
    print(f"{'workload':<12} {'busy':>4} " + " ".join(f"{p:>12}" for p in names) + "  auto/best")
    for r in rows:
        cells = []
        for p in names:
            v = r["policies"][p]
            cells.append(f"{v['ms']:>8.1f} [{v.get('threads', '?')}]")
        print(
            f"{r['workload']:<12} {r['busy']:>4} "
            + " ".join(f"{c:>12}" for c in cells)
            + f"  {r['auto_over_best']:.2f}x ({r['best']})"
        )
        for p in names:
            for e in r["policies"][p]["errors"]:
                print(f"{'':<12}{p}: error: {e}")
    for r in rows:
        choice = r["policies"]["auto"].get("choice")
        if choice:
            print(f"auto, {r['workload']} beside {r['busy']} busy: {choice}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5, help="rotating rounds (median)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--quick", action="store_true", help="small sizes, one round (smoke)")
    parser.add_argument("--samples", type=int, default=None, help="timed calls per process")
    parser.add_argument("--steps", type=int, default=None, help="tokens decoded per sample")
    parser.add_argument("--updates", type=int, default=None, help="training updates per sample")
    parser.add_argument(
        "--busy",
        type=int,
        nargs="+",
        default=None,
        help="busy processes beside the worker, one row each (default: 0, 1 and one per CPU); "
        "with --json, the rows of that file for other counts are kept",
    )
    parser.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    parser.add_argument("--auto", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = args.quick
    args.samples = args.samples or (2 if quick else 5)
    args.steps = args.steps or (8 if quick else 32)
    args.updates = args.updates or (2 if quick else 5)
    if args.worker:
        res = worker(args.worker, args.auto, quick, args.samples, args.steps, args.updates)
        print(json.dumps(res))
        return
    if args.repeats < 1:
        parser.error(f"--repeats: expected an int >= 1, got {args.repeats}")
    if quick:
        args.repeats = 1
    cpus = cpu_count()
    partial = args.busy is not None
    if partial and any(n < 0 for n in args.busy):
        parser.error(f"--busy: expected counts >= 0, got {args.busy}")
    args.busy = sorted(set(args.busy)) if partial else sorted({0, 1, cpus})
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    rows = measure(args)
    print_rows(rows, args, cpus)
    if partial and args.json and os.path.exists(args.json):
        with open(args.json) as fh:
            rows = merge_rows(rows, json.load(fh))
        print(f"kept the rows of {args.json} for other busy counts (each with its load)")
    if quick:
        print("(--quick: small sizes, one round: it checks that the benchmark runs, nothing more)")
    if args.json:
        import torch

        meta = {"benchmark": "threads", "torch": torch.__version__, "quick": quick}
        meta |= {"machine": platform.machine(), "cpus": cpus, "repeats": args.repeats}
        meta |= {"load_at_start": load, "steps": args.steps, "updates": args.updates}
        tmp = f"{args.json}.tmp"
        with open(tmp, "w") as fh:
            json.dump({**meta, "rows": rows}, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, args.json)
    print("auto / best per row: " + ", ".join(
        f"{r['workload']} {r['busy']} busy {r['auto_over_best']:.2f}x" for r in rows
    ))  # fmt: skip
    for line in verdict(rows, cpus):
        print(line)


if __name__ == "__main__":
    main()
