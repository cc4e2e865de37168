"""What a run keeps between updates and saves in every checkpoint: :class:`RunState`.

A checkpoint's ``trainer.json`` holds these fields (with the data position, which the batcher
keeps); a resumed run takes them back, so it counts patience, logs its losses and plans its time
as the uninterrupted run would have.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RunState"]


@dataclass
class RunState:
    """What the loop keeps between updates, saved in every checkpoint's ``trainer.json`` and
    restored on resume (with the data position, which the batcher keeps).

    Attributes:
        step: updates done.
        best_bleu, best_step: the best validation BLEU so far and its update.
        evals_since_best: scheduled evaluations since the best scheduled one (patience).
        grid_best_bleu: the best BLEU of the scheduled evaluations (patience compares to it).
        target_tokens: target tokens trained on.
        history: the logged training and validation figures.
        loss_window: losses of the updates since the last progress line (a resumed run logs
            the same means).
        stopped: ``"early_stopping"`` once patience ran out, ``"max_minutes"`` once the budget
            did: resuming with the same settings then does nothing.
        last_eval, last_save: the updates of the last scheduled evaluation and checkpoint
            (automatic cadence).
        resolved_config: the run's settings after the preset filled them in.
        preset: what the preset chose and why.
        train_seconds: seconds of the run's earlier invocations (``max_minutes`` is the whole
            run's budget).
        init_from: the model a fine-tuning run started from (``path`` and ``step``), or None.
    """

    step: int = 0
    best_bleu: float | None = None
    best_step: int | None = None
    evals_since_best: int = 0
    grid_best_bleu: float | None = None
    target_tokens: int = 0
    history: list[dict] = field(default_factory=list)
    loss_window: list[float] = field(default_factory=list)
    stopped: str | None = None
    last_eval: int = 0
    last_save: int = 0
    resolved_config: dict = field(default_factory=dict)
    preset: dict | None = None
    train_seconds: float = 0.0
    init_from: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready fields (what ``trainer.json`` holds besides the data position)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def restore(self, saved: dict[str, Any]) -> None:
        """Take every field ``saved`` (a checkpoint's ``trainer.json``) holds."""
        for f in dataclasses.fields(self):
            if f.name in saved:
                setattr(self, f.name, saved[f.name])
        if "grid_best_bleu" not in saved:  # written before it was kept apart
            self.grid_best_bleu = self.best_bleu
