"""Long sequences: qkv's chunked backend against torch SDPA and the book's additive attention.

Every measurement runs in a fresh process, so its peak memory (``ru_maxrss``, which includes the
~300 MiB of Python + torch itself; see the ``baseline`` row) is read from the OS.  Peer and qkv
runs alternate; the table shows medians over ``--repeats`` rounds and the ratio last.

Run: ``python -m benchmarks.long [--repeats N] [--json PATH] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

H, D = 8, 64  # heads and head width of the scaled-dot cases
HIDDEN = 64  # additive attention's hidden width


# ---------------------------------------------------------------------------- workers
def _book_additive(m, queries, keys, values, valid_lens):
    """The book's AdditiveAttention.forward (d2l), broadcasting a (B, Lq, Lk, h) tensor."""
    queries, keys = m.W_q(queries), m.W_k(keys)
    features = queries.unsqueeze(2) + keys.unsqueeze(1)
    features = torch.tanh(features)
    scores = m.w_v(features).squeeze(-1)
    shape = scores.shape
    mask = torch.arange(shape[-1])[None, :] < valid_lens.repeat_interleave(shape[1])[:, None]
    scores = scores.reshape(-1, shape[-1]).masked_fill(~mask, -1e6).reshape(shape)
    return torch.bmm(torch.softmax(scores, dim=-1), values)


def worker(case: str, L: int) -> dict:
    """Run one case once in this process; return its wall time."""
    from qkv import functional as qf
    from qkv.nn import AdditiveAttention

    torch.manual_seed(0)
    if case == "baseline":
        return {"seconds": 0.0}
    if case.startswith(("sdpa_causal", "qkv_valid_lens")):
        grad = case.endswith("_bwd")
        backend = "chunked" if "_chunked" in case else "auto"
        q, k, v = (torch.randn(1, H, L, D, requires_grad=grad) for _ in range(3))
        vl = torch.arange(1, L + 1).view(1, L)  # the book's per-query valid_lens: 1..L
        t0 = time.perf_counter()
        with torch.set_grad_enabled(grad):
            if case.startswith("sdpa"):
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                out, _ = qf.attention(q, k, v, valid_lens=vl, backend=backend)
            if grad:
                out.sum().backward()
        return {"seconds": time.perf_counter() - t0}
    if case in ("book_additive", "qkv_additive"):
        m = AdditiveAttention(key_size=HIDDEN, query_size=HIDDEN, num_hiddens=HIDDEN).eval()
        q, k, v = torch.randn(1, L, HIDDEN), torch.randn(1, L, HIDDEN), torch.randn(1, L, HIDDEN)
        vl = torch.tensor([L])
        t0 = time.perf_counter()
        with torch.no_grad():
            if case == "book_additive":
                _book_additive(m, q, k, v, vl)
            else:
                m(q, k, v, vl, need_weights=False)
        return {"seconds": time.perf_counter() - t0}
    raise ValueError(f"case: unknown case {case!r}")


