"""Running a notebook as the tests do: a Jupyter kernel (nbclient) in a temporary folder,
``src/`` of this checkout first on the kernel's ``PYTHONPATH``, matplotlib headless."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: run first in a kernel that ran another notebook: ``%reset -f`` empties the namespace, so a
#: notebook that uses a name it never defines fails as it would in a fresh kernel; the figures
#: left open are closed and the working folder is the notebook's own
_RESET = """\
%reset -f
import os, sys
if "matplotlib.pyplot" in sys.modules:
    sys.modules["matplotlib.pyplot"].close("all")
os.chdir({folder!r})
del os, sys
"""


class Kernel:
    """One started Jupyter kernel that executes notebooks one after the other (its start and
    the imports of torch, matplotlib and qkv, about 3.5 s, paid once)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def execute(self, nb: Any, folder: Path, timeout: int = 600) -> Any:
        """Execute notebook ``nb`` (an nbformat node, changed in place: its cells get their
        outputs) with ``folder`` as the working folder. Returns the nbclient client."""
        import nbclient
        import nbformat

        reset = nbformat.v4.new_code_cell(_RESET.format(folder=str(folder)))
        nb.cells.insert(0, reset)
        client = nbclient.NotebookClient(nb, km=self.manager, timeout=timeout)
        try:
            client.execute()
        except BaseException:
            # a cell left running (a timeout) or a dead kernel would fail every notebook after
            # this one: the next starts on a fresh kernel
            from jupyter_core.utils import run_sync

            run_sync(self.manager.restart_kernel)(now=True)
            raise
        finally:
            nb.cells.remove(reset)
            if client.kc is not None:  # the kernel is not the client's to stop: its channels are
                client.kc.stop_channels()
        return client


@contextmanager
def kernel() -> Iterator[Kernel]:
    """A :class:`Kernel` for the ``with`` block, shut down after it; skips when the dev extra's
    Jupyter packages are missing. The kernel is a child process: this environment with
    ``src/`` first on its ``PYTHONPATH`` and ``MPLBACKEND=Agg`` (this process's own is left
    as it is), at its start and at any restart."""
    pytest.importorskip("nbclient", reason="the notebooks need the dev extra")
    pytest.importorskip("ipykernel", reason="the notebooks need the dev extra")
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync

    manager = AsyncKernelManager(kernel_name="python3")
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    # given at the start, kept for a restart (jupyter_client launches it again with it)
    run_sync(manager.start_kernel)(env={**os.environ, "PYTHONPATH": path, "MPLBACKEND": "Agg"})
    try:
        yield Kernel(manager)
    finally:
        run_sync(manager.shutdown_kernel)(now=True)


def execute(nb: Any, folder: Path, timeout: int = 600) -> Any:
    """Execute notebook ``nb`` in a fresh kernel of its own (see :meth:`Kernel.execute`)."""
    with kernel() as k:
        return k.execute(nb, folder, timeout)
