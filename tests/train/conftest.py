"""Tiny trained models (one per kind), shared by the train tests.

Every test that uses them (directly or through another fixture) is marked ``slow``: the models
are trained once per test run, so ``pytest -m "not slow"`` leaves them out; so are the few tests
named in ``SLOW_TESTS`` that train for many seconds themselves.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _train_helpers import TINY, tiny_config

from qkv.data import bundled_pairs, write_pairs

# fixtures that train models for the run: a test needing one is slow
TRAINING_FIXTURES = frozenset({"trained"})
# tests that train for many seconds by design (a budget in minutes, a run killed and resumed in
# subprocesses, the whole demo): the top of `pytest -m "not slow" --durations=20`, 4 to 25 s each
# on 2 cores.  Per file; a name that is no longer in its file is an error, not a silent no-op.
SLOW_TESTS = {
    "test_train_resume.py": {"test_killed_and_resumed_run_matches_an_uninterrupted_one"},
    "test_train_auto.py": {
        "test_a_timed_run_plans_its_length_and_decays_within_the_budget",
        "test_a_timed_run_resumed_keeps_its_budget_and_its_final_model",
    },
    "test_train_cli.py": {"test_demo_quick"},
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here, checked = Path(__file__).parent, set()
    for item in items:
        file = item.path.name if item.path.parent == here else None
        slow = SLOW_TESTS.get(file, set())
        if slow and file not in checked:
            checked.add(file)
            missing = sorted(n for n in slow if not hasattr(item.module, n))
            if missing:
                raise pytest.UsageError(
                    f"tests/train/conftest.py: SLOW_TESTS names {missing}, which {file} lacks"
                )
        name = getattr(item, "originalname", item.name)
        if name in slow or TRAINING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    """The first 600 bundled pairs as a fra-format file."""
    path = tmp_path_factory.mktemp("corpus") / "en-fr.txt"
    write_pairs(path, bundled_pairs()[:600])
    return path


@pytest.fixture(scope="session")
def trained(tmp_path_factory, corpus_file) -> dict[str, Path]:
    """A run folder per model kind, trained for 30 updates on ``corpus_file``."""
    from qkv.train import train

    runs = {}
    for kind in TINY:
        out = tmp_path_factory.mktemp(f"run-{kind}")
        train(tiny_config(kind, data=str(corpus_file)), out, progress=False)
        runs[kind] = out
    return runs
