"""The documentation site: README, docs/ and the notebooks as pages, in English and Chinese.

``make docs`` runs ``python -m tools.docs_site build``: it executes the notebooks (their executed
copies are kept in ``.cache/notebooks/``, keyed by the notebook's cells, so an unchanged
notebook is not run again), lays out two MkDocs source folders under ``build/docs/`` and builds
them with MkDocs Material into ``site/`` (English) and ``site/zh/`` (Chinese).

The sources stay where a reader of the repository finds them; this module only copies them:

* English: ``README.md`` is the start page, ``docs/*.md`` the other pages, each notebook a page
  (``notebooks/NAME.md``, its cells and outputs), ``notebooks/index.md`` the list of them
  (``docs/notebooks.md``), and every other file of the repository a page links to (say
  ``benchmarks/results/demo.json``) is copied beside them;
* Chinese: the same pages, with ``README.zh-CN.md`` as the start page and ``docs/zh/NAME.md`` in
  place of ``docs/NAME.md`` where it exists (the learner's pages); the others stay in English.

Links are rewritten from the repository's layout to the site's (``docs/train.md`` ->
``train.md``, ``../notebooks/X.ipynb`` -> ``notebooks/X.md``), and ``mkdocs build --strict``
then fails on any link or anchor that does not resolve. ``check`` is that strict build without
executing anything: notebooks already in the cache show their outputs, the others their code
only; ``make test`` runs it.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
DEFAULT_CACHE = ROOT / ".cache" / "notebooks"
DEFAULT_STAGE = ROOT / "build" / "docs"
#: pages of docs/zh/ replace the English page of the same name on the Chinese side
ZH_DOCS = ROOT / "docs" / "zh"
#: a raw HTML output of a notebook travels through Markdown as one attribute (base64) of an
#: empty element; the hook ``tools/mkdocs_hooks.py`` puts the HTML back after Markdown ran
RAW_TAG = '<div class="qkv-nb-raw" data-raw="{}"></div>'
_LINK = re.compile(r"(\]\()([^)\s#]*)(#[^)\s]*)?(\))")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


# ------------------------------------------------------------------------ notebooks
def cell_key(nb: dict[str, Any]) -> str:
    """What the executed copy of a notebook depends on: its cells' kinds and sources."""
    cells = [(c["cell_type"], "".join(c["source"])) for c in nb["cells"]]
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode()).hexdigest()[:16]


def cached_path(cache: Path, path: Path, nb: dict[str, Any]) -> Path:
    """Where the executed copy of notebook ``path`` lies in ``cache``."""
    return cache / f"{path.stem}-{cell_key(nb)}.ipynb"


