"""The docs run: every Python block of README.md and docs/*.md (and of the Chinese pages,
README.zh-CN.md and docs/zh/*.md), each on its own.

Each ```python block is executed in a fresh namespace, in a fresh temporary working directory,
exactly as written: a block that needs an import, an input or a file makes it itself. A block
preceded by the line ``<!-- slow -->`` is marked ``slow``. Shell blocks are not run.

The measured figures README quotes from a benchmark's JSON in ``benchmarks/results/`` are checked
against it, so the two cannot drift apart; so are the demo's time and BLEU wherever a page or a
notebook quotes them, in both languages. The documentation site's own build (tools/docs_site.py,
its strict build run by `make test`) is checked here in its parts: links, notebook pages.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "README.zh-CN.md",
    *sorted((ROOT / "docs" / "zh").glob("*.md")),
]
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
            assert dest.exists(), f"{path.relative_to(ROOT)}: broken link {target}"
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


PLANNED_RUNS = {
    "real-en-fr-10.json": "English→French, 10 min",
    "real-en-de-10.json": "English→German, 10 min",
    "real-en-de-3-busy.json": "English→German, 3 min beside two busy processes",
    "real-en-fr-30.json": "English→French, 30 min",
}


def test_readme_quotes_the_runs_of_todays_defaults_from_their_json():
    """The rows of ``benchmarks.real`` with the preset sized from measured speed and the
    verdict: the preset and speed its log printed, its figures, and its exit status."""
    section = _figures_section()
    for name, label in PLANNED_RUNS.items():
        real = json.loads((ROOT / "benchmarks/results" / name).read_text(encoding="utf-8"))
        # qkv's run, or its longer one (--systems qkv-long --long-minutes M: "qkv-30min")
        key, run = next((k, v) for k, v in real["systems"].items() if k.startswith("qkv"))
        row = next((r for r in section.splitlines() if r.startswith(f"| {label} |")), None)
        assert row is not None, f"no row for {label} in README's measured figures"
        cells = [c.strip().strip("*") for c in row.strip("|").split("|")]
        command = cells[1]
        assert f"--pair {real['pair']}" in command, (label, cells)
        if key != "qkv":
            assert f"--systems qkv-long --long-minutes {key[4:-3]}" in command, (label, cells)
        elif real["minutes"] != 10:
            assert f"--minutes {real['minutes']:g}" in command, (label, cells)
        assert (f"--busy {real['busy_processes']}" in command) == bool(real["busy_processes"])
        tier, speed, bf16 = re.match(
            r"preset ([\w-]+): .*measured ([\d,]+) tokens/s on \d+ threads?( in bfloat16)?",
            run["preset"],
        ).groups()
        assert cells[2] == f"{tier} ({speed} tokens/s{bf16 or ''})", (label, cells)
        assert cells[3] == f"{run['updates']:,}", (label, cells)
        assert cells[4] == f"{run['bleu']:.2f}", (label, cells)
        assert cells[5] == f"{run['chrf']:.2f}", (label, cells)
        assert cells[6].startswith(f"{run['degenerate']:,}"), (label, cells)
        assert cells[7].endswith(f"({run['exit_status']})"), (label, cells)


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


# ------------------------------------------------------------------------- the demo's figures
#: where a time or a BLEU of `make demo` may be quoted: the pages of both languages and the
#: notebooks' explanations
DEMO_JSONS = ("demo.json", "demo-busy.json")
_MINUTES = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*(?:[-–]\s*(\d+)\s*)?(?:min\b|minutes|分钟)")
_BLEU = re.compile(r"BLEU\s*(?:above\s*)?(\d+(?:\.\d+)?)(\s*以上)?")


def _split(text: str) -> list[str]:
    """Paragraphs, a table's rows each on its own."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        rows = [r for r in para.splitlines() if r.startswith("|")]
        out.extend(rows if rows else [para])
    return out


def _paragraphs() -> list[tuple[str, str]]:
    """``(where, text)`` for every paragraph (or table row) of the docs and of the notebooks'
    Markdown cells."""
    found = []
    for path in DOCS:
        for n, para in enumerate(_split(path.read_text(encoding="utf-8"))):
            found.append((f"{path.relative_to(ROOT)} paragraph {n}", para))
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for i, cell in enumerate(cells):
            if cell["cell_type"] == "markdown":
                for para in _split("".join(cell["source"])):
                    found.append((f"{path.name} cell {i}", para))
    return found


