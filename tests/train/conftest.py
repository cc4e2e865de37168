"""Tiny trained models (one per kind), shared by the train tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from _train_helpers import TINY, tiny_config

from qkv.data import bundled_pairs, write_pairs


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
