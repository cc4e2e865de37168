"""The docs run: every Python block of README.md and docs/*.md, each on its own.

Each ```python block is executed in a fresh namespace, in a fresh temporary working directory,
exactly as written: a block that needs an import, an input or a file makes it itself. A block
preceded by the line ``<!-- slow -->`` is marked ``slow``. Shell blocks are not run.

The measured figures README quotes from a benchmark's JSON in ``benchmarks/results/`` are checked
against it, so the two cannot drift apart.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SLOW_MARK = "<!-- slow -->"
#: the languages a fenced block may be written in; only ``python`` is executed
KNOWN_LANGUAGES = {"python", "bash", "console", "toml", "json", "text", ""}
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    index: int  # 1-based among the file's blocks of the same language
    line: int  # 1-based line of the first line of code
    language: str
    code: str
    slow: bool

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.index}"


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced code block of a Markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    counts: dict[str, int] = {}
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        language, start = m.group(1), i + 1
        end = start
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        if end == len(lines):
            raise AssertionError(f"{path.name}:{i + 1}: a code block is never closed")
        before = next((s.strip() for s in reversed(lines[:i]) if s.strip()), "")
        counts[language] = counts.get(language, 0) + 1
        code = "\n".join(lines[start:end]) + "\n"
        blocks.append(Block(path, counts[language], start + 1, language, code, before == SLOW_MARK))
        i = end + 1
    return blocks


ALL_BLOCKS = [b for path in DOCS for b in fenced_blocks(path)]
PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.language == "python"]


def _param(block: Block):
    marks = [pytest.mark.slow] if block.slow else []
    return pytest.param(block, id=block.id, marks=marks)


@pytest.fixture
def one_thread():
    """The blocks are small: one torch thread runs them as fast as two, and far faster when
    the machine is busy (two threads then spend their time waiting for each other)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("block", [_param(b) for b in PYTHON_BLOCKS])
def test_python_block_runs(block: Block, tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)
    # padded with blank lines so that a traceback gives the line number in the Markdown file
    source = "\n" * (block.line - 1) + block.code
    namespace = {"__name__": "__docs__"}
    exec(compile(source, str(block.path), "exec"), namespace)


def test_every_doc_has_its_blocks_collected():
    assert len(PYTHON_BLOCKS) >= 14
    for name in ("README.md", "docs/models.md", "docs/data.md", "docs/train.md", "docs/viz.md"):
        assert any(b.id.startswith(name + ":") for b in PYTHON_BLOCKS), name


def test_blocks_are_in_known_languages_and_slow_marks_sit_on_python_blocks():
    for b in ALL_BLOCKS:
        assert b.language in KNOWN_LANGUAGES, f"{b.id} (line {b.line}): ```{b.language}"
        assert not (b.slow and b.language != "python"), f"{b.id}: {SLOW_MARK} on a non-Python block"
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            if line.strip() == SLOW_MARK:
                nxt = next((s for s in lines[n + 1 :] if s.strip()), "")
                assert nxt.startswith("```python"), f"{path.name}:{n + 1}: stray {SLOW_MARK}"


