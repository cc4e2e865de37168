"""qkv.train.rng: the generators a checkpoint saves are the ones training draws from, and put
back they draw the same numbers again."""

from __future__ import annotations

import random

import numpy as np
import torch

from qkv.train.rng import rng_state, set_rng_state


def _draws() -> tuple:
    return (
        torch.rand(4).tolist(),
        random.random(),
        np.random.rand(3).tolist(),  # noqa: NPY002 - the legacy global generator is the point
    )


def test_a_saved_state_put_back_draws_the_same_numbers():
    cpu = torch.device("cpu")
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)  # noqa: NPY002
    _draws()
    saved = rng_state(cpu)
    expected = _draws()
    _draws()  # the generators move on
    set_rng_state(saved, cpu)
    assert _draws() == expected


def test_the_state_is_what_torch_load_weights_only_reads(tmp_path):
    cpu = torch.device("cpu")
    saved = rng_state(cpu)
    assert "cuda" not in saved  # a CPU run saves no CUDA state
    torch.save(saved, tmp_path / "rng.pt")
    back = torch.load(tmp_path / "rng.pt", weights_only=True)
    expected = _draws()
    set_rng_state(back, cpu)
    assert _draws() == expected
