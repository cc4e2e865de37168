"""One ONNX trace per distinct model in a test run, shared by pytest-xdist's workers.

Tracing a model into its two ONNX graphs (``torch.onnx.export(dynamo=True)``) takes 5-9 s even
for a 32-wide model, and a dozen test files export the same seeded tiny models to test what is
around the graphs: the folder, its manifest, its modes, the runner, the server. The first export
of a model in a run traces it; the same model exported again (the same configuration and the
same weights, bit for bit) gets a copy of the graphs that trace wrote. The tracing is
deterministic (two traces of one model wrote byte-identical graphs), so a copy is what a second
trace would write; everything else about an export (the folder writer, the manifest, the card,
the tokenizers) runs every time. The cache lives in the run's temporary folder, so no run reads
another run's graphs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

GRAPHS = ("encoder.onnx", "decoder_step.onnx")


def model_key(model: nn.Module) -> str:
    """A digest of ``model``'s configuration and of every tensor of its state, bit for bit."""
    h = hashlib.sha256(json.dumps(asdict(model.config), sort_keys=True).encode())
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(-1).view(dtype=torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def caching(trace: Callable[[nn.Module, Path], None], root: Path):
    """``trace(model, folder)`` that traces each distinct model once into ``root`` (under a
    lock, so that two workers exporting one model wait for one trace) and copies its graphs."""

    def traced(model: nn.Module, folder: Path) -> None:
        key = model_key(model)
        store = root / key
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (store / GRAPHS[-1]).is_file():
                part = root / f"{key}.{os.getpid()}.part"
                shutil.rmtree(part, ignore_errors=True)
                part.mkdir()
                trace(model, part)
                if sorted(p.name for p in part.iterdir()) != sorted(GRAPHS):
                    raise AssertionError(f"the ONNX trace wrote {sorted(os.listdir(part))}")
                part.rename(store)
        for name in GRAPHS:
            shutil.copyfile(store / name, Path(folder) / name)

    return traced