def test_the_fast_blocks_are_most_of_them():
    slow = [b.id for b in PYTHON_BLOCKS if b.slow]
    assert len(slow) <= 2, slow


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (lower case, punctuation dropped)."""
    anchors, in_code = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        in_code ^= line.startswith("```")
        if not in_code and (m := re.match(r"#{1,6} (.+)", line)):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


def test_relative_links_point_to_files_and_headings_that_exist():
    link = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")
    for path in DOCS:
        for target, anchor in link.findall(path.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            dest = path.parent / target if target else path
            assert dest.exists(), f"{path.name}: broken link {target}"
            if anchor and dest.suffix == ".md":
                assert anchor in _anchors(dest), f"{path.name}: no heading #{anchor} in {target}"


# ------------------------------------------------------------------------- measured figures


def _figures_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("## Measured figures")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_readme_quotes_the_real_corpus_figures_of_the_json():
    section = _figures_section()
    real = json.loads((ROOT / "benchmarks/results/real.json").read_text(encoding="utf-8"))
    book, qkv10, qkv30 = (real["systems"][k] for k in ("book", "qkv", "qkv-30min"))
    rows = {
        "the book's d2l Transformer": book,
        "`qkv train --data train.tsv --max-minutes 10`": qkv10,
        "`qkv train --data train.tsv --max-minutes 30`": qkv30,
    }
    for label, run in rows.items():
        row = next((r for r in section.splitlines() if r.startswith(f"| {label}")), None)
        assert row is not None, f"no row for {label} in README's measured figures"
        cells = [c.strip().strip("*") for c in row.strip("|").split("|")]
        assert cells[2] == f"{run['updates']:,}", (label, cells)
        assert cells[3] == f"{run['bleu']:.2f}", (label, cells)
        assert cells[4] == f"{run['chrf']:.2f}", (label, cells)
        assert cells[5].startswith(f"{run['degenerate']:,}" if run["degenerate"] else "0"), cells
    gain = qkv10["bleu"] - book["bleu"]
    assert f"+{gain:.2f} BLEU" in section

    confirm = json.loads(
        (ROOT / "benchmarks/results/real-qkv-confirm.json").read_text(encoding="utf-8")
    )["systems"]["qkv"]
    assert f"{confirm['bleu']:.2f} BLEU, chrF {confirm['chrf']:.2f}" in section


OTHER_PAIRS = {"en-de": "English→German", "en-zh": "English→Chinese", "fr-en": "French→English"}


def test_readme_quotes_the_other_pairs_of_the_json():
    """One row per pair of ``benchmarks.real --pair``: its figures, the BLEU tokenizer its target
    takes (``zh`` for Chinese) and the command that measured it."""
    section = _figures_section()
    for pair, label in OTHER_PAIRS.items():
        path = ROOT / f"benchmarks/results/real-{pair}.json"
        real = json.loads(path.read_text(encoding="utf-8"))
        assert real["pair"] == pair, path
        run = real["systems"]["qkv"]
        row = next((r for r in section.splitlines() if r.startswith(f"| {label}")), None)
        assert row is not None, f"no row for {label} in README's measured figures"
        cells = [c.strip().strip("*") for c in row.strip("|").split("|")]
        assert f"--pair {pair}" in cells[1], (label, cells)
        assert cells[2] == f"{run['updates']:,}", (label, cells)
        assert cells[3] == f"{run['bleu']:.2f}", (label, cells)
        assert cells[4] == f"{run['chrf']:.2f}", (label, cells)
        assert cells[5] == f"{run['degenerate']:,}", (label, cells)
        tok = re.search(r"tok:([\w-]+)", run["signature"]).group(1)
        assert cells[6].startswith(f"`{tok}`"), (label, cells)
        if "bleu_13a" in run:  # what 13a would have said of the same output
            assert f"{run['bleu_13a']:.2f}" in cells[6], (label, cells)


def test_each_real_corpus_figure_is_quoted_once():
    real = json.loads((ROOT / "benchmarks/results/real.json").read_text(encoding="utf-8"))
    figures = [f"{s['bleu']:.2f}" for s in real["systems"].values()]
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for fig in figures:
            n = len(re.findall(rf"(?<![\d.]){re.escape(fig)}(?![\d])", text))
            expected = 1 if path.name == "README.md" else 0
            assert n == expected, f"{path.name} quotes {fig} {n} times (README's table only)"


def test_docs_other_than_readme_quote_no_measured_ratio():
    """docs/*.md link to README's measured figures instead of repeating them (a target such as
    ``>= 5x`` is not a measurement)."""
    ratio = re.compile(r"(?<!>= )(?<![\d.])\d+\.\d+x\b")
    for path in DOCS[1:]:
        found = ratio.findall(path.read_text(encoding="utf-8"))
        assert not found, f"{path.name} quotes {found}: link to README's measured figures"


def test_no_development_notes_in_the_docs():
    stale = re.compile(r"\bissue \d+|\bTODO\b|\bFIXME\b|once .{0,80}\bhas landed", re.I | re.S)
    for path in DOCS:
        found = stale.findall(path.read_text(encoding="utf-8"))
        assert not found, f"{path.name}: {found}"


def test_readme_rows_quote_the_json_they_name():
    """A figures row that names ``benchmarks/results/NAME.json`` quotes that file's numbers:
    every ratio of a side-by-side benchmark (``benchmarks/runner.py``'s format), the total of
    the data pipeline's stages."""
    section = _figures_section()
    named = sorted(set(re.findall(r"benchmarks/results/([\w-]+)\.json", section)))
    assert {"mha", "seq2seq", "train", "data", "demo"} <= set(named), named
    for name in named:
        data = json.loads((ROOT / f"benchmarks/results/{name}.json").read_text(encoding="utf-8"))
        if name == "data":
            assert f"| {data['total_s']:.2f} s |" in section, "data.json's total"
            continue
        if name in ("demo", "demo-busy"):
            quoted = f"test BLEU {data['test_bleu']:.2f}, chrF {data['test_chrf']:.2f}"
            assert quoted in section, f"{name}.json: {quoted}"
            continue
        results = data.get("results")
        if not isinstance(results, list) or not results or "ratio" not in results[0]:
            continue  # another format (real-corpus and translation tables have their own test)
        for r in results:
            if r.get("target") is None and name == "mha":
                continue  # the ragged rows are quoted as a pair
            assert f"{r['ratio']:.2f}x" in section, f"{name}.json: {r['name']} {r['ratio']:.2f}x"


def test_readme_threads_row_quotes_auto_against_the_best_and_the_default():
    """The threads row quotes benchmarks/results/threads.json: qkv's automatic choice against
    the best policy of every row, and against the default on a quiet machine (issue 31)."""
    section = _figures_section()
    data = json.loads((ROOT / "benchmarks/results/threads.json").read_text(encoding="utf-8"))
    (row,) = [line for line in section.splitlines() if "benchmarks/results/threads.json" in line]
    assert not data["quick"] and "leaves it to you" not in row
    for r in data["rows"]:
        what = f"threads.json: {r['workload']} beside {r['busy']} busy"
        assert f"{r['auto_over_best']:.2f}x" in row, f"{what}: auto / best"
        if r["busy"] == 0:
            assert f"{r['auto_over_default']:.2f}x" in row, f"{what}: auto / default"


def serve_rows(record: dict) -> list[str]:
    """README's serving table, row by row, as benchmarks/results/serve.json gives it."""
    by = {(r["server"], r["clients"]): r for r in record["results"]}
    rows = []
    for c in sorted({r["clients"] for r in record["results"]}):
        b, n = by[("batching", c)], by[("no batching", c)]

        def lat(r: dict) -> str:
            return f"{r['p50_s']:.3f} / {r['p95_s']:.3f} / {r['p99_s']:.3f}"

        rows.append(
            f"| {c} | {b['sentences_per_s']:.1f} | {lat(b)} | {b['mean_batch']:.1f} | "
            f"{n['sentences_per_s']:.1f} | {lat(n)} | {b['errors']} / {n['errors']} |"
        )
    return rows


def test_readme_quotes_the_serving_figures_of_the_json():
    record = json.loads((ROOT / "benchmarks/results/serve.json").read_text(encoding="utf-8"))
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Serve it: `qkv serve`") :]
    section = section[: section.index("\n### ")]
    for row in serve_rows(record):
        assert row in section, row
    v = record["verdict"]
    assert f"**{v['throughput_ratio']:.2f}x**" in section
    assert f"p99 {v['p99_s']:.3f} s" in section
    soak = record["soak"]
    assert f"{soak['sentences']:,} sentences" in section
    assert f"{soak['rss_growth']:+.1%}" in section


def test_readme_long_sequence_table_quotes_long_json():
    """Each row of README's long-sequence table quotes benchmarks/results/long.json: the qkv
    time and peak of every case, the peer's where it has one, and the 4k additive speedup."""
    record = json.loads((ROOT / "benchmarks/results/long.json").read_text(encoding="utf-8"))
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Long sequences") :]
    section = section[: section.index("\n## ")]
    assert "benchmarks/results/long.json" in section
    assert f"load {record['load_average_at_start']:.2f}" in section
    for row in record["rows"]:
        assert f"{row['qkv_s']:.2f} s, {row['qkv_peak_mib']:.0f} MiB" in section, row["case"]
        if row["peer_s"] is not None:
            assert f"{row['peer_s']:.2f} s, {row['peer_peak_mib']:.0f} MiB" in section, row["case"]
            if "min_speedup" in row["targets"]:
                assert f"{row['peer_s'] / row['qkv_s']:.2f}x faster" in section, row["case"]


def test_readme_translation_rows_quote_translate_json():
    """README's translation-speed rows quote benchmarks/results/translate.json: every ratio it
    records (greedy and beam 4) and the load it was run at."""
    record = json.loads((ROOT / "benchmarks/results/translate.json").read_text(encoding="utf-8"))
    section = _figures_section()
    rows = [
        line for line in section.splitlines() if "translation speed" in line or "beam 4" in line
    ]
    assert len(rows) >= 2, "the greedy and beam 4 rows"
    assert f"load {record['load_average_at_start'][0]:.2f} at the start" in rows[0]
    for search, row in zip(("greedy", "beam 4"), rows):
        for r in record["results"][search]["ratios"]:
            assert f"{r['ratio']:.2f}x" in row, f"{search}: {r['case']} {r['ratio']:.2f}x"
    for mode, block in record["results"].items():  # every mode (threads, batching) has its row
        if mode in ("greedy", "beam 4"):
            continue
        (row,) = [line for line in rows if f"translation speed, {mode}:" in line]
        for r in block["ratios"]:
            assert f"{r['ratio']:.2f}x" in row, f"{mode}: {r['case']} {r['ratio']:.2f}x"
