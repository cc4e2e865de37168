"""The random state a checkpoint saves, so that a resumed run draws what it would have drawn.

Training draws from torch's generator (dropout), CUDA's on a GPU, and Python's and NumPy's global
ones (any code the data path calls). Each rank's are saved in every checkpoint (``trainer.pt``,
tensors and numbers only) and put back on resume. The batch order is not among them: it has its
own seeded generator, restored from the data position.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["rng_state", "set_rng_state"]


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's generators (CUDA's too when ``device`` is a GPU), as tensors and numbers
    that ``torch.load(weights_only=True)`` reads back."""
    np_state = np.random.get_state()  # noqa: NPY002 - the legacy global state is what is saved
    py_version, py_state, _ = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "python": list(py_state),
        "python_version": py_version,
        "numpy": torch.from_numpy(np_state[1].astype(np.int64)),
        "numpy_pos": int(np_state[2]),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Put back the generators :func:`rng_state` saved (CUDA's when both are on a GPU)."""
    torch.set_rng_state(state["torch"])
    random.setstate((int(state["python_version"]), tuple(int(x) for x in state["python"]), None))
    np_state = (
        "MT19937",
        state["numpy"].numpy().astype(np.uint32),
        int(state["numpy_pos"]),
        0,
        0.0,
    )
    np.random.set_state(np_state)  # noqa: NPY002
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
