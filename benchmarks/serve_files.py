"""A document through ``qkv serve``'s ``POST /translate_file`` against ``qkv translate`` on its
sentences already split (issue 39).

The document: 100 paragraphs of 10 sentences each (about 1,000 sentences), English sentences of
the bundled corpus written as prose ("I'm home." rather than the corpus's "i'm home ."), one
paragraph per line, a blank line between paragraphs, as a ``.txt`` file. The same work three
ways, interleaved (the order turns each round), in one run of this script:

* ``file``: ``qkv serve --model-dir M --threads T`` (a subprocess, started once, warmed up)
  gets the file as LibreTranslate's page sends it (a multipart form), cuts it into sentences,
  translates them, writes the file back; timed from the upload to the end of the download of
  the translated file;
* ``cli``: ``qkv translate --model-dir M --split none --src sentences.txt --output out.txt``
  (a subprocess each round, ``OMP_NUM_THREADS=T``) on the document's sentences as the server
  cut them, one per line: the command the issue compares with, start-up and model loading
  included;
* ``library``: ``Translator.translate(sentences, split="none")`` in this process
  (``torch.set_num_threads(T)``, the model loaded once): the decoding alone, the strictest
  peer.

For ``file``, the server's own decoding time (its ``/metrics``) is read around each request,
so what the file costs beyond decoding (upload, cutting, queue, writing, download) is shown
apart. Each way's translations are checked against the library's (the file against
:func:`qkv.text.translate_document`, the command's lines against the library's sentences).
Reported: the median seconds of each, the ratios of the medians ``file / cli`` and ``file /
library`` (target: within 1.2x), and the median of each round's own ratio (``_paired``: the
ways of a round ran back to back, so a slow minute of a shared machine moves both sides); the
ratios come last. ``--json PATH`` writes them with every run's time
and the load average before and after.

Run: ``python -m benchmarks.serve_files [--model-dir DIR] [--repeats 9] [--paragraphs 100]
[--sentences 10] [--threads 1] [--json PATH] [--quick]``. Without ``--model-dir`` the demo model
``demo-out/translator`` is used, trained first with ``qkv demo`` when it is missing. Take
``flock /tmp/quiet.lock`` around it on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def prose(sentence: str) -> str:
    """A corpus sentence (``"i'm home ."``) as a writer would write it (``"I'm home."``)."""
    text = re.sub(r"\s+([.,!?;:])", r"\1", sentence.strip())
    text = re.sub(r"\bi\b", "I", text)
    return text[:1].upper() + text[1:]


def document(paragraphs: int, per: int, seed: int = 0) -> tuple[str, list[str]]:
    """The document's text and the sentences it was made of (distinct, in order)."""
    from qkv.data import bundled_pairs

    src = sorted({prose(s) for s, _ in bundled_pairs()})
    src = [s for s in src if s[-1:] in ".!?"]
    random.Random(seed).shuffle(src)
    picked = src[: paragraphs * per]
    lines = [" ".join(picked[i * per : (i + 1) * per]) for i in range(paragraphs)]
    return "\n\n".join(lines) + "\n", picked


def run_cli(model_dir: Path, src: Path, out: Path, threads: int) -> float:
    """Seconds ``qkv translate`` takes on ``src`` (one sentence per line) into ``out``."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "qkv.cli", "translate", "--model-dir", str(model_dir)]
    cmd += ["--split", "none", "--src", str(src), "--output", str(out), "--quiet"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def decode_seconds(client: Any, url: str) -> float:
    """The seconds the server's models have spent decoding so far (its ``/metrics``)."""
    text = client.get(url + "/metrics").text
    return float(re.search(r"^qkv_decode_seconds_total (\S+)$", text, re.M).group(1))


