"""The floors of qkv: no module imports a higher floor, and no lazy import hides a cycle.

Every module's imports are read with ``ast`` (function-level imports included) and checked
against this table. A package may import its own modules and any package on a LOWER floor; two
packages on one floor are siblings and do not import each other (the package root ``qkv`` may
import ``functional``, which it re-exports).

    floor  package                       what it is                                 may import
    0      qkv._deps                     optional dependencies checked before work   the ground
    0      qkv._errors                   errors that name the setting they are about the ground
    0      qkv._folder                   the file names of a model folder            the ground
    0      qkv._atomic                   files and folders written whole or not      the ground
    0      qkv._machine                  procfs, sysfs, cgroups: CPUs, memory, umask the ground
    0      qkv.functional                the math: attention, masks, scores          the ground
    0      qkv.data                      corpus readers, tokenizers, batching        the ground
    0      qkv (the root __init__)       __version__, re-exports functional          functional
    0      qkv._lazy                     a package's names loaded on first use       the ground
    0      qkv.runtime                   torch's CPU threads chosen from the machine the ground
    1      qkv.nn                        modules: own parameters, call functional    floor 0
    2      qkv.decoding                  greedy and beam search, KV cache            floors 0-1
    3      qkv.inference                 a saved model loaded, text decoded in       floors 0-2
                                         batches, scored; the device picked
    3      qkv.viz                       heatmaps and the HTML viewer                floors 0-2
    4      qkv.interop                   other frameworks' model folders in and out  floors 0-3
                                         (qkv import; the tables of the HF export)
    5      qkv.train, qkv.translate      the training loop; the Translator           floors 0-4
    5      qkv.export                    exported folders; CTranslate2's and ONNX's  floors 0-4
                                         engines
    6      qkv.engines                   an engine opened by name for a folder       floors 0-5
    6      qkv.demos                     ``qkv demo``                                floors 0-5
    7      qkv.serve                     ``qkv serve``: the HTTP app, batching       floors 0-6
    8      qkv.cli                       the ``qkv`` command: parses, calls, prints floors 0-7
    9      qkv.__main__                  ``python -m qkv``: runs qkv.cli             floors 0-8

The modules ``qkv._*`` (:data:`GROUND`) are the ground of floor 0: each imports nothing of qkv
but another of them, and every part of qkv may import them, its siblings on floor 0 included.
``data`` imports no other part of qkv but the ground (its languages check a code with a
``SettingError``, a prepared corpus is written atomically), so it sits on floor 0 beside
``functional``: everything above may use it. ``viz`` imports no other part of qkv either, but sits beside
``inference`` as its sibling: ``translate`` and the demos draw with it, while ``inference`` (what
a server runs) never pulls in the plotting stack.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "qkv"

#: top-level part of qkv ("" is the package root's own __init__) -> its floor
FLOORS: dict[str, int] = {
    "functional": 0,
    "data": 0,
    "viz": 3,
    "": 0,
    "_deps": 0,
    "_errors": 0,
    "_lazy": 0,
    "_folder": 0,
    "_atomic": 0,
    "_machine": 0,
    "runtime": 0,
    "nn": 1,
    "decoding": 2,
    "inference": 3,
    "interop": 4,
    "train": 5,
    "translate": 5,
    "export": 5,
    "engines": 6,
    "demos": 6,
    "serve": 7,
    "cli": 8,
    "__main__": 9,
}
#: the ground of floor 0: modules that import nothing of qkv but each other, which any part may
#: import (a part of floor 0 included)
GROUND = {"_deps", "_errors", "_lazy", "_folder", "_atomic", "_machine"}
#: imports between two parts of one floor that are allowed besides the ground: (importer, imported)
SAME_FLOOR: set[tuple[str, str]] = {("", "functional")}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (SRC / rel).is_dir() or (SRC / rel.with_suffix(".py")).is_file()


def _imports(name: str, source: str, is_package: bool) -> list[tuple[str, int, bool]]:
    """``(imported qkv module, line, at module level)`` for every import in ``source``."""
    tree = ast.parse(source)
    top = {id(n) for n in tree.body}
    # imports under `if`/`try` at module level still run on import
    for node in tree.body:
        if isinstance(node, (ast.If, ast.Try)):
            top |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from qkv import functional` imports the module qkv.functional
            targets = [
                f"{mod}.{a.name}" if _is_module(f"{mod}.{a.name}") else mod for a in node.names
            ]
        else:
            continue
        for t in targets:
            if t == "qkv" or t.startswith("qkv."):
                found.append((t, node.lineno, id(node) in top))
    return found


def _part(module: str) -> str:
    """The top-level part of qkv a module belongs to (``qkv.train.loop`` -> ``train``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _modules() -> dict[str, tuple[Path, bool]]:
    return {_module_name(p): (p, p.name == "__init__.py") for p in sorted(PACKAGE.rglob("*.py"))}


def upward_imports(name: str, source: str, is_package: bool = False) -> list[str]:
    """The imports of module ``name`` (its ``source``) that break the floors, as messages."""
    own = _part(name)
    bad = []
    for target, line, _ in _imports(name, source, is_package):
        other = _part(target)
        if other == own or (own, other) in SAME_FLOOR or other in GROUND:
            continue
        if other not in FLOORS or own not in FLOORS:
            bad.append(f"{name}:{line} imports {target}: {other or own!r} has no floor in FLOORS")
        elif FLOORS[other] >= FLOORS[own]:
            bad.append(
                f"{name}:{line} imports {target} (floor {FLOORS[other]}), "
                f"but {name} is on floor {FLOORS[own]}"
            )
    return bad


def test_every_part_of_qkv_has_a_floor():
    parts = {_part(m) for m in _modules()}
    assert parts <= set(FLOORS), f"place these in FLOORS: {sorted(parts - set(FLOORS))}"
    assert set(FLOORS) <= parts, f"FLOORS names parts that do not exist: {set(FLOORS) - parts}"


def test_no_module_imports_a_higher_floor():
    bad = []
    for name, (path, is_pkg) in _modules().items():
        bad += upward_imports(name, path.read_text(encoding="utf-8"), is_pkg)
    assert not bad, "imports that break the floors:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "name, source, expected",
    [
        ("qkv.inference.decode", "from ..train.loop import train_update", "floor 5"),
        ("qkv.nn.attention", "def f():\n    from qkv.decoding import generate", "floor 2"),
        ("qkv.train.loop", "def f():\n    from ..translate import Translator", "floor 5"),
        ("qkv.interop.marian", "from ..export import ctranslate2", "floor 5"),
        ("qkv.data.readers", "import qkv.viz", "floor 3"),
        ("qkv.inference.saved", "from ..viz import save_attention", "floor 3"),
        ("qkv.functional.masks", "from qkv import nn", "floor 1"),
    ],
)
def test_the_check_sees_an_upward_import(name, source, expected):
    """An upward (or sideways) import, at module level or inside a function, is reported."""
    found = upward_imports(name, source)
    assert len(found) == 1 and expected in found[0], found


