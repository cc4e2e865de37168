"""The HTML viewer as text: self-contained, data round-trips, nothing injectable."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

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
