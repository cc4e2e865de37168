"""The seed notebooks in notebooks/: stored without outputs, and each runs top to bottom.

Each notebook is executed by a fresh Jupyter kernel (nbclient) in a temporary folder, with
``src/`` of this checkout first on the kernel's ``PYTHONPATH`` (a fresh clone needs no install of
its own for the kernel to import this qkv). Notebooks that train a model take more than a few
seconds; running one in a kernel is slow (tests/conftest.py's ``SLOW_TESTS``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from _kernel import execute

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
#: every notebook must show these in its outputs (a figure shown without %matplotlib inline, the
#: viewer inline, a table)
SHOWS = {
    "000_torch_multiheadattention_and_masks.ipynb": ("image/png", "MaskSpec"),
    "001_self_attention_by_hand.ipynb": ("image/png",),
    "002_vit_fused_qkv.ipynb": ("image/png", "qkv-viewer-"),
    "003_additive_and_scaled_dot_product.ipynb": ("image/png", "MaskSpec"),
    "004_d2l_attention_chapter.ipynb": ("image/png", "qkv-viewer-", "Translator"),
}


def test_the_five_seed_notebooks_are_there():
    assert [p.name[:3] for p in NOTEBOOKS] == ["000", "001", "002", "003", "004"]
    assert set(SHOWS) == {p.name for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_stored_without_outputs(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"{path.name} cell {i} stores outputs"
            assert cell["execution_count"] is None, f"{path.name} cell {i} has a count"
        assert "attachments" not in cell or not cell["attachments"]
    assert "widgets" not in nb["metadata"]
    code = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "%matplotlib" not in code  # qkv's figures show themselves


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="the notebooks need the dev extra")
    nb = nbformat.read(path, as_version=4)
    start = time.monotonic()
    execute(nb, tmp_path, monkeypatch)
    seconds = time.monotonic() - start
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, errors
    shown = json.dumps([o.get("data", {}) for o in outputs]) + json.dumps(
        [o.get("text", "") for o in outputs]
    )
    for what in SHOWS[path.name]:
        assert what in shown, f"{path.name} does not show {what}"
    print(f"{path.name}: {seconds:.1f} s")
