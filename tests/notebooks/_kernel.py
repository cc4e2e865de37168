"""Running a notebook as the tests do: a fresh Jupyter kernel (nbclient) in a temporary folder,
``src/`` of this checkout first on the kernel's ``PYTHONPATH``, matplotlib headless."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def execute(nb: Any, folder: Path, monkeypatch: pytest.MonkeyPatch, timeout: int = 600) -> Any:
    """Execute notebook ``nb`` (an nbformat node, changed in place) in ``folder``; skips when
    the dev extra's Jupyter packages are missing. Returns the nbclient client."""
    nbclient = pytest.importorskip("nbclient", reason="the notebooks need the dev extra")
    pytest.importorskip("ipykernel", reason="the notebooks need the dev extra")
    # the kernel is a child process: it inherits this environment
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    )
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = nbclient.NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    )
    client.execute()
    return client
