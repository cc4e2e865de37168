"""qkv.inference loads each public name from its module when first used: ``qkv translate
--help`` (which shows ``Decoding``'s defaults) starts without torch, and every name of
``__all__`` still resolves to what its module defines."""

from __future__ import annotations

import importlib
import subprocess
import sys

import qkv.inference


def test_every_public_name_resolves_to_its_module():
    assert sorted(qkv.inference.__all__) == sorted(qkv.inference._WHERE)
    for name, where in qkv.inference._WHERE.items():
        module = importlib.import_module(f"qkv.inference.{where}")
        assert getattr(qkv.inference, name) is getattr(module, name), name
    assert set(qkv.inference.__all__) <= set(dir(qkv.inference))


def test_an_unknown_name_is_an_attribute_error():
    try:
        qkv.inference.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("qkv.inference.no_such_name resolved")


def test_translate_help_does_not_import_torch():
    code = (
        "import sys\n"
        "from qkv.cli import main\n"
        "sys.argv = ['qkv', 'translate', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--batch-tokens" in out.stdout and out.stdout.rstrip().endswith("ok")
