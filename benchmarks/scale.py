"""Corpora of any size: ``qkv prepare`` once, then ``qkv train`` with flat memory (issue 29).

For each size (default 100k and 1M pairs; ``--sizes 100000 1000000 10000000`` adds 10M):

* **The corpus**: real English-French pairs (:mod:`benchmarks.real_corpus`'s training file,
  23k human translations of software messages) made unique and numerous by joining two of
  them: pair ``k`` is pair ``a`` then pair ``b`` (source and target alike, one space between),
  with ``a = k mod M`` and ``b = (a + 1 + k div M) mod M``; no two ``(a, b)`` are the same for
  ``k < M (M - 1)``. Written once into ``--work`` as ``corpus-N.tsv``.
* **Prepare**: ``qkv prepare --data corpus-N.tsv --out bin-N --set valid=1000 --set test=1000``
  from an empty folder: the wall time, the main process's peak RSS, ``report.json``'s stages;
  then a second prepare of the same data (a no-op: its time).
* **Train**: ``qkv train --data bin-N --max-steps 20``: the peak RSS of the process and the
  time from its start to its first update (the first progress line, ``--log-every 1``).
* **The file path, as before** (sizes up to ``--baseline-max``): ``qkv train --data
  corpus-N.tsv --max-steps 20 --set valid=1000 --set test=1000`` reads, splits, tokenizes and
  encodes the file in the run: its peak RSS and time to the first update.
* **torchrun**: ``torchrun --standalone --nproc_per_node 2 -m qkv.cli train --data bin-N`` (the
  largest size only): the peak of the summed RSS and of the summed PSS (shared pages split
  between the processes that map them) of the two ranks (torchrun's agent process aside),
  against the one process's.
* **The floor of torchrun** (beside the torchrun row): :mod:`benchmarks.ddp_floor`, plain
  PyTorch DDP training the same model on random batches of the same token budget with no data
  pipeline, one process of two threads and two ranks of one thread: what two processes cost
  whatever their data does (each imports torch and holds a replica of the model, its gradients
  and AdamW's moments).

Memory is sampled every 0.1 s from ``/proc`` over the process tree (RSS and PSS from
``smaps_rollup``), and the peak RSS of a single process is also read from ``getrusage``.

Run: ``python -m benchmarks.scale [--sizes N ...] [--work DIR] [--json PATH]``; one size at a
time with ``--sizes``; results already in ``--json`` for other sizes are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "scale.json"
STEPS = 20
HELD_OUT = ["--set", "valid=1000", "--set", "test=1000"]
GIB = 1024**3
#: the issue's targets
TARGETS = {
    "train_rss_gib_at_10m": 1.5,
    "train_rss_vs_100k": 1.2,
    "first_update_s_at_10m": 30.0,
    "prepare_s_at_10m": 15 * 60.0,
    "torchrun_2_vs_1": 1.3,
}


# ---------------------------------------------------------------------------- the corpus
def real_pairs() -> list[tuple[str, str]]:
    """The real corpus's training pairs (built offline by benchmarks.real_corpus)."""
    from .real_corpus import build_corpus

    paths = build_corpus(verbose=False)
    pairs = []
    with open(paths.train, encoding="utf-8") as f:
        for line in f:
            s, _, t = line.rstrip("\n").partition("\t")
            if s and t:
                pairs.append((s, t))
    return pairs


