"""The main demo: train a Transformer translator on the bundled corpus, score it, translate, and
draw its attention -- the workflow the book's chapter ends with, from scratch, on a CPU."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import register

#: the book's four test sentences and their references in the bundled corpus
BOOK_SENTENCES: tuple[tuple[str, str], ...] = (
    ("go .", "va !"),
    ("i lost .", "j'ai perdu ."),
    ("he's calm .", "il est calme ."),
    ("i'm home .", "je suis chez moi ."),
)

#: the full demo: 1.1M parameters; validation BLEU passes 90 after about 400 updates. On 2 idle CPU
#: cores the step budget ends in about 3 minutes; the time cap (8 minutes of training) only matters
#: on a much slower or busier machine
FULL: dict[str, Any] = {
    "model": {
        "kind": "transformer",
        "num_hiddens": 128,
        "ffn_num_hiddens": 512,
        "num_heads": 4,
        "num_enc_layers": 2,
        "num_dec_layers": 2,
        "dropout": 0.1,
    },
    # the book's exercise keeps its hand-set recipe (the automatic preset is for user data)
    "preset": "none",
    "schedule": "inverse_sqrt",
    "max_steps": 700,
    "max_minutes": 8.0,
    "max_tokens": 4096,
    "lr": 2e-3,
    "warmup_steps": 300,
    "eval_every": 350,
    "eval_sentences": 300,
    "save_every": 350,
    "keep_last": 1,
    "log_every": 50,
}

#: --quick: a smaller run of the same pipeline, bounded by its updates (about half a minute on 2
#: idle CPU cores; validation BLEU near 19 after its 120 updates). The time cap is a safety net
#: for a machine many times slower, not the way it ends: a loaded machine takes longer and still
#: learns
QUICK: dict[str, Any] = {
    "model": {
        "kind": "transformer",
        "num_hiddens": 64,
        "ffn_num_hiddens": 128,
        "num_heads": 4,
        "num_enc_layers": 1,
        "num_dec_layers": 1,
        "dropout": 0.1,
    },
    "preset": "none",
    "schedule": "inverse_sqrt",
    "max_pairs": 3000,
    "max_steps": 120,
    "max_minutes": 5.0,
    "max_tokens": 2048,
    "lr": 3e-3,
    "warmup_steps": 40,
    "eval_every": 120,
    "eval_sentences": 100,
    "save_every": 120,
    "keep_last": 1,
    "log_every": 20,
}


def _fresh_run_dir(path: Path) -> None:
    """Empty the demo's own run folder (only if it is one: it holds checkpoints/ or nothing)."""
    from ..inference.layout import RunLayout  # torch: not for `qkv demo --list`

    if path.exists():
        if not RunLayout(path).checkpoints.is_dir() and any(path.iterdir()):
            raise ValueError(
                f"--out: {str(path)!r} exists and is not a qkv run folder; choose another --out"
            )
        shutil.rmtree(path)


#: the least best validation BLEU of a run that learned: the full demo passes 90, --quick ends
#: near 19; a run that stopped early (a time cap on a busy machine) or diverged stays near 0
FULL_FLOOR, QUICK_FLOOR = 30.0, 5.0


def did_not_learn(
    best_bleu: float | None, floor: float, translations: Sequence[str] | None = None
) -> str | None:
    """Why a demo run did not learn, or None when it did: no validation BLEU at all, a best
    validation BLEU below ``floor``, or (once known) only empty translations of the book's
    sentences."""
    if best_bleu is None:
        return "it stopped before its first validation"
    if best_bleu < floor:
        return f"its best validation BLEU {best_bleu:.1f} is below {floor:g}"
    if translations is not None and not any(t.strip() for t in translations):
        return "it translates every one of the book's sentences to nothing"
    return None


def _failed(why: str, result: Any, quick: bool) -> int:
    print(
        f"\nqkv demo translate: FAILED: the model did not learn: {why} (after {result.step} "
        f"updates in {result.minutes:.1f} min, stopped: {result.stopped}). A machine busy with "
        f"other work trains slowly: run it again when it is idle"
        f"{'' if quick else ', or try --quick'}.",
        file=sys.stderr,
        flush=True,
    )
    return 1


@register(
    "translate",
    "train an English-French Transformer, print BLEU, translate, draw attention",
    needs=("safetensors", "sacrebleu", "matplotlib"),
)
def run(out: Path, quick: bool) -> int:
    from ..train import TrainConfig, saved_run_pairs, train
    from ..translate import Translator

    t0 = time.monotonic()
    settings = QUICK if quick else FULL
    run_dir = out / "translator"
    _fresh_run_dir(run_dir)
    config = TrainConfig().updated(settings)
    m = settings["model"]
    print(
        f"qkv demo: training a Transformer ({m['num_enc_layers']}+{m['num_dec_layers']} layers, "
        f"width {m['num_hiddens']}, {m['num_heads']} heads) on the bundled English-French corpus"
        f"{' (quick: a small slice)' if quick else ''}: {settings['max_steps']} updates (at most "
        f"{settings['max_minutes']:g} minutes). Progress on stderr.",
        flush=True,
    )
    result = train(config, run_dir)
    floor = QUICK_FLOOR if quick else FULL_FLOOR
    why = did_not_learn(result.best_bleu, floor)
    if why is not None:
        return _failed(why, result, quick)
    print(
        f"trained {result.step} updates in {result.minutes:.1f} min "
        f"(stopped: {result.stopped}); best validation BLEU {result.best_bleu:.1f}",
        flush=True,
    )

    tr = Translator.load(run_dir)
    test, _ = saved_run_pairs(tr.path, "test")
    ev = tr.evaluate(test)
    print(f"test BLEU = {ev.bleu:.1f}  chrF = {ev.chrf:.1f}  on {ev.n} held-out sentences")
    print(f"  {ev.signatures['bleu']}")

    print("\nthe book's four sentences:")
    hyps = tr.translate([en for en, _ in BOOK_SENTENCES])
    correct = 0
    for (en, ref), hyp in zip(BOOK_SENTENCES, hyps):
        ok = hyp == ref
        correct += ok
        print(f"  {en:<12} => {hyp:<22} {'(correct)' if ok else f'(reference: {ref})'}")
    why = did_not_learn(result.best_bleu, floor, hyps)
    if why is not None:
        return _failed(why, result, quick)

    out.mkdir(parents=True, exist_ok=True)
    att = tr.attention("he's calm .")
    png = att.save(out / "attention-hes-calm.png")
    html = att.save(out / "attention-hes-calm.html")
    print(
        f"\nwrote {png}  (encoder, decoder and cross-attention of 'he's calm .', per layer, heads averaged)"
    )
    print(f"wrote {html}  (interactive: every layer, head and kind)")
    summary = {
        "test_bleu": round(ev.bleu, 2),
        "test_chrf": round(ev.chrf, 2),
        "n": ev.n,
        "signatures": ev.signatures,
        "updates": result.step,
        "train_minutes": round(result.minutes, 2),
        "total_minutes": round((time.monotonic() - t0) / 60, 2),
        "book_sentences_correct": correct,
        "quick": quick,
    }
    (out / "translate-demo.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"\ndone in {summary['total_minutes']:.1f} min; model in {run_dir} "
        f'(try: qkv translate --model-dir {run_dir} "i\'m home .")'
    )
    return 0
