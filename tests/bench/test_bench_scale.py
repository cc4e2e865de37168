"""benchmarks/scale.py: its corpora are unique joined real pairs, and README quotes its JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.scale import write_corpus  # noqa: E402


def test_joined_pairs_are_unique_and_made_of_real_pairs(tmp_path):
    pairs = [(f"s{i}.", f"t{i}.") for i in range(7)]
    path = tmp_path / "c.tsv"
    write_corpus(path, 7 * 6, pairs)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(set(lines)) == 42
    for line in lines:
        src, tgt = line.split("\t")
        a, b = src.split(" ")
        assert tgt == f"t{a[1:-1]}. t{b[1:-1]}." and a != b
    with pytest.raises(ValueError, match="n: at most 42 unique joined pairs, got 43"):
        write_corpus(path, 43, pairs)


def test_readme_quotes_the_scale_figures():
    path = ROOT / "benchmarks" / "results" / "scale.json"
    if not path.is_file():
        pytest.skip("benchmarks/results/scale.json not measured yet")
    record = json.loads(path.read_text(encoding="utf-8"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Measured figures") :]
    rows = section.splitlines()
    for r in record["results"]:
        n = f"{r['pairs']:,} pairs"
        if r.get("tiled_from"):
            n += f" (the {r['tiled_from']:,}-pair folder's arrays x{r['pairs'] // r['tiled_from']}"
        row = next((x for x in rows if x.startswith(f"| {n}")), None)
        assert row is not None, f"README has no row for {n}"
        if "prepare" in r:
            assert f"{r['prepare']['wall_s']:.0f} s" in row, (n, "prepare")
        assert f"{r['train']['peak_rss_gib']:.2f} GiB" in row, (n, "train RSS")
        assert f"{r['train']['first_update_s']:.1f} s" in row, (n, "first update")
        if "train_file" in r:
            assert f"{r['train_file']['peak_rss_gib']:.2f} GiB" in row, (n, "file RSS")
        if "torchrun_2" in r:
            assert f"{r['torchrun_2']['tree_peak_rss_gib']:.2f}" in row, (n, "torchrun")


def test_ddp_floor_trains_the_run_model_on_random_batches(tmp_path, capsys):
    from benchmarks.ddp_floor import main

    model = tmp_path / "model.json"
    config = {"kind": "transformer", "src_vocab_size": 37, "tgt_vocab_size": 37,
              "num_hiddens": 16, "ffn_num_hiddens": 24, "num_heads": 2, "num_enc_layers": 1,
              "num_dec_layers": 1, "dropout": 0.0, "max_len": 64}  # fmt: skip
    model.write_text(json.dumps({"config": config}))
    main(["--model", str(model), "--max-tokens", "60", "--steps", "3", "--threads", "1",
          "--length", "7"])  # fmt: skip
    lines = capsys.readouterr().err.splitlines()
    assert [x.split(" loss ")[0] for x in lines] == ["1/3", "2/3", "3/3"]
    losses = [float(x.split(" loss ")[1]) for x in lines]
    assert all(0 < v < 10 for v in losses)  # a finite cross-entropy near log(37) = 3.6


def test_summary_sets_qkv_torchrun_beside_its_floor():
    from benchmarks.scale import summarize

    one = {"tree_peak_rss_gib": 1.0, "tree_peak_pss_gib": 0.9, "peak_rss_gib": 1.0,
           "first_update_s": 1.0}  # fmt: skip
    two = {"tree_peak_rss_gib": 1.8, "tree_peak_pss_gib": 1.5}
    floor = {"2_vs_1_rss": 1.99, "2_vs_1_pss": 1.82}
    r = {"pairs": 100_000, "train": one, "torchrun_2": two, "floor": floor}
    out = summarize({"results": [r]})
    assert out["torchrun_2_vs_1_rss"] == 1.8 and out["torchrun_2_vs_1_pss"] == round(1.5 / 0.9, 3)
    assert out["floor_2_vs_1_rss"] == 1.99 and out["floor_2_vs_1_pss"] == 1.82
