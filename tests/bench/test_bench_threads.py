"""benchmarks/threads.py: each policy's worker starts from the environment it names, and a row's
best policy and auto's ratios come from the medians (values given, nothing timed)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import threads as bt


def test_the_policies_are_the_issues_four():
    assert list(bt.POLICIES) == ["auto", "default", "passive", "one"]


@pytest.mark.parametrize(
    "policy, want",
    [
        ("auto", {}),
        ("default", {}),
        ("passive", {"OMP_WAIT_POLICY": "PASSIVE"}),
        ("one", {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}),
    ],
)
def test_a_workers_environment_is_its_policys_alone(policy, want):
    """The caller's own thread settings never reach a worker: auto would take them as the
    user's, and the default would not be libgomp's."""
    mine = {
        "PATH": "/bin",
        "OMP_WAIT_POLICY": "ACTIVE",
        "OMP_NUM_THREADS": "7",
        "MKL_NUM_THREADS": "7",
        "GOMP_SPINCOUNT": "10",
        "KMP_BLOCKTIME": "0",
        "QKV_AUTO_THREADS": "0",
        "QKV_THREADS_SET": "OMP_NUM_THREADS=7",
    }
    assert bt.worker_env(policy, mine) == {"PATH": "/bin", **want}


def _per(**rounds: list[float]) -> dict[str, dict]:
    return {p: {"rounds_ms": v, "errors": [], "threads": 1} for p, v in rounds.items()}


def test_a_row_takes_medians_and_names_the_best():
    row = bt.summarise(
        "training",
        2,
        _per(auto=[10, 30, 11], default=[40, 41, 39], passive=[20, 22, 21], one=[9, 10, 100]),
    )
    assert {p: v["ms"] for p, v in row["policies"].items()} == {
        "auto": 11,
        "default": 40,
        "passive": 21,
        "one": 10,
    }
    assert row["best"] == "one"
    assert row["auto_over_best"] == pytest.approx(1.1)
    assert row["auto_over_default"] == pytest.approx(11 / 40)


def test_a_policy_that_failed_is_never_the_best():
    row = bt.summarise("translation", 0, _per(auto=[12], default=[10], passive=[], one=[30]))
    assert math.isnan(row["policies"]["passive"]["ms"]) and row["best"] == "default"
    assert row["auto_over_best"] == pytest.approx(1.2)


def test_the_verdict_checks_the_issues_two_targets():
    quiet = bt.summarise("training", 0, _per(auto=[10.4], default=[10], passive=[20], one=[15]))
    one = bt.summarise("training", 1, _per(auto=[99], default=[10], passive=[10], one=[10]))
    busy = bt.summarise("training", 2, _per(auto=[13], default=[30], passive=[20], one=[10]))
    lines = bt.verdict([quiet, one, busy], cpus=2)
    assert lines == [
        "training beside 0 busy: auto / default 1.04x (target <= 1.05x: met)",
        "training beside 2 busy: auto / best (one) 1.30x (target <= 1.2x: MISSED)",
    ]


def test_a_partial_run_keeps_the_earlier_rows_it_did_not_measure_with_their_load():
    earlier = {
        "load_at_start": 3.2,
        "rows": [
            {"workload": w, "busy": b, "auto_over_best": 9.0}
            for w in ("training", "translation")
            for b in (0, 1, 2)
        ],
    }
    again = [
        {"workload": "translation", "busy": 0, "auto_over_best": 1.0, "load": 0.5},
        {"workload": "training", "busy": 0, "auto_over_best": 1.1, "load": 0.4},
    ]
    rows = bt.merge_rows(again, earlier)
    assert [(r["workload"], r["busy"], r["load"], r["auto_over_best"]) for r in rows] == [
        ("training", 0, 0.4, 1.1),
        ("training", 1, 3.2, 9.0),
        ("training", 2, 3.2, 9.0),
        ("translation", 0, 0.5, 1.0),
        ("translation", 1, 3.2, 9.0),
        ("translation", 2, 3.2, 9.0),
    ]
    assert bt.merge_rows(again, None) == again