def execute_notebook(path: Path, out: Path, timeout: int = 1800) -> float:
    """Run notebook ``path`` in a fresh kernel (this checkout's ``src/`` first on its path) and
    write it with its outputs to ``out``; returns the seconds it took."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    env = {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])
        ),
        "MPLBACKEND": "Agg",
    }
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits the environment of this process
    start = time.monotonic()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            client = nbclient.NotebookClient(
                nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": tmp}}
            )
            client.execute()
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".partial")
    nbformat.write(nb, tmp_out)
    tmp_out.replace(out)
    return time.monotonic() - start


def executed_notebooks(cache: Path, *, execute: bool, log: Callable[[str], None]) -> dict:
    """Each notebook's JSON, executed: from ``cache`` when its cells are unchanged, else run now
    (``execute``) or left without outputs. Stale copies of a notebook are removed."""
    found = {}
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        target = cached_path(cache, path, nb)
        if not target.exists() and execute:
            for old in cache.glob(f"{path.stem}-*.ipynb"):
                old.unlink()
            log(f"docs: executing {path.name} ...")
            log(f"docs: {path.name} ran in {execute_notebook(path, target):.1f} s")
        if target.exists():
            nb = json.loads(target.read_text(encoding="utf-8"))
        elif not execute:
            log(f"docs: {path.name} is not in the cache: shown without outputs")
        found[path.name] = nb
    return found


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "".join(value)


def _fence(text: str, language: str = "text") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{language}\n{text.rstrip()}\n{ticks}\n"


def _raw(markup: str) -> str:
    return RAW_TAG.format(base64.b64encode(markup.encode("utf-8")).decode("ascii"))


def _output_markdown(out: dict[str, Any], images: dict[str, bytes], stem: str) -> str:
    """One output of a code cell as Markdown: text in a block, a PNG as a file beside the
    page, HTML as it is (the attention viewer, tables, cards)."""
    kind = out.get("output_type")
    if kind == "stream":
        text = _ANSI.sub("", _text(out.get("text", "")))
        css = "qkv-nb-stderr" if out.get("name") == "stderr" else "qkv-nb-stdout"
        return f'<div class="{css}" markdown="1">\n\n{_fence(text)}\n</div>\n'
    if kind == "error":
        trace = _ANSI.sub("", "\n".join(out.get("traceback", [])))
        return _fence(trace)
    data = out.get("data", {})
    if "text/html" in data:
        return _raw(f'<div class="qkv-nb-html">{_text(data["text/html"])}</div>') + "\n"
    if "image/png" in data:
        name = f"{stem}/output-{len(images) + 1}.png"
        images[name] = base64.b64decode(_text(data["image/png"]))
        return f"![output {len(images)}]({name})\n"
    if "text/plain" in data:
        return _fence(_ANSI.sub("", _text(data["text/plain"])))
    return ""


def notebook_markdown(nb: dict[str, Any], stem: str) -> tuple[str, dict[str, bytes]]:
    """A notebook as one Markdown page and the images its outputs hold (``name -> PNG``)."""
    parts: list[str] = []
    images: dict[str, bytes] = {}
    for cell in nb["cells"]:
        source = _text(cell["source"])
        if cell["cell_type"] == "markdown":
            parts.append(source.strip() + "\n")
        elif cell["cell_type"] == "code":
            parts.append(_fence(source, "python"))
            outs = [_output_markdown(o, images, stem) for o in cell.get("outputs", [])]
            if any(outs):
                body = "\n".join(o for o in outs if o)
                parts.append(f'<div class="qkv-nb-outputs" markdown="1">\n\n{body}\n</div>\n')
    download = f"[{stem}.ipynb](../files/notebooks/{stem}.ipynb)"
    parts.insert(1, f"*笔记本文件 · the notebook: {download}*\n")
    return "\n".join(parts), images


# ------------------------------------------------------------------------ links
def site_path(target: Path, lang: str) -> tuple[str, str]:
    """Where the repository file ``target`` (absolute) is shown when a page of side ``lang``
    links to it: ``(side, path)``, the path relative to that side's source root. A page of
    ``docs/`` that ``docs/zh/`` translates is on the English side only (the Chinese side holds
    the translation under its name); the other pages are on both sides; ``files/...`` are the
    repository's other files, copied beside the pages."""
    rel = target.resolve().relative_to(ROOT).as_posix()
    if rel == "README.md":
        return "en", "index.md"
    if rel == "README.zh-CN.md":
        return "zh", "index.md"
    if rel in ("docs/zh/notebooks.md",):
        return "zh", "notebooks/index.md"
    if rel in ("notebooks", "notebooks/", "docs/notebooks.md"):
        return ("en" if rel == "docs/notebooks.md" else lang), "notebooks/index.md"
    if rel.startswith("notebooks/") and rel.endswith(".ipynb"):
        return lang, rel[: -len(".ipynb")] + ".md"
    if rel.startswith("docs/zh/") and rel.endswith(".md"):
        return "zh", rel[len("docs/zh/") :]
    if rel.startswith("docs/") and rel.endswith(".md"):
        name = rel[len("docs/") :]
        return ("en" if (ZH_DOCS / name).exists() else lang), name
    return lang, f"files/{rel}"


def _relative(dest: str, page: str) -> str:
    return os.path.relpath(dest, os.path.dirname(page) or ".").replace(os.sep, "/")