def test_the_check_allows_downward_and_own_imports():
    src = (
        "from ..inference import decode_texts\nfrom . import checkpoint\nfrom .. import __version__"
    )
    assert upward_imports("qkv.train.loop", src) == []


def _closure(start: str, graph: dict[str, set[str]], skip: set[str]) -> set[str]:
    """Every module that importing ``start`` runs (its parent packages' __init__ included),
    not going through ``skip`` (packages being imported already)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        m = todo.pop()
        parts = m.split(".")
        for k in range(1, len(parts) + 1):
            mod = ".".join(parts[:k])
            if mod not in seen and mod not in skip and mod in graph:
                seen.add(mod)
                todo.extend(graph[mod])
    return seen


def test_no_lazy_import_hides_a_cycle():
    """A function-level import of a qkv module is for speed (``qkv --help``) or an optional
    dependency, never to break a cycle: what it imports never imports the importer back (at
    module level), and its part of qkv never imports the importer's part."""
    modules = _modules()
    top: dict[str, set[str]] = {}
    lazy: list[tuple[str, str, int]] = []
    for name, (path, is_pkg) in modules.items():
        top[name] = set()
        for target, line, at_top in _imports(name, path.read_text(encoding="utf-8"), is_pkg):
            if at_top:
                top[name].add(target)
            else:
                lazy.append((name, target, line))
    parts: dict[str, set[str]] = {}
    for name, targets in top.items():
        parts.setdefault(_part(name), set()).update(_part(t) for t in targets)
    hidden = []
    for name, target, line in lazy:
        if _part(name) == _part(target):
            # the importer's own packages are being imported already when its code runs
            ancestors = {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 1)}
            back = name in _closure(target, top, ancestors)
        else:
            back = _part(name) in _closure(_part(target), parts, set())
        if back:
            hidden.append(f"{name}:{line} imports {target} lazily, and {target} imports {name}")
    assert not hidden, "\n".join(hidden)


# ---------------------------------------------------------------------------- tests mirror src
#: test folders that mirror something other than a package of src/qkv
MIRRORS_ELSEWHERE = {"bench": "benchmarks/", "notebooks": "notebooks/"}
#: test files at the top of tests/: a module of src/qkv (qkv._deps, qkv._machine) or the project
#: as a whole
TOP_LEVEL_TESTS = {
    "test_architecture.py",
    "test_atomic.py",
    "test_deps.py",
    "test_docs.py",
    "test_machine.py",
    "test_runtime.py",
}


