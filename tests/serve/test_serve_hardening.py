"""A fourth hostile pass on the server: language tags matched with their script (no Simplified
model answers Traditional Chinese), a model that fails to load remembered rather than loaded on
every request, ``--models-dir`` serving the models it holds and skipping the rest, a strict
``Host``, and a ``/health`` that shows no path of the host's to a client without the key."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import pytest
from _serve_helpers import live_app, live_server, tiny_model_folder
from test_serve_server import kept_logs

from qkv._errors import SettingError
from qkv.data.languages import language_script, match_language
from qkv.serve import ServeConfig, create_app
from qkv.serve.registry import ModelRegistry, inspect_folder, models_in
from qkv.translate import Translator

logs = pytest.fixture(kept_logs)

TEXT = "the cat sat on the mat ."


# ---------------------------------------------------------------------------- language tags
@pytest.mark.parametrize(
    ("asked", "offered", "found"),
    [
        ("zh", ["zh-CN"], "zh-CN"),
        ("zh-Hans", ["zh-CN"], "zh-CN"),
        ("zh-CN", ["zh"], "zh"),
        ("zh-SG", ["zh-Hans"], "zh-Hans"),
        ("zh-TW", ["zh-CN"], None),
        ("zh-HK", ["zh"], None),
        ("zh-Hant", ["zh-CN"], None),
        ("zt", ["zh-CN"], None),
        ("zt", ["zh-TW", "zh-CN"], "zh-TW"),
        ("zh-Hant", ["zh-CN", "zh-HK"], "zh-HK"),
        ("zh-TW", ["zh-Hant", "zh-CN"], "zh-Hant"),
        ("zh-CN", ["zh-TW"], None),
        ("zh", ["zh-TW"], "zh-TW"),  # the bare language: the one Chinese served
        ("zh", ["zh-TW", "zh-CN"], "zh-CN"),
        ("en-GB", ["en"], "en"),
        ("en-GB", ["en-US"], "en-US"),
        ("en-GB", ["en-US", "en-GB"], "en-GB"),
        ("en", ["en-US", "en-GB"], None),
        ("pt-BR", ["pt"], "pt"),
        ("sr-Latn", ["sr"], None),
        ("EN", ["en"], "en"),
        ("x-custom", ["x-custom"], "x-custom"),
        ("klingon", ["en"], None),
    ],
)
def test_tags_match_with_their_script(asked, offered, found):
    assert match_language(asked, offered) == found


def test_scripts_given_or_implied():
    assert [language_script(c) for c in ("zh", "zh-CN", "zh-TW", "zh-Hant-CN", "zt")] == [
        "Hans", "Hans", "Hant", "Hant", "Hant",
    ]  # fmt: skip
    assert language_script("en-GB") is None and language_script("x-custom") is None


@pytest.fixture(scope="module")
def chinese(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chinese")
    return {
        "en-fr": tiny_model_folder(root / "en-fr", ("en", "fr"), seed=1),
        "en-zh-CN": tiny_model_folder(root / "en-zh-CN", ("en", "zh-CN"), seed=2),
        "en-zh-TW": tiny_model_folder(root / "en-zh-TW", ("en", "zh-TW"), seed=3),
    }


def test_traditional_chinese_is_not_answered_by_a_simplified_model(chinese):
    """A model trained on zh_CN answered ``target: "zh-TW"`` with a 200 and no note: the
    match dropped region and script. Traditional is now a 400 that names the Chinese served;
    the codes of Simplified, LibreTranslate's included, reach the model."""
    ref = Translator.load(chinese["en-zh-CN"]).translate(TEXT)
    registry = ModelRegistry.from_folders(
        [inspect_folder(chinese["en-fr"]), inspect_folder(chinese["en-zh-CN"])]
    )
    with live_app(create_app(registry, ServeConfig())) as s:
        for target in ("zh-TW", "zh-Hant", "zh-HK", "zt"):
            r = s.post("/translate", json={"q": TEXT, "source": "en", "target": target})
            assert r.status_code == 400, (target, r.text)
            said = r.json()["error"]
            assert said.startswith(f"target: '{target}' (Chinese in its Traditional script)")
            assert "the Chinese served is zh-CN (Simplified)" in said, said
        for target in ("zh", "zh-CN", "zh-Hans", "ZH-cn"):
            r = s.post("/translate", json={"q": TEXT, "source": "en-GB", "target": target})
            assert r.status_code == 200, (target, r.text)
            assert r.json() == {"translatedText": ref}
    # a server of one Simplified model refuses them as well
    tr = Translator.load(chinese["en-zh-CN"])
    with live_server(tr, source_lang="en", target_lang="zh-CN") as s:
        r = s.post("/translate", json={"q": TEXT, "target": "zh-TW"})
        assert r.status_code == 400 and "Traditional" in r.json()["error"], r.text
        assert "this model translates en to zh-CN" in r.json()["error"]
        r = s.post("/translate", json={"q": TEXT, "source": "en-US", "target": "zh-Hans"})
        assert r.status_code == 200 and r.json() == {"translatedText": ref}


