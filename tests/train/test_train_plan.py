"""qkv.train.plan: the cadences a run follows, and when a scheduled evaluation or checkpoint is
due (the timed plan itself: test_train_auto.py)."""

from __future__ import annotations

import pytest

from qkv.train import Plan, TrainConfig
from qkv.train.plan import scheduled


def test_the_cadence_is_the_configured_one_else_the_plans():
    auto = Plan(TrainConfig(), timed=False)
    # about EVALS evaluations over the planned run, a checkpoint every half interval
    assert auto.cadence(600) == (100, 50)
    assert auto.cadence(601) == (101, 51)
    assert auto.cadence(3) == (1, 1)
    fixed = Plan(TrainConfig(eval_every=7, save_every=5), timed=False)
    assert fixed.cadence(600) == (7, 5)
    # evaluations fixed, checkpoints automatic: about SAVES of them, not half of 7
    half = Plan(TrainConfig(eval_every=7), timed=False)
    assert half.cadence(600) == (7, 600 // Plan.SAVES)


@pytest.mark.parametrize(
    ("step", "last", "fixed", "due"),
    [
        (20, 0, True, True),  # a fixed cadence is a grid: multiples of every
        (25, 20, True, False),
        (30, 25, True, True),  # whatever happened in between
        (25, 20, False, False),  # an automatic one counts from the last
        (30, 20, False, True),
        (33, 20, False, True),
    ],
)
def test_a_fixed_cadence_is_a_grid_an_automatic_one_counts_from_the_last(step, last, fixed, due):
    assert scheduled(step, last, 10, fixed) is due


def test_a_timed_run_replans_after_3_6_and_every_10_updates():
    assert [n for n in range(1, 45) if Plan.due(n)] == [3, 6, 10, 20, 30, 40]
