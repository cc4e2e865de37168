"""A context for the demos that train tiny models."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["one_thread"]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one intra-op thread inside the block, then restore the setting.

    A tiny model's operations are too small to share: on a busy 2-core machine two threads
    made an update of the heads demo 6x slower (45 ms against 8 ms), waiting for each other.
    """
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