def write_corpus(path: Path, n: int, pairs: list[tuple[str, str]]) -> None:
    """``n`` unique pairs, each two real pairs joined (see the module docstring)."""
    m = len(pairs)
    if n > m * (m - 1):
        raise ValueError(f"n: at most {m * (m - 1)} unique joined pairs, got {n}")
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        block = []
        for k in range(n):
            a = k % m
            b = (a + 1 + k // m) % m
            block.append(f"{pairs[a][0]} {pairs[b][0]}\t{pairs[a][1]} {pairs[b][1]}\n")
            if len(block) == 100_000:
                f.writelines(block)
                block = []
        f.writelines(block)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------- measuring
def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        todo += [int(c) for c in children]
    return out


def _memory(pids: list[int]) -> tuple[int, int]:
    """Summed RSS and PSS (bytes) of ``pids``."""
    rss = pss = 0
    for p in pids:
        try:
            text = Path(f"/proc/{p}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Rss:"):
                rss += int(line.split()[1]) * 1024
            elif line.startswith("Pss:"):
                pss += int(line.split()[1]) * 1024
    return rss, pss


def measure(
    cmd: list[str], first_line: str | None = None, cwd: Path | None = None, skip: int = 1
) -> dict:
    """Run ``cmd``: its wall time, exit status, the peak summed RSS/PSS of its process tree
    (the first ``skip`` processes of the tree aside: the measuring wrapper, and for torchrun
    its agent), its own peak RSS (``getrusage``: the largest process of the tree) and, with
    ``first_line`` (a regex), the seconds until a line of its stderr matches."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT / "src")}
    wrapper = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:])\n"
        "print('MAXRSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
        "file=sys.stderr)\n"
        "sys.exit(r.returncode)\n"
    )
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", wrapper, *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
    )
    peak = [0, 0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rss, pss = _memory(_tree(proc.pid)[skip:])
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    first = None
    lines = []
    pattern = re.compile(first_line) if first_line else None
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if pattern is not None and first is None and pattern.search(line):
            first = time.monotonic() - t0
    proc.wait()
    wall = time.monotonic() - t0
    done.set()
    sampler.join()
    maxrss = next((int(x.split()[1]) * 1024 for x in lines if x.startswith("MAXRSS")), None)
    tail = "".join(lines[-6:])
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{tail}")
    return {
        "command": " ".join(cmd),
        "wall_s": round(wall, 2),
        "first_update_s": round(first, 2) if first is not None else None,
        "peak_rss_gib": round(maxrss / GIB, 3) if maxrss else None,
        "tree_peak_rss_gib": round(peak[0] / GIB, 3),
        "tree_peak_pss_gib": round(peak[1] / GIB, 3),
    }


QKV = [sys.executable, "-m", "qkv.cli"]
FIRST = r"\b1/\d+ loss"  # the progress line of update 1 (--log-every 1)
#: two ranks on this machine (``measure(..., skip=2)`` counts the two ranks, not the agent)
TORCHRUN_2 = [
    str(Path(sys.executable).with_name("torchrun")),
    "--standalone",
    "--nproc_per_node",
    "2",
]


def _torchrun(folder: Path, run: Path) -> list[str]:
    """``qkv train`` on ``folder`` under torchrun, two ranks of one thread each, into a fresh
    ``run`` (``measure(..., skip=2)`` counts the two ranks, not the agent)."""
    shutil.rmtree(run, ignore_errors=True)
    cmd = [*TORCHRUN_2, "-m", "qkv.cli", *_train_args(str(folder), run)]
    cmd[cmd.index("--threads") + 1] = "1"
    return cmd


def _train_args(data: str, out: Path) -> list[str]:
    return [
        "train", "--data", data, "--out", str(out), "--max-steps", str(STEPS),
        "--log-every", "1", "--threads", "2",
    ]  # fmt: skip


def _uptime() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run_prepare(n: int, work: Path, pairs: list) -> dict:
    """``qkv prepare`` of ``corpus-N.tsv`` (written first if need be) into a fresh ``bin-N``,
    then again (a no-op): the row's ``corpus_bytes``, ``prepare`` and ``prepare_again_s``."""
    corpus = work / f"corpus-{n}.tsv"
    if not corpus.is_file():
        t = time.monotonic()
        write_corpus(corpus, n, pairs)
        print(f"{n}: corpus written in {time.monotonic() - t:.0f} s", flush=True)
    folder = work / f"bin-{n}"
    shutil.rmtree(folder, ignore_errors=True)
    r: dict[str, Any] = {"corpus_bytes": corpus.stat().st_size}
    r["prepare"] = measure([*QKV, "prepare", "--data", str(corpus), "--out", str(folder),
                            *HELD_OUT])  # fmt: skip
    r["prepare"]["report"] = json.loads((folder / "report.json").read_text())
    r["prepare_again_s"] = measure([*QKV, "prepare", "--data", str(corpus), "--out",
                                    str(folder), *HELD_OUT])["wall_s"]  # fmt: skip
    print(f"{n}: prepare {r['prepare']['wall_s']} s", flush=True)
    return r


def run_size(n: int, work: Path, pairs: list, baseline_max: int, torchrun: bool) -> dict:
    corpus, folder = work / f"corpus-{n}.tsv", work / f"bin-{n}"
    r: dict[str, Any] = {"pairs": n, **run_prepare(n, work, pairs)}
    run = work / f"run-{n}"
    shutil.rmtree(run, ignore_errors=True)
    r["train"] = measure([*QKV, *_train_args(str(folder), run)], FIRST)
    print(f"{n}: train {r['train']}", flush=True)
    if n <= baseline_max:
        run = work / f"run-file-{n}"
        shutil.rmtree(run, ignore_errors=True)
        r["train_file"] = measure(
            [*QKV, *_train_args(str(corpus), run), *HELD_OUT, "--prepare-data", "never"], FIRST
        )  # in memory, as before (a large file is prepared into the run otherwise)
        print(f"{n}: train from the file {r['train_file']}", flush=True)
    if torchrun:
        r["torchrun_2"] = measure(_torchrun(folder, work / f"run-ddp-{n}"), FIRST, skip=2)
        print(f"{n}: torchrun {r['torchrun_2']}", flush=True)
        r["floor"] = measure_floor(work / f"run-{n}")
    return r


def measure_floor(run: Path) -> dict:
    """:mod:`benchmarks.ddp_floor` on the model ``run`` trained: one process of two threads,
    then two ranks of one thread under torchrun; their peaks and ratios."""
    model = run / "final" / "model.json"
    resolved = json.loads((run / "final" / "trainer.json").read_text())["resolved_config"]
    budget = resolved["max_tokens"]
    args = ["-m", "benchmarks.ddp_floor", "--model", str(model), "--max-tokens", str(budget),
            "--steps", str(STEPS)]  # fmt: skip
    one = measure([sys.executable, *args, "--threads", "2"], FIRST, cwd=ROOT)
    two = measure([*TORCHRUN_2, *args, "--threads", "1"], FIRST, cwd=ROOT, skip=2)
    out = {"one": one, "torchrun_2": two}
    for kind in ("rss", "pss"):
        key = f"tree_peak_{kind}_gib"
        out[f"2_vs_1_{kind}"] = round(two[key] / one[key], 3)
    print(f"floor: {out}", flush=True)
    return out


def tile_folder(src: Path, dst: Path, times: int) -> None:
    """A prepared folder of ``times`` x the training pairs of ``src``, its arrays repeated
    (the same token ids): what training reads at that size, without preparing that many."""
    import numpy as np

    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    shutil.copytree(src / "tokenizers", dst / "tokenizers")
    for name in ("valid.jsonl", "test.jsonl", "report.json"):
        shutil.copy(src / name, dst / name)
    for side in ("src", "tgt"):
        col = f"train.{side}"
        with open(dst / f"{col}.tok", "wb") as f:
            for _ in range(times):
                f.write((src / f"{col}.tok").read_bytes())
        lengths = np.fromfile(src / f"{col}.len", dtype=np.uint16)
        np.tile(lengths, times).tofile(dst / f"{col}.len")
        offsets = np.fromfile(src / f"{col}.idx", dtype=np.int64)
        total = int(offsets[-1])
        tiled = [offsets[:1]] + [offsets[1:] + k * total for k in range(times)]
        np.concatenate(tiled).tofile(dst / f"{col}.idx")
    manifest = json.loads((src / "manifest.json").read_text())
    manifest["counts"]["train"] *= times
    # the vocabulary is the one trained (a run would size it to the tiled count otherwise)
    manifest["settings"]["vocab_size"] = manifest["resolved"]["vocab_size"]
    manifest["fingerprint"] += f"-tiled-{times}"
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=1))


