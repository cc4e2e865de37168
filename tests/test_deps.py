"""Optional dependencies are checked before work: one line naming the extra, nothing written.

A package is made "not installed" in-process by ``sys.modules[name] = None`` (import and
``find_spec`` both fail), and in a subprocess by a meta-path finder that refuses it, as on a
base install.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from qkv._deps import EXTRAS, MissingDependency, missing, require
from qkv.cli import main

try:
    import tomllib
except ImportError:  # Python 3.10: the train extra brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]

#: a base install in a subprocess: the modules named in QKV_TEST_BLOCK cannot be found
BLOCKER = textwrap.dedent(
    """
    import os, sys
    blocked = set(os.environ["QKV_TEST_BLOCK"].split(","))
    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in blocked:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, Blocker())
    from qkv.cli import main
    raise SystemExit(main(sys.argv[1:]))
    """
)


def run_blocked(blocked: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "QKV_TEST_BLOCK": blocked, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", BLOCKER, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
    )


def block(monkeypatch, *names: str) -> None:
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


# ---------------------------------------------------------------------------- require
def test_installed_modules_pass_and_nothing_is_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "sacrebleu", raising=False)
    require("scoring", ["json", "sacrebleu"])  # installed in the dev environment
    assert "sacrebleu" not in sys.modules  # looked up, not imported
    assert missing(["json", "sacrebleu"]) == []


def test_a_missing_module_is_one_line_naming_the_package_and_the_extra(monkeypatch):
    block(monkeypatch, "sacrebleu", "safetensors", "yaml")
    with pytest.raises(MissingDependency) as e:
        require("qkv train", ["safetensors", "sacrebleu", "json"])
    assert str(e.value) == "qkv train needs sacrebleu, safetensors: pip install 'qkv[train]'"
    assert isinstance(e.value, ImportError) and e.value.extras == ["train"]
    with pytest.raises(MissingDependency, match=r"^x needs pyyaml: pip install 'qkv\[train\]'$"):
        require("x", ["yaml"])  # the module is yaml, the package pyyaml


def test_several_extras_and_packages_outside_them(monkeypatch):
    block(monkeypatch, "safetensors", "matplotlib")
    with pytest.raises(MissingDependency) as e:
        require("qkv translate", ["safetensors", "matplotlib"])
    assert str(e.value) == (
        "qkv translate needs matplotlib, safetensors: pip install 'qkv[train,viz]'"
    )
    with pytest.raises(MissingDependency, match=r"^y needs no_such_pkg_qkv: pip install no_such"):
        require("y", ["no_such_pkg_qkv"])


def test_every_extra_named_lists_the_package_in_pyproject():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]

    def packages(extra: str) -> set[str]:
        out = set()
        for req in extras[extra]:
            name = req.split(";")[0].split("[")[0]
            for sep in "<>=!~ ":
                name = name.split(sep)[0]
            out.add(name.lower())
            if name == "qkv":  # qkv[train] inside another extra
                out |= set().union(
                    *(packages(e) for e in req.split("[")[1].split("]")[0].split(","))
                )
        return out

    for module, (package, extra) in EXTRAS.items():
        assert package in packages(extra), f"{module}: {package} is not in qkv[{extra}]"


# ---------------------------------------------------------------------------- commands
def test_train_without_the_extra_fails_before_training(tmp_path):
    out = tmp_path / "run"
    t0 = time.monotonic()
    res = run_blocked("sacrebleu,safetensors", "train", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip() == (
        "qkv train needs sacrebleu, safetensors: pip install 'qkv[train]'"
    )
    assert res.stdout == "" and not out.exists()  # no folder, no update, no data read
    assert time.monotonic() - t0 < 60


def test_train_library_checks_before_reading_data(monkeypatch, tmp_path):
    from qkv.train import TrainConfig, train

    block(monkeypatch, "sacrebleu")
    with pytest.raises(MissingDependency, match=r"^training needs sacrebleu: pip install"):
        train(TrainConfig(data=str(tmp_path / "no-such-file.tsv")), tmp_path / "run")
    assert not (tmp_path / "run").exists()
    block(monkeypatch, "sentencepiece")  # a user's corpus gets a subword tokenizer
    with pytest.raises(MissingDependency, match="sacrebleu, sentencepiece"):
        train(TrainConfig(data="x.tsv"), tmp_path / "run")


def test_the_library_names_tensorboard_only_when_asked_for(monkeypatch, tmp_path):
    from qkv.train import TrainConfig, train

    block(monkeypatch, "tensorboard", "sacrebleu")
    with pytest.raises(MissingDependency) as e:
        train(TrainConfig(tensorboard=True), tmp_path / "run")
    assert str(e.value) == (
        "training needs sacrebleu, tensorboard: pip install 'qkv[tensorboard,train]'"
    )
    with pytest.raises(MissingDependency, match=r"^training needs sacrebleu:"):
        train(TrainConfig(), tmp_path / "run")


@pytest.mark.parametrize(
    "args, blocked, line",
    [
        (["translate", "go ."], "safetensors", "qkv translate needs safetensors"),
        (
            ["translate", "--attention", "a.png", "go ."],
            "matplotlib",
            "qkv translate needs matplotlib",
        ),
        (["evaluate"], "sacrebleu", "qkv evaluate needs sacrebleu"),
        (["average", "--out", "avg"], "safetensors", "qkv average needs safetensors"),
    ],
)
def test_model_commands_check_before_loading(monkeypatch, tmp_path, capsys, args, blocked, line):
    block(monkeypatch, blocked)
    monkeypatch.chdir(tmp_path)
    # the model folder does not exist: the check comes first
    argv = [args[0], *(["--model-dir", "nowhere"] if args[0] != "average" else []), *args[1:]]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1 and "pip install 'qkv[" in err
    assert not any(tmp_path.iterdir())


def test_translate_to_html_needs_no_matplotlib(monkeypatch, tmp_path, capsys):
    block(monkeypatch, "matplotlib")
    args = ["translate", "--model-dir", str(tmp_path / "nowhere"), "--attention"]
    assert main([*args, str(tmp_path / "a.html"), "go ."]) == 2  # got past the check
    assert "matplotlib" not in capsys.readouterr().err


def test_the_library_loads_no_model_without_safetensors(monkeypatch, tmp_path):
    from qkv.inference import load_model
    from qkv.translate import Translator

    block(monkeypatch, "safetensors")
    for load in (load_model, Translator.load):
        with pytest.raises(MissingDependency, match=r"^loading a model needs safetensors"):
            load(tmp_path)


@pytest.mark.parametrize("name", ["translate", "masks"])
def test_a_demo_without_its_packages_says_so_before_starting(monkeypatch, tmp_path, capsys, name):
    from qkv import demos

    block(monkeypatch, "matplotlib")
    out = tmp_path / "demo"
    assert main(["demo", name, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err == f"qkv demo {name} needs matplotlib: pip install 'qkv[viz]'\n"
    assert not out.exists()
    with pytest.raises(MissingDependency):  # the library's entry point checks too
        demos.load()[name].run(out, True)
    assert demos.load()["tour"].needs == ()


def test_a_demo_without_the_extra_in_a_base_install(tmp_path):
    res = run_blocked("safetensors,sacrebleu,matplotlib", "demo", "--quick", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr == (
        "qkv demo translate needs matplotlib, sacrebleu, safetensors: "
        "pip install 'qkv[train,viz]'\n"
    )
    assert not (tmp_path / "demo-out").exists()
