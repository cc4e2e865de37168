"""qkv.data at the scale of today's fra.txt: read, normalise, split, tokenise and batch 200k pairs.

A synthetic ``fra.txt`` (three tab-separated columns, as downloaded today) is written to a
temporary directory by sampling the bundled corpus and undoing the book's normalisation
(capitals, no space before ``.``, a narrow no-break space before French ``!``/``?``), so every
stage does its real work. Then each stage of the training-data pipeline is timed once, with the
word tokenizer, and the table prints the stage times and the total (the issue's target: under
30 s on the development machine).

Run: ``python -m benchmarks.data [--pairs 200000] [--max-tokens 4096] [--quick] [--json PATH]``;
``--quick`` times 5,000 pairs (a smoke run: the target applies to the full size).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from qkv.data import (
    Normalizer,
    TokenBatcher,
    build_tokenizers,
    bundled_pairs,
    encode_pairs,
    read_pairs,
    split_pairs,
)

TARGET_S = 30.0
#: pairs of a ``--quick`` smoke run
QUICK_PAIRS = 5_000


def _raw(text: str, french: bool) -> str:
    """Undo the book's normalisation the way real Tatoeba text looks."""
    text = text.replace(" .", ".").replace(" ,", ",")
    if french:
        text = text.replace(" !", "\u202f!").replace(" ?", "\u202f?")
    else:
        text = text.replace(" !", "!").replace(" ?", "?")
    return text[:1].upper() + text[1:]


def write_fra(path: Path, n: int, seed: int = 0) -> None:
    """Write ``n`` pairs sampled from the bundled corpus as a 3-column fra.txt."""
    rng = random.Random(seed)
    corpus = bundled_pairs()
    attribution = "CC-BY 2.0 (France) Attribution: tatoeba.org #{} (x) & #{} (y)"
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            en, fr = corpus[rng.randrange(len(corpus))]
            f.write(
                f"{_raw(en, False)}\t{_raw(fr, True)}\t{attribution.format(2 * i, 2 * i + 1)}\n"
            )


def run(n: int, max_tokens: int, seed: int = 0) -> dict:
    """Time every stage on ``n`` pairs; returns the figures as a dict."""
    stages: list[tuple[str, float, str]] = []

    def timed(name: str, fn: Callable[[], object], note: Callable[[object], str]) -> object:
        t0 = time.perf_counter()
        out = fn()
        stages.append((name, time.perf_counter() - t0, note(out)))
        return out

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fra.txt"
        write_fra(path, n, seed)
        size_mb = path.stat().st_size / 1e6
        pairs, _ = timed(  # type: ignore[misc]
            "read",
            lambda: read_pairs(path),
            lambda r: f"{r[1].pairs} pairs from {size_mb:.1f} MB, {r[1].n_skipped} skipped",
        )
    book = Normalizer.book()
    norm = timed("normalise", lambda: book.pairs(pairs), lambda r: "book + NFC, both sides")
    split = timed(
        "split", lambda: split_pairs(norm, valid=0.05, test=0.05, seed=seed), lambda s: repr(s)
    )
    train, _, _ = split.apply(norm, check=False)  # type: ignore[union-attr]
    src_tok, tgt_tok = timed(  # type: ignore[misc]
        "vocabulary",
        lambda: build_tokenizers(train, "word", normalizer=book, pre_normalized=True, min_freq=2),
        lambda r: f"word, min_freq 2: {r[0].vocab_size} + {r[1].vocab_size} types",
    )
    src_ids, tgt_ids = timed(  # type: ignore[misc]
        "tokenise",
        lambda: encode_pairs(norm, src_tok, tgt_tok, pre_normalized=True),
        lambda r: f"{sum(map(len, r[0])) + sum(map(len, r[1]))} tokens",
    )

    def batch_epoch():
        batcher = TokenBatcher(src_ids, tgt_ids, max_tokens=max_tokens, seed=seed)
        count = padded = 0
        for b in batcher:
            count += 1
            padded += b.src.numel() + b.tgt_in.numel()
        return count, padded

    timed(
        "batch",
        batch_epoch,
        lambda r: f"{r[0]} padded batches of <= {max_tokens} tokens ({r[1] / 1e6:.1f}M positions)",
    )
    total = sum(s for _, s, _ in stages)
    return {
        "pairs": n,
        "max_tokens": max_tokens,
        "stages": [{"stage": a, "seconds": round(s, 3), "note": c} for a, s, c in stages],
        "total_s": round(total, 3),
        "target_s": TARGET_S,
        "machine": f"{platform.machine()}, Python {platform.python_version()}, {os.cpu_count()} CPUs",
    }


def print_table(res: dict) -> None:
    rows = [(s["stage"], f"{s['seconds']:.2f}", s["note"]) for s in res["stages"]]
    verdict = "meets" if res["total_s"] < res["target_s"] else "MISSES"
    rows.append(("total", f"{res['total_s']:.2f}", f"{verdict} the {res['target_s']:.0f} s target"))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    print(f"qkv.data pipeline, {res['pairs']:,} pairs, word tokenizer")
    print(f"{'stage':<{w0}}  {'s':>{w1}}  note")
    for i, (a, b, c) in enumerate(rows):
        if i == len(rows) - 1:
            print("-" * (w0 + w1 + 4))
        print(f"{a:<{w0}}  {b:>{w1}}  {c}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.data", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--pairs", type=int, default=200_000, help="pairs to process (default 200000)")
    ap.add_argument("--max-tokens", type=int, default=4096, help="token budget of a batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_PAIRS:,} pairs (a smoke run; overrides --pairs)",
    )
    args = ap.parse_args(argv)
    res = run(QUICK_PAIRS if args.quick else args.pairs, args.max_tokens, args.seed)
    res["quick"] = args.quick
    print_table(res)
    if args.quick:
        print(f"(--quick: {QUICK_PAIRS:,} pairs; the {TARGET_S:.0f} s target is for 200,000)")
    if args.json:
        res["load_average_at_end"] = round(os.getloadavg()[0], 2)
        Path(args.json).write_text(json.dumps(res, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