def rewrite_links(
    text: str, source: Path, page: str, lang: str, copies: set[str], crossing: list | None = None
) -> str:
    """``text`` of repository file ``source``, shown at site page ``page``: every relative link
    rewritten to the site's layout. Files that are not pages are added to ``copies`` (repository
    paths) to be copied beside the pages; a link to a page of the other language's side
    (:func:`site_path`) is written ``qkv-side:SIDE/PAGE.html#anchor`` and added to ``crossing``
    as ``(lang, page, link)`` for :func:`check_crossing_links`."""

    def one(m: re.Match[str]) -> str:
        target, anchor = m.group(2), m.group(3) or ""
        if not target or "://" in target or target.startswith(("mailto:", "/")):
            return m.group(0)
        repo_file = (source.parent / target).resolve()
        if not repo_file.exists():
            return m.group(0)  # left as it is: the strict build names it
        side, dest = site_path(repo_file, lang)
        if side != lang:  # a page of the other side (MkDocs checks within one side only)
            link = f"{side}/{dest[: -len('.md')]}.html{anchor}"
            if crossing is not None:
                crossing.append((lang, page, link))
            return f"{m.group(1)}qkv-side:{link}{m.group(4)}"  # the hook makes it relative
        if dest.startswith("files/"):
            if repo_file.is_dir():
                return m.group(0)
            copies.add(repo_file.relative_to(ROOT).as_posix())
        return f"{m.group(1)}{_relative(dest, page)}{anchor}{m.group(4)}"

    return _LINK.sub(one, text)


# ------------------------------------------------------------------------ staging
def _pages(lang: str) -> dict[str, Path]:
    """Site page -> repository source, for one side of the site."""
    pages = {"index.md": ROOT / ("README.md" if lang == "en" else "README.zh-CN.md")}
    for p in sorted((ROOT / "docs").glob("*.md")):
        pages[p.name] = p
    if lang == "zh":
        for p in sorted(ZH_DOCS.glob("*.md")):
            pages[p.name] = p
    pages["notebooks/index.md"] = pages.pop("notebooks.md")
    return pages


def stage(out: Path, notebooks: dict[str, dict], lang: str, crossing: list | None = None) -> Path:
    """Lay out the MkDocs source folder of one side of the site in ``out / lang``; links to
    the other side are added to ``crossing`` (see :func:`rewrite_links`)."""
    root = out / lang
    if root.exists():
        shutil.rmtree(root)
    copies: set[str] = set()
    for page, source in _pages(lang).items():
        text = source.read_text(encoding="utf-8")
        dest = root / page
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(rewrite_links(text, source, page, lang, copies, crossing), encoding="utf-8")
    for name, nb in notebooks.items():
        stem = name[: -len(".ipynb")]
        page = f"notebooks/{stem}.md"
        text, images = notebook_markdown(nb, stem)
        text = rewrite_links(text, NOTEBOOKS / name, page, lang, copies)
        (root / page).write_text(text, encoding="utf-8")
        for img, data in images.items():
            (root / "notebooks" / img).parent.mkdir(parents=True, exist_ok=True)
            (root / "notebooks" / img).write_bytes(data)
        copies.add(f"notebooks/{name}")
    for rel in sorted(copies):
        dest = root / "files" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, dest)  # a notebook as stored: without outputs
    assets = ROOT / "docs" / "assets"
    if assets.is_dir():
        shutil.copytree(assets, root / "assets")
    return root


