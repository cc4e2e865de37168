"""Training in a notebook: one progress output updated in place, the run's messages in one
collapsible output, nothing on stderr (which a notebook shows as one red box per write).

A notebook of two cells is executed by a fresh kernel (nbclient); nbclient applies the display updates a kernel sends, as JupyterLab does.
"""

from __future__ import annotations

import json
import sys

import pytest
from _kernel import ROOT, execute

TRAIN = """\
import sys
sys.path.insert(0, {tests!r})
from _train_helpers import tiny_config
from qkv.train import train

result = train(tiny_config(max_steps=12, eval_every=6, save_every=6, log_every=4), {out!r})
"""


@pytest.mark.slow  # a kernel's start and a short run: about 20 s on 2 busy cores
def test_a_training_cell_shows_one_progress_output_and_one_messages_output(tmp_path):
    nbformat = pytest.importorskip("nbformat", reason="the notebooks need the dev extra")
    nb = nbformat.v4.new_notebook()
    code = TRAIN.format(tests=str(ROOT / "tests"), out=str(tmp_path / "run"))
    nb.cells = [nbformat.v4.new_code_cell(code), nbformat.v4.new_code_cell("print(result.step)")]
    execute(nb, tmp_path, timeout=300)
    outputs = nb.cells[0].outputs
    kinds = [(o.output_type, o.get("name")) for o in outputs]
    assert ("stream", "stderr") not in kinds, outputs
    assert not [o for o in outputs if o.output_type == "error"], outputs
    html = [o.data.get("text/html", "") for o in outputs if o.output_type == "display_data"]
    bars = [h for h in html if "qkv-progress" in h]
    notes = [o for o in outputs if "qkv-messages" in o.get("data", {}).get("text/html", "")]
    assert len(bars) == 1 and len(notes) == 1, json.dumps(kinds)
    assert len(outputs) == 2, json.dumps(kinds)
    assert "qkv-progress" in outputs[0].data["text/html"]  # the progress first, then the notes
    # the progress output was updated in place to the run's last update
    steps = int(nb.cells[1].outputs[0].text)
    assert steps == 12
    final = next(o for o in outputs if "qkv-progress" in o.data.get("text/html", ""))
    assert f"{steps}/{steps} loss" in final.data["text/plain"]
    assert f'<progress value="{steps}" max="{steps}"' in final.data["text/html"]
    # the messages: the run's plan and results, and the lines a terminal prints every 4 updates
    text = notes[0].data["text/plain"]
    assert "<details" in notes[0].data["text/html"]
    assert text.count(" loss ") >= 3 and len(text.splitlines()) >= 5, text


def test_the_terminal_output_is_unchanged_outside_a_notebook(tmp_path, capsys):
    """Outside a kernel, lines on stderr as before (no display, no HTML)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from _train_helpers import tiny_config

    from qkv.train import train
    from qkv.train.progress import in_notebook

    assert not in_notebook()
    train(tiny_config(max_steps=8, eval_every=8, save_every=8, log_every=4), tmp_path / "run")
    err = capsys.readouterr().err
    assert "4/8 loss" in err and "8/8 loss" in err and "<" not in err