def test_a_traditional_model_answers_libretranslates_zt(chinese):
    ref = Translator.load(chinese["en-zh-TW"]).translate(TEXT)
    registry = ModelRegistry.from_folders(
        [inspect_folder(chinese["en-zh-TW"]), inspect_folder(chinese["en-fr"])]
    )
    with live_app(create_app(registry, ServeConfig())) as s:
        for target in ("zt", "zh-Hant", "zh-TW", "zh-HK", "zh"):
            r = s.post("/translate", json={"q": TEXT, "source": "en", "target": target})
            assert r.status_code == 200, (target, r.text)
            assert r.json() == {"translatedText": ref}
        r = s.post("/translate", json={"q": TEXT, "source": "en", "target": "zh-CN"})
        assert r.status_code == 400 and "zh-TW (Traditional)" in r.json()["error"], r.text


# ---------------------------------------------------------------------------- failed loads
def test_a_model_that_fails_to_load_is_remembered(tmp_path, logs):
    """A model that failed to load was loaded (its weights hashed) again on every request,
    a log line each: a keyless client could keep the server hashing. The failure is now
    remembered until its files change or its back-off passes: N requests, one attempt."""
    good = tiny_model_folder(tmp_path / "en-fr", ("en", "fr"), seed=1)
    bad = tiny_model_folder(tmp_path / "en-de", ("en", "de"), seed=2)
    folders = [inspect_folder(good), inspect_folder(bad)]
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64] + bytes(64))  # damaged: its hash differs
    attempts = []

    def load(folder):
        attempts.append(folder.pair)
        return Translator.load(folder.path)

    registry = ModelRegistry.from_folders(folders, load)
    with live_app(create_app(registry, ServeConfig())) as s:
        for _ in range(12):
            r = s.post("/translate", json={"q": TEXT, "source": "en", "target": "de"})
            assert r.status_code == 503, r.text
            assert r.json()["error"].startswith("model: the en-de model could not be loaded")
            assert str(tmp_path) not in r.json()["error"]  # no path of the host's
            assert 1 <= int(r.headers["retry-after"]) <= 60
        assert attempts == ["en-de"]
        assert (
            s.post("/translate", json={"q": TEXT, "source": "en", "target": "fr"}).status_code
            == 200
        )
        failed = [x for x in logs.records if "loading en-de" in x.getMessage()]
        assert len(failed) == 1 and "not tried again for 60 s" in failed[0].getMessage()
        # its files change (the model is saved again): tried at once, and served
        shutil.rmtree(bad)
        tiny_model_folder(bad, ("en", "de"), seed=2)
        time.sleep(1.1)  # its files are looked at once a second at most
        r = s.post("/translate", json={"q": TEXT, "source": "en", "target": "de"})
        assert r.status_code == 200, r.text
        assert attempts == ["en-de", "en-fr", "en-de"]


def test_the_back_off_passes_then_doubles(tmp_path, monkeypatch):
    import asyncio

    from qkv.serve import registry as reg

    bad = tiny_model_folder(tmp_path / "en-de", ("en", "de"), seed=2)
    attempts = []

    def load(folder):
        attempts.append(1)
        raise OSError("disk gone")

    registry = ModelRegistry.from_folders([inspect_folder(bad)], load)
    registry.attach(lambda lane: None)  # type: ignore[arg-type,return-value]
    now = [1000.0]
    monkeypatch.setattr(reg.time, "monotonic", lambda: now[0])
    lane = registry.lanes[0]

    async def ask() -> float:
        with pytest.raises(reg.LoadError) as caught:
            await registry.acquire(lane)
        return caught.value.retry_after

    async def run() -> list[tuple[int, float]]:
        seen = []
        for step in (0, 30, 31, 60, 121, 240, 480):  # seconds later
            now[0] += step
            left = await ask()
            seen.append((len(attempts), left))
        return seen

    seen = asyncio.run(run())
    # tried at 0 (60 s), remembered at 30, tried at 61 (120 s), remembered at 121, tried at
    # 242 (240 s), at 482 (480 s) and at 962 (600 s, the most)
    assert [n for n, _ in seen] == [1, 1, 2, 2, 3, 4, 5]
    assert [round(r) for _, r in seen] == [60, 30, 120, 60, 240, 480, 600]


