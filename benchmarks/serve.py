"""``qkv serve`` under load: dynamic batching against the same server with batching off.

Issue 15's shape: two servers on the demo model (``qkv serve`` in subprocesses on the loopback),
one batching (the default: a 4096-token budget, 5 ms wait), one with ``--no-batching`` (each
request decoded alone, in arrival order: the peer). A load generator of its own (asyncio +
httpx, one request per sentence, LibreTranslate's request shape, English sentences of the bundled
corpus) keeps 1, 8 and 64 clients busy for about a minute each against each server in turn
(alternating which goes first); each client sends its next request when the last is answered.
The first 5 s of each phase (the clients connecting, the first batches forming) are not measured.
Reported per server and client count: sentences/s, latency p50/p95/p99, errors, and the mean
batch size the server's ``/metrics`` saw. ``--soak``: then 10 minutes at 8 clients on the
batching server, its memory (RSS) sampled every 10 s.

Targets (2 CPU cores): at 64 clients the batching server's throughput >= 3x the peer's, its p99
<= 2 s, no errors; the soak without error and with RSS growth < 10 %. The ratios come last.

Run: ``python -m benchmarks.serve [--quick] [--soak] [--json PATH] [--model-dir DIR]
[--seconds S] [--clients 1,8,64] [--threads N]``. Without ``--model-dir`` the demo model
``demo-out/translator`` is used, trained first with ``qkv demo`` when it is missing (``--quick``:
the quick demo's model, in a temporary folder, and 8 s per phase).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
DEMO_MODEL = Path("demo-out/translator")


# ---------------------------------------------------------------------------- the model
def demo_model(quick: bool) -> Path:
    """The demo's model folder, trained with ``qkv demo`` when missing."""
    if quick:
        out = Path(tempfile.mkdtemp(prefix="qkv-serve-bench-"))
        cmd = [sys.executable, "-m", "qkv.cli", "demo", "--quick", "--out", str(out)]
    else:
        if (DEMO_MODEL / "final").is_dir() or (DEMO_MODEL / "checkpoints").is_dir():
            return DEMO_MODEL
        out = DEMO_MODEL.parent
        cmd = [sys.executable, "-m", "qkv.cli", "demo", "--out", str(out)]
    print(f"training the demo model: {' '.join(cmd[2:])}", flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out / "translator"


def sentences(n: int = 2000, seed: int = 0) -> list[str]:
    """English sentences of the bundled corpus, shuffled (the demo model's own kind of input)."""
    from qkv.data import bundled_pairs

    src = sorted({s for s, _ in bundled_pairs()})
    random.Random(seed).shuffle(src)
    return src[:n]


# ---------------------------------------------------------------------------- a server
class Server:
    """``qkv serve`` in a subprocess on a free loopback port."""

    def __init__(self, model_dir: Path, name: str, *flags: str) -> None:
        self.name = name
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "qkv.cli", "serve", "--model-dir", str(model_dir)),
                *("--port", "0", "--quiet", *flags),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.url = ""
        self.banner = ""
        deadline = time.monotonic() + 120
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            m = re.search(r" on (http://127\.0\.0\.1:\d+)/$", line.strip())
            if m:
                self.url, self.banner = m.group(1), line.strip()
                break
        if not self.url:
            self.proc.kill()
            raise RuntimeError(f"{name}: qkv serve did not start")
        self.stderr: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def batches(self) -> tuple[float, float]:
        """``(decodes, sentences)`` so far, from /metrics."""
        text = httpx.get(self.url + "/metrics", timeout=30).text
        count = float(re.search(r"^qkv_batch_sentences_count (\S+)$", text, re.M).group(1))
        total = float(re.search(r"^qkv_batch_sentences_sum (\S+)$", text, re.M).group(1))
        return count, total

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: a graceful stop, exit status 0
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait(10)
        return self.proc.returncode


@contextlib.contextmanager
def servers(model_dir: Path, threads: int | None) -> Iterator[dict[str, Server]]:
    common = ["--threads", str(threads)] if threads else []
    made: dict[str, Server] = {}
    try:
        made["batching"] = Server(model_dir, "batching", *common)
        made["no batching"] = Server(model_dir, "no batching", "--no-batching", *common)
        yield made
    finally:
        for s in made.values():
            s.stop()


