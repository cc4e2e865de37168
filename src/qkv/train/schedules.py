"""Learning-rate schedules, as plain functions of the update number.

The schedule keeps no state of its own besides the step, so a checkpoint restores it exactly by
storing the step (``state_dict`` / ``load_state_dict`` are there for symmetry with torch's
schedulers).
"""

from __future__ import annotations

import math

from torch.optim import Optimizer

__all__ = ["InverseSqrtSchedule", "inverse_sqrt_lr"]


def inverse_sqrt_lr(step: int, *, peak_lr: float, warmup_steps: int) -> float:
    """The learning rate of update ``step`` (1-based): "Attention is all you need"'s schedule.

    Linear warm-up from ``peak_lr / warmup_steps`` to ``peak_lr`` over ``warmup_steps`` updates,
    then ``peak_lr * sqrt(warmup_steps / step)``. ``warmup_steps=0`` starts at ``peak_lr`` and
    decays as ``peak_lr / sqrt(step)``.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step: expected an int >= 1, got {step!r}")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps: expected an int >= 0, got {warmup_steps!r}")
    if not (isinstance(peak_lr, (int, float)) and math.isfinite(peak_lr) and peak_lr > 0):
        raise ValueError(f"peak_lr: expected a positive finite number, got {peak_lr!r}")
    if step <= warmup_steps:
        return peak_lr * step / warmup_steps
    return peak_lr * math.sqrt(max(warmup_steps, 1) / step)


class InverseSqrtSchedule:
    """Sets ``optimizer``'s learning rate to :func:`inverse_sqrt_lr` before every update.

    Call :meth:`step` once per update, before ``optimizer.step()``; :attr:`last_step` is the
    number of updates scheduled so far.
    """

    def __init__(self, optimizer: Optimizer, *, peak_lr: float, warmup_steps: int) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"optimizer: expected a torch Optimizer, got {type(optimizer).__name__}"
            )
        inverse_sqrt_lr(1, peak_lr=peak_lr, warmup_steps=warmup_steps)  # validate
        self.optimizer, self.peak_lr, self.warmup_steps = optimizer, peak_lr, warmup_steps
        self.last_step = 0

    def lr(self, step: int) -> float:
        return inverse_sqrt_lr(step, peak_lr=self.peak_lr, warmup_steps=self.warmup_steps)

    def step(self) -> float:
        """Advance to the next update and set its learning rate, which is returned."""
        self.last_step += 1
        lr = self.lr(self.last_step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def state_dict(self) -> dict:
        return {"last_step": self.last_step, "peak_lr": self.peak_lr, "warmup": self.warmup_steps}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or "last_step" not in state:
            raise ValueError(f"state: expected a dict from state_dict(), got {state!r:.80}")
        self.last_step = int(state["last_step"])