def run_in_process(case: str, L: int) -> dict:
    """Run ``worker(case, L)`` in a fresh interpreter; return seconds and peak RSS (MiB)."""
    cmd = [sys.executable, "-m", "benchmarks.long", "--worker", case, "--length", str(L)]
    env = dict(os.environ)
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        return {"seconds": float("nan"), "peak_mib": float("nan"), "error": res.stderr[-500:]}
    return json.loads(res.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- table
def measure(pairs, repeats: int) -> list[dict]:
    rows = []
    for name, L, peer, ours, targets in pairs:
        samples: dict[str, list[dict]] = {peer: [], ours: []} if peer else {ours: []}
        # a case without a peer or a time target is there for its peak memory: one run is enough
        for r in range(repeats if peer or "max_seconds" in targets else 1):
            order = [c for c in (peer, ours) if c]
            for c in order if r % 2 == 0 else order[::-1]:
                samples[c].append(run_in_process(c, L))

        def med(c, key, samples=samples):
            vals = [s[key] for s in samples[c]] if c else []
            return statistics.median(vals) if vals else None

        rows.append(
            {
                "case": name,
                "L": L,
                "peer": peer,
                "peer_s": med(peer, "seconds"),
                "peer_peak_mib": med(peer, "peak_mib"),
                "qkv_s": med(ours, "seconds"),
                "qkv_peak_mib": med(ours, "peak_mib"),
                "targets": targets,
                "peer_samples_s": [s["seconds"] for s in samples[peer]] if peer else [],
                "qkv_samples_s": [s["seconds"] for s in samples[ours]],
                "errors": [s.get("error") for c in samples for s in samples[c] if "error" in s],
            }
        )
    return rows


def check(row: dict) -> list[str]:
    out = []
    t = row["targets"]
    if "max_peak_mib" in t:
        ok = row["qkv_peak_mib"] <= t["max_peak_mib"]
        out.append(f"peak <= {t['max_peak_mib']} MiB: {'ok' if ok else 'MISSED'}")
    if "max_time_ratio" in t and row["peer_s"]:
        r = row["qkv_s"] / row["peer_s"]
        ok = r <= t["max_time_ratio"]
        out.append(f"time <= {t['max_time_ratio']}x peer: {'ok' if ok else 'MISSED'}")
    if "max_seconds" in t:
        ok = row["qkv_s"] <= t["max_seconds"]
        out.append(f"time <= {t['max_seconds']} s: {'ok' if ok else 'MISSED'}")
    if "min_speedup" in t and row["peer_s"]:
        r = row["peer_s"] / row["qkv_s"]
        ok = r >= t["min_speedup"]
        out.append(f"speedup >= {t['min_speedup']}x: {'ok' if ok else 'MISSED'}")
    if "max_peak_fraction" in t and row["peer_peak_mib"]:
        ok = row["qkv_peak_mib"] <= row["peer_peak_mib"] * t["max_peak_fraction"]
        out.append(
            f"peak <= 1/{round(1 / t['max_peak_fraction'])} of peer: {'ok' if ok else 'MISSED'}"
        )
    return out


def print_rows(rows: list[dict], baseline_mib: float) -> None:
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"peaks are process RSS, baseline (import torch + qkv) {baseline_mib:.0f} MiB"
    )
    hdr = (
        f"{'case':<44} {'peer':<16} {'peer s':>8} {'peer MiB':>9} {'qkv s':>8} "
        f"{'qkv MiB':>8}  ratio (peer/qkv time; qkv/peer memory)"
    )
    print(hdr)
    for r in rows:

        def f(x, fmt):
            return format(x, fmt) if x is not None else "-"

        ratio = ""
        if r["peer_s"]:
            ratio = (
                f"{r['peer_s'] / r['qkv_s']:.2f}x time, "
                f"{r['qkv_peak_mib'] / r['peer_peak_mib']:.3f} memory"
            )
        print(
            f"{r['case']:<44} {r['peer'] or '-':<16} {f(r['peer_s'], '8.2f')} "
            f"{f(r['peer_peak_mib'], '9.0f')} {f(r['qkv_s'], '8.2f')} "
            f"{f(r['qkv_peak_mib'], '8.0f')}  {ratio}"
        )
        for c in check(r):
            print(f"{'':<46}{c}")
        for e in r["errors"]:
            print(f"{'':<46}error: {e}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--quick", action="store_true", help="short lengths (smoke test)")
    parser.add_argument(
        "--cases", help="comma-separated case numbers to run (1-6; default: all)", default=""
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        res = worker(args.worker, args.length)
        res["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(res))
        return
    s = 8 if args.quick else 1  # --quick divides every length by 8
    # (name, length, peer case, qkv case, targets)
    pairs = [
        ("scaled dot, valid_lens (1, L) = 1..L", 16384 // s, "sdpa_causal", "qkv_valid_lens",
         {"max_peak_mib": 700, "max_time_ratio": 1.5}),
        ("  the same, chunked backend forced", 16384 // s, "sdpa_causal",
         "qkv_valid_lens_chunked", {"max_peak_mib": 700, "max_time_ratio": 1.5}),
        ("additive, hidden 64, need_weights=False", 16384 // s, None, "qkv_additive",
         {"max_peak_mib": 1024, "max_seconds": 30}),
        ("additive, hidden 64 vs the book's broadcast", 4096 // s, "book_additive",
         "qkv_additive", {"min_speedup": 10.0, "max_peak_fraction": 1 / 20}),
        ("forward+backward, valid_lens (1, L) = 1..L", 8192 // s, "sdpa_causal_bwd",
         "qkv_valid_lens_bwd", {"max_peak_mib": 1536}),
        ("  the same, chunked backend forced", 8192 // s, "sdpa_causal_bwd",
         "qkv_valid_lens_chunked_bwd", {"max_peak_mib": 1536}),
    ]  # fmt: skip
    if args.cases:
        pairs = [pairs[int(i) - 1] for i in args.cases.split(",")]
    load_at_start = round(os.getloadavg()[0], 2)
    baseline = run_in_process("baseline", 1)["peak_mib"]
    rows = measure(pairs, 1 if args.quick else args.repeats)
    print_rows(rows, baseline)
    if args.quick:
        print("(--quick: lengths divided by 8; the targets apply to the full sizes)")
    if args.json:
        with open(args.json, "w") as fh:
            record = {
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "repeats": args.repeats,
                "baseline_mib": baseline,
                # 1-minute load averages: the run's own 2 threads count in the one at the end
                "load_average_at_start": load_at_start,
                "load_average_at_end": round(os.getloadavg()[0], 2),
                "rows": rows,
            }
            json.dump(record, fh, indent=2)


if __name__ == "__main__":
    main()