# ---------------------------------------------------------------------------- the load
async def load(
    url: str,
    texts: list[str],
    clients: int,
    seconds: float,
    *,
    ramp: float = 0.0,
    sample=None,
    every: float = 10.0,
) -> dict[str, Any]:
    """``clients`` concurrent clients, each sending its next request when the last is answered,
    for ``ramp + seconds``; returns the latencies and errors of the requests sent after the
    ``ramp`` (the clients connecting and the first batches forming are not measured), and the
    measured window. ``sample()`` is called every ``every`` seconds (the soak's memory)."""
    lat: list[float] = []
    errors: list[str] = []
    samples: list[Any] = []
    # TCP_NODELAY, as browsers and curl set it: httpx writes a request's head and body apart,
    # and without it Nagle's algorithm can hold the body for the server's delayed ACK (~40 ms)
    nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    t_ramp = time.perf_counter()
    t0 = t_ramp + ramp  # measured from here
    deadline = t0 + seconds
    counter = iter(range(10**9))
    last_done = [t0]

    async def one_client() -> None:
        # a client of its own per user, one keep-alive connection each: one pool shared by 64
        # connections cost httpx more CPU than the server spent (130 requests/s at most)
        transport = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=1), socket_options=nodelay
        )
        async with httpx.AsyncClient(base_url=url, timeout=120, transport=transport) as client:
            while time.perf_counter() < deadline:
                text = texts[next(counter) % len(texts)]
                body = {"q": text, "source": "en", "target": "fr"}
                start = time.perf_counter()
                counted = start >= t0
                try:
                    r = await client.post("/translate", json=body)
                    ok = r.status_code == 200 and isinstance(r.json().get("translatedText"), str)
                    if not ok:
                        errors.append(f"{r.status_code}: {r.text[:200]}")
                except Exception as e:  # a refused or dropped connection is an error too
                    errors.append(f"{type(e).__name__}: {e}")
                    continue
                end = time.perf_counter()
                if counted:
                    lat.append(end - start)
                    last_done[0] = max(last_done[0], end)

    async def sampler() -> None:
        await asyncio.sleep(ramp)
        while time.perf_counter() < deadline:
            samples.append((round(time.perf_counter() - t0, 1), sample()))
            await asyncio.sleep(every)

    tasks = [one_client() for _ in range(clients)]
    if sample is not None:
        tasks.append(sampler())
    await asyncio.gather(*tasks)
    elapsed = last_done[0] - t0  # the measured window: to the last counted answer
    if sample is not None:
        samples.append((round(elapsed, 1), sample()))
    return {"latencies": lat, "errors": errors, "elapsed": elapsed, "samples": samples}


def quantile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def phase(
    server: Server, texts: list[str], clients: int, seconds: float, ramp: float
) -> dict[str, Any]:
    before = server.batches()
    rss0 = server.rss_mb()
    res = asyncio.run(load(server.url, texts, clients, seconds, ramp=ramp))
    after = server.batches()
    lat = res["latencies"]
    decodes, sents = after[0] - before[0], after[1] - before[1]
    return {
        "server": server.name,
        "clients": clients,
        "seconds": round(res["elapsed"], 2),
        "sentences": len(lat),
        "sentences_per_s": round(len(lat) / res["elapsed"], 2),
        "p50_s": round(quantile(lat, 0.50), 4),
        "p95_s": round(quantile(lat, 0.95), 4),
        "p99_s": round(quantile(lat, 0.99), 4),
        "mean_s": round(statistics.fmean(lat), 4) if lat else None,
        "errors": len(res["errors"]),
        "error_examples": res["errors"][:3],
        "mean_batch": round(sents / decodes, 2) if decodes else None,  # ramp included
        "rss_mb": [round(rss0, 1), round(server.rss_mb(), 1)],
    }


def warm_up(server: Server, texts: list[str]) -> None:
    asyncio.run(load(server.url, texts[:200], 8, 3.0))


# ---------------------------------------------------------------------------- the report
def print_table(rows: list[dict[str, Any]]) -> None:
    head = f"{'server':<12} {'clients':>7} {'sent/s':>8} {'p50 s':>7} {'p95 s':>7} {'p99 s':>7}"
    head += f" {'errors':>6} {'batch':>6} {'RSS MB':>13}"
    print(head)
    print("-" * len(head))
    for r in rows:
        rss = f"{r['rss_mb'][0]:.0f}->{r['rss_mb'][1]:.0f}"
        batch = "-" if r["mean_batch"] is None else f"{r['mean_batch']:.1f}"
        print(
            f"{r['server']:<12} {r['clients']:>7} {r['sentences_per_s']:>8.1f} {r['p50_s']:>7.3f} "
            f"{r['p95_s']:>7.3f} {r['p99_s']:>7.3f} {r['errors']:>6} {batch:>6} {rss:>13}"
        )


