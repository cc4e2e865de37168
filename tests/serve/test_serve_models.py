"""``qkv serve`` reads what ``qkv translate --model-dir`` reads: a run folder, one of its
checkpoints, and a ``qkv export`` folder; a model of the bundled corpus says en -> fr itself."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _serve_helpers import SOURCES, live_server

from qkv.export import export_model
from qkv.inference import find_checkpoints
from qkv.serve import ServeConfig, create_app, translator_languages
from qkv.serve.registry import inspect_folder
from qkv.translate import Translator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny `qkv train` run on the bundled corpus (about 2 s)."""
    from _train_helpers import tiny_config

    from qkv.train import train

    out = tmp_path_factory.mktemp("run")
    train(tiny_config(max_steps=30), out, progress=False)
    return out


@pytest.mark.slow
def test_run_checkpoint_and_export_folders(run, tmp_path):
    (checkpoint, *_) = find_checkpoints(run / "checkpoints")
    exported = export_model(run, tmp_path / "exported")
    for folder in (run, checkpoint, exported):
        tr = Translator.load(folder)
        assert translator_languages(tr) == ("en", "fr"), folder
        found = inspect_folder(folder)  # what a server of several models reads of it
        assert (found.pair, found.engine) == ("en-fr", "qkv") and found.size > 0
        app = create_app(tr, ServeConfig(model_dir=str(folder)))  # no languages given
        st = app.state.qkv
        assert (st.source, st.target) == ("en", "fr")
        with live_server(tr, source_lang=None, target_lang=None, model_dir=str(folder)) as s:
            h = s.get("/health").json()
            assert (
                h["model"]["model_dir"] == Path(folder).name
                and h["model"]["step"] == st.registry.lanes[0].step
            )
            assert h["model"]["step"] > 0
            r = s.post("/translate", json={"q": SOURCES[:5], "source": "en", "target": "fr"})
            assert r.json() == {"translatedText": tr.translate(SOURCES[:5])}
            assert s.post("/translate", json={"q": "go .", "source": "de"}).status_code == 400


def test_a_model_that_does_not_say_needs_the_languages(translator):
    assert translator_languages(translator) is None
    with pytest.raises(ValueError, match="source_lang: the model does not record"):
        create_app(translator, ServeConfig())
    app = create_app(translator, ServeConfig(source_lang="EN", target_lang="x-custom"))
    assert (app.state.qkv.source, app.state.qkv.target) == ("en", "x-custom")
    with pytest.raises(ValueError, match="source_lang"):
        ServeConfig(source_lang="auto")
    with pytest.raises(TypeError, match="translator"):
        create_app("demo-out/translator")  # type: ignore[arg-type]
