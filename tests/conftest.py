"""Shared fixtures; the float64 reference lives in tests/_reference.py."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(1234)
    yield
