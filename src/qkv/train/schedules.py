"""Learning-rate schedules, as plain functions of the update number.

Two families:

* ``"inverse_sqrt"`` ("Attention is all you need"): linear warm-up, then ``1/sqrt(step)`` decay
  that never ends. Good for open-ended runs; a run stopped by a clock never reaches small rates.
* ``"linear"`` and ``"cosine"``: linear warm-up to the peak, then a decay that reaches
  ``min_lr_ratio * peak`` right after ``total_steps``, the planned end of the run. ``qkv train``
  uses these for runs bounded by ``max_steps`` or ``max_minutes``, and re-estimates
  ``total_steps`` from the measured speed while a time-bounded run goes on
  (:meth:`Schedule.plan`), so the rate decays to the end of the budget whatever the machine.

A schedule keeps no state besides the step and its plan (``warmup_steps``, ``total_steps``), so
a checkpoint restores it exactly from :meth:`Schedule.state_dict`.
"""

from __future__ import annotations

import math

from torch.optim import Optimizer

__all__ = [
    "SCHEDULES",
    "InverseSqrtSchedule",
    "Schedule",
    "inverse_sqrt_lr",
    "scheduled_lr",
]

#: the schedule kinds :func:`scheduled_lr` knows
SCHEDULES: tuple[str, ...] = ("inverse_sqrt", "linear", "cosine")


def _check_step(step: object) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step: expected an int >= 1, got {step!r}")


def _check_count(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")


def _check_peak(peak_lr: object) -> None:
    if not (
        isinstance(peak_lr, (int, float))
        and not isinstance(peak_lr, bool)
        and math.isfinite(peak_lr)
        and peak_lr > 0
    ):
        raise ValueError(f"peak_lr: expected a positive finite number, got {peak_lr!r}")


def inverse_sqrt_lr(step: int, *, peak_lr: float, warmup_steps: int) -> float:
    """The learning rate of update ``step`` (1-based): "Attention is all you need"'s schedule.

    Linear warm-up from ``peak_lr / warmup_steps`` to ``peak_lr`` over ``warmup_steps`` updates,
    then ``peak_lr * sqrt(warmup_steps / step)``. ``warmup_steps=0`` starts at ``peak_lr`` and
    decays as ``peak_lr / sqrt(step)``.
    """
    _check_step(step)
    _check_count("warmup_steps", warmup_steps, 0)
    _check_peak(peak_lr)
    if step <= warmup_steps:
        return peak_lr * step / warmup_steps
    return peak_lr * math.sqrt(max(warmup_steps, 1) / step)


def scheduled_lr(
    step: int,
    *,
    kind: str,
    peak_lr: float,
    warmup_steps: int,
    total_steps: int | None = None,
    min_lr_ratio: float = 0.0,
) -> float:
    """The learning rate of update ``step`` (1-based) under schedule ``kind``.

    ``"inverse_sqrt"`` is :func:`inverse_sqrt_lr` (``total_steps`` is ignored). ``"linear"`` and
    ``"cosine"`` warm up linearly over ``warmup_steps`` updates, then decay from ``peak_lr`` at
    the end of the warm-up to ``min_lr_ratio * peak_lr`` just after ``total_steps`` (update
    ``total_steps + 1``; linearly, or along half a cosine), and stay there.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"kind: expected one of {SCHEDULES}, got {kind!r}")
    if kind == "inverse_sqrt":
        return inverse_sqrt_lr(step, peak_lr=peak_lr, warmup_steps=warmup_steps)
    _check_step(step)
    _check_count("warmup_steps", warmup_steps, 0)
    _check_peak(peak_lr)
    _check_count("total_steps", total_steps, 1)
    if not (isinstance(min_lr_ratio, (int, float)) and 0 <= min_lr_ratio <= 1):
        raise ValueError(f"min_lr_ratio: expected a number in [0, 1], got {min_lr_ratio!r}")
    if step <= warmup_steps:
        return peak_lr * step / warmup_steps
    # the floor is reached at the update after the last planned one, so that one still learns
    span = max(total_steps - warmup_steps + 1, 1)
    t = min((step - warmup_steps) / span, 1.0)  # 0 at the peak, 1 after the end
    shape = 1.0 - t if kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * t))
    return peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * shape)


class Schedule:
    """Sets ``optimizer``'s learning rate to :func:`scheduled_lr` before every update.

    Call :meth:`step` once per update, before ``optimizer.step()``; :attr:`last_step` is the
    number of updates scheduled so far. :meth:`plan` changes ``warmup_steps``/``total_steps``
    during the run (a time-bounded run re-estimates its length); the rate of an update depends
    only on the step and the plan at that update.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        peak_lr: float,
        warmup_steps: int,
        kind: str = "inverse_sqrt",
        total_steps: int | None = None,
        min_lr_ratio: float = 0.0,
    ) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"optimizer: expected a torch Optimizer, got {type(optimizer).__name__}"
            )
        self.optimizer, self.peak_lr, self.kind = optimizer, peak_lr, kind
        self.warmup_steps, self.total_steps, self.min_lr_ratio = (
            warmup_steps,
            total_steps,
            min_lr_ratio,
        )
        self.lr(1)  # validate
        self.last_step = 0

    def lr(self, step: int) -> float:
        """The rate of update ``step`` under the current plan."""
        return scheduled_lr(
            step,
            kind=self.kind,
            peak_lr=self.peak_lr,
            warmup_steps=self.warmup_steps,
            total_steps=self.total_steps,
            min_lr_ratio=self.min_lr_ratio,
        )

    def plan(self, *, warmup_steps: int | None = None, total_steps: int | None = None) -> None:
        """Change the warm-up length and/or the planned number of updates (None: keep)."""
        old = (self.warmup_steps, self.total_steps)
        if warmup_steps is not None:
            self.warmup_steps = warmup_steps
        if total_steps is not None:
            self.total_steps = total_steps
        try:
            self.lr(1)
        except ValueError:
            self.warmup_steps, self.total_steps = old
            raise

    def step(self) -> float:
        """Advance to the next update and set its learning rate, which is returned."""
        self.last_step += 1
        lr = self.lr(self.last_step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def state_dict(self) -> dict:
        return {
            "last_step": self.last_step,
            "peak_lr": self.peak_lr,
            "warmup": self.warmup_steps,
            "kind": self.kind,
            "total": self.total_steps,
            "min_lr_ratio": self.min_lr_ratio,
        }

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or "last_step" not in state:
            raise ValueError(f"state: expected a dict from state_dict(), got {state!r:.80}")
        self.last_step = int(state["last_step"])
        if "warmup" in state and "total" in state:  # older checkpoints kept only the step
            self.plan(
                warmup_steps=int(state["warmup"]),
                total_steps=None if state["total"] is None else int(state["total"]),
            )


class InverseSqrtSchedule(Schedule):
    """:class:`Schedule` of kind ``"inverse_sqrt"`` (kept for its name)."""

    def __init__(self, optimizer: Optimizer, *, peak_lr: float, warmup_steps: int) -> None:
        super().__init__(optimizer, peak_lr=peak_lr, warmup_steps=warmup_steps)
