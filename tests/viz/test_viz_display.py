"""What a notebook shows for qkv's objects: the embeddable viewer (as text), figures as PNG
whatever matplotlib's backend, a translator's card, a sentence's attention, masks and
``explain()`` as tables."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from qkv import functional as qf
from qkv import viz
from qkv.functional.masks import check_masks

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/_tiny_models.py

PAIRS = [("i lost .", "j'ai perdu ."), ("he's calm .", "il est calme ."), ("go .", "va !")]


def _kind(seed: int = 0) -> viz.AttentionKind:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(2, 3, 4, 5, generator=g).softmax(-1)
    return viz.AttentionKind("self", w, list("abcd"), list("vwxyz"))


def _style(fragment: str) -> str:
    (css,) = re.findall(r"<style>(.*?)</style>", fragment, re.S)
    return css


def _data(fragment: str) -> dict:
    m = re.search(r"data = (\{.*?\}), tries = 0;", fragment, re.S)
    assert m is not None
    return json.loads(m.group(1))


# ---------------------------------------------------------------------------- the fragment
def test_fragment_is_scoped_to_its_own_root():
    frag = viz.attention_fragment(_kind(), title="<b>t</b>")
    (root,) = re.findall(r'\sid="([^"]+)"', frag)  # one id: the root's
    assert frag.startswith(f'<div id="{root}" class="qkv-viewer">')
    selectors = [
        s.strip() for rule in re.findall(r"([^{}]+)\{", _style(frag)) for s in rule.split(",")
    ]
    assert len(selectors) > 20
    assert all(s == f"#{root}" or s.startswith(f"#{root} ") for s in selectors), selectors
    # no reliance on where the script is, no global name, nothing from the network
    assert "currentScript" not in frag and "window.qkvViewer" not in frag
    assert "document.getElementById(id)" in frag and json.dumps(root) in frag
    assert not re.search(r"https?://|//cdn|<link|src=|@import|fetch\(|XMLHttpRequest", frag)
    assert "<b>t</b>" not in frag and "&lt;b&gt;t&lt;/b&gt;" in frag


def test_each_fragment_has_its_own_id_and_its_own_data():
    a, b = viz.attention_fragment(_kind(0)), viz.attention_fragment(_kind(1))
    ida, idb = (re.search(r'id="([^"]+)"', f).group(1) for f in (a, b))
    assert ida != idb and ida.startswith("qkv-viewer-")
    da, db = _data(a), _data(b)
    assert da["kinds"][0]["layers"][0]["heads"] != db["kinds"][0]["layers"][0]["heads"]
    got = np.array(da["kinds"][0]["layers"][1]["heads"][2]).reshape(4, 5) / da["scale"]
    want = _kind(0).layers[1][2]
    np.testing.assert_allclose(got, want, atol=0.5e-4 + 1e-12)
    fixed = viz.attention_fragment(_kind(), viewer_id="mine")
    assert fixed.startswith('<div id="mine" class="qkv-viewer">')
    with pytest.raises(ValueError, match="viewer_id"):
        viz.attention_fragment(_kind(), viewer_id="a b")


def test_a_token_cannot_break_out_of_the_fragment():
    evil = ["</script><script>alert(1)</script>", "<b>"]
    frag = viz.attention_fragment(viz.AttentionKind("k", [np.eye(2)], evil, evil))
    assert frag.count("</script>") == 1  # its own script's end only
    assert _data(frag)["kinds"][0]["q"] == evil


def test_the_page_keeps_its_ids_and_its_global_viewer():
    page = viz.attention_html(_kind())
    for part in ("heat", "kind", "head", "qtokens", "readout"):
        assert f'id="{part}"' in page
    assert "window.qkvViewer = mount(document.body)" in page


def test_viewer_object_shows_a_new_viewer_each_time(tmp_path):
    v = viz.AttentionViewer(_kind(), title="t")
    one, two = v._repr_html_(), v._repr_html_()
    assert one != two and _data(one) == _data(two)
    assert repr(v) == "AttentionViewer('self' 2 layers 4x5)"
    page = v.save(tmp_path / "v.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "<title>t</title>" in page
    with pytest.raises(ValueError, match="max_cells"):
        viz.AttentionViewer(_kind(), max_cells=10)


# ---------------------------------------------------------------------------- figures
def test_figures_display_as_png_without_pyplot():
    fig = viz.show_heatmaps(torch.rand(2, 3, 4, 5), xlabel="keys", ylabel="queries")
    png = fig._repr_png_()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    img = Image.open(io.BytesIO(png))
    assert img.size[0] > 100 and img.size[1] > 100
    fig2 = viz.plot_attention(_kind())
    assert fig2._repr_png_().startswith(b"\x89PNG")
    from matplotlib.figure import Figure

    assert isinstance(fig, Figure) and isinstance(fig2, Figure)


def test_ipython_shows_the_figure_as_one_png():
    shell_mod = pytest.importorskip("IPython.core.interactiveshell")
    shell = shell_mod.InteractiveShell.instance()
    fig = viz.show_heatmaps(torch.rand(3, 3), xlabel="k", ylabel="q")
    data, _ = shell.display_formatter.format(fig)
    assert data["image/png"].startswith(b"\x89PNG") and "image/svg+xml" not in data
    att = viz.AttentionViewer(_kind())
    data, _ = shell.display_formatter.format(att)
    assert 'class="qkv-viewer"' in data["text/html"]


# ---------------------------------------------------------------------------- translate
@pytest.fixture(scope="module")
def translator():
    from _tiny_models import tiny_translator

    from qkv.translate import Translator

    model, src, tgt = tiny_translator(PAIRS, eos_boost=3.0)
    return Translator(model, src, tgt)


def test_translator_card(translator):
    card = translator._repr_html_()
    n = sum(p.numel() for p in translator.model.parameters())
    for text in (
        "engine",
        "<td",
        f"transformer, {n / 1e6:.2f} M parameters, 1+1 layers, width 32, 2 heads",
        "greedy",
        "not recorded",
        "cpu",
    ):
        assert text in card, text
    beam = translator.with_decoding(beam_size=4, length_penalty=0.6, no_repeat_ngram=3)
    assert "beam 4, length penalty 0.6, no 3-gram repeated" in beam._repr_html_()


def test_sentence_attention_shows_the_viewer(translator):
    att = translator.attention("he's calm .")
    html = att._repr_html_()
    assert 'class="qkv-viewer"' in html
    data = _data(html)
    assert [k["name"] for k in data["kinds"]] == [
        "encoder self-attention",
        "decoder self-attention",
        "cross-attention",
    ]
    assert data["kinds"][2]["k"] == att.src_tokens and data["kinds"][2]["q"] == att.tgt_tokens
    assert data["title"] == f"he's calm .  \u2192  {att.translation}"
    text = repr(att)
    assert "\n" not in text and "tensor" not in text
    assert text.startswith('SentenceAttention("he\'s calm ." -> ')


# ---------------------------------------------------------------------------- masks, explain
def _spec(B: int, Lq: int, Lk: int, **masks):
    return check_masks(
        B=B, H=1, Lq=Lq, Lk=Lk, device=torch.device("cpu"), batched_heads=False, **masks
    )


def test_mask_spec_table_and_grid():
    kpm = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.bool)
    spec = _spec(2, 5, 5, key_padding_mask=kpm, is_causal=True)
    text = repr(spec)
    assert text.startswith("MaskSpec(B=2, H=1, Lq=5, Lk=5; key_padding_mask: torch.bool")
    assert "is_causal" in text and "\n" not in text
    html = spec._repr_html_()
    merged = kpm[:, None, :] | torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert html.count("✕") == int(merged.sum())
    assert html.count("<caption") == 2
    lens = _spec(2, 3, 4, valid_lens=torch.tensor([2, 3]))
    assert "one length per sequence, keys from there on hidden: [[2], [3]]" in lens._repr_html_()
    add = _spec(1, 2, 2, attn_mask=torch.tensor([[0.0, -1.5], [float("-inf"), 0.0]]))
    html = add._repr_html_()
    assert "added to the scores" in html and "-1.5" in html and html.count("✕") == 1


def test_explain_table():
    q = torch.randn(2, 4, 5, 8)
    choice = qf.explain(q, q, q, need_weights=True)
    html = choice._repr_html_()
    assert f"<code>{choice.backend}</code>" in html
    for reason in choice.reasons:
        assert reason.replace(">", "&gt;").replace("<", "&lt;") in html
