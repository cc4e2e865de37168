"""A big data file in one command: the peak memory of ``qkv train --data BIG.tsv --max-steps 20``,
which prepares the corpus inside the run (the file is over ``PREPARE_ABOVE``), its tokenizers
trained on a bounded sample.

* **Data**: a generated tab-separated file of N pairs (``--pairs``, 1,000,000 by default): two
  made-up languages whose words follow Zipf's law over a vocabulary of 200,000 words each (a
  long tail of rare words, as real text has: what SentencePiece's trainer holds grows with the
  distinct words and the characters it reads), sentences of 4 to 30 words, the target a
  word-by-word mapping of the source with its last two words swapped. Written once into
  ``--cache`` and kept.
* **Measured**: the command's wall time; the peak resident memory of its largest process
  (``getrusage(RUSAGE_CHILDREN).ru_maxrss``: the run itself, the encoding workers being
  smaller) and the peak of the whole process tree's proportional set size (PSS: pages shared
  between the run and its forked workers counted once), sampled every 0.5 s with psutil.
* **Settings**: ``--max-steps 20`` and, so that validating and testing a model trained for 20
  updates does not decide the time, ``--set eval_sentences=100 --set tune_decoding=false --set
  valid=2000 --set test=2000`` (the default holds out 5% of the pairs each); everything else
  is the defaults (the preset, its vocabulary size, SentencePiece unigram, every core
  encoding).

Run: ``python -m benchmarks.big_file [--pairs 1000000] [--json P]``; under ``flock
/tmp/quiet.lock`` on a shared machine. ``--quick`` runs 50,000 pairs (a smoke run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

WORDS = 200_000
#: pairs of a ``--quick`` smoke run
QUICK_PAIRS = 50_000
HERE = Path(__file__).resolve().parent


def _words(rng: np.random.Generator, n: int, letters: str) -> list[str]:
    """``n`` distinct made-up words of 2 to 12 letters drawn from ``letters``."""
    seen: set[str] = set()
    alphabet = np.array(list(letters))
    while len(seen) < n:
        for length in rng.integers(2, 13, size=n):
            seen.add("".join(alphabet[rng.integers(0, len(alphabet), size=length)]))
            if len(seen) == n:
                break
    return sorted(seen)


def write_corpus(path: Path, n: int, seed: int = 0) -> None:
    """``n`` generated pairs, one per line, tab-separated (see the module docstring)."""
    rng = np.random.default_rng(seed)
    src_words = np.array(_words(rng, WORDS, "abcdefghijklmnoprstuvwy"))
    tgt_words = np.array(_words(rng, WORDS, "abcdefghijlmnopqrstuvzéèàêç"))
    ranks = np.arange(1, WORDS + 1)
    p = 1.0 / ranks
    p /= p.sum()
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        block = 10_000
        for start in range(0, n, block):
            m = min(block, n - start)
            lengths = rng.integers(4, 31, size=m)
            ids = rng.choice(WORDS, size=int(lengths.sum()), p=p)
            lines = []
            at = 0
            for length in lengths.tolist():
                w = ids[at : at + length]
                at += length
                t = w.copy()
                t[-2:] = t[-2:][::-1]
                src = " ".join(src_words[w].tolist())
                tgt = " ".join(tgt_words[t].tolist())
                lines.append(f"{src[:1].upper()}{src[1:]}.\t{tgt[:1].upper()}{tgt[1:]}.\n")
            f.write("".join(lines))
    tmp.replace(path)


def _tree_pss(pid: int) -> int:
    """The proportional set size of ``pid`` and its descendants, in bytes (0 once gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_full_info().pss
    return total


def measure(command: list[str], env: dict[str, str]) -> dict:
    """Run ``command``; its wall time, exit status, the peak RSS of its largest process and
    the peak PSS of its process tree."""
    peak = [0]
    t0 = time.monotonic()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    while proc.poll() is None:
        peak[0] = max(peak[0], _tree_pss(proc.pid))
        time.sleep(0.5)
    reader.join()
    seconds = time.monotonic() - t0
    rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    text = b"".join(out).decode("utf-8", "replace")
    return {
        "returncode": proc.returncode,
        "seconds": round(seconds, 1),
        "peak_rss_largest_process_gib": round(rss_kib / 2**20, 3),
        "peak_pss_tree_gib": round(peak[0] / 2**30, 3),
        "output_tail": text.splitlines()[-25:],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_PAIRS:,} pairs")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "qkv-big-file")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "big_file.json")
    ap.add_argument("--note", default="", help="recorded in the JSON (what was measured)")
    args = ap.parse_args(argv)
    n = QUICK_PAIRS if args.quick else args.pairs
    args.cache.mkdir(parents=True, exist_ok=True)
    data = args.cache / f"pairs-{n}.tsv"
    t = time.monotonic()
    if not data.is_file():
        write_corpus(data, n)
    print(f"data: {data} ({data.stat().st_size / 2**20:.0f} MiB, {time.monotonic() - t:.0f} s)")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=args.cache) as tmp:
        command = [sys.executable, "-m", "qkv", "train", "--data", str(data), "--max-steps",
                   "20", "--set", "eval_sentences=100", "--set", "tune_decoding=false",
                   "--set", "valid=2000", "--set", "test=2000",
                   "--out", str(Path(tmp) / "run")]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        result = measure(command, env)
    load_after = os.getloadavg()
    row = {
        "pairs": n,
        "file_mib": round(data.stat().st_size / 2**20, 1),
        "command": "qkv train --data FILE --max-steps 20 --set eval_sentences=100 "
        "--set tune_decoding=false --set valid=2000 --set test=2000 --out RUN",
        **result,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
        "machine": f"{platform.machine()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs",
        "note": args.note,
    }
    print(json.dumps({k: v for k, v in row.items() if k != "output_tail"}, indent=1))
    print("\n".join(result["output_tail"]))
    rows = []
    if args.json.is_file():
        rows = json.loads(args.json.read_text(encoding="utf-8")).get("rows", [])
    rows.append(row)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": rows}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