def verdicts(rows: list[dict[str, Any]], soak: dict[str, Any] | None) -> dict[str, Any]:
    by = {(r["server"], r["clients"]): r for r in rows}
    top = max(r["clients"] for r in rows)
    b, n = by[("batching", top)], by[("no batching", top)]
    ratio = b["sentences_per_s"] / n["sentences_per_s"] if n["sentences_per_s"] else float("inf")
    out: dict[str, Any] = {
        "clients": top,
        "throughput_ratio": round(ratio, 2),
        "throughput_ratio_target": 3.0,
        "p99_s": b["p99_s"],
        "p99_target_s": 2.0,
        "errors": sum(r["errors"] for r in rows),
        "met": ratio >= 3.0 and b["p99_s"] <= 2.0 and sum(r["errors"] for r in rows) == 0,
    }
    print(
        f"\nat {top} clients: batching {b['sentences_per_s']:.1f} sentences/s vs "
        f"{n['sentences_per_s']:.1f} without: {ratio:.2f}x (target >= 3x) "
        f"{'OK' if ratio >= 3 else 'MISSED'}"
    )
    print(
        f"at {top} clients: batching p99 {b['p99_s']:.3f} s (target <= 2 s) "
        f"{'OK' if b['p99_s'] <= 2 else 'MISSED'}; errors in all phases: {out['errors']} "
        f"{'OK' if out['errors'] == 0 else 'MISSED'}"
    )
    if soak is not None:
        growth = soak["rss_growth"]
        soak_ok = soak["errors"] == 0 and growth < 0.10
        out["soak"] = {"errors": soak["errors"], "rss_growth": growth, "met": soak_ok}
        out["met"] = out["met"] and soak_ok
        print(
            f"soak {soak['minutes']:g} min at {soak['clients']} clients: {soak['sentences']} "
            f"sentences, {soak['errors']} errors, RSS {soak['rss_mb_start']:.0f} -> "
            f"{soak['rss_mb_end']:.0f} MB ({growth:+.1%}; target < +10%) "
            f"{'OK' if soak_ok else 'MISSED'}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the quick demo model, 8 s per phase")
    p.add_argument("--soak", action="store_true", help="then 10 minutes at 8 clients")
    p.add_argument("--soak-minutes", type=float, default=None, help="(default 10; quick: 1)")
    p.add_argument("--model-dir", type=Path, default=None, help="default: the demo's model")
    p.add_argument("--seconds", type=float, default=None, help="per phase (default 60; quick 8)")
    p.add_argument(
        "--ramp",
        type=float,
        default=None,
        help="unmeasured start of each phase (default 5; quick 1)",
    )
    p.add_argument("--clients", default="1,8,64", help="client counts (default 1,8,64)")
    p.add_argument(
        "--threads", type=int, default=None, help="qkv serve --threads (default: torch's)"
    )
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    seconds = args.seconds or (8.0 if args.quick else 60.0)
    soak_minutes = args.soak_minutes or (1.0 if args.quick else 10.0)
    ramp = args.ramp if args.ramp is not None else (1.0 if args.quick else 5.0)
    counts = [int(c) for c in args.clients.split(",")]
    load_start = os.getloadavg()
    model_dir = args.model_dir or demo_model(args.quick)
    texts = sentences()
    rows: list[dict[str, Any]] = []
    soak: dict[str, Any] | None = None
    t_start = time.time()
    with servers(model_dir, args.threads) as srv:
        print(srv["batching"].banner)
        print(srv["no batching"].banner)
        for s in srv.values():
            warm_up(s, texts)
        for i, c in enumerate(counts):
            order = ["batching", "no batching"] if i % 2 == 0 else ["no batching", "batching"]
            for name in order:
                print(f"{name}: {c} clients for {seconds:g} s ...", flush=True)
                rows.append(phase(srv[name], texts, c, seconds, ramp))
        rows.sort(key=lambda r: (r["server"] != "batching", r["clients"]))
        if args.soak:
            s = srv["batching"]
            print(f"soak: 8 clients for {soak_minutes:g} min ...", flush=True)
            res = asyncio.run(load(s.url, texts, 8, soak_minutes * 60, sample=s.rss_mb))
            rss = [v for _, v in res["samples"]]
            soak = {
                "clients": 8,
                "minutes": soak_minutes,
                "sentences": len(res["latencies"]),
                "sentences_per_s": round(len(res["latencies"]) / res["elapsed"], 2),
                "p99_s": round(quantile(res["latencies"], 0.99), 4),
                "errors": len(res["errors"]),
                "error_examples": res["errors"][:3],
                "rss_mb_start": round(rss[0], 1),
                "rss_mb_end": round(rss[-1], 1),
                "rss_mb_max": round(max(rss), 1),
                "rss_growth": round(rss[-1] / rss[0] - 1, 4),
                "rss_samples": [(t, round(v, 1)) for t, v in res["samples"]],
            }
        exits = {name: s.stop() for name, s in srv.items()}
    load_end = os.getloadavg()
    print()
    print_table(rows)
    out = verdicts(rows, soak)
    if args.json is not None:
        import torch

        record = {
            "torch": torch.__version__,
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "model_dir": str(model_dir),
            "quick": args.quick,
            "seconds_per_phase": seconds,
            "ramp_seconds": ramp,
            "threads": args.threads,
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in load_end],
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t_start)),
            "server_exit_status": exits,
            "results": rows,
            "soak": soak,
            "verdict": out,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