def mkdocs_builds(configs: list[Path], *, strict: bool, env: dict[str, str]) -> dict[str, float]:
    """``mkdocs build`` of each of ``configs`` at once, ``env`` added to the environment
    (subprocesses: MkDocs keeps state between builds); returns each one's seconds, by config
    name. RuntimeError with the last lines of one that fails (in strict mode a warning fails it:
    a link or an anchor that does not resolve)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", **env}
    start, runs = time.monotonic(), {}
    for config in configs:
        cmd = [sys.executable, "-m", "mkdocs", "build", "-f", str(config)]
        cmd += ["--strict"] if strict else []
        runs[config.name] = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    seconds, failed = {}, []
    for name, run in runs.items():
        out, _ = run.communicate()
        seconds[name] = time.monotonic() - start
        if run.returncode != 0:
            failed.append(f"mkdocs build -f {name} failed:\n" + "\n".join(out.splitlines()[-20:]))
    if failed:
        raise RuntimeError("\n".join(failed))
    return seconds


_ID = re.compile(r'\sid="([^"]+)"')


def check_crossing_links(site: Path, crossing: list) -> None:
    """Each link from one side of the built ``site`` to the other reaches a page there, and the
    heading it names; ValueError listing those that do not."""
    broken = []
    for lang, page, link in crossing:
        side, _, rest = link.partition("/")
        path, _, anchor = rest.partition("#")
        dest = (site if side == "en" else site / "zh") / path
        if not dest.is_file():
            broken.append(f"{lang}/{page}: {link} (no such page)")
        elif anchor and anchor not in _ID.findall(dest.read_text(encoding="utf-8")):
            broken.append(f"{lang}/{page}: {link} (no such heading)")
    if broken:
        raise ValueError("links between the two sides of the site:\n" + "\n".join(broken))


def build(
    *,
    execute: bool,
    strict: bool,
    cache: Path = DEFAULT_CACHE,
    stage_dir: Path = DEFAULT_STAGE,
    site_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, float]:
    """Stage both sides and build them; returns the seconds each step took."""
    times: dict[str, float] = {}
    start = time.monotonic()
    notebooks = executed_notebooks(cache, execute=execute, log=log)
    times["notebooks"] = time.monotonic() - start
    crossing: list = []
    for lang in ("en", "zh"):
        stage(stage_dir, notebooks, lang, crossing)
    site = (site_dir or ROOT / "site").resolve()
    # the Chinese side is built beside the English one at the same time, then moved into its
    # zh/ (the English build empties its folder first)
    zh_apart = (stage_dir / "site-zh").resolve()
    env = {
        "QKV_DOCS_EN": str((stage_dir / "en").resolve()),
        "QKV_DOCS_ZH": str((stage_dir / "zh").resolve()),
        "QKV_SITE_EN": str(site),
        "QKV_SITE_ZH": str(zh_apart),
    }
    took = mkdocs_builds([ROOT / "mkdocs.yml", ROOT / "mkdocs.zh.yml"], strict=strict, env=env)
    times["en"], times["zh"] = took["mkdocs.yml"], took["mkdocs.zh.yml"]
    if (site / "zh").exists():
        shutil.rmtree(site / "zh")
    shutil.move(str(zh_apart), str(site / "zh"))
    check_crossing_links(site, crossing)
    times["total"] = time.monotonic() - start
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docs_site", description=__doc__)
    parser.add_argument("command", choices=("build", "check"))
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="executed notebooks")
    parser.add_argument("--site-dir", type=Path, default=None, help="default: site/")
    parser.add_argument(
        "--record",
        type=Path,
        default=None,
        metavar="JSON",
        help="add this build's times to JSON (benchmarks/results/docs.json), under its kind: "
        "'first' (every notebook executed), 'cached' or 'check'",
    )
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    if args.command == "check":  # make test: strict, nothing executed, the site kept apart
        site = args.site_dir or ROOT / "build" / "site-check"
        times = build(
            execute=False,
            strict=True,
            cache=args.cache,
            stage_dir=ROOT / "build" / "docs-check",
            site_dir=site,
            log=lambda s: None,
        )
    else:
        times = build(execute=True, strict=True, cache=args.cache, site_dir=args.site_dir)
    shown = ", ".join(f"{k} {v:.1f} s" for k, v in times.items())
    print(f"docs: {args.command}: {shown}")
    if args.record is not None:
        record(args.record, args.command, times, load)
    return 0


def record(path: Path, command: str, times: dict[str, float], load: float) -> None:
    """Add one build's times to the JSON at ``path``: ``runs[kind]`` with ``kind`` "check", or
    "first" when the notebooks ran (more than a second), else "cached"."""
    kind = "check" if command == "check" else ("first" if times["notebooks"] > 1 else "cached")
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"runs": {}}
    data["command"] = (
        "python -m tools.docs_site {build,check} --record (make docs, make docs-check)"
    )
    data["runs"][kind] = {
        "load_average_at_start": round(load, 2),
        **{f"{k}_s": round(v, 1) for k, v in times.items()},
    }
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
