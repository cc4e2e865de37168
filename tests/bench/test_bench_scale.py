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
