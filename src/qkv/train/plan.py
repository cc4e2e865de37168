"""A run's plan: how many updates it makes, its warm-up, and when it validates and saves.

A run bounded by ``max_steps`` alone knows its length. A run with a clock (``max_minutes``)
measures its speed (:class:`Clock`: the time of its updates, of its evaluations and of its
checkpoint writes) and :class:`Plan` re-plans the updates that fit in the budget, so the learning
rate decays to the end of the budget on any machine. The cadences (``eval_every``,
``save_every``) are the user's, or follow from the planned length (about :attr:`Plan.EVALS`
evaluations and :attr:`Plan.SAVES` checkpoints a run; a timed run measures its first
evaluation and plans only as many as fit in :attr:`Plan.EVAL_SHARE` of its budget);
``qkv train --help`` shows them from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .config import TrainConfig
from .schedules import Schedule

__all__ = ["FIRST_GUESS", "Clock", "Plan", "scheduled"]

#: the provisional length of a timed run, until its speed is measured (after 6 updates)
FIRST_GUESS = 10_000


@dataclass
class Clock:
    """Where this invocation's time went: evaluations and checkpoint writes are not training.

    Attributes:
        t_start: when the invocation began (``time.monotonic()``).
        evals: the seconds each evaluation took.
        saving: the seconds spent writing checkpoints.
        t_first, steps_at_first, busy_at_first: when the speed began to be measured, the
            updates done then, and the evaluation and saving seconds spent by then.
    """

    t_start: float
    evals: list[float] = field(default_factory=list)
    saving: float = 0.0
    t_first: float | None = None
    steps_at_first: int = 0
    busy_at_first: float = 0.0

    def eval_cost(self, per_update: float) -> float:
        """Seconds one validation takes: measured, or guessed before the first one."""
        if self.evals:
            return sum(self.evals[-3:]) / len(self.evals[-3:])
        return max(1.0, 10 * per_update)


class Plan:
    """How long the run will be, and the warm-up and cadences that follow from it.

    A run with a clock (``timed``) plans the updates that fit in its budget, keeping time for the
    evaluations still to come and the final averaging and decoding choice (about
    :attr:`FINAL_EVALS` validations). It re-plans after 3, 6 and 10 updates and then every 10
    (:meth:`due`).
    """

    EVALS = 6  # scheduled evaluations over a run whose eval_every is automatic
    SAVES = 12  # checkpoints over a run whose save_every is automatic
    WARMUP_FRACTION = 0.1
    MIN_WARMUP = 10
    FINAL_EVALS = 7.0  # the final evaluation, the averaged model's, greedy and two beams (~2x)

    EVAL_SHARE = 0.1  # the most of a timed run's budget its scheduled evaluations take

    def __init__(self, config: TrainConfig, timed: bool) -> None:
        self.config, self.timed = config, timed
        self.evals = self.EVALS  # scheduled evaluations, until their cost is measured

    def fit_evals(self, budget_s: float, eval_cost: float) -> int:
        """Plan as many scheduled evaluations (at most :attr:`EVALS`, at least one) as fit in
        :attr:`EVAL_SHARE` of a timed run's ``budget_s`` at ``eval_cost`` seconds each (a
        measured one); returns the number."""
        if self.timed and math.isfinite(budget_s) and eval_cost > 0:
            fit = int(self.EVAL_SHARE * budget_s / eval_cost)
            self.evals = max(1, min(self.EVALS, fit))
        return self.evals

    def warmup(self, total: int) -> int:
        """Warm-up updates of a run of ``total`` updates: the configured ones, or a tenth."""
        if self.config.warmup_steps is not None:
            return self.config.warmup_steps
        return min(max(self.MIN_WARMUP, round(self.WARMUP_FRACTION * total)), max(total, 1))

    def eval_every(self, total: int) -> int:
        """The automatic evaluation interval of a run of ``total`` updates."""
        return max(1, math.ceil(total / self.evals))

    def save_every(self, total: int, eval_every: int | None = None) -> int:
        """Half the evaluation interval (rounded up, so a checkpoint never falls one update
        before an evaluation's), or ``total / SAVES`` when evaluations are not automatic."""
        if eval_every is not None and self.config.eval_every is None:
            return max(1, math.ceil(eval_every / 2))
        return max(1, math.ceil(total / self.SAVES))

    def cadence(self, planned: int) -> tuple[int, int]:
        """``(eval_every, save_every)`` of a run planned to end at update ``planned``: the
        configured ones, or the plan's."""
        eval_every = self.config.eval_every or self.eval_every(planned)
        save_every = self.config.save_every or self.save_every(planned, eval_every)
        return eval_every, save_every

    def near_end(
        self, step: int, planned: int, every: int, elapsed: float, budget_s: float
    ) -> bool:
        """Is ``step`` of a timed run planned to end at update ``planned`` within a quarter of
        a cadence of ``every`` updates before that end, in the last fifth of the budget (where
        the plan counts)? What falls due there (:meth:`ends_at_evaluation`,
        :meth:`skips_save`) would repeat, a few updates earlier and at a learning rate near 0,
        what the run's end does anyway."""
        return self.timed and planned - step < every / 4 and elapsed >= 0.8 * budget_s

    def ends_at_evaluation(
        self, step: int, planned: int, last_eval: int, elapsed: float, budget_s: float
    ) -> bool:
        """Does an automatic evaluation due at ``step`` end a timed run planned to end at
        update ``planned``? It does :meth:`near_end`: the final evaluation a few updates later
        would only repeat it, with a checkpoint, in the time the final model's averaging and
        decoding choice need (a run beside busy processes validated and saved at updates 2534
        and 2535, then had no time left to choose its beam)."""
        if self.config.eval_every is not None:
            return False
        eval_every, _ = self.cadence(planned)
        return scheduled(step, last_eval, eval_every, False) and self.near_end(
            step, planned, eval_every, elapsed, budget_s
        )

    def skips_save(self, step: int, planned: int, elapsed: float, budget_s: float) -> bool:
        """Is an automatic checkpoint due at ``step`` left out? It is :meth:`near_end`: the
        run's last update is saved anyway, and the final averaging of the newest checkpoints
        would take two nearly the same (a run averaged updates 2080, 2271 and 2276)."""
        if self.config.save_every is not None:
            return False
        _, save_every = self.cadence(planned)
        return self.near_end(step, planned, save_every, elapsed, budget_s)

    def leaves_save_to_evaluation(self, step: int, planned: int, last_eval: int) -> bool:
        """Is an automatic checkpoint due at ``step`` left to the next automatic evaluation, as
        now planned, due within a quarter of a save cadence after it, which saves anyway (a
        re-plan that moves that evaluation further has the checkpoint written then)?
        Cadences re-planned from measured speed can bring the two a few updates apart, and
        the final averaging of the newest checkpoints would then take two nearly the same (a
        run averaged updates 3744, 3745 and 3895)."""
        if self.config.save_every is not None or self.config.eval_every is not None:
            return False
        eval_every, save_every = self.cadence(planned)
        return 0 < last_eval + eval_every - step < save_every / 4

    @staticmethod
    def due(done_steps: int) -> bool:
        """Is a timed run re-planned after ``done_steps`` updates of this invocation?"""
        return done_steps in (3, 6) or (done_steps >= 10 and done_steps % 10 == 0)

    def final_reserve(self, clock: Clock, budget_s: float) -> float:
        """Seconds kept at the end of a timed run for its final evaluation and averaging."""
        if not clock.evals:
            return 0.05 * budget_s
        return min(self.FINAL_EVALS * clock.eval_cost(0.0), budget_s / 6) + 2 * clock.saving / max(
            len(clock.evals), 1
        )

    def estimate(
        self,
        step: int,
        done_steps: int,
        elapsed: float,
        budget_s: float,
        clock: Clock,
        current: int,
    ) -> int:
        """The number of updates (in all) this run can make within ``budget_s`` (``current``:
        the plan so far, kept until something is measured)."""
        now = clock.t_start + elapsed
        if clock.t_first is None:
            clock.t_first, clock.steps_at_first = now, done_steps
            clock.busy_at_first = sum(clock.evals) + clock.saving
            return current  # nothing measured yet: keep the plan
        n = done_steps - clock.steps_at_first
        busy = sum(clock.evals) + clock.saving - clock.busy_at_first
        per_update = max((now - clock.t_first - busy) / max(n, 1), 1e-6)
        eval_cost = clock.eval_cost(per_update)
        save_cost = clock.saving / max(len(clock.evals), 1) if clock.evals else 0.0
        # evaluations may take at most a quarter of the budget, the final ones a sixth
        remaining = budget_s - elapsed - min(self.FINAL_EVALS * eval_cost, budget_s / 6)
        total = float(step + max(remaining, 0.0) / per_update)
        for _ in range(3):  # the evaluations and saves still to come shorten the run
            left = max(total - step, 0.0) / max(total, 1.0)
            busy_left = left * (self.evals * eval_cost + self.SAVES * save_cost)
            busy_left = min(busy_left, 0.25 * max(remaining, 0.0))
            total = step + max(remaining - busy_left, 0.0) / per_update
        return max(int(total), step)

    def describe(self, schedule: Schedule) -> str:
        """The schedule line a run logs before its first update."""
        c = self.config
        end = (
            f"the planned end of a {c.max_minutes:g}-minute budget (re-planned from the "
            f"measured speed{f'; at most {c.max_steps} updates' if c.max_steps else ''})"
            if self.timed
            else f"update {c.step_limit}"
        )
        if schedule.kind == "inverse_sqrt":
            shape = "then 1/sqrt(step) decay"
        else:
            shape = f"then {schedule.kind} decay to {c.min_lr_ratio:g} x peak at {end}"
        cadence = (
            f"evaluation every {c.eval_every} updates"
            if c.eval_every
            else f"up to {self.EVALS} evaluations (at most {self.EVAL_SHARE:.0%} of the budget)"
            if self.timed
            else f"about {self.EVALS} evaluations"
        )
        saves = (
            f"a checkpoint every {c.save_every}"
            if c.save_every
            else f"about {self.SAVES} checkpoints"
        )
        warm = (
            f"{c.warmup_steps} warm-up updates"
            if c.warmup_steps is not None
            else f"warm-up over {self.WARMUP_FRACTION:.0%} of the run"
        )
        return (
            f"schedule: peak lr {c.lr:g}, {warm}, {shape}; {cadence} and {saves}; "
            f"{c.max_tokens} tokens per batch"
            + (f" x {c.accum_steps} micro-batches" if c.accum_steps > 1 else "")
        )


def scheduled(step: int, last: int, every: int, fixed: bool) -> bool:
    """Is a scheduled evaluation/checkpoint due at ``step``? A fixed cadence is a grid
    (multiples of ``every``); an automatic one counts from the ``last``."""
    return step % every == 0 if fixed else step - last >= every
