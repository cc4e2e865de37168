"""qkv's viewer against bertviz, the tool learners know: for the same model and sentence, the
weights each of its views holds and draws are the weights bertviz's head view and model view
show.

bertviz is given the attention tensors of a qkv Transformer as it takes a Hugging Face model's
(``encoder_attention``, ``decoder_attention``, ``cross_attention``: per layer ``(1, H, L, L')``)
and returns its page (``html_action="return"``), whose script carries its data; qkv's viewer is
given the same sentence's :meth:`Translator.attention`.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from _viz_translation import sentence_attention

from qkv import viz

bertviz = pytest.importorskip("bertviz", reason="bertviz is in the compare extra (make test)")

#: bertviz's names of the three kinds -> qkv's
KINDS = {
    "Encoder": "encoder self-attention",
    "Decoder": "decoder self-attention",
    "Cross": "cross-attention",
}


@pytest.fixture(scope="module")
def att():
    return sentence_attention()


def _bertviz_data(view, att) -> dict:
    """The data bertviz's ``view`` puts into its page for ``att``'s three kinds."""
    shown = view(
        encoder_attention=[w[None] for w in att.encoder_self],
        decoder_attention=[w[None] for w in att.decoder_self],
        cross_attention=[w[None] for w in att.cross],
        encoder_tokens=att.src_tokens,
        decoder_tokens=att.tgt_input_tokens,
        html_action="return",
    )
    m = re.search(r"const params = (\{.*?\});", shown.data, re.S)
    assert m, "bertviz's page no longer carries its params as before"
    return json.loads(m.group(1))


def _qkv_kinds(att) -> dict[str, np.ndarray]:
    """Each kind's weights as qkv's viewer holds them: ``(layers, H, Lq, Lk)``."""
    payload = viz.attention_payload(att.kinds())
    out = {}
    for k in payload["kinds"]:
        Lq, Lk = len(k["q"]), len(k["k"])
        heads = [[np.array(h).reshape(Lq, Lk) for h in layer["heads"]] for layer in k["layers"]]
        out[k["name"]] = np.array(heads) / payload["scale"]
    return out


@pytest.mark.parametrize("view", ["head_view", "model_view"])
def test_every_weight_equals_bertvizs(att, view):
    theirs = _bertviz_data(getattr(bertviz, view), att)
    ours = _qkv_kinds(att)
    assert [d["name"] for d in theirs["attention"]] == list(KINDS)
    for d in theirs["attention"]:
        mine, other = ours[KINDS[d["name"]]], np.array(d["attn"])
        assert mine.shape == other.shape == (2, 4, len(d["left_text"]), len(d["right_text"]))
        # qkv embeds 4 decimals: half a unit of the last one apart at most
        assert np.abs(mine - other).max() <= 0.5e-4 + 1e-9, d["name"]
        assert np.abs(other.sum(-1) - 1).max() < 1e-5  # a real softmax on both sides
    # the same tokens (qkv labels cross-attention rows with what each step produces, bertviz
    # with what the decoder reads: the weights are the same rows)
    enc, dec, cross = theirs["attention"]
    assert enc["left_text"] == enc["right_text"] == att.src_tokens
    assert dec["left_text"] == att.tgt_input_tokens and cross["right_text"] == att.src_tokens


def test_what_the_head_and_model_views_draw_equals_bertvizs(att, browser, tmp_path):
    """In Chromium: the head view's lines (every head, every layer, each kind) carry bertviz's
    weights, and the model view draws one thumbnail per layer and head, as bertviz's."""
    theirs = _bertviz_data(bertviz.head_view, att)
    page = viz.save_attention_html(tmp_path / "compare.html", att.kinds(), title="compare")
    browser.open(page)
    names = browser.eval("qkvViewer.data.kinds.map(k => k.name)")
    for d in theirs["attention"]:
        kind = names.index(KINDS[d["name"]])
        other = np.array(d["attn"])
        for layer in range(other.shape[0]):
            browser.eval(f"qkvViewer.select({kind}, {layer}, -1); qkvViewer.setView('head')")
            drawn = browser.eval("qkvViewer.headView()")
            assert drawn["heads"] == [0, 1, 2, 3] and drawn["layer"] == layer
            for h in range(4):
                lines = np.array(drawn["weights"][str(h)]).reshape(other.shape[2:])
                assert np.abs(lines - other[layer, h]).max() <= 0.5e-4 + 1e-9
        browser.eval("qkvViewer.setView('model')")
        assert browser.eval("qkvViewer.modelView().thumbs") == other.shape[0] * other.shape[1]
