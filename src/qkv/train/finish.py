"""The end of a run: the model to use, written to ``OUT/final``.

:func:`write_final` starts from the best checkpoint's weights, takes the average of the newest
``average_last`` checkpoints instead when it validates better, then (``tune_decoding``) keeps the
decoding of :data:`qkv.inference.CANDIDATES` (greedy, or beam 4 with a length penalty) that
validates best, and writes the model folder with its ``decoding.json``. A timed run does only
what its budget leaves room for. :func:`read_final` reads back what a previous invocation wrote,
for a resumed run that had nothing left to train.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._folder import DECODING, SPLIT, TRAIN_CONFIG, TRAINER_STATE
from ..inference import CANDIDATES, Decoding
from ..inference.layout import RunLayout, step_of
from ..inference.writing import data_files
from .checkpoint import (
    average_weights,
    find_checkpoints,
    read_json,
    read_weights,
    run_lock_in_use,
    write_model_folder,
)
from .interrupt import resume_command
from .prepare import Setup
from .progress import Say

__all__ = ["Final", "read_final", "write_final"]


@dataclass(frozen=True)
class Final:
    """A run's final model: its folder (None when the run has none), its validation BLEU with
    its decoding, and that decoding (None when unknown)."""

    folder: Path | None = None
    bleu: float | None = None
    decoding: Decoding | None = None


def _average_if_better(
    setup: Setup,
    best: dict[str, torch.Tensor],
    found: list[Path],
    say: Say,
    deadline: float,
    eval_cost: float,
) -> tuple[dict[str, torch.Tensor], float, dict[str, Any]]:
    """The ``best`` checkpoint's weights, or the average of the newest checkpoints of ``found``
    (the run's, oldest first) when it validates better: ``(weights, validation BLEU, where the
    weights come from)``."""
    state, config, model = setup.state, setup.config, setup.model
    weights, bleu = best, float(state.best_bleu)
    source: dict[str, Any] = {"kind": "best checkpoint", "steps": [int(state.best_step)]}
    # the newest checkpoints only (pruning keeps keep_last of them, and the best)
    n_avg = min(config.average_last, config.keep_last)
    last = found[-n_avg:] if n_avg >= 2 else []
    # a timed run does only what its budget has room for (beam search costs ~2 validations)
    if len(last) >= 2 and deadline - time.monotonic() < eval_cost:
        say("no time left to validate an average of the last checkpoints; skipped")
        last = []
    if len(last) >= 2:
        avg = average_weights(last)
        model.load_state_dict(avg)
        sc = setup.validation.bleu(model)  # as the checkpoints were scored
        steps = [step_of(p) for p in last]
        better = sc.bleu > bleu
        say(
            f"average of the checkpoints of updates {steps}: valid BLEU {sc.bleu:.2f} "
            f"({'better than' if better else 'not better than'} the best checkpoint's {bleu:.2f})"
        )
        if better:
            weights, bleu = avg, float(sc.bleu)
            source = {"kind": "average", "steps": steps}
    return weights, bleu, source


def _choose_decoding(
    setup: Setup, say: Say, deadline: float, eval_cost: float
) -> tuple[Decoding, float | None]:
    """The decoding of :data:`~qkv.inference.CANDIDATES` that validates best with the model's
    current weights, and its BLEU; greedy (and None) when the run does not tune its decoding,
    the first candidate (greedy, never repeating a 3-gram: what a short run's undertrained model
    needs most) when it has no time left to."""
    if not setup.config.tune_decoding:
        return Decoding(), None
    if deadline - time.monotonic() < 5 * eval_cost:
        say(
            "no time left to choose a beam on the validation split; "
            f"{CANDIDATES[0].describe()} kept"
        )
        return CANDIDATES[0], None
    decoding, tried, best_bleu = Decoding(), [], -math.inf
    cap = setup.validation.decoding.output_len_cap
    for candidate in CANDIDATES:  # scored as the checkpoints were: capped at the pair limit
        sc = setup.validation.bleu(setup.model, dataclasses.replace(candidate, output_len_cap=cap))
        tried.append(f"{candidate.describe()}: {sc.bleu:.2f}")
        if sc.bleu > best_bleu:
            best_bleu, decoding = float(sc.bleu), candidate
    say(f"decoding chosen on validation: {decoding.describe()} (tried: {', '.join(tried)})")
    return decoding, best_bleu


def write_final(
    setup: Setup,
    layout: RunLayout,
    say: Say,
    *,
    time_left: float = math.inf,
    eval_cost: float = 0.0,
    verdict: Callable[[], dict | None] | None = None,
) -> Final:
    """Write ``OUT/final`` from the run ``setup`` holds (rank 0, after its last checkpoint):
    the best checkpoint's weights, or the average of the newest ``average_last`` checkpoints
    when it validates better, with the decoding that validates best. ``time_left`` is what the
    run's budget leaves (seconds), ``eval_cost`` the seconds one validation takes: what does not
    fit is skipped, and said. ``verdict``: called once the final weights and decoding have
    validated (the run judges them then), it returns the run's verdict
    (:meth:`qkv.train.verdict.Verdict.to_dict` and its ``fix``), recorded in ``trainer.json``
    for :func:`qkv.inference.load_model` to warn about a model that is not usable. Returns the
    folder, its validation BLEU and the decoding."""
    t0 = time.monotonic()
    state = setup.state
    best = read_weights(layout.step_dir(int(state.best_step)))
    found = find_checkpoints(layout.checkpoints)
    deadline = time.monotonic() + time_left
    weights, bleu, source = _average_if_better(setup, best, found, say, deadline, eval_cost)
    setup.model.load_state_dict(weights)
    decoding, tuned_bleu = _choose_decoding(setup, say, deadline, eval_cost)
    if tuned_bleu is not None:
        bleu = tuned_bleu
    decoding = decoding.replace(
        chosen_on=f"{len(setup.validation.pairs)} validation sentences, BLEU {bleu:.2f}"
    )
    folder = write_model_folder(
        layout.final,
        step=int(state.step),
        state_dict=setup.model.state_dict(),
        model_config=setup.model_config.to_dict(),
        write_tokenizers=setup.save_tokenizers,
        documents={
            TRAIN_CONFIG: setup.settings,
            SPLIT: setup.data.split.to_dict(),
            TRAINER_STATE: {
                "step": int(state.step),
                "weights": source,
                "valid_bleu": bleu,
                "data_files": data_files(setup.config.data),  # what a card of it publishes
                "resolved_config": setup.config.to_dict(),
                "preset": state.preset,
                "history": state.history,
                "verdict": verdict() if verdict is not None else None,
            },
            DECODING: decoding.to_dict(),
        },
        in_use=run_lock_in_use(layout.out),
        remedy=f"then finish the run: {resume_command(layout.out)}",
        languages=setup.languages,
    )
    say(
        f"final model ({source['kind']} of updates {source['steps']}, "
        f"{decoding.describe()}) valid BLEU {bleu:.2f} in "
        f"{folder} ({time.monotonic() - t0:.1f} s)"
    )
    return Final(folder, bleu, decoding)


def read_final(folder: Path) -> Final:
    """The final model an earlier invocation wrote in ``folder``, with its validation BLEU and
    decoding as recorded there (each None when unreadable: the folder still stands)."""
    bleu, decoding = None, None
    try:
        bleu = read_json(folder, TRAINER_STATE).get("valid_bleu")  # verified, as every read
        decoding = Decoding.from_dict(read_json(folder, DECODING))
    except (OSError, ValueError, AttributeError):  # CheckpointError is a ValueError
        pass
    return Final(folder, bleu, decoding)