def run_tiled(n: int, base: int, work: Path, torchrun: bool) -> dict:
    """Train on ``bin-base`` tiled to ``n`` pairs: the run's peak RSS, time to first update."""
    folder = work / f"bin-{n}-tiled"
    tile_folder(work / f"bin-{base}", folder, n // base)
    manifest = json.loads((folder / "manifest.json").read_text())
    r: dict[str, Any] = {
        "pairs": n,
        "tiled_from": base,
        "train_pairs": manifest["counts"]["train"],
    }
    run = work / f"run-{n}-tiled"
    shutil.rmtree(run, ignore_errors=True)
    r["train"] = measure([*QKV, *_train_args(str(folder), run)], FIRST)
    print(f"{n} (tiled): train {r['train']}", flush=True)
    if torchrun:
        r["torchrun_2"] = measure(_torchrun(folder, work / f"run-ddp-{n}-tiled"), FIRST, skip=2)
        print(f"{n} (tiled): torchrun {r['torchrun_2']}", flush=True)
    return r


def _versus_100k(results: list[dict], tiled: bool) -> dict | None:
    """The largest size of one kind (prepared, or tiled from a folder) against 100,000 pairs of
    the same kind (the same code and conditions); None when there is no such pair."""
    kind = [r for r in results if bool(r.get("tiled_from")) == tiled]
    base = next((r for r in kind if r["pairs"] == 100_000), None)
    if not kind or base is None:
        return None
    big = max(kind, key=lambda r: r["pairs"])
    rss = big["train"]["peak_rss_gib"]
    return {
        "pairs": big["pairs"],
        "train_rss_gib": rss,
        "train_rss_vs_100k": round(rss / base["train"]["peak_rss_gib"], 3),
        "first_update_s": big["train"]["first_update_s"],
    }


def summarize(record: dict) -> dict:
    """The targets, from the results there are: the largest prepared size against 100,000
    prepared pairs (the vocabulary grows with the corpus: 8k, 16k, 32k pieces), the largest tiled
    one against 100,000 tiled pairs (the same model: the data's own memory), prepare from the
    largest size prepared, torchrun from the largest size run with it."""
    results = record["results"]
    out: dict[str, Any] = {
        "prepared": _versus_100k(results, tiled=False),
        "tiled": _versus_100k(results, tiled=True),
    }
    prepared = [r for r in results if "prepare" in r]
    if prepared:
        big = max(prepared, key=lambda r: r["pairs"])
        out["prepare_pairs"] = big["pairs"]
        out["prepare_s"] = big["prepare"]["wall_s"]
    ddp = [r for r in results if "torchrun_2" in r]
    if ddp:
        r = max(ddp, key=lambda r: (r["pairs"], not r.get("tiled_from")))
        one, two = r["train"], r["torchrun_2"]
        out["torchrun_pairs"] = r["pairs"]
        out["torchrun_tiled"] = bool(r.get("tiled_from"))
        out["torchrun_2_vs_1_rss"] = round(two["tree_peak_rss_gib"] / one["tree_peak_rss_gib"], 3)
        out["torchrun_2_vs_1_pss"] = round(two["tree_peak_pss_gib"] / one["tree_peak_pss_gib"], 3)
        if "floor" in r:
            out["floor_2_vs_1_rss"] = r["floor"]["2_vs_1_rss"]
            out["floor_2_vs_1_pss"] = r["floor"]["2_vs_1_pss"]
    for r in results:
        same = next((b for b in results if b["pairs"] == 100_000
                     and bool(b.get("tiled_from")) == bool(r.get("tiled_from"))), None)  # fmt: skip
        if same is not None:
            r["train_rss_vs_100k"] = round(
                r["train"]["peak_rss_gib"] / same["train"]["peak_rss_gib"], 3
            )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--work", type=Path, default=Path("/tmp/qkv-scale"))
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    p.add_argument("--baseline-max", type=int, default=1_000_000,
                   help="train from the file too, up to this size")  # fmt: skip
    p.add_argument("--torchrun", type=int, default=None,
                   help="the size to run torchrun with 2 processes on (default: the largest)")  # fmt: skip
    p.add_argument("--conditions", default="under flock /tmp/quiet.lock",
                   help="how the machine was shared, recorded with every result")  # fmt: skip
    p.add_argument("--tile", metavar="BASE:N",
                   help="train on bin-BASE's arrays repeated to N pairs (no prepare at N)")  # fmt: skip
    p.add_argument("--no-torchrun", action="store_true", help="with --tile: one process only")
    p.add_argument("--prepare-only", action="store_true",
                   help="measure qkv prepare alone, keeping the rest of each size's row")  # fmt: skip
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    record = json.loads(args.json.read_text()) if args.json.is_file() else {"results": []}
    pairs = real_pairs()
    ddp_size = args.torchrun if args.torchrun is not None else max(args.sizes)
    jobs: list[tuple[int, int | None]] = [(n, None) for n in args.sizes]
    if args.tile:
        base, _, n = args.tile.partition(":")
        jobs = [(int(n), int(base))]
    for n, base in jobs:
        load_before = _uptime()
        if args.prepare_only:  # the prepare entries replaced, with their own conditions
            old = [x for x in record["results"] if x["pairs"] == n and not x.get("tiled_from")]
            r = {**(old[0] if old else {"pairs": n}), **run_prepare(n, args.work, pairs)}
            r["prepare"]["load_before"], r["prepare"]["load_after"] = load_before, _uptime()
            r["prepare"]["conditions"] = args.conditions
        elif base is not None:
            r = run_tiled(n, base, args.work, not args.no_torchrun)
        else:
            r = run_size(n, args.work, pairs, args.baseline_max, n == ddp_size)
        if not args.prepare_only:
            r["load_before"], r["load_after"] = load_before, _uptime()
            r["conditions"] = args.conditions
        same = (n, r.get("tiled_from"))
        record["results"] = [
            x for x in record["results"] if (x["pairs"], x.get("tiled_from")) != same
        ] + [r]
        record["results"].sort(key=lambda x: (x["pairs"], x.get("tiled_from") or 0))
        record["machine"] = {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        }
        record["real_pairs"] = len(pairs)
        record["targets"] = TARGETS
        record["summary"] = summarize(record)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, args.json)
    print(json.dumps(record["summary"], indent=1))


if __name__ == "__main__":
    main()
