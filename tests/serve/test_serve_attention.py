"""POST /attention: the translation and its weights, the very ones Translator.attention gives,
in the viewer's data format; bounded like the viewer's file."""

from __future__ import annotations

import numpy as np
import pytest
from _serve_helpers import SOURCES, live_server


def matrix(layer: dict, head: int | None, Lq: int, Lk: int, scale: int) -> np.ndarray:
    flat = layer["heads"][head] if head is not None else layer["mean"]
    return np.asarray(flat, dtype=np.float64).reshape(Lq, Lk) / scale


def test_the_weights_are_the_models(live, translator):
    text = SOURCES[4]
    r = live.post("/attention", json={"q": text, "source": "en", "target": "fr"})
    assert r.status_code == 200, r.text
    body = r.json()
    ref = translator.attention(text)
    assert body["translatedText"] == ref.translation == translator.translate(text)
    assert body["srcTokens"] == ref.src_tokens and body["tgtTokens"] == ref.tgt_tokens
    data = body["attention"]
    assert data["scale"] == 10_000
    assert data["title"] == f"{text}  \u2192  {ref.translation}"
    kinds = {k["name"]: k for k in data["kinds"]}
    assert list(kinds) == ["encoder self-attention", "decoder self-attention", "cross-attention"]
    S, T = len(ref.src_tokens), len(ref.tgt_tokens)
    cross = kinds["cross-attention"]
    assert cross["q"] == ref.tgt_tokens and cross["k"] == ref.src_tokens
    for name, weights, (Lq, Lk) in (
        ("cross-attention", ref.cross, (T, S)),
        ("encoder self-attention", ref.encoder_self, (S, S)),
        ("decoder self-attention", ref.decoder_self, (T, T)),
    ):
        k = kinds[name]
        assert len(k["layers"]) == len(weights)
        for layer, w in zip(k["layers"], weights):  # w: (H, Lq, Lk)
            assert len(layer["heads"]) == w.shape[0] == 2
            for h in range(w.shape[0]):
                np.testing.assert_allclose(
                    matrix(layer, h, Lq, Lk, 10_000), w[h].double().numpy(), atol=0.5e-4 + 1e-9
                )
            np.testing.assert_allclose(
                matrix(layer, None, Lq, Lk, 10_000), w.mean(0).double().numpy(), atol=0.5e-4 + 1e-9
            )
    # fewer decimals when asked
    r = live.post("/attention", json={"q": text, "decimals": 2})
    assert r.json()["attention"]["scale"] == 100


def test_a_chosen_alternative_is_that_translation(live, translator):
    text = SOURCES[6]
    listed = live.post("/translate", json={"q": text, "alternatives": 2}).json()
    texts = [listed["translatedText"], *listed["alternatives"]]
    for choice, want in enumerate(texts):
        r = live.post("/attention", json={"q": text, "alternatives": 2, "choice": choice})
        assert r.status_code == 200, r.text
        assert r.json()["translatedText"] == want
        assert r.json()["choice"] == choice
    hyps = translator.generate([text], beam_size=3, n_best=3)[0]
    ids = hyps[1][0]
    ref = translator.attention(text, ids=ids)
    got = live.post("/attention", json={"q": text, "alternatives": 2, "choice": 1}).json()
    T, S = len(ref.tgt_tokens), len(ref.src_tokens)
    cross = got["attention"]["kinds"][2]["layers"][0]
    np.testing.assert_allclose(
        matrix(cross, 0, T, S, 10_000), ref.cross[0][0].double().numpy(), atol=0.5e-4 + 1e-9
    )


def test_a_blank_sentence(live):
    r = live.post("/attention", json={"q": "   "})
    assert r.status_code == 200, r.text
    assert r.json()["translatedText"] == ""


@pytest.mark.parametrize("long", [False, True])
def test_an_attention_over_the_cap_is_413(translator, long):
    """The viewer's bound applies to /attention: refused with a clear error, before decoding
    when the encoder's part alone is over it, else once the translation is known but before
    the weights are computed (they were computed first: 7x the cap cost 3 s and 720 MB)."""
    text = " ".join(SOURCES) if long else SOURCES[4]
    ref = translator.attention(SOURCES[4])
    S, T = len(ref.src_tokens), len(ref.tgt_tokens)
    cells = 3 * S * S + 3 * T * T + 3 * T * S  # 1+1 layers, 2 heads and their mean
    with live_server(translator, max_attention_cells=cells - 1) as s:
        calls = []
        real = s.lane.translator.attention
        s.lane.translator.attention = lambda *a, **k: calls.append(a) or real(*a, **k)
        try:
            r = s.post("/attention", json={"q": text})
        finally:
            del s.lane.translator.attention
        assert r.status_code == 413, r.text
        err = r.json()["error"]
        assert err.startswith("q: its attention holds ") and "--max-attention-cells" in err
        assert f"{cells - 1:,}" in err
        if not long:  # the weights counted exactly, before computing them
            assert err.startswith(f"q: its attention holds {cells:,} weights"), err
        assert calls == []
    with live_server(translator, max_attention_cells=cells) as s:
        assert s.post("/attention", json={"q": SOURCES[4]}).status_code == 200


def test_the_viewer_file_of_qkv_translate_has_the_bound(model_dir, tmp_path, capsys):
    """Issue 17: `qkv translate --attention x.html` on a 2,000-word input wrote a 176 MB page;
    now a one-line error, and no file."""
    from qkv.cli import main

    words = " ".join(SOURCES).split()
    text = " ".join((words * 20)[:2000])
    out = tmp_path / "long.html"
    args = ["--attention", str(out), "--split", "none", text]  # one sentence of 2,000 words
    rc = main(["translate", "--model-dir", str(model_dir), *args])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("qkv translate: error: --attention: the viewer would embed ")
    assert "max_cells" in err and err.count("\n") == 1
    assert not out.exists()
