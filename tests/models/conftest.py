"""The model tests run tiny models: one intra-op thread is faster for them, and far faster on a
busy machine, where a second OpenMP thread spins waiting for a core."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