# ---------------------------------------------------------------------------- --models-dir
def test_models_dir_serves_its_models_and_skips_the_rest(tmp_path, caplog):
    """A prepared corpus in ``--models-dir`` stopped the server ("does not record the
    languages it translates"): it is not a model. Each subfolder that is not one is now skipped
    with a line saying what it is, and the server starts with the models there."""
    root = tmp_path / "models"
    tiny_model_folder(root / "en-fr", ("en", "fr"), seed=1)
    corpus = root / "corpus"
    corpus.mkdir()
    (corpus / "manifest.json").write_text(json.dumps({"type": "qkv.PreparedCorpus", "version": 1}))
    (corpus / "train.src.bin").write_bytes(b"\0" * 8)
    run = root / "run"
    run.mkdir()
    (run / "train.json").write_text("{}")
    (root / "photos").mkdir()
    tiny_model_folder(root / "unrecorded")
    (root / ".hidden").mkdir()
    (root / "notes.txt").write_text("a file")
    with caplog.at_level(logging.WARNING, logger="qkv.serve.registry"):
        found = models_in(root)
    assert [f.pair for f in found] == ["en-fr"]
    lines = sorted(r.getMessage().removeprefix("qkv serve: --models-dir: skipped ")
                   for r in caplog.records)  # fmt: skip
    assert lines == [
        f"{str(corpus)!r} is a prepared corpus (qkv prepare), not a model",
        f"{str(root / 'photos')!r} holds none of a model's files",
        f"{str(run)!r} is a training run with no model saved yet",
        f"{str(root / 'unrecorded')!r} does not record the languages it translates: train it "
        "with qkv train --src-lang --tgt-lang, or serve it alone (one --model-dir, with "
        "--source-lang and --target-lang)",
    ]
    # none there: one line naming each, nothing logged
    shutil.rmtree(root / "en-fr")
    caplog.clear()
    with pytest.raises(SettingError) as caught:
        models_in(root)
    assert caught.value.key == "models_dir" and not caplog.records
    said = str(caught.value)
    assert "holds no model folder" in said and "\n" not in said
    assert f"{str(corpus)!r} is a prepared corpus" in said


def test_qkv_serve_models_dir_starts_beside_a_corpus(tmp_path, capsys):
    """The CLI's side: the folders are read (not served) and the one model is."""
    from qkv.cli import build_parser
    from qkv.cli import serve as cli_serve

    root = tmp_path / "models"
    tiny_model_folder(root / "en-fr", ("en", "fr"), seed=1)
    corpus = root / "corpus"
    corpus.mkdir()
    (corpus / "manifest.json").write_text(json.dumps({"type": "qkv.PreparedCorpus", "version": 1}))
    args = build_parser().parse_args(["serve", "--models-dir", str(root)])
    registry = cli_serve._registry(args)
    assert [lane.pair for lane in registry.lanes] == ["en-fr"]


# ---------------------------------------------------------------------------- Host, /health
def test_a_host_header_is_parsed_strictly(live):
    """``Host: [localhost]evil.example`` was read as localhost: the bracket's inside was taken
    and the rest dropped. A bracket now holds an IPv6 address followed by nothing or a port,
    and a name is a DNS name or an IPv4 address."""
    port = live.url.rsplit(":", 1)[1]
    for host in ("[localhost]evil.example", "[::1]evil.example", "[::1]:80:80", "[::1",
                 "localhost:99999", "localhost:80:80", "local host", "localhost,evil.example",
                 "localhost/evil", "localhost@evil.example", "[evil.example]", "..",
                 "localhost..", f"127.0.0.1:{port}x"):  # fmt: skip
        r = live.get("/health", headers={"Host": host})
        assert r.status_code == 400, (host, r.text)
        said = r.json()["error"]
        assert said.startswith("Host: ") and "is not a host name" in said, said
    for host in (
        "localhost",
        f"localhost:{port}",
        "[::1]",
        "[::1]:8000",
        "127.0.0.1",
        "LOCALHOST.",
    ):
        assert live.get("/health", headers={"Host": host}).status_code == 200, host


def _paths(health: dict) -> list[str]:
    models = [health["model"]] if "model" in health else health["models"]
    return [str(m[k]) for m in models for k in ("model_dir", "path") if m.get(k)]


def test_health_shows_no_path_without_the_key(translator, model_dir, tmp_path):
    """``/health`` answered without a key, listing each model's absolute folder. Without the
    key it now names the folders only; a client with the key sees the paths."""
    with live_server(translator, model_dir=str(model_dir)) as s:
        shown = _paths(s.get("/health").json())
        assert shown and all(os.sep not in p for p in shown), shown
    with live_server(translator, model_dir=str(model_dir), api_key="sesame") as s:
        assert all(os.sep not in p for p in _paths(s.get("/health").json()))
        wrong = s.get("/health", headers={"X-API-Key": "wrong"}).json()
        assert all(os.sep not in p for p in _paths(wrong))
        keyed = s.get("/health", headers={"Authorization": "Bearer sesame"}).json()
        assert str(model_dir) in _paths(keyed)
    folder = tiny_model_folder(tmp_path / "en-fr", ("en", "fr"), seed=1)
    registry = ModelRegistry.from_folders([inspect_folder(folder)])
    with live_app(create_app(registry, ServeConfig())) as s:
        assert (
            s.post("/translate", json={"q": TEXT, "source": "en", "target": "fr"}).status_code
            == 200
        )
        (m,) = s.get("/health").json()["models"]
        assert (m["model_dir"], m["path"]) == ("en-fr", "en-fr")
        assert str(tmp_path) not in json.dumps(s.get("/health").json())
