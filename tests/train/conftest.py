"""Tiny trained models (one per kind), shared by the train tests.

Every test that uses them (directly or through another fixture) is marked ``slow``: the models
are trained once per test run, so ``pytest -m "not slow"`` leaves them out.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _train_helpers import TINY, tiny_config

from qkv.data import bundled_pairs, write_pairs

# fixtures that train models for the run: a test needing one is slow
TRAINING_FIXTURES = frozenset({"trained"})


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if TRAINING_FIXTURES & set(getattr(item, "fixturenames", ())):
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
