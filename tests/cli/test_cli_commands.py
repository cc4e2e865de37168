"""The ``qkv`` command as a package: one module per command, each with ``NAME``,
``add_parser(subparsers)`` and ``run(args)``, assembled by ``build_parser``; building the
parser loads neither torch nor the serve extra."""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import qkv.cli
from qkv.cli import COMMANDS, build_parser, main

CLI = Path(qkv.cli.__file__).parent
SRC = CLI.parents[1]
#: the modules of src/qkv/cli/ that are not a command
NOT_COMMANDS = {"__init__", "__main__", "_common", "_train_settings"}


def _subparsers() -> dict:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices


def test_every_command_module_is_a_command():
    """A command's module is named by the word the user types (``import_`` where the word is a
    Python keyword)."""
    stems = {p.stem for p in CLI.glob("*.py")} - NOT_COMMANDS
    names = {s.rstrip("_") for s in stems}
    assert names == set(COMMANDS) == set(_subparsers())
    for stem in stems:
        module = importlib.import_module(f"qkv.cli.{stem}")
        name = stem.rstrip("_")
        assert COMMANDS[name] is module
        assert name == module.NAME
        assert list(inspect.signature(module.add_parser).parameters) == ["subparsers"]
        assert list(inspect.signature(module.run).parameters) == ["args"]


def test_main_runs_the_module_of_the_command(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(qkv.cli.demo, "run", lambda args: seen.append(args.name) or 3)
    assert main(["demo", "tour"]) == 3 and seen == ["tour"]
    with pytest.raises(SystemExit):
        main(["nonsense"])
    assert "invalid choice: 'nonsense'" in capsys.readouterr().err


def _modules_after(code: str, *blocked: str) -> set[str]:
    """The top-level modules loaded by ``code`` in a fresh interpreter (``blocked``: not
    installed), one name per line on its stdout."""
    prelude = (
        "import sys\n"
        "class B:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.partition('.')[0] in {set(blocked)!r}:\n"
        "            raise ModuleNotFoundError(name, name=name)\n"
        "sys.meta_path.insert(0, B())\n"
    )
    end = "\nprint('\\n'.join(sorted({m.partition('.')[0] for m in sys.modules})))\n"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    res = subprocess.run(
        [sys.executable, "-c", prelude + code + end],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    return set(res.stdout.split())


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["average", "--help"]])
def test_help_loads_no_torch_and_no_serve_extra(argv):
    """``qkv --help`` and the help of a command whose defaults need no torch start without it;
    ``qkv serve --help`` shows ServeConfig's defaults on a base install (no starlette)."""
    code = (
        "import contextlib, io\n"
        "from qkv.cli import main\n"
        "try:\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as shown:\n"
        f"        main({argv!r})\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0 and shown.getvalue().startswith('usage: qkv'), e.code\n"
    )
    loaded = _modules_after(code, "starlette", "uvicorn")
    assert "torch" not in loaded and "starlette" not in loaded


def test_building_the_parser_loads_no_torch():
    loaded = _modules_after("from qkv.cli import build_parser\nbuild_parser()\n")
    assert "torch" not in loaded


def test_python_dash_m_qkv_cli_is_the_command():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    res = subprocess.run(
        [sys.executable, "-m", "qkv.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert res.returncode == 0 and res.stdout.strip() == f"qkv {qkv.__version__}"
