"""The learner's docs hold together: every relative link of README.md, README.zh-CN.md and
docs/seeds.md resolves (the file or folder exists; a ``#fragment`` into a Markdown file names one
of its headings), and docs/seeds.md names only demos that exist and every seed notebook."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "README.zh-CN.md", ROOT / "docs" / "seeds.md"]
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters of any script,
    digits, ``-`` and ``_`` kept), each space a ``-``."""
    text = re.sub(r"[`*_]{1,2}(?=\S)|(?<=\S)[`*_]{1,2}", "", heading.strip().lower())
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def relative_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return [
        t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)
    ]  # http:, https:, mailto: are not ours


def test_slugs_as_github_makes_them():
    assert slug("What `qkv train --data X` chooses by itself") == (
        "what-qkv-train---data-x-chooses-by-itself"
    )
    assert slug("种子对照表") == "种子对照表"
    assert slug("Learning with qkv: notebooks, the seed map, 中文") == (
        "learning-with-qkv-notebooks-the-seed-map-中文"
    )


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_every_relative_link_resolves(doc):
    links = relative_links(doc)
    assert links, f"{doc.name} has no relative link"
    for link in links:
        target, _, fragment = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        assert path.exists(), f"{doc.name}: {link} -> {path} does not exist"
        if fragment and path.suffix == ".md":
            assert fragment in anchors(path), f"{doc.name}: {link}: no heading #{fragment}"


def test_seed_map_names_real_demos_and_every_notebook():
    from qkv.demos import load

    text = (ROOT / "docs" / "seeds.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    demos = set(load())
    named = set()
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) == 5 and cells[0] != "seed section":
            named |= set(re.findall(r"`([a-z0-9-]+)`", cells[2]))
    assert named, "no demo named in the tables"
    assert named <= demos, named - demos
    assert demos - {"tour"} <= named | {"tour"}, demos - named  # every demo has its row
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"../notebooks/{nb.name}" in text, nb.name