def test_the_demos_time_and_bleu_come_from_its_json_in_both_languages():
    """A paragraph that speaks of `make demo` (or `qkv demo` / the demo translator) and quotes a
    measured time (a figure with decimals: a whole number of minutes is a budget, like its
    7 minutes) or a BLEU names the JSON the figure comes from, and the figure is that JSON's.
    No ranges ("3-5 minutes"), no round claims ("BLEU above 80")."""
    runs = {
        name: json.loads((ROOT / "benchmarks/results" / name).read_text(encoding="utf-8"))
        for name in DEMO_JSONS
    }
    minutes = {f"{r['wall_minutes']:.1f}" for r in runs.values()} | {
        f"{r['train_minutes']:.2f}" for r in runs.values()
    }
    bleus = {f"{r['test_bleu']:.2f}" for r in runs.values()}
    checked = 0
    for where, para in _paragraphs():
        if not re.search(r"make demo|qkv demo\b|demo translate", para):
            continue
        for low, high in [(m.group(1), m.group(2)) for m in _MINUTES.finditer(para)]:
            assert high is None, f"{where}: a range of minutes ({low}-{high}): quote demo.json"
            if "." in low:
                checked += 1
                assert low in minutes, f"{where}: {low} min is not in {DEMO_JSONS}"
                assert any(j in para for j in DEMO_JSONS), f"{where}: {low} min names no JSON"
        for figure, above in [(m.group(1), m.group(2)) for m in _BLEU.finditer(para)]:
            if re.search(rf">=\s*{re.escape(figure)}", para):
                continue  # a target, not a measurement
            checked += 1
            assert not above and figure in bleus, f"{where}: BLEU {figure} is not in {DEMO_JSONS}"
            assert any(j in para for j in DEMO_JSONS), f"{where}: BLEU {figure} names no JSON"
    # README (en), README.zh-CN, docs/seeds.md and notebook 004 quote the demo
    assert checked >= 8, checked


# ------------------------------------------------------------------------- the site's parts
def _docs_site():
    import importlib
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("tools.docs_site")


def test_a_notebook_page_shows_text_figures_and_html_and_no_ansi():
    site = _docs_site()
    png = "iVBORw0KGgo="  # the PNG signature, base64
    nb = {
        "cells": [
            {"cell_type": "markdown", "source": ["# 9 · a notebook\n", "text"]},
            {
                "cell_type": "code",
                "source": ["print('hi')"],
                "outputs": [
                    {"output_type": "stream", "name": "stdout", "text": "hi\n```\n"},
                    {"output_type": "stream", "name": "stderr", "text": "\x1b[31mwarn\x1b[0m"},
                    {"output_type": "display_data", "data": {"image/png": png}},
                    {
                        "output_type": "display_data",
                        "data": {"text/html": "<b>x</b><script>1<2</script>"},
                    },
                ],
            },
        ]
    }
    text, images = site.notebook_markdown(nb, "009_x")
    assert text.startswith("# 9 · a notebook\n") and "```python\nprint('hi')\n```" in text
    assert "````text\nhi\n```\n````" in text  # a fence longer than any in the output
    assert "warn" in text and "\x1b" not in text and "qkv-nb-stderr" in text
    assert (
        images == {"009_x/output-1.png": b"\x89PNG\r\n\x1a\n"} and "](009_x/output-1.png)" in text
    )
    assert "<script>" not in text  # the HTML travels base64 past Markdown, the hook restores it
    hooks = importlib_hooks()
    restored = hooks.on_page_content(
        text,
        page=type("P", (), {"url": "notebooks/009_x.html"})(),
        config={"theme": {"language": "en"}},
    )
    assert "<b>x</b><script>1<2</script>" in restored and "data-search-exclude" in restored


def importlib_hooks():
    import importlib

    _docs_site()
    return importlib.import_module("tools.mkdocs_hooks")


