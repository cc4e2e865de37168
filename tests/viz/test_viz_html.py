"""The HTML viewer as text: self-contained, data round-trips, nothing injectable."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest
import torch

from qkv import viz
from qkv.viz import AttentionKind, attention_html, save_attention_html


def _data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="qkv-data">(.*?)</script>', page, re.S)
    assert m is not None
    return json.loads(m.group(1))


def test_self_contained_no_network():
    page = attention_html(AttentionKind("k", torch.rand(1, 2, 3, 3).softmax(-1)))
    assert "<canvas" in page
    assert not re.search(r"https?://|//cdn|<link|src=|@import|fetch\(|XMLHttpRequest", page)


def test_weights_round_trip_as_scaled_integers(tmp_path):
    w = torch.rand(2, 3, 4, 6).softmax(-1)
    kind = AttentionKind("enc", w, list("abcd"), list("uvwxyz"))
    path = save_attention_html(tmp_path / "v.html", kind, decimals=4)
    data = _data(path.read_text(encoding="utf-8"))
    assert data["scale"] == 10_000
    (k,) = data["kinds"]
    assert k["q"] == list("abcd") and k["k"] == list("uvwxyz")
    assert len(k["layers"]) == 2 and len(k["layers"][1]["heads"]) == 3
    got = np.array(k["layers"][1]["heads"][2]).reshape(4, 6) / data["scale"]
    np.testing.assert_allclose(got, w[1, 2].numpy(), atol=0.5e-4 + 1e-9)
    mean = np.array(k["layers"][0]["mean"]).reshape(4, 6) / data["scale"]
    np.testing.assert_allclose(mean, w[0].mean(0).numpy(), atol=0.5e-4 + 1e-9)
    assert all(isinstance(v, int) for v in k["layers"][0]["heads"][0])


def test_tokens_and_title_cannot_break_out():
    evil = ["</script><script>alert(1)</script>", "<b>&amp;"]
    page = attention_html(AttentionKind("k", [np.eye(2)], evil, evil), title="<i>t</i>")
    assert page.count("</script>") == 2  # the data's and the code's own
    assert "<i>t</i>" not in page and "&lt;i&gt;t&lt;/i&gt;" in page
    assert _data(page)["kinds"][0]["q"] == evil  # JSON keeps the text exactly


def test_compact_at_500_tokens():
    w = torch.rand(1, 1, 500, 500).softmax(-1)  # weights ~ 1/500
    page = attention_html(AttentionKind("long", w), decimals=4)
    assert len(page) < 1_200_000  # about 3 characters a weight, the one head not repeated
    assert _data(page)["kinds"][0]["layers"][0]["mean"] is None


@pytest.mark.parametrize("decimals", [0, 7, 2.5, True])
def test_bad_decimals(decimals):
    with pytest.raises(ValueError, match="decimals"):
        attention_html(AttentionKind("k", [np.eye(2)]), decimals=decimals)


def test_bad_kinds():
    with pytest.raises(TypeError, match="kinds"):
        attention_html(np.eye(2))


def test_placeholders_in_the_title_are_not_substituted():
    # substituted one after another, a title holding "%%JS%%" pulled the script into <title>
    kind = AttentionKind("%%CSS%%", [np.eye(2)], ["%%DATA%%", "b"], ["%%TITLE%%", "d"])
    page = attention_html(kind, title="t %%JS%% %%DATA%% %%CSS%% %%TITLE%%")
    m = re.search(r"<title>(.*?)</title>", page, re.S)
    assert m is not None and m.group(1) == "t %%JS%% %%DATA%% %%CSS%% %%TITLE%%"
    assert page.count('"use strict"') == 1 and page.count("<style>") == 1
    data = _data(page)
    assert data["title"] == "t %%JS%% %%DATA%% %%CSS%% %%TITLE%%"
    assert data["kinds"][0]["name"] == "%%CSS%%" and data["kinds"][0]["q"][0] == "%%DATA%%"


def test_lone_surrogates_and_non_ascii_tokens_save(tmp_path):
    toks = ["\ud800", "café", "\U0001f600"]
    kind = AttentionKind("k \udfff", [np.eye(3)], toks, toks)
    path = save_attention_html(tmp_path / "s.html", kind, title="t \ud800")
    text = path.read_bytes().decode("utf-8")  # valid UTF-8
    data = _data(text)
    assert data["kinds"][0]["q"] == toks  # JSON escapes keep the text exactly
    assert "<title>t \ufffd</title>" in text


# ---------------------------------------------------------------------------- bounded pictures
def test_cells_count_the_heads_and_their_mean():
    kinds = [
        AttentionKind("a", torch.rand(2, 4, 3, 5).softmax(-1)),  # 2 layers, 4 heads + mean
        AttentionKind("b", [np.eye(3)]),  # one head: no mean
    ]
    assert viz.attention_cells(kinds) == 2 * 5 * 3 * 5 + 9
    page = attention_html(kinds)
    n = sum(
        len(m)
        for k in _data(page)["kinds"]
        for layer in k["layers"]
        for m in [*layer["heads"], *([layer["mean"]] if layer["mean"] else [])]
    )
    assert n == viz.attention_cells(kinds)


def test_a_page_over_the_cap_is_refused_saying_what_to_do(tmp_path):
    """Issue 17: a 2,000-word input gave a 176 MB page. Over MAX_CELLS weights the viewer is
    refused with a ValueError (one line for the CLI) and nothing is written."""
    n = 2900  # one head: n * n = 8,410,000 weights, just over the default cap
    assert n * n > viz.MAX_CELLS
    kind = AttentionKind("self-attention", [np.full((n, n), 1.0 / n)])
    path = tmp_path / "big.html"
    with pytest.raises(ValueError) as e:
        save_attention_html(path, kind)
    msg = str(e.value)
    assert msg.startswith("kinds: the viewer would embed 8,410,000 attention weights")
    assert "over the limit of 8,000,000 (max_cells)" in msg and ".png" in msg
    assert "\n" not in msg
    assert not path.exists()
    # the cap is the caller's to move
    small = AttentionKind("s", [np.eye(30)])
    with pytest.raises(ValueError, match="max_cells"):
        attention_html(small, max_cells=899)
    assert "<canvas" in attention_html(small, max_cells=900)
    with pytest.raises(ValueError, match="max_cells"):
        attention_html(small, max_cells=0)


def test_a_big_page_warns(caplog):
    kind = AttentionKind("s", [np.eye(40)])
    with caplog.at_level(logging.WARNING, logger="qkv.viz.html"):
        attention_html(kind, warn_cells=1600)
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="qkv.viz.html"):
        attention_html(kind, warn_cells=1599)
    (rec,) = caplog.records
    assert "embeds 1,600 weights" in rec.getMessage()
    caplog.clear()
    n = 1500  # over the default WARN_CELLS (2,000,000), under the cap
    assert viz.WARN_CELLS < n * n < viz.MAX_CELLS
    with caplog.at_level(logging.WARNING, logger="qkv.viz.html"):
        page = attention_html(AttentionKind("k", [np.full((n, n), 1.0 / n)]))
    assert len(caplog.records) == 1 and "<canvas" in page


# ---------------------------------------------------------------------------- views' data
def test_a_translation_opens_on_cross_attention_at_its_last_layer():
    w = torch.rand(3, 2, 4, 4).softmax(-1)
    kinds = viz.translation_attention(list("abcd"), list("wxyz"), encoder=w, decoder=w, cross=w)
    assert viz.attention_payload(kinds)["start"] == {"kind": 2, "layer": 2}
    alone = viz.AttentionKind("self-attention", w[:2])
    assert viz.attention_payload(alone)["start"] == {"kind": 0, "layer": 1}
    bahdanau = viz.translation_attention(list("ab"), list("xyz"), bahdanau=torch.rand(3, 2))
    assert viz.attention_payload(bahdanau)["start"] == {"kind": 0, "layer": 0}


def test_recorded_vectors_give_the_weights_and_travel_in_the_payload():
    from _viz_translation import sentence_attention

    att = sentence_attention()
    assert set(att.vectors) == {"encoder", "decoder", "cross"}
    for what, weights in (
        ("encoder", att.encoder_self),
        ("decoder", att.decoder_self),
        ("cross", att.cross),
    ):
        queries, keys, scale = att.vectors[what]
        assert scale == pytest.approx(1 / (32 / 4) ** 0.5)
        for q, k, w in zip(queries, keys, weights):
            scores = q @ k.transpose(-1, -2) * scale
            if what == "decoder":
                scores = scores.masked_fill(w == 0, float("-inf"))
            torch.testing.assert_close(scores.softmax(-1), w, atol=1e-6, rtol=0)
    payload = viz.attention_payload(att.kinds())
    cross = payload["kinds"][2]["vectors"]
    q = np.array(cross["q"][1][3]).reshape(len(att.tgt_tokens), 8)
    np.testing.assert_allclose(q, att.vectors["cross"][0][1][3].numpy(), atol=1e-6)
    assert payload["kinds"][1]["vectors"]["hidden"][:5] == [0, 1, 1, 1, 1]  # causal
    assert set(payload["kinds"][2]["vectors"]["hidden"]) == {0}


def test_vectors_are_checked_naming_the_argument():
    w = torch.rand(1, 2, 3, 4).softmax(-1)
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 4, 8)
    ok = viz.AttentionKind("self", w, queries=q, keys=k, scale=0.5)
    assert ok.queries[0].shape == (2, 3, 8) and ok.scale == 0.5
    with pytest.raises(ValueError, match="keys: expected it with the other vectors"):
        viz.AttentionKind("self", w, queries=q, scale=0.5)
    with pytest.raises(TypeError, match="scale: expected a number"):
        viz.AttentionKind("self", w, queries=q, keys=k)
    with pytest.raises(
        ValueError, match=r"keys\[0\]: expected finite vectors of shape \(2, 4, d\)"
    ):
        viz.AttentionKind("self", w, queries=q, keys=torch.randn(1, 2, 5, 8), scale=1.0)
    with pytest.raises(ValueError, match=r"keys\[0\]: expected the queries' width d = 8"):
        viz.AttentionKind("self", w, queries=q, keys=torch.randn(1, 2, 4, 6), scale=1.0)
    with pytest.raises(ValueError, match="scale: given without queries and keys"):
        viz.AttentionKind("self", w, scale=1.0)
    assert viz.attention_cells(ok) == 3 * 3 * 4  # the weights: the vectors are not counted