def run_file(client: Any, url: str, name: str, data: bytes) -> tuple[float, bytes]:
    """Seconds from the upload of ``data`` to the end of the translation's download."""
    t0 = time.perf_counter()
    r = client.post(
        url + "/translate_file",
        files={"file": (name, data)},
        data={"source": "en", "target": "fr", "api_key": ""},
    )
    r.raise_for_status()
    got = client.get(r.json()["translatedFileUrl"])
    got.raise_for_status()
    return time.perf_counter() - t0, got.content


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The three ways, ``args.repeats`` rounds: each way's seconds, the server's decoding of
    each file, and what the run was."""
    import httpx
    import torch

    from benchmarks.serve import Server, demo_model
    from qkv.text import plan_texts, translate_document
    from qkv.translate import Translator

    torch.set_num_threads(args.threads)
    model_dir = args.model_dir or demo_model(args.quick)
    text, made_of = document(args.paragraphs, args.sentences)
    data = text.encode()
    segments = list(plan_texts([text], source="en", target="fr").segments)
    work = Path(tempfile.mkdtemp(prefix="qkv-bench-files-"))
    src, out = work / "sentences.txt", work / "out.txt"
    src.write_text("\n".join(segments) + "\n", encoding="utf-8")
    tr = Translator.load(model_dir)
    print(
        f"document: {args.paragraphs} paragraphs, {len(data):,} bytes, {len(segments)} "
        f"sentences as qkv.text cuts them ({len(made_of)} written); threads {args.threads}",
        flush=True,
    )
    ref_doc = translate_document(data, tr, "txt")
    ref_lines = tr.translate(segments, split="none")
    times: dict[str, list[float]] = {"file": [], "cli": [], "library": []}
    decoding: list[float] = []  # of each file: the server's decoding alone
    server = Server(model_dir, "serve", "--threads", str(args.threads))
    try:
        with httpx.Client(timeout=600) as client:
            run_file(client, server.url, "warm-up.txt", b"I am home. He is calm.\n")
            for r in range(args.repeats):
                order = ["file", "cli", "library"]
                for way in order[r % 3 :] + order[: r % 3]:
                    if way == "file":
                        before = decode_seconds(client, server.url)
                        secs, got = run_file(client, server.url, "document.txt", data)
                        decoding.append(decode_seconds(client, server.url) - before)
                        assert got == ref_doc, "the served file differs from the library's"
                    elif way == "cli":
                        secs = run_cli(model_dir, src, out, args.threads)
                        lines = out.read_text(encoding="utf-8").split("\n")[: len(segments)]
                        assert lines == ref_lines, "qkv translate differs from the library"
                    else:
                        t0 = time.perf_counter()
                        tr.translate(segments, split="none")
                        secs = time.perf_counter() - t0
                    times[way].append(secs)
                    print(f"round {r + 1}: {way:8s} {secs:7.2f} s", flush=True)
        exit_status = server.stop()
    finally:
        server.stop()
    return {
        "torch": torch.__version__,
        "model_dir": str(model_dir),
        "sentences_written": len(made_of),
        "sentences_cut": len(segments),
        "bytes": len(data),
        "server_exit_status": exit_status,
        "times": times,
        "decoding": decoding,
    }


def summary(times: dict[str, list[float]], decoding: list[float]) -> dict[str, Any]:
    """The medians, the ratios (of the medians, and paired by round) and what a file costs
    beyond the server's decoding, printed; returned for the JSON."""
    med = {k: statistics.median(v) for k, v in times.items()}
    # each round's own ratio (its ways ran back to back): a slow minute of a shared machine
    # moves both sides of it
    paired = {
        peer: statistics.median(f / o for f, o in zip(times["file"], times[peer]))
        for peer in ("cli", "library")
    }
    ratios = {
        "file_over_cli": med["file"] / med["cli"],
        "file_over_library": med["file"] / med["library"],
        "file_over_cli_paired": paired["cli"],
        "file_over_library_paired": paired["library"],
    }
    rest = [f - d for f, d in zip(times["file"], decoding)]
    print()
    for k, v in med.items():
        print(f"{k:8s} median {v:7.2f} s  ({', '.join(f'{x:.2f}' for x in times[k])})")
    print(
        f"file: the server decoding {statistics.median(decoding):.2f} s, the rest (upload, "
        f"cutting, queue, writing, download) {statistics.median(rest):.3f} s (medians)"
    )
    return {
        "seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
        "median_seconds": {k: round(v, 4) for k, v in med.items()},
        "file_decoding_seconds": [round(x, 4) for x in decoding],
        "file_rest_median_seconds": round(statistics.median(rest), 4),
        "ratios": {k: round(v, 4) for k, v in ratios.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--paragraphs", type=int, default=100)
    p.add_argument("--sentences", type=int, default=10, help="sentences per paragraph")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="a smoke run: 10 paragraphs, 1 round")
    args = p.parse_args(argv)
    if args.quick:
        args.paragraphs, args.repeats = min(args.paragraphs, 10), 1
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # this process's torch, before it loads
    load_start = os.getloadavg()
    run = measure(args)
    load_end = os.getloadavg()
    found = summary(run.pop("times"), run.pop("decoding"))
    print(f"load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end")
    for k, v in found["ratios"].items():
        print(f"{k}: {v:.3f} (target <= 1.2: {'met' if v <= 1.2 else 'NOT met'})")
    if args.json is not None:
        record = {
            **run,
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "threads": args.threads,
            "paragraphs": args.paragraphs,
            "repeats": args.repeats,
            "quick": args.quick,
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in load_end],
            **found,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
