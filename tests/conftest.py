"""Shared fixtures; the float64 reference lives in tests/_reference.py.

* every test starts from one torch seed;
* the tests of ``tests/nn``, ``tests/decoding`` and ``tests/serve`` run tiny models on one
  intra-op thread (faster for them, far faster on a busy machine, where a second OpenMP thread
  spins waiting for a core), set for each test and given back after it: a setting left behind
  would change the float sums of every later test;
* ``corpus_file`` and ``trained`` (tiny runs of ``qkv train``, one per model kind) serve every
  folder that tests a trained model: the train, cli and serve tests. Every test that uses
  ``trained`` (directly or through another fixture) is marked ``slow``: the models are trained
  once per test run, so ``pytest -m "not slow"`` leaves them out; so are the tests named in
  :data:`SLOW_TESTS`, which train for many seconds themselves.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _train_helpers import TINY, tiny_config

from qkv.data import bundled_pairs, write_pairs

HERE = Path(__file__).parent
#: folders whose tests run tiny models on one thread
ONE_THREAD = ("nn", "decoding", "serve")
#: fixtures that train models for the run: a test needing one is slow
TRAINING_FIXTURES = frozenset({"trained", "marian_trained"})
#: tests that train for many seconds by design (a budget in minutes, a run killed and resumed in
#: subprocesses, the whole demo): the top of `pytest -m "not slow" --durations=20`, 4 to 25 s
#: each on 2 cores. Per file (relative to tests/); a name no longer in its file is an error.
SLOW_TESTS = {
    "train/test_train_resume.py": {"test_killed_and_resumed_run_matches_an_uninterrupted_one"},
    "train/test_train_auto.py": {
        "test_a_timed_run_plans_its_length_and_decays_within_the_budget",
        "test_a_timed_run_resumed_keeps_its_budget_and_its_final_model",
    },
    "cli/test_cli_train.py": {"test_demo_quick"},
}


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(1234)
    yield


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (restored after it)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    checked: set[str] = set()
    for item in items:
        try:
            rel = item.path.relative_to(HERE).as_posix()
        except ValueError:  # a test outside tests/
            continue
        if rel.split("/")[0] in ONE_THREAD:
            item.add_marker(pytest.mark.usefixtures("one_thread"))
        slow = SLOW_TESTS.get(rel, set())
        if slow and rel not in checked:
            checked.add(rel)
            missing = sorted(n for n in slow if not hasattr(item.module, n))
            if missing:
                raise pytest.UsageError(f"tests/conftest.py: SLOW_TESTS names {missing}, which {rel} lacks")  # fmt: skip
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


@pytest.fixture(scope="session")
def marian_folder(tmp_path_factory) -> Path:
    """An untrained MarianMTModel folder made by transformers (OPUS-MT's layout, swish, tied
    embeddings; tests/_hf_models.py), for what needs a folder and not its translations."""
    pytest.importorskip("transformers")
    from _hf_models import build_marian

    folder, _ = build_marian(tmp_path_factory.mktemp("marian"), "swish-tied", steps=0)
    return folder


@pytest.fixture(scope="session")
def marian_trained(tmp_path_factory) -> dict[str, tuple[Path, list[str]]]:
    """Every configuration of tests/_hf_models.py's KINDS as a MarianMTModel folder trained
    briefly by transformers, with its test sources: ``{name: (folder, sources)}``."""
    pytest.importorskip("transformers")
    from _hf_models import KINDS, build_marian

    root = tmp_path_factory.mktemp("marian-trained")
    return {name: build_marian(root, name) for name in KINDS}