def test_site_links_go_to_the_page_of_the_right_side():
    site = _docs_site()
    docs, zh = ROOT / "docs", ROOT / "docs" / "zh"
    cases = [  # (target, the side of the page linking, expected)
        (ROOT / "README.md", "en", ("en", "index.md")),
        (ROOT / "README.md", "zh", ("en", "index.md")),
        (ROOT / "README.zh-CN.md", "en", ("zh", "index.md")),
        (docs / "models.md", "zh", ("zh", "models.md")),  # not translated: on both sides
        (docs / "viz.md", "zh", ("en", "viz.md")),  # translated: the English one is on en only
        (zh / "viz.md", "en", ("zh", "viz.md")),
        (
            ROOT / "notebooks" / "001_self_attention_by_hand.ipynb",
            "zh",
            ("zh", "notebooks/001_self_attention_by_hand.md"),
        ),
        (ROOT / "benchmarks/results/demo.json", "en", ("en", "files/benchmarks/results/demo.json")),
    ]
    for target, lang, expected in cases:
        assert site.site_path(target, lang) == expected, (target, lang)
    crossing: list = []
    copies: set = set()
    text = site.rewrite_links(
        "[a](../viz.md#the-html-viewer) [b](models.md) [c](../../benchmarks/results/demo.json)",
        zh / "train.md",
        "train.md",
        "zh",
        copies,
        crossing,
    )
    assert text == (
        "[a](qkv-side:en/viz.html#the-html-viewer) [b](models.md) "
        "[c](files/benchmarks/results/demo.json)"
    )
    assert crossing == [("zh", "train.md", "en/viz.html#the-html-viewer")]
    assert copies == {"benchmarks/results/demo.json"}
    hooks = importlib_hooks()
    assert hooks.side_href("notebooks/x.html", "zh", "en/viz.html") == "../../viz.html"
    assert hooks.side_href("seeds.html", "en", "zh/seeds.html") == "zh/seeds.html"


def test_the_sites_build_times_come_from_docs_json_in_both_languages():
    """A paragraph about `make docs` that quotes seconds names benchmarks/results/docs.json, and
    each figure is one of that file's."""
    record = json.loads((ROOT / "benchmarks/results/docs.json").read_text(encoding="utf-8"))
    figures = {
        f"{v:.1f}" for run in record["runs"].values() for k, v in run.items() if k.endswith("_s")
    }
    assert {"first", "cached", "check"} <= set(record["runs"])
    seconds = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*(?:s\b|秒)")
    quoted = 0
    for where, para in _paragraphs():
        if "make docs" not in para:
            continue
        for figure in seconds.findall(para):
            quoted += 1
            assert figure in figures, f"{where}: {figure} s is not in docs.json"
            assert "docs.json" in para, f"{where}: {figure} s names no JSON"
    assert quoted >= 8, quoted  # four figures, in README and README.zh-CN


def test_the_strict_build_fails_on_a_heading_that_is_not_there(tmp_path):
    """What `make test`'s strict build catches: a link to a heading a page does not have."""
    site = _docs_site()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Start\n\n[there](other.md#no-such-heading)\n", "utf-8")
    (docs / "other.md").write_text("# Other\n\n## A heading\n", "utf-8")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        "site_name: t\nvalidation:\n  anchors: warn\nnav:\n  - index.md\n  - other.md\n",
        encoding="utf-8",
    )
    with pytest.raises(RuntimeError, match="no-such-heading"):  # the real site: make docs-check
        site.mkdocs_builds([config], strict=True, env={})


def test_readme_quotes_the_fine_tuning_figures_of_the_json():
    """README's fine-tuning table quotes benchmarks/results/finetune.json: each system's
    updates, BLEU and chrF on the new domain's test set, the foreign model's training, and the
    load it ran at."""
    record = json.loads((ROOT / "benchmarks/results/finetune.json").read_text(encoding="utf-8"))
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Fine-tuning an imported model") :]
    section = section[: section.index("\n## ")]
    assert record["command"] in section
    for name, run in record["systems"].items():
        (row,) = [line for line in section.splitlines() if line.startswith(f"| {name} ")]
        cells = [c.strip().strip("*") for c in row.strip("|").split("|")]
        scores = run["b_test"]
        assert cells[-2:] == [f"{scores['bleu']:.2f}", f"{scores['chrf']:.2f}"], (name, cells)
        assert cells[-3] == (f"{run['updates']:,}" if "updates" in run else "none"), (name, cells)
    foreign = record["foreign"]
    assert f"{foreign['updates']:,} updates" in section and foreign["transformers"] in section
    assert f"{record['systems']['import']['a_test']['bleu']:.2f}" in section
    for key in ("load_average_at_start", "load_average_at_end"):
        assert f"{record[key][0]:.2f}" in section, key