def test_tests_mirror_src():
    """tests/PART/ tests src/qkv/PART (a package), each of its files named test_PART_*.py, so the
    tests of a part are found where the part is; README says so."""
    tests = Path(__file__).resolve().parent
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    wrong = []
    for d in sorted(p for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        if d.name not in packages and d.name not in MIRRORS_ELSEWHERE:
            wrong.append(f"tests/{d.name}/ mirrors no package of src/qkv")
        wrong += [
            f"tests/{d.name}/{f.name} is not named test_{d.name}_*.py"
            for f in sorted(d.glob("test_*.py"))
            if not f.name.startswith(f"test_{d.name}_") and f.name != f"test_{d.name}.py"
        ]
    top = {f.name for f in tests.glob("test_*.py")}
    wrong += [
        f"tests/{n} belongs in the folder of the part it tests"
        for n in sorted(top - TOP_LEVEL_TESTS)
    ]
    assert not wrong, "\n".join(wrong)


# ---------------------------------------------------------------------------- engines
#: the engines' classes, and the classmethods that open one
ENGINE_CLASSES = {"Translator", "ModelEngine", "Ct2Translator", "OnnxTranslator"}
#: what the engine base does once for every engine (an engine implements ``_decode_batch``)
BASE_POLICY = {"_decode", "hypotheses", "generate", "translate", "translate_ids", "_generate"}


def _parsed(part: str) -> list[tuple[str, ast.Module]]:
    return [
        (str(path.relative_to(SRC)), ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted((PACKAGE / part).rglob("*.py"))
    ]


def engine_constructions(source: str) -> list[str]:
    """The calls in ``source`` that open an engine itself (``Translator(...)``,
    ``Ct2Translator.load(...)``, ...), as ``line: call``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in ENGINE_CLASSES:
            found.append(f"{node.lineno}: {f.id}(...)")
        elif (
            isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Name)
            and f.value.id in ENGINE_CLASSES
        ):
            found.append(f"{node.lineno}: {f.value.id}.{f.attr}(...)")
    return found


def test_commands_and_the_server_open_engines_through_open_translator():
    """``qkv.engines.open_translator`` is the one way ``cli/`` and ``serve/`` open an engine:
    neither calls an engine's constructor or its ``load``."""
    bad = []
    for part in ("cli", "serve"):
        for path in sorted((PACKAGE / part).rglob("*.py")):
            calls = engine_constructions(path.read_text(encoding="utf-8"))
            bad += [f"{path.relative_to(SRC)}:{c}" for c in calls]
    assert not bad, "open engines with qkv.engines.open_translator:\n" + "\n".join(bad)


def test_the_engine_check_sees_a_construction():
    src = "from ..translate import Translator\nTranslator.load(d)\nOnnxTranslator(d)\nf(d)\n"
    assert engine_constructions(src) == ["2: Translator.load(...)", "3: OnnxTranslator(...)"]


def test_every_engine_leaves_the_policy_to_the_base():
    """Each engine (a ``TranslatorBase`` subclass in src) implements ``_decode_batch`` and
    none of what the base does once (encode, skip, batch, order, shape); the engines' names
    are the ones ``qkv.engines`` finds them by."""
    names, engines, bad = set(), [], []
    for rel, tree in _parsed(""):
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            bases = {b.id for b in cls.bases if isinstance(b, ast.Name)}
            if not bases & {"TranslatorBase", "ModelEngine"}:
                continue
            defined = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
            engines.append(cls.name)
            bad += [f"{rel}: {cls.name}.{m}" for m in sorted(defined & BASE_POLICY)]
            if "ModelEngine" not in bases and "_decode_batch" not in defined:
                bad.append(f"{rel}: {cls.name} has no _decode_batch")
            for stmt in cls.body:
                if isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "engine" for t in stmt.targets
                ):
                    names.add(ast.literal_eval(stmt.value))
    assert sorted(engines) == sorted(ENGINE_CLASSES), engines
    assert not bad, "\n".join(bad)
    from qkv.engines import ENGINES

    assert names == set(ENGINES)


# ---------------------------------------------------------------------------- one softmax
#: modules outside qkv.functional that call a softmax themselves: demos that spell attention's
#: formula out by hand to show it
SOFTMAX_BY_HAND = {
    "qkv.demos.cat_milk",
    "qkv.demos.mha_step_by_step",
    "qkv.demos.sqrt_dk",
    "qkv.demos.vit_qkv",
}


def softmax_calls(source: str) -> list[int]:
    """The lines of ``source`` that call a softmax (``torch.softmax``, ``F.softmax``,
    ``x.softmax``, ``softmax``); a log-softmax over a vocabulary (decoding, the loss) and
    qkv.functional's own functions (``safe_softmax``, ``masked_softmax``) are not counted."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name == "softmax":
                lines.append(node.lineno)
    return lines


def test_the_softmax_check_sees_every_spelling():
    src = "import torch\nimport torch.nn.functional as F\ntorch.softmax(s, -1)\nF.softmax(s, -1)\n"
    src += "s.softmax(-1)\nsafe_softmax(s)\ns.log_softmax(-1)\n"
    assert softmax_calls(src) == [3, 4, 5]


def test_attention_softmax_is_computed_in_functional_only():
    """docs/architecture.md: no module outside qkv.functional computes attention's softmax; the
    scripted decoding step (qkv.nn._scripted) calls qkv.functional.decode.matmul_attention."""
    found = [
        f"{name}:{line}"
        for name, (path, _) in _modules().items()
        if _part(name) != "functional" and name not in SOFTMAX_BY_HAND
        for line in softmax_calls(path.read_text(encoding="utf-8"))
    ]
    assert not found, "softmax computed outside qkv.functional:\n" + "\n".join(found)


# ---------------------------------------------------------------------------- the fast path
#: the modules of the Transformer's fast path in inference, which only qkv.nn._fast_decode uses
FAST_PATH_MODULES = {"qkv.nn._inference", "qkv.nn._scripted"}


def test_the_transformer_reaches_its_fast_path_through_one_module():
    """docs/architecture.md: qkv/nn/transformer.py is the model; its fast path in inference is
    qkv.nn._fast_decode, the one module that uses the kept weights (_inference) and the
    scripted step (_scripted) in nn, and whose why_not_fast_path every caller asks."""
    users = {
        name
        for name, (path, is_pkg) in _modules().items()
        if _part(name) == "nn"
        for target, _, _ in _imports(name, path.read_text(encoding="utf-8"), is_pkg)
        if target in FAST_PATH_MODULES and name not in FAST_PATH_MODULES
    }
    assert users == {"qkv.nn._fast_decode"}, users


def test_the_ground_imports_nothing_of_qkv_but_the_ground():
    """``qkv._*`` sits under every part of qkv: it imports no part but another ``qkv._*``."""
    bad = [
        f"{name}:{line} imports {target}"
        for name, (path, is_pkg) in _modules().items()
        if _part(name) in GROUND
        for target, line, _ in _imports(name, path.read_text(encoding="utf-8"), is_pkg)
        if _part(target) not in GROUND
    ]
    assert {p for p in FLOORS if p.startswith("_") and p != "__main__"} == GROUND
    assert not bad, "the ground imports a part of qkv:\n" + "\n".join(bad)


def _string_constants(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (n.value, n.lineno)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


#: the files of a model folder whose names only qkv._folder spells
FOLDER_FILES = {
    "model.json",
    "decoding.json",
    "trainer.json",
    "manifest.json",
    "model.safetensors",
    "train.json",
    "split.json",
    "trainer.pt",
    "card.json",
    "onnx.json",
    "qkv.json",
    "model.bin",
}


def test_the_model_folders_file_names_are_spelled_in_one_module():
    """A model folder's files (``model.json``, ``decoding.json``, ``trainer.json``,
    ``manifest.json``, the weights, an export's files: :data:`FOLDER_FILES`) are named by
    ``qkv._folder`` (a string of its own, not prose of a message or docstring); every other
    module uses its names."""
    found = {
        f"{path.relative_to(SRC)}:{line}: {value!r}"
        for path, _ in _modules().values()
        for value, line in _string_constants(path)
        if value in FOLDER_FILES
    }
    assert {f.split(":")[0] for f in found} == {"qkv/_folder.py"}, "\n".join(sorted(found))


@pytest.mark.parametrize(
    "needle, home, at_most",
    [
        ("os.replace", {"qkv/_atomic.py"}, 1),  # files and folders renamed into place
        ("/proc/", {"qkv/_machine.py"}, 1),  # procfs read
    ],
)
def test_one_module_does_each_kind_of_system_work(needle, home, at_most):
    """Atomic renames are :mod:`qkv._atomic`'s; procfs, sysfs and cgroups are
    :mod:`qkv._machine`'s: no other module of src spells them."""
    where = {
        str(path.relative_to(SRC))
        for path, _ in _modules().values()
        if needle in path.read_text(encoding="utf-8")
    }
    assert where <= home and len(where) <= at_most, sorted(where)


def test_no_class_is_named_plan():
    """A class name means one thing: the batcher's epoch of batches and attention's checked
    call and the server's route of a request have names of their own, not the eight meanings
    of "plan"."""
    found = {
        str(path.relative_to(SRC))
        for path, _ in _modules().values()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and node.name == "_Plan"
    }
    assert not found, sorted(found)
