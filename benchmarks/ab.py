"""Is a change faster or slower? One benchmark run on two revisions of qkv, alternated.

A refactor promises "the same speed"; this says whether it kept it. Each round runs the
benchmark once on the base revision and once on the working tree (in alternating order, so a
machine that slows down over time hurts both alike), each a separate process on its own tree's
``src/`` and ``benchmarks/``; every figure the benchmark writes to its JSON is collected, and the
table gives per figure the median over the rounds on each side and their ratio, last (> 1: the
working tree is faster). Figures of the benchmark's peers (the plain loop, CTranslate2, the
book) are in the table too: they run the same code on both sides, so their ratio shows how much
of a difference is the machine's noise.

Run: ``python -m benchmarks.ab [--base REV] [--rounds N] [--json PATH] -- MODULE [ARGS ...]``,
e.g. ``python -m benchmarks.ab --base main -- translate --sentences 300 --out-len 32``.
``MODULE`` is a module of ``benchmarks`` whose ``--json PATH`` writes either runner results
(``benchmarks.runner.write_json``: ``qkv_ms``/``peer_ms`` per case) or per-system medians
(``benchmarks.translate``: ``results[mode]["systems"][name]["median_s"]``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def figures(data: dict) -> dict[str, float]:
    """The timings of a benchmark's JSON, flat: ``{"greedy / qkv fp32": seconds, ...}``."""
    out: dict[str, float] = {}
    results = data.get("results")
    if isinstance(results, list):  # benchmarks.runner
        for r in results:
            out[f"{r['name']} / qkv"] = r["qkv_ms"] / 1e3
            out[f"{r['name']} / {r['peer_name']}"] = r["peer_ms"] / 1e3
    elif isinstance(results, dict):  # benchmarks.translate
        for mode, block in results.items():
            for system, row in block.get("systems", {}).items():
                if isinstance(row, dict) and "median_s" in row:
                    out[f"{mode} / {system}"] = row["median_s"]
    if not out:
        raise ValueError("the benchmark's JSON holds no timings this script knows")
    return out


def checkout(rev: str, where: Path) -> Path:
    """A detached worktree of ``rev`` at ``where`` (made once, reused)."""
    if not (where / "src" / "qkv").is_dir():
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(where), rev],
            check=True,
            capture_output=True,
        )
    return where


def run_once(tree: Path, module: str, args: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}"}
        cmd = [sys.executable, "-m", f"benchmarks.{module}", *args, "--json", str(out)]
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} in {tree} failed:\n{done.stderr[-3000:]}")
        return figures(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: python -m benchmarks.ab [--base REV] [--rounds N] -- MODULE ...")
    cut = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="main", help="the revision to compare against (main)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of both sides (median)")
    ap.add_argument("--json", metavar="PATH", help="also write every sample as JSON")
    args = ap.parse_args(argv[:cut])
    module, bench_args = argv[cut + 1], argv[cut + 2 :]
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.base],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    base = checkout(rev, Path(tempfile.gettempdir()) / f"qkv-ab-{rev}")
    sides = {"base": base, "head": ROOT}
    samples: dict[str, dict[str, list[float]]] = {"base": {}, "head": {}}
    load = [os.getloadavg()[0]]
    for i in range(args.rounds):
        order = ["base", "head"] if i % 2 == 0 else ["head", "base"]
        for side in order:
            for key, value in run_once(sides[side], module, bench_args).items():
                samples[side].setdefault(key, []).append(value)
            print(f"round {i + 1}/{args.rounds}: {side} done", file=sys.stderr, flush=True)
        load.append(os.getloadavg()[0])
    print(f"\nbenchmarks.{module} {' '.join(bench_args)}: base {rev} vs the working tree, "
          f"{args.rounds} rounds, load {load[0]:.2f} at the start, {max(load):.2f} at most")  # fmt: skip
    print(f"{'figure':<44} {'base s':>9} {'head s':>9}  ratio (base / head, > 1: head faster)")
    rows = []
    for key in samples["base"]:
        b, h = statistics.median(samples["base"][key]), statistics.median(samples["head"][key])
        rows.append({"figure": key, "base_s": b, "head_s": h, "ratio": b / h})
        print(f"{key:<44} {b:>9.3f} {h:>9.3f}  {b / h:.3f}x")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"base": rev, "load": load, "samples": samples, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
