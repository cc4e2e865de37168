"""OpenMP's wait policy on the CPU: small-model loops with and without a competing process.

Two OpenMP threads that spin while they wait (libgomp's default) fight any other busy process
for the cores, and loops of small torch ops slow down several-fold; ``OMP_WAIT_POLICY=PASSIVE``
avoids that but makes the threads wake for every parallel operation.  qkv sets neither
(docs/train.md); this benchmark measures both:

* **decoding**: greedy decoding of ``--steps`` tokens with the KV cache, batch 8, a 2+2-layer
  Transformer 128 wide, 4 heads (``benchmarks.seq2seq``'s decoding case at that size);
* **training**: ``--updates`` training updates (forward, cross-entropy, backward, AdamW) of the
  same model size on 16 sentence pairs of 16 tokens (``benchmarks.seq2seq``'s training case).

Each runs with the policy unset (libgomp's default: the threads spin) and with ``PASSIVE``,
alone and beside a competing CPU-bound process (``python -c 'while True: pass'``), each
configuration in a fresh process (libgomp reads the policy when torch loads), the two policies
interleaved, ``--repeats`` rounds; the table shows medians and, last, the ratio default / passive
(> 1: passive is faster).  Threads: torch's default (one per core) unless ``--threads N``.

Run: ``python -m benchmarks.threads [--quick] [--repeats N] [--threads N] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

POLICIES = ("default", "passive")  # OMP_WAIT_POLICY unset, and PASSIVE
WORKLOADS = ("decoding", "training")
COMPETITORS = ("alone", "busy")


# ---------------------------------------------------------------------------- worker
def worker(workload: str, quick: bool, samples: int, steps: int, updates: int) -> dict:
    """Time ``samples`` calls of ``workload`` in this process; return the seconds of each."""
    import torch

    from .seq2seq import decoding_case, training_case

    if workload == "decoding":
        case = decoding_case(B=8, steps=steps, D=64 if quick else 128, layers=2, src_len=16)
        run = case.qkv
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
        "policy": os.environ.get("OMP_WAIT_POLICY", ""),
    }


def run_in_process(args: argparse.Namespace, workload: str, policy: str, competitor: str) -> dict:
    """``worker(...)`` in a fresh interpreter under ``policy``, beside a busy process if asked."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    cmd = [sys.executable, "-m", "benchmarks.threads", "--worker", workload]
    cmd += ["--samples", str(args.samples), "--steps", str(args.steps)]
    cmd += ["--updates", str(args.updates)] + (["--quick"] if args.quick else [])
    busy = None
    if competitor == "busy":
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.2)  # running before the worker starts
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    if res.returncode != 0:
        return {"seconds": [], "error": res.stderr[-500:]}
    return json.loads(res.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- table
def measure(args: argparse.Namespace) -> list[dict]:
    """Every (workload, competitor) with both policies, interleaved over ``args.repeats``."""
    rows = []
    for workload in WORKLOADS:
        for competitor in COMPETITORS:
            per_round: dict[str, list[float]] = {p: [] for p in POLICIES}
            errors, threads = [], None
            for r in range(args.repeats):
                for policy in POLICIES if r % 2 == 0 else POLICIES[::-1]:
                    res = run_in_process(args, workload, policy, competitor)
                    if res["seconds"]:
                        per_round[policy].append(statistics.median(res["seconds"]) * 1e3)
                        threads = res["threads"]
                    else:
                        errors.append(res["error"])
            med = {p: statistics.median(v) if v else float("nan") for p, v in per_round.items()}
            rows.append(
                {
                    "workload": workload,
                    "competitor": competitor,
                    "threads": threads,
                    "default_ms": med["default"],
                    "passive_ms": med["passive"],
                    "ratio": med["default"] / med["passive"],
                    "default_rounds_ms": per_round["default"],
                    "passive_rounds_ms": per_round["passive"],
                    "errors": errors,
                }
            )
    return rows


def print_rows(rows: list[dict], args: argparse.Namespace) -> None:
    import torch

    print(
        f"torch {torch.__version__}, {rows[0]['threads']} threads, {platform.machine()}; "
        f"decoding {args.steps} tokens, training {args.updates} updates per sample; "
        "ratio = default / passive (> 1: passive faster)"
    )
    print(f"{'workload':<10} {'beside':<22} {'default ms':>11} {'passive ms':>11}  ratio")
    for r in rows:
        beside = "a busy process" if r["competitor"] == "busy" else "nothing"
        print(
            f"{r['workload']:<10} {beside:<22} {r['default_ms']:>11.1f} "
            f"{r['passive_ms']:>11.1f}  {r['ratio']:.2f}x"
        )
        for e in r["errors"]:
            print(f"{'':<12}error: {e}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds (median)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--quick", action="store_true", help="small sizes, one round (smoke)")
    parser.add_argument("--threads", type=int, default=0, help="OMP threads (0: torch's)")
    parser.add_argument("--samples", type=int, default=None, help="timed calls per process")
    parser.add_argument("--steps", type=int, default=None, help="tokens decoded per sample")
    parser.add_argument("--updates", type=int, default=None, help="training updates per sample")
    parser.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = args.quick
    args.samples = args.samples or (2 if quick else 5)
    args.steps = args.steps or (8 if quick else 32)
    args.updates = args.updates or (2 if quick else 5)
    if args.worker:
        res = worker(args.worker, quick, args.samples, args.steps, args.updates)
        print(json.dumps(res))
        return
    if quick:
        args.repeats = 1
    rows = measure(args)
    print_rows(rows, args)
    busy = {r["workload"]: r["ratio"] for r in rows if r["competitor"] == "busy"}
    if quick:
        print("(--quick: small sizes, one round: it checks that the benchmark runs, nothing more)")
    if args.json:
        import torch

        with open(args.json, "w") as fh:
            meta = {"benchmark": "threads", "torch": torch.__version__, "quick": quick}
            json.dump({**meta, "machine": platform.machine(), "rows": rows}, fh, indent=2)
    print(
        "ratio default / passive beside a busy process: "
        + ", ".join(f"{w} {x:.2f}x" for w, x in busy.items())
    )


if __name__ == "__main__":
    main()
