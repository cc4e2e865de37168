"""The main demo: train a Transformer translator on the bundled corpus, score it, translate, and
draw its attention -- the workflow the book's chapter ends with, from scratch, on a CPU."""

from __future__ import annotations

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

#: the full demo: 1.1M parameters, small batches (more updates for the same compute: 600 updates of
#: 2,048 tokens reach validation BLEU 99.8 and the book's four sentences where 300 of 4,096 reach
#: 85 and three), a linear schedule whose warm-up (a tenth), evaluations and checkpoints follow the
#: planned length. Its 800 updates took 1.9 minutes on 2 cores, 4.2 beside two busy processes; a
#: slower or busier machine makes as many as its measured speed fits in the 7-minute budget (as
#: ``qkv train --max-minutes`` plans), and the schedule decays to the end of that plan
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
    "schedule": "linear",
    "max_steps": 800,
    "max_minutes": 7.0,
    "max_tokens": 2048,
    "lr": 3e-3,
    "label_smoothing": 0.0,
    "eval_sentences": 300,
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


def continue_command(run_dir: Path, settings: dict[str, Any]) -> str:
    """The command that trains the demo's run further: resumed, with twice its time budget
    (a run's budget counts all its invocations, see ``qkv train --max-minutes``)."""
    from ..train.interrupt import resume_command

    return f"{resume_command(run_dir)} --max-minutes {2 * settings['max_minutes']:g}"


def _trained_line(result: Any, settings: dict[str, Any]) -> str:
    """What the training did, without a BLEU (the demo quotes one: the test split's)."""
    text = f"trained {result.step} updates in {result.minutes:.1f} min"
    if result.stopped == "max_minutes":
        text += (
            f" (of at most {settings['max_steps']}: as many as this machine's measured speed "
            f"fitted in the {settings['max_minutes']:g}-minute budget)"
        )
    elif result.stopped != "max_steps":
        text += f" (stopped: {result.stopped})"
    return text


def _not_finished(why: str, result: Any, run_dir: Path, settings: dict[str, Any]) -> str:
    """The line of a run that the clock stopped before it learned enough."""
    return (
        f"qkv demo translate: not finished: {why} after {result.step} updates in "
        f"{result.minutes:.1f} min: this machine trained too slowly for the demo's "
        f"{settings['max_minutes']:g}-minute budget (busy with other work?). The run can go "
        f"on; continue with: {continue_command(run_dir, settings)}"
    )


def _failed(why: str, result: Any, quick: bool) -> str:
    """The line of a run that did not learn in its time: it diverged, or its recipe is bad."""
    return (
        f"qkv demo translate: FAILED: the model did not learn: {why} (after {result.step} "
        f"updates in {result.minutes:.1f} min, stopped: {result.stopped}). A machine busy with "
        f"other work trains slowly: run it again when it is idle"
        f"{'' if quick else ', or try --quick'}."
    )


def _stop(why: str, result: Any, run_dir: Path, settings: dict[str, Any], quick: bool) -> int:
    """Say why the demo has no model worth showing (exit status 1): not finished when its
    clock stopped it, failed otherwise."""
    out_of_time = result.stopped == "max_minutes"
    line = _not_finished(why, result, run_dir, settings) if out_of_time else None
    print("\n" + (line or _failed(why, result, quick)), file=sys.stderr, flush=True)
    return 1


def _book_sentences(tr: Any) -> tuple[list[str], int]:
    """Translate the book's four sentences and print them; returns them and how many are
    right."""
    print("\nthe book's four sentences:")
    hyps = tr.translate([en for en, _ in BOOK_SENTENCES])
    correct = 0
    for (en, ref), hyp in zip(BOOK_SENTENCES, hyps):
        ok = hyp == ref
        correct += ok
        print(f"  {en:<12} => {hyp:<22} {'(correct)' if ok else f'(reference: {ref})'}")
    return hyps, correct


def _figures(tr: Any, out: Path) -> None:
    """The attention of "he's calm ." as a picture and as the interactive page."""
    out.mkdir(parents=True, exist_ok=True)
    att = tr.attention("he's calm .")
    png = att.save(out / "attention-hes-calm.png")
    html = att.save(out / "attention-hes-calm.html")
    print(
        f"\nwrote {png}  (encoder, decoder and cross-attention of 'he's calm .', per layer, heads averaged)"
    )
    print(f"wrote {html}  (interactive: every layer, head and kind)")


@register(
    "translate",
    "train an English-French Transformer, print BLEU, translate, draw attention",
    needs=("safetensors", "sacrebleu", "matplotlib"),
)
def run(out: Path, quick: bool) -> int:
    """Train the demo's Transformer into ``OUT/translator`` within its time budget, quote its
    test BLEU, translate the book's sentences and draw the attention (exit status: 0 when the
    model learned, 1 when not)."""
    from ..train import TrainConfig, saved_run_pairs, train
    from ..train.checkpoint import atomic_write_json
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
        f"{' (quick: a small slice)' if quick else ''}: {settings['max_steps']} updates, or as "
        f"many as fit in {settings['max_minutes']:g} minutes on a slower machine (planned from "
        f"its measured speed). Progress on stderr.",
        flush=True,
    )
    result = train(config, run_dir)
    floor = QUICK_FLOOR if quick else FULL_FLOOR
    # the verdict of every run (qkv train's: baselines, degenerate output), then the demo's floor
    verdict = result.verdict
    why = verdict.reason if verdict is not None and not verdict.usable else None
    why = why or did_not_learn(result.best_bleu, floor)
    if why is not None:
        return _stop(why, result, run_dir, settings, quick)
    print(_trained_line(result, settings), flush=True)

    tr = Translator.load(run_dir)
    test, _ = saved_run_pairs(tr.path, "test")
    ev = tr.evaluate(test)
    print(f"test BLEU = {ev.bleu:.1f}  chrF = {ev.chrf:.1f}  on {ev.n} held-out sentences")
    print(f"  {ev.signatures['bleu']}")
    hyps, correct = _book_sentences(tr)
    why = did_not_learn(result.best_bleu, floor, hyps)
    if why is not None:
        return _stop(why, result, run_dir, settings, quick)

    _figures(tr, out)
    summary = {
        "test_bleu": round(ev.bleu, 2),
        "test_chrf": round(ev.chrf, 2),
        "n": ev.n,
        "signatures": ev.signatures,
        "updates": result.step,
        "stopped": result.stopped,
        "train_minutes": round(result.minutes, 2),
        "total_minutes": round((time.monotonic() - t0) / 60, 2),
        "book_sentences_correct": correct,
        "quick": quick,
    }
    atomic_write_json(out / "translate-demo.json", summary)
    if correct < len(BOOK_SENTENCES) and result.stopped == "max_minutes":
        right = f"{correct} of the book's {len(BOOK_SENTENCES)} sentences right"
        print("\n" + _not_finished(right, result, run_dir, settings), flush=True)
    print(
        f"\ndone in {summary['total_minutes']:.1f} min; model in {run_dir} "
        f'(try: qkv translate --model-dir {run_dir} "i\'m home .")'
    )
    return 0
