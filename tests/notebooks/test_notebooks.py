"""The seed notebooks in notebooks/: stored without outputs, and each runs top to bottom.

The notebooks are executed one after the other by one Jupyter kernel (nbclient), each in a
temporary folder of its own, with ``src/`` of this checkout first on the kernel's
``PYTHONPATH`` (a fresh clone needs no install of its own for the kernel to import this qkv).
Each starts with the kernel's namespace emptied (``%reset -f``: a name a notebook uses but never
defines fails as in a fresh kernel) and its figures closed; the modules imported stay imported,
which is what a fresh kernel per notebook cost (its start and the imports of torch, matplotlib
and qkv: about 3.5 s each). Notebooks that train a model take more than a few
seconds; running one in a kernel is slow (tests/conftest.py's ``SLOW_TESTS``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from _kernel import kernel

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


@pytest.fixture(scope="module")
def shared_kernel():
    with kernel() as k:
        yield k


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, shared_kernel):
    nbformat = pytest.importorskip("nbformat", reason="the notebooks need the dev extra")
    nb = nbformat.read(path, as_version=4)
    start = time.monotonic()
    shared_kernel.execute(nb, tmp_path)
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


def test_a_notebook_sees_no_name_of_the_one_before(shared_kernel, tmp_path):
    """The shared kernel is no looser than a fresh one: what a notebook defined is gone for the
    next, and one that relies on it fails."""
    nbformat = pytest.importorskip("nbformat", reason="the notebooks need the dev extra")
    from nbclient.exceptions import CellExecutionError

    first = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("left_over = 1")])
    shared_kernel.execute(first, tmp_path)
    second = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(left_over)")])
    with pytest.raises(CellExecutionError, match="left_over"):
        shared_kernel.execute(second, tmp_path)
    third = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import os; os.getcwd()")])
    (tmp_path / "other").mkdir()
    shared_kernel.execute(third, tmp_path / "other")
    assert third.cells[0].outputs[0]["data"]["text/plain"] == repr(str(tmp_path / "other"))
